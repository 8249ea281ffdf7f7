"""One activation layout for CNNs: channels last, converted only where the graph's ops need channels first.

1. Every float32 spatial op (Conv, ConvTranspose, pools, global pools, Resize on the spatial axes) becomes
   Transpose(to channels-last) -> dynshape::ChannelsLast(op) -> Transpose(back).
2. Transposes sink: an op that computes the same thing in either layout (elementwise ops, whose other operands
   are constants, one-element values or the same-permuted values; Concat, Split, Softmax and keepdims reductions,
   with their axes permuted) is moved above the Transpose that feeds it, the Transpose re-made below it.
3. Transposes that meet their inverse cancel. What remains converts at the edges: graph inputs and outputs, and
   ops that need the channels-first order (a Reshape to a sequence, a Flatten of a feature map).
4. A channel shuffle (ShuffleNet: Reshape (N, g, C/g, H, W) -> Transpose (0, 2, 1, 3, 4) -> Reshape (N, C, H, W)) of
   a channels-last value is done in channels last: the same permutation of the last axis, as a Transpose of its
   (N, H, W, g, C/g) view, so the feature map is not converted to channels first and back around it.

Exact: every rewrite computes the same values in another order (constants are transposed, never rounded).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from dynshape.ir import opdef
from dynshape.ir.graph import Node
from dynshape.ir.opdef import Layout, is_default_domain
from dynshape.ir.types import TensorType
from dynshape.ops.layout import DOMAIN, to_first, to_last
from dynshape.passes.values import is_float32, reduction_axes

# What each op does with a channels-last operand is its op table entry's `layout` (`ir.opdef.Layout`), set where
# the op is defined (dynshape.ops): SPATIAL ops are wrapped (step 1); ELEMENTWISE, AXIS and REDUCE ops are sunk
# through (step 2), only their first `permuted_inputs` inputs permuted (Clip's bounds and a reduction's axes are
# parameters); every other op keeps the ONNX order.
_SINKABLE = frozenset({Layout.ELEMENTWISE, Layout.AXIS, Layout.REDUCE})


def _layout(n: Node) -> Layout:
    op = opdef.of(n)
    return Layout.CHANNELS_FIRST if op is None else op.layout


@dataclasses.dataclass
class Rewrite:
    nodes: list[Node]
    types: dict  # name -> TensorType of every new value
    consts: dict  # name -> ndarray of every new constant (transposed operands)
    seq: int = 0
    opset: int = 13  # the graph's default-domain opset: Softmax's axis means something else below 13

    def fresh(self, base: str, taken: dict) -> str:
        while True:
            self.seq += 1
            name = f"{base}__cl{self.seq}"
            if name not in taken and name not in self.types:
                return name


def _perm(n: Node) -> list[int] | None:
    return list(n.attrs.get("perm", [])) if n.op_type == "Transpose" and is_default_domain(n) else None


def _permuted(t: TensorType, perm: list[int]) -> TensorType:
    return TensorType(t.dtype, tuple(t.shape[p] for p in perm))


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _wrappable(n: Node, types: dict) -> bool:
    if _layout(n) is not Layout.SPATIAL or len([o for o in n.outputs if o]) != 1:
        return False
    x = types.get(n.inputs[0])
    if not is_float32(x) or len(x.shape) < 3 or not is_float32(types.get(n.outputs[0])):
        return False
    if n.op_type in ("Resize", "Upsample"):  # only when N and C keep their size (scales 1 there)
        y = types[n.outputs[0]]
        return tuple(x.shape[:2]) == tuple(y.shape[:2])
    return True


def channels_last(nodes: list[Node], types: dict, consts: dict, keep: set[str], opset: int = 13) -> Rewrite:
    """The rewritten schedule, with the types and constants of the values it makes (see the module doc)."""
    rw = Rewrite([], {}, {}, opset=opset)
    all_types = dict(types)
    for n in nodes:
        if not _wrappable(n, all_types):
            rw.nodes.append(n)
            continue
        x, y = n.inputs[0], n.outputs[0]
        r = len(all_types[x].shape)
        xl, yl = rw.fresh(x, all_types), rw.fresh(y, all_types)
        for name, t in ((xl, _permuted(all_types[x], to_last(r))), (yl, _permuted(all_types[y], to_last(r)))):
            rw.types[name] = all_types[name] = t
        rw.nodes += [Node("Transpose", "", f"{n.name}__to_last", {"perm": to_last(r)}, [x], [xl]),
                     Node("ChannelsLast", DOMAIN, n.name, {"op": n.op_type, **n.attrs}, [xl, *n.inputs[1:]], [yl]),
                     Node("Transpose", "", f"{n.name}__to_first", {"perm": to_first(r)}, [yl], [y])]
    if len(rw.nodes) == len(nodes):
        return rw
    for _ in range(len(rw.nodes) * 4):  # a sweep moves Transposes down and cancels pairs; most graphs need two
        if not (_sweep(rw, all_types, consts, keep) or _shuffle_once(rw, all_types, consts, keep)):
            break
    return rw


def _producers(nodes: list[Node]) -> dict[str, Node]:
    return {o: n for n in nodes for o in n.outputs if o}


def _readers(nodes: list[Node]) -> dict[str, list[Node]]:
    out: dict[str, list[Node]] = {}
    for n in nodes:
        for x in n.inputs:
            if x:
                out.setdefault(x, []).append(n)
    return out


def _sweep(rw: Rewrite, types: dict, consts: dict, keep: set[str]) -> bool:
    """One pass in schedule order: a Transpose meeting its inverse cancels (its readers read the value before
    both), an op fed by a Transpose moves above it (rule 2), then Transposes nothing reads are dropped.

    One pass carries a Transpose down a whole chain of sinkable ops, since the Transpose re-made below each op
    is seen by the next one: linear in the graph's size, where a rewrite per round over the whole schedule was
    quadratic (DenseNet-121: 0.93 s of a 1.4 s warm build)."""
    later = {m.outputs[0]: m for m in rw.nodes if _perm(m) is not None}
    transposed = {(m.inputs[0], tuple(_perm(m))): m.outputs[0] for m in later.values()}
    rename: dict[str, str] = {}
    prod: dict[str, Node] = {}
    placed: set[int] = set()
    out: list[Node] = []
    changed = False

    def renamed(m: Node) -> Node:  # reading past the Transposes cancelled so far
        return dataclasses.replace(m, inputs=[rename.get(x, x) for x in m.inputs]) \
            if any(x in rename for x in m.inputs) else m

    def place(m: Node) -> None:
        m = renamed(m)
        out.append(m)
        prod.update((o, m) for o in m.outputs if o)

    for n in rw.nodes:
        if id(n) in placed:  # a Transpose placed early: an op moved above it reads its output
            continue
        n = renamed(n)
        p2 = _perm(n)
        first = prod.get(n.inputs[0]) if p2 is not None else None
        p1 = _perm(first) if first is not None else None
        if p1 is not None and len(p1) == len(p2) and all(p1[p2[i]] == i for i in range(len(p2))):
            if n.outputs[0] in keep:  # (a graph output keeps its name: the value before both, as a view of it)
                place(Node("Identity", "", n.name, {}, [first.inputs[0]], [n.outputs[0]]))
            else:
                rename[n.outputs[0]] = first.inputs[0]
            changed = True
            continue
        moved = _sunk(n, prod, transposed, types, consts, rw)
        if moved is None:
            place(n)
            continue
        new, perm, pre = moved
        for m in pre:  # views of small operands in the other layout (`_vector_view`)
            place(m)
        new = renamed(new)  # its operands may be the inputs of Transposes cancelled above
        for x in new.inputs:  # the other layout of an operand, computed by a Transpose later in the schedule
            early = later.get(x) if x not in prod else None
            if early is not None and id(early) not in placed:
                placed.add(id(early))
                place(early)
        if not perm:  # its result is already in the original layout
            place(new)
            changed = True
            continue
        low = [rw.fresh(o, types) if o else "" for o in n.outputs]
        for o, lo in zip(n.outputs, low):
            if o:
                rw.types[lo] = types[lo] = _permuted(types[o], _inverse(perm))
        place(dataclasses.replace(new, outputs=low))
        for j, (o, lo) in enumerate(zip(n.outputs, low)):
            if o:
                place(Node("Transpose", "", f"{n.name}__back{j}", {"perm": perm}, [lo], [o]))
                transposed[(lo, tuple(perm))] = o
        changed = True
    rw.nodes = out
    _prune(rw, keep)
    return changed


def _prune(rw: Rewrite, keep: set[str]) -> None:
    """Drop Transposes nothing reads (the ones cancelling and sinking left behind), in one backward pass: a
    reader comes after what it reads, so a chain of dead Transposes goes at once."""
    read: set[str] = set(keep)
    kept: list[Node] = []
    for n in reversed(rw.nodes):
        if _perm(n) is not None and n.outputs[0] not in read:
            continue
        kept.append(n)
        read.update(x for x in (*n.inputs, *n.free_names()) if x)
    rw.nodes = kept[::-1]


def _data_inputs(n: Node) -> Iterator[int]:
    op = opdef.of(n)
    k = None if op is None else op.permuted_inputs
    return iter(range(len(n.inputs) if k is None else k))


def _sunk(n: Node, prod: dict, transposed: dict, types: dict, consts: dict, rw: Rewrite):
    """(n on the un-permuted operands, the perm) when n can move above its Transposes (the constants it needs are
    added to `rw`). `transposed`: (value, perm) -> the Transpose output that already holds it in that order."""
    layout = _layout(n)
    if layout is Layout.ORDER_FREE:  # a function of the elements alone: read them where they lie, no Transpose
        x = n.inputs[0] if n.inputs else ""
        p = _perm(prod[x]) if x in prod else None
        return None if p is None else (dataclasses.replace(n, inputs=[prod[x].inputs[0], *n.inputs[1:]]), (), [])
    if layout not in _SINKABLE or not n.inputs or not all(o for o in n.outputs):
        return None
    pre: list[Node] = []
    perm = None
    for k in _data_inputs(n):
        x = n.inputs[k]
        p = _perm(prod[x]) if x in prod else None
        if p is not None and x not in consts:
            perm = p
            break
    if perm is None:
        return None
    r = len(perm)
    inv = _inverse(perm)
    flat = layout is Layout.REDUCE and not n.attrs.get("keepdims", 1)
    if flat and not _flat_reduce_keeps_order(n, perm, consts):
        return None
    if not flat and any(len(getattr(types.get(o), "shape", ())) != r for o in n.outputs):
        return None
    inputs = list(n.inputs)
    for k in _data_inputs(n):
        x = n.inputs[k]
        p = _perm(prod[x]) if x in prod else None
        if p == perm and x not in consts:
            inputs[k] = prod[x].inputs[0]
            continue
        if _scalar(types.get(x), r):  # one element: broadcasts alike in both layouts
            continue
        moved = transposed.get((x, tuple(inv)))
        if moved is not None:  # the other layout of this operand is computed already (it feeds a wrapped op)
            inputs[k] = moved
            continue
        c = consts.get(x)
        if c is None:
            view = _vector_view(x, types.get(x), inv, rw, types)
            if view is None:
                return None
            pre.append(view)
            inputs[k] = view.outputs[0]
            continue
        if c.ndim > r:
            return None
        name = rw.fresh(x, types)
        moved = np.ascontiguousarray(np.transpose(c.reshape((1,) * (r - c.ndim) + c.shape), inv))
        rw.consts[name] = moved
        rw.types[name] = types[name] = TensorType(c.dtype, moved.shape, moved)
        inputs[k] = name
    attrs = dict(n.attrs)
    if layout is Layout.AXIS:
        if n.op_type in ("Softmax", "LogSoftmax") and rw.opset < 13:
            # below opset 13 one softmax runs over the flattened axes from `axis` on (default 1): order-free, so
            # the op moves when those axes are a suffix of the operand's axes too (NCHW's C, H, W are NHWC's
            # H, W, C); else (H and W only) it stays where it is
            a = int(attrs.get("axis", 1)) % r
            block = sorted(perm[k] for k in range(a, r))
            if block != list(range(r - len(block), r)):
                return None
            attrs["axis"] = r - len(block)
        else:
            # each op's own default: -1 for (Log)Softmax from opset 13, 0 for Split (Concat requires one); a
            # LogSoftmax without the attribute was moved to axis perm[1] (the wrong axis)
            a = int(attrs.get("axis", 0 if n.op_type == "Split" else -1))
            attrs["axis"] = perm[a % r]
        if n.op_type == "Split" and len(inputs) > 1 and inputs[1] and inputs[1] not in consts:
            return None
    if layout is Layout.REDUCE:
        if "axes" in attrs:
            attrs["axes"] = [perm[a % r] for a in attrs["axes"]]
        elif len(n.inputs) > 1 and n.inputs[1] in consts:  # opset 18: the axes are an input
            axes = np.array([perm[int(a) % r] for a in consts[n.inputs[1]].reshape(-1)], np.int64)
            name = rw.fresh(n.inputs[1], types)
            rw.consts[name] = axes
            rw.types[name] = types[name] = TensorType(axes.dtype, axes.shape, axes)
            inputs[1] = name
        else:
            return None
    # a reduction dropping its axes whose kept axes come out in their original order: its result is the
    # original one, no Transpose back (perm ())
    return dataclasses.replace(n, inputs=inputs, attrs=attrs), (() if flat else perm), pre


def _vector_view(x: str, t: object, inv: list[int], rw: Rewrite, types: dict) -> Node | None:
    """A Reshape giving computed operand `x` the permuted layout when at most one of its axes is longer than 1 (a
    per-channel vector computed per call, such as a bias rounded under a per-call scale): its elements keep their
    order, so the Reshape is a view, not a copy. None for any other operand."""
    r = len(inv)
    if not isinstance(t, TensorType) or len(t.shape) > r or not all(isinstance(d, int) for d in t.shape) \
            or sum(d != 1 for d in t.shape) > 1:
        return None
    full = (1,) * (r - len(t.shape)) + tuple(t.shape)
    shape = np.array([full[i] for i in inv], np.int64)
    sname, name = rw.fresh(f"{x}_shape", types), rw.fresh(x, types)
    rw.consts[sname] = shape
    rw.types[sname] = types[sname] = TensorType(shape.dtype, shape.shape, shape)
    rw.types[name] = types[name] = TensorType(t.dtype, tuple(int(d) for d in shape))
    return Node("Reshape", "", f"{name}__view", {}, [x, sname], [name])


def _flat_reduce_keeps_order(n: Node, perm: list[int], consts: dict) -> bool:
    """A keepdims=0 reduction with explicit axes, read through Transpose(perm), whose kept axes keep their
    order in the un-permuted operand: a byte classifier's global max / mean over its length (N, C, L) -> (N, C)
    reads the channels-last (N, L, C) directly."""
    axes = reduction_axes(n, consts.get)
    if not axes:
        return False
    r = len(perm)
    gone = {a % r for a in axes}
    kept = [perm[a] for a in range(r) if a not in gone]
    return kept == sorted(kept)


def _scalar(t: object, rank: int) -> bool:
    return isinstance(t, TensorType) and len(t.shape) <= rank and all(isinstance(d, int) and d == 1
                                                                        for d in t.shape)


def _shuffle_once(rw: Rewrite, types: dict, consts: dict, keep: set[str]) -> bool:
    """One channel shuffle of a channels-last value rewritten in channels last (rule 4 of the module doc)."""
    prod, read = _producers(rw.nodes), _readers(rw.nodes)
    for r2 in rw.nodes:
        if r2.op_type != "Reshape" or not is_default_domain(r2):
            continue
        t = prod.get(r2.inputs[0])
        r1 = prod.get(t.inputs[0]) if t is not None and _perm(t) == [0, 2, 1, 3, 4] else None
        first = prod.get(r1.inputs[0]) if r1 is not None and r1.op_type == "Reshape" else None
        if first is None or _perm(first) != to_first(4) or any(
                v in keep or len(read.get(v, [])) != 1 for v in (t.outputs[0], r1.outputs[0])):
            continue
        a, y = types.get(first.outputs[0]), types.get(r2.outputs[0])
        mid = types.get(r1.outputs[0])
        if not all(map(is_float32, (a, y, mid))) or tuple(y.shape) != tuple(a.shape) or len(mid.shape) != 5:
            continue
        n, c, h, w = a.shape
        g, cg = mid.shape[1], mid.shape[2]
        if not (isinstance(c, int) and isinstance(g, int) and isinstance(cg, int) and g * cg == c) \
                or tuple(mid.shape[3:]) != (h, w) or mid.shape[0] != n:
            continue
        b = first.inputs[0]
        names = [rw.fresh(b, types) for _ in range(3)]
        shapes = [(n, h, w, g, cg), (n, h, w, cg, g), (n, h, w, c)]
        for name, shape in zip(names, shapes):
            rw.types[name] = types[name] = TensorType(a.dtype, shape)
        consts5, consts4 = rw.fresh(f"{r2.name}_shape5", types), rw.fresh(f"{r2.name}_shape4", types)
        for name, v in ((consts5, np.array([0, 0, 0, g, cg], np.int64)), (consts4, np.array([0, 0, 0, c], np.int64))):
            rw.consts[name] = v  # 0: the input's own dim (N, H, W stay symbolic)
            rw.types[name] = types[name] = TensorType(v.dtype, v.shape, v)
        new = [Node("Reshape", "", f"{r2.name}__cl_split", {}, [b, consts5], [names[0]]),
               Node("Transpose", "", f"{r2.name}__cl_shuffle", {"perm": [0, 1, 2, 4, 3]}, [names[0]], [names[1]]),
               Node("Reshape", "", f"{r2.name}__cl_join", {}, [names[1], consts4], [names[2]]),
               Node("Transpose", "", f"{r2.name}__to_first", {"perm": to_first(4)}, [names[2]], [r2.outputs[0]])]
        at = rw.nodes.index(r2)
        rw.nodes[at:at + 1] = new
        rw.nodes = [m for m in rw.nodes if m is not t and m is not r1]
        _prune(rw, keep)
        return True
    return False
