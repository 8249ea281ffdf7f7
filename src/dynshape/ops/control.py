"""Control flow (If, Loop, Scan) and the sequence/optional ops their bodies use.

Shape rules infer the bodies with the enclosing values in scope (`ctx.infer_subgraph`). Where a size can
differ between branches or iterations it becomes a fresh symbol; what is provably the same stays exact:
- If: a dim equal in both branches stays, otherwise fresh; a constant condition picks its branch.
- Loop/Scan: a carried dim that changes per iteration becomes fresh; scan outputs get the trip count as
  leading dim when it is known (constant or symbolic) and the loop cannot stop early, else a fresh one.
References run the bodies with the reference executor, which passes `_scope` (visible values) and `_env`
(bound symbols) in `attrs` for ops that have subgraphs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import OptionalType, SequenceType, TensorType

I64 = np.dtype(np.int64)
BOOL = np.dtype(bool)


def _run(graph: Any, inputs: list, attrs: dict) -> list:
    from dynshape.ir.execute import run_subgraph

    return run_subgraph(graph, inputs, attrs.get("_scope", {}), attrs.get("_env", {}))


def _same(a: Any, b: Any) -> bool:
    if a is b or (isinstance(a, int) and isinstance(b, int)):
        return a == b
    from dynshape.sym import eq, prove

    return a == b or prove(eq(a, b)) is True


def _const(t: Any) -> np.ndarray | None:
    if isinstance(t, TensorType) and t.value is not None and t.value.dtype != object:
        return t.value
    return None


def _one_element(ctx: InferCtx, t: Any, what: str) -> None:
    """A trip count or condition is a scalar (onnxruntime also takes a one-element tensor): a longer one would
    silently be read as its first element, so its element count must be 1 (checked per call when symbolic)."""
    if not isinstance(t, TensorType) or t.shape is None:
        return
    from dynshape.sym import eq

    n: Any = 1
    for d in t.shape:
        n = n * d
    msg = f"the {what} must be a scalar (one element); it has shape {list(t.shape)}"
    if isinstance(n, int):
        if n != 1:
            ctx.error(msg, "feed a scalar (shape []) or a one-element tensor")
        return
    ctx.require(eq(n, 1), msg)


def _scalar_value(x: Any, what: str) -> Any:
    a = np.asarray(x)
    if a.size != 1:
        raise ValueError(f"the {what} must be a scalar (one element), got shape {a.shape}")
    return a.reshape(-1)[0]


# ---- If ------------------------------------------------------------------------------------------------
def _if_ref(inputs: list, attrs: dict) -> list:
    cond = bool(_scalar_value(inputs[0], "condition"))
    return _run(attrs["then_branch"] if cond else attrs["else_branch"], [], attrs)


def _merge(ctx: InferCtx, a: Any, b: Any, i: int) -> Any:
    """The type covering both branches: equal dims stay, others become fresh."""
    if isinstance(a, OptionalType) or isinstance(b, OptionalType):
        ea = a.elem if isinstance(a, OptionalType) else a
        eb = b.elem if isinstance(b, OptionalType) else b
        return OptionalType(_merge(ctx, ea, eb, i))
    if type(a) is not type(b) or a.dtype != b.dtype:
        ctx.error(f"branches disagree on output {i}: then gives {a}, else gives {b}",
                  "make both branches produce the same type")
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        if isinstance(a, SequenceType):
            return SequenceType(a.dtype, None, a.rank if a.rank == b.rank else None)
        ctx.rank_depends_on([], f"the branches give output {i} different ranks ({a.shape} vs {b.shape}) and "
                                "the condition is only known at run time")
    shape = tuple(x if _same(x, y) else ctx.fresh("if") for x, y in zip(a.shape, b.shape))
    return type(a)(a.dtype, shape)


def _if_infer(ctx: InferCtx) -> list:
    then_g, else_g = ctx.attr("then_branch"), ctx.attr("else_branch")
    _one_element(ctx, ctx.inputs[0], "condition")
    c = _const(ctx.inputs[0])
    if c is not None:
        return ctx.infer_subgraph(then_g if bool(c.reshape(-1)[0]) else else_g, [])
    before = ctx.snapshot()
    a = ctx.infer_subgraph(then_g, [])
    b = ctx.infer_subgraph(else_g, [])
    if len(a) != len(b):
        ctx.error(f"then branch has {len(a)} outputs, else branch {len(b)}")
    if ctx.outer_facts_changed(before):
        # a branch required something of the outer shapes (a Squeeze of a dim that must then be 1): that holds
        # only when the branch runs, so it is not a fact of the graph (kept, it refused valid inputs of the other
        # branch). The outputs get fresh dims; a build per truth value re-infers the branch it inlines.
        ctx.restore(before)
        return [_merge(ctx, _unknown(ctx, x), _unknown(ctx, y), i) for i, (x, y) in enumerate(zip(a, b))]
    return [_merge(ctx, x, y, i) for i, (x, y) in enumerate(zip(a, b))]


def _unknown(ctx: InferCtx, t: Any) -> Any:
    """The type with every dim fresh (its rank and dtype kept)."""
    if isinstance(t, TensorType) and t.shape is not None:
        return TensorType(t.dtype, tuple(ctx.fresh("if") for _ in t.shape))
    return t


# ---- Loop ----------------------------------------------------------------------------------------------
def _loop_ref(inputs: list, attrs: dict) -> list:
    body = attrs["body"]
    m, cond, carried = inputs[0], inputs[1], list(inputs[2:])
    n = len(carried)
    trips = None if m is None else int(_scalar_value(m, "trip count M"))
    go = True if cond is None else bool(_scalar_value(cond, "condition"))
    scans: list[list] = [[] for _ in range(len(body.outputs) - 1 - n)]
    i = 0
    while go and (trips is None or i < trips):
        outs = _run(body, [np.array(i, I64), np.array(go), *carried], attrs)
        go = bool(np.asarray(outs[0]).reshape(-1)[0])
        carried = list(outs[1:1 + n])
        for k, s in enumerate(outs[1 + n:]):
            scans[k].append(s)
        i += 1
    return carried + [_stack(s, body, 1 + n + k, attrs.get("_env", {})) for k, s in enumerate(scans)]


def _stack(items: list, body: Any, out_index: int, env: dict) -> np.ndarray:
    if items:
        return np.stack(items)
    t = body.types.get(body.outputs[out_index].name)  # zero iterations: an empty tensor of the right type
    if isinstance(t, TensorType):
        shape = [d if isinstance(d, int) else d.evaluate(env) if d.free_symbols <= env.keys() else 0
                 for d in t.shape]
        shape.insert(0, 0)
        return np.zeros(shape, t.dtype)
    return np.zeros((0,), np.float32)


def _generalize(ctx: InferCtx, t_in: Any, t_out: Any, mine: set) -> Any:
    """The type of a carried value across iterations: dims that change become fresh (once)."""
    if type(t_in) is not type(t_out):  # optional(T) on one side, T on the other: optional(T) covers both
        a = t_in.elem if isinstance(t_in, OptionalType) else t_in
        b = t_out.elem if isinstance(t_out, OptionalType) else t_out
        if type(a) is not type(b):
            ctx.error(f"a loop-carried value changes type from {t_in} to {t_out}")
        return OptionalType(_generalize(ctx, a, b, mine))
    if isinstance(t_in, OptionalType):
        return OptionalType(_generalize(ctx, t_in.elem, t_out.elem, mine))
    if t_in.dtype != t_out.dtype:
        ctx.error(f"a loop-carried value changes dtype from {t_in.dtype} to {t_out.dtype}")
    if t_in.shape is None or t_out.shape is None or len(t_in.shape) != len(t_out.shape):
        if isinstance(t_in, SequenceType):
            return SequenceType(t_in.dtype, None, t_in.rank if t_in.rank == t_out.rank else None)
        ctx.error(f"a loop-carried value changes rank ({t_in.shape} -> {t_out.shape})",
                  "keep loop-carried tensors at a fixed rank")
    shape = []
    for a, b in zip(t_in.shape, t_out.shape):
        if _same(a, b) or str(a) in mine:
            shape.append(a)
        else:
            f = ctx.fresh("loop")
            mine.add(str(f))
            shape.append(f)
    return type(t_in)(t_in.dtype, tuple(shape))


def _carry(ctx: InferCtx, body: Any, head: list, carried: list, tail: list, offset: int) -> tuple[list, list]:
    """Infer `body` until the carried types are stable; returns (carried types, body output types).

    `head`/`tail` are the body inputs around the carried ones; carried outputs start at `offset`.
    """
    mine: set = set()
    types = list(carried)
    for _ in range(4):
        outs = ctx.infer_subgraph(body, [*head, *types, *tail])
        types = [ctx.resolve(t) for t in types]  # the body may have refined their symbols
        new = [_generalize(ctx, a, b, mine) for a, b in zip(types, outs[offset:offset + len(types)])]
        if all(_same_type(a, b) for a, b in zip(new, types)):
            return types, outs
        types = new
    ctx.error("the loop-carried types do not settle across iterations (dynshape bug)")


def _same_type(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, OptionalType):
        return _same_type(a.elem, b.elem)
    if a.shape is None or b.shape is None:
        return a.shape is b.shape
    return len(a.shape) == len(b.shape) and all(x is y or x == y for x, y in zip(a.shape, b.shape))


def _localize(ctx: InferCtx, t: Any, mark: int, lead: Any = None, axis: int = 0) -> Any:
    """A body output seen from outside: body-local sizes become fresh; `lead` inserted at `axis`."""
    if not isinstance(t, TensorType):
        return t
    shape = [ctx.fresh("scan") if ctx.is_local(d, mark) else d for d in t.shape]
    if lead is not None:
        shape.insert(axis, lead)
    return TensorType(t.dtype, tuple(shape))


def _loop_infer(ctx: InferCtx) -> list:
    body = ctx.attr("body")
    m, cond = ctx.inputs[0], ctx.inputs[1]
    _one_element(ctx, m, "trip count M")
    _one_element(ctx, cond, "condition")
    carried = list(ctx.inputs[2:])
    mark = ctx.mark()
    head = [TensorType(I64, ()), TensorType(BOOL, ())]
    state, outs = _carry(ctx, body, head, carried, [], 1)
    if len(outs) < 1 + len(carried):
        ctx.error(f"the body returns {len(outs)} values, but a Loop with {len(carried)} loop-carried values needs "
                  f"the condition and those {len(carried)} first")
    state = [_localize(ctx, t, mark) for t in state]
    trips = _trip_count(ctx, body, m, cond, outs[0])
    scans = [_localize(ctx, t, mark, trips if trips is not None else ctx.fresh("loop_trips"))
             for t in outs[1 + len(carried):]]
    return state + scans


def _trip_count(ctx: InferCtx, body: Any, m: Any, cond: Any, cond_out: Any) -> Any:
    """M when the loop provably runs exactly M times (no early exit), else None."""
    if m is None or m.value is None:
        return None
    c = _const(cond)
    if cond is not None and (c is None or not bool(c.reshape(-1)[0])):
        return None
    out_name, in_name = body.outputs[0].name, body.inputs[1].name if len(body.inputs) > 1 else None
    passthrough = out_name == in_name or any(
        n.op_type == "Identity" and n.outputs[0] == out_name and n.inputs[0] == in_name for n in body.nodes)
    co = _const(cond_out)
    if not passthrough and not (co is not None and bool(co.reshape(-1)[0])):
        return None
    v = m.value.reshape(-1)[0]
    return int(v) if isinstance(v, (int, np.integer)) else v


# ---- Scan (opset 9+) -----------------------------------------------------------------------------------
def _scan8_ref(inputs: list, attrs: dict) -> list:
    """Scan before opset 9: axis 0 is a batch scanned independently (axis 1 is time), `sequence_lens` says
    how many steps each batch element takes; scan outputs are zero past that length."""
    body = attrs["body"]
    k = attrs["num_scan_inputs"]
    lens, rest = inputs[0], list(inputs[1:])
    states, xs = rest[: len(rest) - k], rest[len(rest) - k:]
    dirs = attrs.get("directions", [0] * k)
    batch, steps = xs[0].shape[0], xs[0].shape[1]
    n_out = len(body.outputs) - len(states)
    final: list[list] = [[] for _ in states]
    ys: list[list] = [[] for _ in range(n_out)]
    for b in range(batch):
        st = [np.asarray(x[b]) for x in states]
        n = steps if lens is None else int(np.asarray(lens).reshape(-1)[b])
        per: list[list] = [[] for _ in range(n_out)]
        for t in range(n):
            args = [np.asarray(x[b, n - 1 - t] if d else x[b, t]) for x, d in zip(xs, dirs)]
            outs = _run(body, [*st, *args], attrs)
            st = [np.asarray(o) for o in outs[: len(st)]]
            for j, y in enumerate(outs[len(st):]):
                per[j].append(np.asarray(y))
        for j, v in enumerate(st):
            final[j].append(v)
        for j, items in enumerate(per):
            y = _stack(items, body, len(states) + j, attrs.get("_env", {}))
            pad = [(0, steps - y.shape[0])] + [(0, 0)] * (y.ndim - 1)
            ys[j].append(np.pad(y, pad))
    return [np.stack(f) for f in final] + [np.stack(y) for y in ys]


def _scan8_infer(ctx: InferCtx) -> list:
    body = ctx.attr("body")
    k = ctx.attr("num_scan_inputs")
    rest = ctx.inputs[1:]
    state, xs = list(rest[: len(rest) - k]), rest[len(rest) - k:]
    batch = steps = None
    sliced = []
    for x in xs:
        if x.rank < 2:
            ctx.error(f"scan inputs must be (batch, sequence, ...) before opset 9, got {x.shape}")
        batch = x.shape[0] if batch is None else ctx.unify(batch, x.shape[0])
        steps = x.shape[1] if steps is None else ctx.unify(steps, x.shape[1])
        sliced.append(TensorType(x.dtype, x.shape[2:]))
    for t in state:
        batch = t.shape[0] if batch is None else ctx.unify(batch, t.shape[0])
    mark = ctx.mark()
    types, outs = _carry(ctx, body, [], [TensorType(t.dtype, t.shape[1:]) for t in state], sliced, 0)
    lead = batch if batch is not None else ctx.fresh("scan_batch")
    finals = [_localize(ctx, t, mark, lead) for t in types]
    ys = [_localize(ctx, y, mark, steps if steps is not None else ctx.fresh("scan")) for y in outs[len(state):]]
    return finals + [TensorType(y.dtype, (lead, *y.shape)) for y in ys]


def _scan_ref(inputs: list, attrs: dict) -> list:
    if attrs.get("_opset", 9) < 9:
        return _scan8_ref(inputs, attrs)
    body = attrs["body"]
    k = attrs["num_scan_inputs"]
    state, xs = list(inputs[: len(inputs) - k]), inputs[len(inputs) - k:]
    in_axes = attrs.get("scan_input_axes", [0] * k)
    in_dirs = attrs.get("scan_input_directions", [0] * k)
    xs = [np.moveaxis(x, a % x.ndim, 0)[::-1] if d else np.moveaxis(x, a % x.ndim, 0)
          for x, a, d in zip(xs, in_axes, in_dirs)]
    n_out = len(body.outputs) - len(state)
    steps = xs[0].shape[0] if xs else 0
    ys: list[list] = [[] for _ in range(n_out)]
    for i in range(steps):
        outs = _run(body, [*state, *(np.asarray(x[i]) for x in xs)], attrs)  # a 1-D input gives 0-d slices
        state = list(outs[: len(state)])
        for j, y in enumerate(outs[len(state):]):
            ys[j].append(y)
    out_axes = attrs.get("scan_output_axes", [0] * n_out)
    out_dirs = attrs.get("scan_output_directions", [0] * n_out)
    res = []
    for j, items in enumerate(ys):
        items = items[::-1] if out_dirs[j] else items
        y = _stack(items, body, len(state) + j, attrs.get("_env", {}))
        res.append(np.moveaxis(y, 0, out_axes[j] % y.ndim))
    return state + res


def _scan_infer(ctx: InferCtx) -> list:
    if ctx.opset < 9:
        return _scan8_infer(ctx)
    body = ctx.attr("body")
    k = ctx.attr("num_scan_inputs")
    ins = ctx.inputs
    state, xs = list(ins[: len(ins) - k]), ins[len(ins) - k:]
    in_axes = ctx.attr("scan_input_axes", [0] * k)
    steps, sliced = None, []
    for x, a in zip(xs, in_axes):
        a %= len(x.shape)
        steps = x.shape[a] if steps is None else ctx.unify(steps, x.shape[a])
        sliced.append(TensorType(x.dtype, x.shape[:a] + x.shape[a + 1:]))
    mark = ctx.mark()
    types, outs = _carry(ctx, body, [], state, sliced, 0)
    types = [_localize(ctx, t, mark) for t in types]
    ys = outs[len(state):]
    out_axes = ctx.attr("scan_output_axes", [0] * len(ys))
    return types + [_localize(ctx, y, mark, steps if steps is not None else ctx.fresh("scan"),
                              out_axes[j] % (len(y.shape) + 1)) for j, y in enumerate(ys)]


# ---- sequences and optionals ---------------------------------------------------------------------------
def _seq_shape(shapes: list) -> Any:
    if not shapes or any(s is None for s in shapes):
        return None
    first = shapes[0]
    if all(len(s) == len(first) and all(_same(a, b) for a, b in zip(s, first)) for s in shapes):
        return first
    return None


def _seq_of(dtype: np.dtype, shapes: list, ranks: list | None = None) -> SequenceType:
    """The sequence type holding elements of these shapes: their common shape, else their common rank."""
    shape = _seq_shape(shapes)
    if shape is not None:
        return SequenceType(dtype, shape)
    ranks = ranks or [None if sh is None else len(sh) for sh in shapes]
    ranks = [r if r is not None else (None if sh is None else len(sh)) for r, sh in zip(ranks, shapes)]
    return SequenceType(dtype, None, ranks[0] if ranks and None not in ranks and len(set(ranks)) == 1 else None)


def seq_elem(ctx: InferCtx, s: SequenceType, what: str = "this sequence") -> TensorType:
    """The type of one element: the common shape, or fresh dims of the common rank."""
    if s.shape is not None:
        return TensorType(s.dtype, s.shape)
    if s.rank is None:
        ctx.error(f"the element rank of {what} is not known", "give the sequence elements one rank")
    return TensorType(s.dtype, tuple(ctx.fresh("seq_elem") for _ in range(s.rank)))


def _seq_construct_infer(ctx: InferCtx) -> list:
    ts = ctx.inputs
    return [_seq_of(ts[0].dtype, [t.shape for t in ts])]


def _seq_insert_ref(inputs: list, attrs: dict) -> list:
    seq = list(inputs[0])
    pos = len(seq) if len(inputs) < 3 or inputs[2] is None else int(np.asarray(inputs[2]).reshape(-1)[0])
    seq.insert(pos if pos >= 0 else pos + len(seq), inputs[1])
    return [seq]


def _seq_insert_infer(ctx: InferCtx) -> list:
    s, t = ctx.inputs[0], ctx.inputs[1]
    if s.shape is None and s.rank is None:  # SequenceEmpty: the first element fixes the shape
        return [SequenceType(t.dtype, t.shape)]
    return [_seq_of(t.dtype, [s.shape, t.shape], [s.rank, t.rank])]


def _seq_empty_ref(inputs: list, attrs: dict) -> list:
    return [[]]


def _seq_empty_infer(ctx: InferCtx) -> list:
    from dynshape.ops.dtypes import np_dtype

    return [SequenceType(np_dtype(ctx.attr("dtype", 1)), None)]


def _seq_at_ref(inputs: list, attrs: dict) -> list:
    return [inputs[0][int(np.asarray(inputs[1]).reshape(-1)[0])]]


def _seq_at_infer(ctx: InferCtx) -> list:
    return [seq_elem(ctx, ctx.inputs[0])]


def _optional_ref(inputs: list, attrs: dict) -> list:
    return [inputs[0] if inputs else None]


def _optional_infer(ctx: InferCtx) -> list:
    if ctx.inputs and ctx.inputs[0] is not None:
        return [OptionalType(ctx.inputs[0])]
    t = ctx.attr("type")
    if t is None:
        ctx.error("Optional without input needs the 'type' attribute")
    return [OptionalType(t)]


def _has_elem_ref(inputs: list, attrs: dict) -> list:
    return [np.array(bool(inputs) and inputs[0] is not None)]


def _get_elem_ref(inputs: list, attrs: dict) -> list:
    if inputs[0] is None:
        raise ValueError("OptionalGetElement of an empty optional")
    return [inputs[0]]


def _get_elem_infer(ctx: InferCtx) -> list:
    t = ctx.inputs[0]
    return [t.elem if isinstance(t, OptionalType) else t]


register("If", reference=_if_ref, infer=_if_infer)
register("Loop", reference=_loop_ref, infer=_loop_infer)
register("Scan", reference=_scan_ref, infer=_scan_infer)
register("SequenceConstruct", reference=lambda ins, attrs: [list(ins)], infer=_seq_construct_infer)
register("SequenceInsert", reference=_seq_insert_ref, infer=_seq_insert_infer)
register("SequenceEmpty", reference=_seq_empty_ref, infer=_seq_empty_infer)
register("SequenceAt", reference=_seq_at_ref, infer=_seq_at_infer)
register("SequenceLength", reference=lambda ins, attrs: [np.array(len(ins[0]), I64)],
         infer=lambda ctx: [TensorType(I64, ())])
register("Optional", reference=_optional_ref, infer=_optional_infer)
register("OptionalHasElement", reference=_has_elem_ref, infer=lambda ctx: [TensorType(BOOL, ())])
register("OptionalGetElement", reference=_get_elem_ref, infer=_get_elem_infer)
