"""Elementwise fusion: chains of float32 elementwise ops become one loop nest (one pass over memory).

A group runs at the position of its first node, so a node may join a group only when every input it takes
from outside the group is already computed there. Values a group produces that anything outside it reads
(or that are graph outputs) are its outputs; the others never reach memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from dynshape.ir.graph import Graph, Node
from dynshape.ir.types import TensorType

# op -> number of float inputs it reads (Where reads a bool condition first)
ELEMENTWISE = {
    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Erf", "Tanh", "Sigmoid", "Relu",
    "Pow", "Where", "Identity", "IsNaN",
}


@dataclass
class SoftmaxGroup:
    """A last-axis Softmax with the elementwise group that feeds it and the one that consumes it, row by row."""

    node: Node
    pre: Group | None
    post: Group | None
    shape: tuple
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> list[Node]:
        return (self.pre.nodes if self.pre else []) + [self.node] + (self.post.nodes if self.post else [])


@dataclass
class AttentionGroup:
    """softmax(f(Q @ KT)) @ V with f/g the softmax's producer/consumer groups, a block of query rows at a time:
    the scores never reach memory (at batch 8 x 512 tokens they are 33 MB per layer)."""

    scores: Node  # MatMul(Q, KT)
    softmax: SoftmaxGroup
    values: Node  # MatMul(P, V)
    inputs: list[str] = field(default_factory=list)  # [Q, KT, V, *softmax operands other than the scores]
    outputs: list[str] = field(default_factory=list)
    folded: list[Node] = field(default_factory=list)  # a Transpose (0, 2, 1, 3) written directly (heads last)
    k_rows: list[Node] = field(default_factory=list)  # movement making KT from K: the kernel packs KT from K

    @property
    def nodes(self) -> list[Node]:
        return [*self.k_rows, self.scores, *self.softmax.nodes, self.values, *self.folded]


@dataclass
class GemmGroup:
    """A product with a constant 2-D right operand (MatMul, or Gemm without transA) and the elementwise group
    that alone consumes it (its epilogue: bias, activation, residual add), run block of rows by block."""

    node: Node
    weight: str  # the constant right operand
    trans_b: bool
    epilogue: Group | None
    shape: tuple  # of the product
    inputs: list[str] = field(default_factory=list)  # [A, *epilogue/bias inputs]
    outputs: list[str] = field(default_factory=list)
    folded: list[Node] = field(default_factory=list)  # Reshape to heads + Transpose (0, 2, 1, 3), written directly
    heads: int = 0  # with `folded`: (b, s, heads * d) is written as (b, heads, s, d)
    layernorm: Node | None = None  # a last-axis LayerNormalization of the result, applied per block of rows

    @property
    def nodes(self) -> list[Node]:
        return [self.node] + (self.epilogue.nodes if self.epilogue else []) + self.folded + \
            ([self.layernorm] if self.layernorm else [])


@dataclass
class Group:
    nodes: list[Node] = field(default_factory=list)
    shape: tuple = ()
    inputs: list[str] = field(default_factory=list)  # external values, in first-use order
    outputs: list[str] = field(default_factory=list)  # values read outside the group


def _float32(t) -> bool:
    return isinstance(t, TensorType) and np.dtype(t.dtype) == np.float32


def eligible(node: Node, graph: Graph) -> bool:
    """An elementwise node on float32 tensors whose output has the broadcast shape of its inputs."""
    if node.op_type not in ELEMENTWISE or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return False
    out = graph.types.get(node.outputs[0])
    if not (_float32(out) or (node.op_type == "IsNaN" and isinstance(out, TensorType)
                              and np.dtype(out.dtype) == np.bool_)):
        return False
    ins = [graph.types.get(x) for x in node.inputs]
    if any(t is None or not isinstance(t, TensorType) for t in ins) or not node.inputs or "" in node.inputs:
        return False
    data = ins[1:] if node.op_type == "Where" else ins
    if node.op_type == "Where" and np.dtype(ins[0].dtype) != np.bool_:
        return False
    if node.op_type == "Pow" and not (len(ins) == 2 and _scalar_const(node.inputs[1], graph) is not None):
        return False
    return all(_float32(t) for t in (data if node.op_type != "Pow" else data[:1])) and all(
        broadcast_pattern(tuple(t.shape), tuple(out.shape)) is not None for t in ins)


def broadcast_pattern(shape: tuple, out: tuple) -> tuple | None:
    """Per output axis: True where `shape` (right-aligned) spans it, False where it broadcasts; None if neither."""
    if len(shape) > len(out):
        return None
    pad = len(out) - len(shape)
    pattern = []
    for k, d in enumerate(out):
        if k < pad:
            pattern.append(False)
            continue
        e = shape[k - pad]
        if isinstance(e, int) and e == 1 and not (isinstance(d, int) and d == 1):
            pattern.append(False)
        elif e == d:
            pattern.append(True)
        else:
            return None
    return tuple(pattern)


def _scalar_const(name: str, graph: Graph):
    t = graph.types.get(name)
    if isinstance(t, TensorType) and t.value is not None and t.value.dtype != object and t.value.size == 1:
        return float(np.asarray(t.value).reshape(-1)[0])
    c = graph.initializers.get(name)
    if c is not None and c.size == 1:
        return float(c.reshape(-1)[0])
    return None


def fuse(nodes: list[Node], graph: Graph, known: set) -> list:
    """Partition live nodes into single nodes and Groups (in execution order)."""
    pos = {id(n): i for i, n in enumerate(nodes)}
    producer = {o: n for n in nodes for o in n.outputs if o}
    consumers: dict[str, list] = {}
    for n in nodes:
        for x in n.inputs:
            if x:
                consumers.setdefault(x, []).append(n)
    graph_outputs = {v.name for v in graph.outputs}
    group_of: dict[int, Group] = {}
    first: dict[int, int] = {}
    order: list = []
    for n in nodes:
        if not eligible(n, graph):
            order.append(n)
            continue
        out_shape = tuple(graph.types[n.outputs[0]].shape)
        target = None
        for x in n.inputs:
            p = producer.get(x)
            g = group_of.get(id(p)) if p is not None else None
            if g is None or g.shape != out_shape:
                continue
            ok = True
            for y in n.inputs:  # every outside input must exist before the group's first node
                q = producer.get(y)
                if q is None or y in known or group_of.get(id(q)) is g:
                    continue
                if pos[id(q)] >= first[id(g)]:
                    ok = False
                    break
            if ok:
                target = g
                break
        if target is None:
            target = Group(shape=out_shape)
            first[id(target)] = pos[id(n)]
            order.append(target)
        target.nodes.append(n)
        group_of[id(n)] = target
    out: list = []
    for item in order:
        if isinstance(item, Group):
            if len(item.nodes) == 1 and item.nodes[0].op_type == "Identity":
                out.append(item.nodes[0])
                continue
            _finish(item, consumers, graph_outputs, group_of)
        out.append(item)
    items = _fuse_softmax(out, graph, consumers, graph_outputs)
    items = _fuse_attention(items, graph, consumers, graph_outputs)
    items = _fuse_gemm(items, graph, consumers, graph_outputs)
    items = _fuse_layernorm(items, graph, consumers, graph_outputs)
    return _fold_head_transposes(items, graph, consumers, graph_outputs)


def _softmax_ok(n: Node, graph: Graph) -> bool:
    t = graph.types.get(n.outputs[0]) if n.outputs else None
    if n.op_type != "Softmax" or not _float32(t) or not t.shape or graph.opset < 13:
        return False
    return n.attrs.get("axis", -1) in (-1, len(t.shape) - 1)


def _fuse_softmax(items: list, graph: Graph, consumers: dict, graph_outputs: set) -> list:
    """Absorb a last-axis Softmax's producer group and consumer group into one row-wise kernel."""
    made: dict[int, SoftmaxGroup] = {}
    drop: set[int] = set()
    slot_of = _slots(items)
    for i, item in enumerate(items):
        if isinstance(item, Group) or not _softmax_ok(item, graph):
            continue
        x, y = item.inputs[0], item.outputs[0]
        shape = tuple(graph.types[y].shape)
        pre_i = slot_of.get(x)
        pre = items[pre_i] if pre_i is not None else None
        if not (isinstance(pre, Group) and pre.outputs == [x] and pre.shape == shape and pre_i not in drop
                and all(c is item for c in consumers.get(x, []))):
            pre, pre_i = None, None
        users = consumers.get(y, [])
        post_i = slot_of.get(users[0].outputs[0]) if users else None
        post = items[post_i] if post_i is not None else None
        at = pre_i if pre_i is not None else i
        if not (isinstance(post, Group) and post.shape == shape and y not in graph_outputs
                and all(slot_of.get(u.outputs[0]) == post_i for u in users)
                and all(slot_of.get(z, -1) < at for z in post.inputs if z != y)):
            post, post_i = None, None
        sg = SoftmaxGroup(item, pre, post, shape)
        sg.inputs = list(pre.inputs if pre else [x])
        for z in (post.inputs if post else []):
            if z != y and z not in sg.inputs:
                sg.inputs.append(z)
        sg.outputs = list(post.outputs) if post else [y]
        made[at] = sg
        drop.update(j for j in (i, pre_i, post_i) if j is not None and j != at)
    return [made.get(i, item) for i, item in enumerate(items) if i not in drop or i in made]


def _finish(g: Group, consumers: dict, graph_outputs: set, group_of: dict) -> None:
    produced = {o for n in g.nodes for o in n.outputs}
    for n in g.nodes:
        for x in n.inputs:
            if x not in produced and x not in g.inputs:
                g.inputs.append(x)
    for n in g.nodes:
        o = n.outputs[0]
        outside = any(group_of.get(id(c)) is not g for c in consumers.get(o, []))
        if outside or o in graph_outputs:
            g.outputs.append(o)


def _slots(items: list) -> dict[str, int]:
    """Value name -> index of the item (node or group) that produces it."""
    return {o: i for i, item in enumerate(items) for n in (item.nodes if not isinstance(item, Node) else [item])
            for o in n.outputs}


def _const(name: str, graph: Graph) -> np.ndarray | None:
    c = graph.initializers.get(name)
    if c is None:
        t = graph.types.get(name)
        c = t.value if isinstance(t, TensorType) and t.value is not None and t.value.dtype != object else None
    return c


def _gemm_ok(n: Node, graph: Graph) -> tuple[str, bool] | None:
    """(weight, transB) when n is a float32 product by a constant matrix that GemmGroup can run."""
    if n.domain not in ("", "ai.onnx") or len(n.outputs) != 1 or len(n.inputs) < 2 or "" in n.inputs[:2]:
        return None
    a, b, y = (graph.types.get(x) for x in (n.inputs[0], n.inputs[1], n.outputs[0]))
    if not (_float32(a) and _float32(y) and _float32(b) and a.shape and len(b.shape) == 2):
        return None
    w = _const(n.inputs[1], graph)
    if w is None or w.dtype != np.float32 or not all(isinstance(d, int) and d > 0 for d in b.shape):
        return None
    if n.op_type == "MatMul":
        return n.inputs[1], False
    if n.op_type == "Gemm" and not n.attrs.get("transA", 0) and len(a.shape) == 2:
        if len(n.inputs) > 2 and n.inputs[2] and not _float32(graph.types.get(n.inputs[2])):
            return None
        return n.inputs[1], bool(n.attrs.get("transB", 0))
    return None


def _row_pattern(pat: tuple) -> bool:
    """Operands an epilogue can index as [row * n + j] (full), [j] (a row vector) or [0] (one value)."""
    return all(pat) or not any(pat[:-1])


def _fuse_gemm(items: list, graph: Graph, consumers: dict, graph_outputs: set) -> list:
    """Products by constant matrices become GemmGroups, taking the group that alone consumes them
    (DYNSHAPE_PACKED_GEMM=0 turns this off: products then go to the BLAS, epilogues run as separate groups)."""
    if os.environ.get("DYNSHAPE_PACKED_GEMM", "1") == "0":
        return items
    slot_of = _slots(items)
    made: dict[int, GemmGroup] = {}
    drop: set[int] = set()
    for i, item in enumerate(items):
        if not isinstance(item, Node) or (ok := _gemm_ok(item, graph)) is None:
            continue
        y = item.outputs[0]
        shape = tuple(graph.types[y].shape)
        users = consumers.get(y, [])
        j = slot_of.get(users[0].outputs[0]) if users else None
        epi = items[j] if j is not None else None
        if not (isinstance(epi, Group) and j not in made and j not in drop and epi.shape == shape
                and y not in graph_outputs and len(epi.outputs) == 1 and y not in epi.outputs
                and all(slot_of.get(u.outputs[0]) == j for u in users)
                and all(_row_pattern(broadcast_pattern(tuple(graph.types[z].shape), shape) or (False,))
                        or _scalar_const(z, graph) is not None for z in epi.inputs if z != y)):
            epi, j = None, None
        gg = GemmGroup(item, ok[0], ok[1], epi, shape)
        gg.inputs = [item.inputs[0]] + [z for z in item.inputs[2:3] if z]
        for z in (epi.inputs if epi else []):
            if z != y and z not in gg.inputs:
                gg.inputs.append(z)
        gg.outputs = list(epi.outputs) if epi else [y]
        at = j if j is not None else i
        made[at] = gg
        drop.update(k for k in (i, j) if k is not None and k != at)
    return [made.get(i, item) for i, item in enumerate(items) if i not in drop or i in made]


def _batched_matmul(n, graph: Graph) -> tuple | None:
    """(a, b, y) types of a float32 MatMul of two matrices stacks with the same batch dims, else None."""
    if not isinstance(n, Node) or n.op_type != "MatMul" or n.domain not in ("", "ai.onnx") or len(n.outputs) != 1:
        return None
    a, b, y = (graph.types.get(x) for x in (*n.inputs[:2], n.outputs[0]))
    if not (_float32(a) and _float32(b) and _float32(y)) or len(a.shape) < 2 or len(a.shape) != len(b.shape):
        return None
    if tuple(a.shape[:-2]) != tuple(b.shape[:-2]) or _const(n.inputs[1], graph) is not None:
        return None
    return a, b, y


def _fuse_attention(items: list, graph: Graph, consumers: dict, graph_outputs: set) -> list:
    """MatMul -> SoftmaxGroup -> MatMul chains where each result has one reader become AttentionGroups."""
    if os.environ.get("DYNSHAPE_FUSED_ATTENTION", "1") == "0":
        return items
    slot_of = _slots(items)
    producer = {o: n for users in consumers.values() for n in users for o in n.outputs if o}
    made: dict[int, AttentionGroup] = {}
    drop: set[int] = set()
    for i, item in enumerate(items):
        if (t1 := _batched_matmul(item, graph)) is None:
            continue
        s = item.outputs[0]
        j = slot_of.get(consumers[s][0].outputs[0]) if consumers.get(s) else None
        sg = items[j] if j is not None else None
        if not isinstance(sg, SoftmaxGroup) or s in graph_outputs or len(sg.outputs) != 1 or j in drop \
                or tuple(sg.shape) != tuple(t1[2].shape) or not all(slot_of.get(c.outputs[0]) == j
                                                                     for c in consumers[s]):
            continue
        if sg.post is not None and s in sg.post.inputs:
            continue
        p = sg.outputs[0]
        users = consumers.get(p, [])
        if len(users) != 1 or p in graph_outputs or users[0].inputs[0] != p or p in users[0].inputs[1:]:
            continue
        k = slot_of.get(users[0].outputs[0])
        t2 = _batched_matmul(items[k], graph) if k is not None else None
        if t2 is None or tuple(t2[1].shape[:-2]) != tuple(t1[2].shape[:-2]) or k in made:
            continue
        q, kt = item.inputs[:2]
        ag = AttentionGroup(item, sg, items[k])
        rows = _transposed_rows(kt, graph, producer, consumers, graph_outputs)
        if rows is not None and all(m.outputs[0] in slot_of and isinstance(items[slot_of[m.outputs[0]]], Node)
                                    for m in rows[1]):
            kt, ag.k_rows = rows
        ag.inputs = [q, kt, items[k].inputs[1]] + [z for z in sg.inputs if z != s]
        if len(set(ag.inputs)) != len(ag.inputs):
            continue
        ag.outputs = [items[k].outputs[0]]
        made[k] = ag
        drop.update((i, j, *(slot_of[m.outputs[0]] for m in ag.k_rows)))
    return [made.get(i, item) for i, item in enumerate(items) if i not in drop]


def _transposed_rows(kt: str, graph: Graph, producer: dict, consumers: dict,
                     graph_outputs: set) -> tuple[str, list] | None:
    """(K, movement nodes) when the only use of the chain is to make `kt` = K with its last two axes swapped,
    K a stack of row-major matrices: a Transpose (..., 2, 1), or torch's Reshape (b*h, s, d) -> Transpose
    (0, 2, 1) -> Reshape (b, h, d, s). Each value on the way has one reader."""
    chain: list[Node] = []
    x = kt
    for _ in range(3):
        m = producer.get(x)
        if m is None or m.op_type not in ("Reshape", "Transpose") or len(consumers.get(x, [])) != 1 \
                or x in graph_outputs or not _float32(graph.types.get(m.inputs[0])):
            break
        chain.insert(0, m)
        x = m.inputs[0]
        shapes = [tuple(graph.types[v].shape) for v in (x, *(c.outputs[0] for c in chain))]
        perms = [list(c.attrs.get("perm", [])) if c.op_type == "Transpose" else None for c in chain]
        r = len(shapes[0])
        if len(chain) == 1 and perms[0] == [*range(r - 2), r - 1, r - 2] and r >= 3:
            return x, chain
        if len(chain) == 3 and [c.op_type for c in chain] == ["Reshape", "Transpose", "Reshape"] \
                and perms[1] == [0, 2, 1] and r == 4:
            (b, h, s, d), merged, swapped, out = shapes
            if merged == (h * b, s, d) and swapped == (h * b, d, s) and out == (b, h, d, s):
                return x, chain
    return None


_HEADS_PERM = [0, 2, 1, 3]


def _sole_reader(name: str, consumers: dict, graph_outputs: set) -> Node | None:
    users = consumers.get(name, [])
    return users[0] if len(users) == 1 and name not in graph_outputs else None


def _fold_head_transposes(items: list, graph: Graph, consumers: dict, graph_outputs: set) -> list:
    """The copies attention layers make between (batch, seq, heads, d) and (batch, heads, seq, d) disappear:
    a product whose result is only reshaped to heads and transposed writes the transposed layout itself, and
    attention whose result is only transposed back writes (batch, seq, heads, d)."""
    if os.environ.get("DYNSHAPE_FOLD_TRANSPOSES", "1") == "0":
        return items
    slot_of = _slots(items)
    drop: set[int] = set()
    for item in items:
        if isinstance(item, GemmGroup) and len(item.outputs) == 1 and len(item.shape) == 3 and not item.layernorm:
            y = item.outputs[0]
            rs = _sole_reader(y, consumers, graph_outputs)
            if rs is None or rs.op_type != "Reshape" or rs.inputs[0] != y:
                continue
            t4 = graph.types.get(rs.outputs[0])
            tr = _sole_reader(rs.outputs[0], consumers, graph_outputs)
            if tr is None or tr.op_type != "Transpose" or list(tr.attrs.get("perm", [])) != _HEADS_PERM \
                    or not isinstance(t4, TensorType) or len(t4.shape) != 4:
                continue
            b, s, h, d = t4.shape
            n = item.shape[-1]
            if (b, s) != tuple(item.shape[:2]) or not (isinstance(h, int) and isinstance(d, int) and h * d == n
                                                        and d % 32 == 0):
                continue
            item.folded, item.heads, item.outputs = [rs, tr], h, [tr.outputs[0]]
            drop.update(slot_of[o] for o in (rs.outputs[0], tr.outputs[0]))
        elif isinstance(item, AttentionGroup) and len(item.outputs) == 1:
            o = item.outputs[0]
            tr = _sole_reader(o, consumers, graph_outputs)
            to = graph.types.get(o)
            if tr is None or tr.op_type != "Transpose" or list(tr.attrs.get("perm", [])) != _HEADS_PERM \
                    or not isinstance(to, TensorType) or len(to.shape) != 4:
                continue
            item.folded, item.outputs = [tr], [tr.outputs[0]]
            drop.add(slot_of[tr.outputs[0]])
    return [item for i, item in enumerate(items) if i not in drop]


def _fuse_layernorm(items: list, graph: Graph, consumers: dict, graph_outputs: set) -> list:
    """A product (with its epilogue) whose result only a last-axis LayerNormalization reads, with constant
    scale and bias over the whole last axis: the normalisation runs on each block of rows while it is in cache
    (the residual add + LayerNorm that closes every transformer sub-layer)."""
    if os.environ.get("DYNSHAPE_FUSED_LAYERNORM", "1") == "0":
        return items
    slot_of = _slots(items)
    drop: set[int] = set()
    for item in items:
        if not isinstance(item, GemmGroup) or len(item.outputs) != 1 or not item.shape:
            continue
        y = item.outputs[0]
        ln = _sole_reader(y, consumers, graph_outputs)
        if ln is None or ln.op_type != "LayerNormalization" or ln.inputs[0] != y or len(ln.inputs) < 2 \
                or any(o for o in ln.outputs[1:]) or ln.attrs.get("axis", -1) not in (-1, len(item.shape) - 1):
            continue
        n = item.shape[-1]
        params = [_const(x, graph) for x in ln.inputs[1:3] if x]
        if not all(c is not None and c.dtype == np.float32 and c.shape in ((n,), (1, n)) for c in params):
            continue
        if not _float32(graph.types.get(ln.outputs[0])):
            continue
        item.layernorm, item.outputs = ln, [ln.outputs[0]]
        item.inputs += [x for x in ln.inputs[1:3] if x]
        drop.add(slot_of[ln.outputs[0]])
    return [item for i, item in enumerate(items) if i not in drop]
