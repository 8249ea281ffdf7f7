"""Data movement: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat, Split, Slice, Expand, Tile, Pad,
DepthToSpace, SpaceToDepth, Trilu, ReverseSequence: numpy references and exact symbolic shape rules.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dynshape.errors import ShapeError
from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import Layout, Movement, register
from dynshape.ops.dims import (
    HUGE,
    MAX_VALUE_SIZE,
    apply_value,
    arg_given,
    arg_value,
    axis_of,
    ceil_div,
    decide,
    dim_eq,
    dmax,
    dmin,
    ints,
    is_static,
    make_value,
    norm,
    out_type,
    prod,
    ref_arg,
    require_divides,
    require_eq,
    same_as_input_infer,
    static_len,
    static_shape,
    value_list,
)
from dynshape.sym import eq, exact_quotient


# ----------------------------------------------------------------------------------------------------
# Reshape, Flatten, Squeeze, Unsqueeze, Transpose
# ----------------------------------------------------------------------------------------------------
def _reshape_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    shape = ref_arg(inputs, 1, attrs, "shape")
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(shape)]


def cancel(num: list, den: list) -> tuple[Any, Any]:
    """(prod(num), prod(den)) after equal symbolic factors and common integer factors cancel."""
    num, rest = list(num), []
    for d in den:
        j = next((j for j, n in enumerate(num) if not is_static(d) and not is_static(n) and dim_eq(n, d)), None)
        if j is None:
            rest.append(d)
        else:
            del num[j]
    ni = prod(d for d in num if is_static(d))
    di = prod(d for d in rest if is_static(d))
    g = math.gcd(ni, di) or 1
    return (ni // g) * prod(d for d in num if not is_static(d)), (di // g) * prod(d for d in rest if not is_static(d))


def quotient(ctx: InferCtx, num: list, den: list, what: str) -> Any:
    """prod(num) // prod(den), exact: equal factors cancel first, and the divisibility it needs is recorded.

    A symbolic divisor that may be 0 cannot divide: where it divides num as polynomials (one term dividing every
    term of num: Swin's window reverse), the quotient is the dim wherever the divisor is not 0, which the generic
    graph assumes (a divisor of 0 leaves the -1 undefined: such inputs run on a static specialisation, where the
    rule refuses them as numpy and onnxruntime do); else the result is a fresh dim q with q * divisor == num.
    """
    n, k = cancel(num, den)
    if is_static(k):
        if k == 0:
            ctx.error(f"{what}: cannot infer a dim next to a zero-sized one")
        require_divides(ctx, k, n, what)
        return n // k
    try:
        q, r = n // k, n % k
    except ShapeError:
        q = exact_quotient(n, k)
        if q is not None and not ctx.is_local(k, 0):
            ctx.assume(k >= 1, f"{what}'s divisor {k} is not 0")
            return q
        q = ctx.fresh(what)
        ctx.require(eq(q * k, n))
        return q
    ctx.require(eq(r, 0))
    return q


def reshape_dims(ctx: InferCtx, in_shape: tuple, target: list, allowzero: bool) -> list:
    """ONNX Reshape semantics over `int | Expr`: 0 copies the input dim, -1 is inferred (exactly)."""
    out: list = []
    infer_at = None
    for i, t in enumerate(target):
        if is_static(t):
            if t == -1:
                if infer_at is not None:
                    ctx.error("more than one -1 in the target shape")
                infer_at = i
            elif t == 0 and not allowzero:
                if i >= len(in_shape):
                    ctx.error(f"0 at position {i} copies a dim the input does not have")
                t = in_shape[i]
            elif t < 0:
                ctx.error(f"invalid target dim {t}")
        elif not allowzero and not decide(t >= 1) and not (i < len(in_shape) and dim_eq(t, in_shape[i])):
            # a symbolic entry that is 0 at run time means "copy the input dim". Over input symbols the generic
            # graph assumes it is not (inputs where it is run on a graph specialised to their shapes); an entry
            # only the data fixes cannot be checked before running, so its dim is unknown (fresh)
            if ctx.is_local(t, 0):
                t = ctx.fresh("reshape")
            else:
                ctx.assume(t >= 1, f"Reshape's target entry {i} ({t}) is not 0")
        out.append(t)
    if infer_at is None:
        a, b = cancel(list(in_shape), out)
        if is_static(a) and is_static(b) and a != b:
            ctx.error(f"the input shape {list(in_shape)} ({prod(in_shape)} elements) cannot be reshaped to {out} "
                      f"({prod(out)} elements)")
        require_eq(ctx, a, b, "element count")
    else:
        out[infer_at] = quotient(ctx, list(in_shape), out[:infer_at] + out[infer_at + 1 :], "the -1 dim")
    return out


def _reshape_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    target = arg_value(ctx, 1, "shape")
    if target is None:
        n = static_len(ctx, ctx.inputs[1])
        return [out_type(x.dtype, [ctx.fresh("reshape") for _ in range(n)])]
    shape = reshape_dims(ctx, x.shape, target, bool(ctx.attr("allowzero", 0)))
    value = apply_value(x, lambda v: v.reshape(shape), x.dtype) if static_shape(shape) else None
    return [out_type(x.dtype, shape, value)]


register("Reshape", reference=_reshape_ref, infer=_reshape_infer, movement=Movement.VIEW)


def _flatten_axis(a: int, rank: int) -> int:
    """Flatten's axis lies in [-rank, rank] (rank itself meaning "everything in the first dim")."""
    a = int(a)
    if not -rank <= a <= rank:
        raise ValueError(f"axis {a} out of range for Flatten of rank {rank} (valid: {-rank}..{rank})")
    return a + rank if a < 0 else a


def _flatten_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    a = _flatten_axis(attrs.get("axis", 1), x.ndim)
    return [x.reshape(int(np.prod(x.shape[:a])), int(np.prod(x.shape[a:])))]


def _flatten_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    a = _flatten_axis(ctx.attr("axis", 1), x.rank)
    shape = (prod(x.shape[:a]), prod(x.shape[a:]))
    value = apply_value(x, lambda v: v.reshape(shape), x.dtype) if static_shape(shape) else None
    return [out_type(x.dtype, shape, value)]


register("Flatten", reference=_flatten_ref, infer=_flatten_infer, movement=Movement.VIEW)


def _squeeze_ref(inputs: list, attrs: dict) -> list:
    axes = ref_arg(inputs, 1, attrs, "axes")
    x = inputs[0]
    return [np.squeeze(x, axis=None if axes is None else tuple(axis_of(a, x.ndim) for a in axes))]


def _squeeze_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    if arg_given(ctx, 1, "axes"):
        axes = arg_value(ctx, 1, "axes")
        if axes is None or not all(is_static(a) for a in axes):  # which dims go is data: rank known, dims not
            n = x.rank - static_len(ctx, ctx.inputs[1])
            return [out_type(x.dtype, [ctx.fresh("squeeze") for _ in range(n)])]
        axes = {axis_of(a, x.rank) for a in axes}
        for a in axes:
            require_eq(ctx, x.shape[a], 1, f"Squeeze: dim {a} must be 1")
    else:
        axes = set()
        for i, d in enumerate(x.shape):
            one = dim_eq(d, 1)
            if one is None:  # the output rank depends on whether d is 1
                ctx.rank_depends_on([d], f"Squeeze without axes: dim {i} ({d}) may be 1")
            if one:
                axes.add(i)
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    return [out_type(x.dtype, shape, apply_value(x, lambda v: v.reshape(shape), x.dtype))]


register("Squeeze", reference=_squeeze_ref, infer=_squeeze_infer, movement=Movement.VIEW)


def _unsqueeze_shape(shape: tuple, axes: list) -> list:
    r = len(shape) + len(axes)
    axes = sorted(axis_of(a, r) for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError("Unsqueeze: repeated axis")
    out, it = [], iter(shape)
    for i in range(r):
        out.append(1 if i in axes else next(it))
    return out


def _unsqueeze_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    return [x.reshape(_unsqueeze_shape(x.shape, ref_arg(inputs, 1, attrs, "axes")))]


def _unsqueeze_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    axes = arg_value(ctx, 1, "axes")
    if axes is None or not all(is_static(a) for a in axes):  # where the 1s go is data: rank known, dims not
        n = x.rank + static_len(ctx, ctx.inputs[1])
        return [out_type(x.dtype, [ctx.fresh("unsqueeze") for _ in range(n)])]
    shape = _unsqueeze_shape(x.shape, axes)
    return [out_type(x.dtype, shape, apply_value(x, lambda v: v.reshape(shape), x.dtype))]


register("Unsqueeze", reference=_unsqueeze_ref, infer=_unsqueeze_infer, movement=Movement.VIEW)


def _perm(attrs_get: Any, rank: int) -> list[int]:
    p = attrs_get("perm", None)
    if p is None:
        return list(range(rank))[::-1]
    if sorted(int(a) for a in p) != list(range(rank)):
        raise ValueError(f"perm {list(p)} is not a permutation of the {rank} axes 0..{rank - 1} (each axis once)")
    return [int(a) for a in p]


def _transpose_ref(inputs: list, attrs: dict) -> list:
    return [np.transpose(inputs[0], _perm(attrs.get, inputs[0].ndim))]


def _transpose_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    perm = _perm(ctx.attr, x.rank)
    value = apply_value(x, lambda v: np.transpose(v, perm), x.dtype)
    return [out_type(x.dtype, [x.shape[p] for p in perm], value)]


register("Transpose", reference=_transpose_ref, infer=_transpose_infer, movement=Movement.PERMUTE)

# ----------------------------------------------------------------------------------------------------
# Concat, Split, Slice
# ----------------------------------------------------------------------------------------------------
def _concat_ref(inputs: list, attrs: dict) -> list:
    xs = [x for x in inputs if x is not None]
    return [np.concatenate(xs, axis=axis_of(attrs["axis"], xs[0].ndim))]


def _concat_infer(ctx: InferCtx) -> list:
    xs = [t for t in ctx.inputs if t is not None]
    a = axis_of(ctx.attr("axis", 0), xs[0].rank)
    shape = list(xs[0].shape)
    for t in xs[1:]:
        if t.rank != len(shape):
            ctx.error(f"rank {t.rank} != {len(shape)}")
        for i, d in enumerate(t.shape):
            if i != a:
                shape[i] = ctx.unify(shape[i], d)
    shape[a] = sum((norm(t.shape[a]) for t in xs[1:]), norm(xs[0].shape[a]))
    value = None
    if all(t.value is not None for t in xs):
        value = make_value(np.concatenate([np.asarray(t.value) for t in xs], axis=a), xs[0].dtype)
    return [out_type(xs[0].dtype, shape, value)]


register("Concat", reference=_concat_ref, infer=_concat_infer, layout=Layout.AXIS)


def _split_sizes(d: Any, attrs_get: Any, split: list | None, n_out: int) -> list:
    """Sizes of the Split outputs; an uneven `num_outputs` split (opset 18) makes the last chunk smaller."""
    if split is not None:
        return split
    n = attrs_get("num_outputs", None) or n_out
    chunk = ceil_div(d, n) if attrs_get("num_outputs", None) else d // n
    return [chunk] * (n - 1) + [d - chunk * (n - 1)]


def _split_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    a = axis_of(attrs.get("axis", 0), x.ndim)
    sizes = _split_sizes(x.shape[a], attrs.get, ref_arg(inputs, 1, attrs, "split"), attrs.get("_num_outputs", 1))
    return np.split(x, np.cumsum(sizes)[:-1], axis=a)


def _split_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    a = axis_of(ctx.attr("axis", 0), x.rank)
    n_out = ctx.num_outputs
    split = arg_value(ctx, 1, "split")
    if split is None and arg_given(ctx, 1, "split"):
        sizes = [ctx.fresh("split") for _ in range(n_out)]
        ctx.require(eq(sum(sizes), x.shape[a]))
    else:
        sizes = _split_sizes(x.shape[a], ctx.attr, split, n_out)
        if split is not None:
            require_eq(ctx, sum(split, 0), x.shape[a], "split sizes must add up to the dim")
        elif not ctx.attr("num_outputs", None):
            require_divides(ctx, len(sizes), x.shape[a], "equal split")
    outs = []
    for i, s in enumerate(sizes):
        shape = list(x.shape)
        shape[a] = s
        value = None
        if x.value is not None and all(is_static(v) for v in sizes):
            start = sum(sizes[:i])
            value = make_value(np.take(np.asarray(x.value), range(start, start + s), axis=a), x.dtype)
        outs.append(out_type(x.dtype, shape, value))
    return outs


register("Split", reference=_split_ref, infer=_split_infer, layout=Layout.AXIS,
         permuted_inputs=1)  # the split sizes (opset 13: an input) are a parameter, not an operand to permute


def slice_bounds(d: Any, s: Any, e: Any, t: int) -> tuple[Any, Any, Any]:
    """(start, end, length) of an ONNX slice over `int | Expr`, clamped as the spec says.

    Negative indices count from the end. A symbolic index whose sign cannot be proven uses the exact indicator
    `min(max(-i, 0), 1)` (1 when i < 0) instead of guessing, so the result is sound for every value.
    """
    if t == 0:
        raise ValueError("Slice step cannot be 0")
    lo, hi = (0, d) if t > 0 else (-1, d - 1)

    def place(i: Any, first: bool) -> Any:
        if is_static(i) and i >= HUGE:
            i = d
        elif is_static(i) and i <= -HUGE:
            i = -1
        elif is_static(i) or decide(i >= 0) is not None:
            i = i + d if decide(i < 0) else i
        else:
            i = i + d * dmin(dmax(-i, 0), 1)
        low = 0 if first else lo
        if not decide(i >= low):
            i = low if decide(i < low) else dmax(i, low)
        if not decide(i <= hi):
            i = hi if decide(i > hi) else dmin(i, hi)
        return i

    s, e = place(norm(s), True), place(norm(e), False)
    n = dmax(ceil_div(e - s, t), 0) if t > 0 else dmax(ceil_div(s - e, -t), 0)
    return s, e, n


def _slice_params(rank: int, starts: list, ends: list, axes: list | None, steps: list | None) -> list:
    axes = list(range(len(starts))) if axes is None else [axis_of(a, rank) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    return list(zip(axes, starts, ends, steps))


def _slice_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    if attrs.get("_opset", 13) < 10:
        starts, ends, axes, steps = ints(attrs["starts"]), ints(attrs["ends"]), attrs.get("axes"), None
    else:
        starts, ends = ints(inputs[1]), ints(inputs[2])
        axes, steps = ref_arg(inputs, 3, attrs), ref_arg(inputs, 4, attrs)
    index = [slice(None)] * x.ndim
    for a, s, e, t in _slice_params(x.ndim, starts, ends, axes, steps):
        s, e, _ = slice_bounds(x.shape[a], s, e, t)
        index[a] = slice(s, None if e < 0 else e, t)
    return [x[tuple(index)]]


def _slice_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    if ctx.opset < 10:
        params = [None] * 4
        starts, ends = arg_value(ctx, None, "starts"), arg_value(ctx, None, "ends")
        axes, steps = arg_value(ctx, None, "axes"), None
    else:
        params = [ctx.inputs[i] if len(ctx.inputs) > i else None for i in range(1, 5)]
        starts, ends, axes, steps = (value_list(t) for t in params)
    shape = list(x.shape)
    if any(t is not None and t.value is None for t in params):
        # where (or how far) we cut is data-dependent: every axis that may be cut gets a fresh size
        for a in range(x.rank) if axes is None else [axis_of(a, x.rank) for a in axes]:
            shape[a] = ctx.fresh("slice")
        return [out_type(x.dtype, shape)]
    index: list | None = [slice(None)] * x.rank
    for a, s, e, t in _slice_params(x.rank, starts, ends, axes, steps):
        if not is_static(t):
            shape[a], index = ctx.fresh("slice"), None
            continue
        s, e, shape[a] = slice_bounds(x.shape[a], s, e, int(t))
        if index is not None and is_static(s) and is_static(e):
            index[a] = slice(s, None if e < 0 else e, int(t))
        else:
            index = None
    value = apply_value(x, lambda v: v[tuple(index)], x.dtype) if index is not None else None
    return [out_type(x.dtype, shape, value)]


register("Slice", reference=_slice_ref, infer=_slice_infer)

# ----------------------------------------------------------------------------------------------------
# Expand, Tile, Pad
# ----------------------------------------------------------------------------------------------------
def _expand_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    shape = np.broadcast_shapes(x.shape, tuple(ints(inputs[1])))
    return [np.asarray(x).copy() if shape == np.shape(x) else np.broadcast_to(x, shape).copy()]


def _expand_infer(ctx: InferCtx) -> list:
    x, s = ctx.inputs[:2]
    target = value_list(s)
    if target is None:  # a dim of x that cannot be 1 survives any broadcast; the others are data
        n = max(static_len(ctx, s), x.rank)
        dims = [None] * (n - x.rank) + list(x.shape)
        keep = [d is not None and dim_eq(d, 1) is False for d in dims]
        return [out_type(x.dtype, [d if k else ctx.fresh("expand") for d, k in zip(dims, keep)])]
    shape = ctx.broadcast(tuple(x.shape), tuple(target))
    value = None
    if x.value is not None and static_shape(shape) and prod(shape) <= MAX_VALUE_SIZE:
        value = make_value(np.broadcast_to(np.asarray(x.value), tuple(shape)), x.dtype)
    return [out_type(x.dtype, shape, value)]


register("Expand", reference=_expand_ref, infer=_expand_infer)


def _tile_ref(inputs: list, attrs: dict) -> list:
    return [np.tile(inputs[0], ints(inputs[1]))]


def _tile_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    reps = value_list(ctx.inputs[1])
    if reps is None:
        return [out_type(x.dtype, [ctx.fresh("tile") for _ in x.shape])]
    shape = [d * r for d, r in zip(x.shape, reps)]
    value = None
    if x.value is not None and static_shape(shape) and prod(shape) <= MAX_VALUE_SIZE:
        value = make_value(np.tile(np.asarray(x.value), reps), x.dtype)
    return [out_type(x.dtype, shape, value)]


register("Tile", reference=_tile_ref, infer=_tile_infer)


def pad_args(inputs: list, attrs: dict) -> tuple[list[int], Any, list[int] | None]:
    """(pads, constant value, axes): attributes before opset 11, inputs after."""
    if attrs.get("_opset", 18) < 11:
        pads = attrs.get("pads", attrs.get("paddings"))
        return ints(pads), attrs.get("value", 0.0), None
    value = inputs[2] if len(inputs) > 2 and inputs[2] is not None and inputs[2].size else 0
    return ints(inputs[1]), np.asarray(value).reshape(-1)[0], ref_arg(inputs, 3, {})


def _pad_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    pads, value, axes = pad_args(inputs, attrs)
    axes = list(range(x.ndim)) if axes is None else [axis_of(a, x.ndim) for a in axes]
    width = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        width[a] = (pads[i], pads[len(axes) + i])
    mode = attrs.get("mode", "constant")
    grow = [(max(b, 0), max(e, 0)) for b, e in width]

    def crop(a: np.ndarray) -> np.ndarray:  # negative pads remove elements
        return a[tuple(slice(max(-b, 0), n - max(-e, 0)) for (b, e), n in zip(width, a.shape))]

    if mode == "constant":  # output[j] = input[j - pad_begin] or the constant: pad, then crop
        return [crop(np.pad(x, grow, mode="constant", constant_values=value).astype(x.dtype))]
    return [np.pad(crop(x), grow, mode=mode)]  # edge/reflect/wrap extend what is left after cropping


def _pad_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    if ctx.opset < 11:
        pads, axes = arg_value(ctx, None, "pads") or arg_value(ctx, None, "paddings"), None
    else:
        pads, axes = value_list(ctx.inputs[1]), arg_value(ctx, 3)
        for i, what in ((1, "pads"), (3, "axes")):
            t = ctx.inputs[i] if len(ctx.inputs) > i else None
            if t is not None and len(t.shape) != 1:
                ctx.error(f"{what} must be a 1-D tensor, it has shape {list(t.shape)}")
        cv = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        if cv is not None and cv.shape:
            if any(is_static(d) and d != 1 for d in cv.shape):
                ctx.error(f"constant_value must be a scalar (one element), it has shape {list(cv.shape)}")
            if not static_shape(cv.shape):
                ctx.require(eq(prod(cv.shape), 1), "constant_value must be a scalar (one element)")
    if axes is None and arg_given(ctx, 3):
        return [out_type(x.dtype, [ctx.fresh("pad") for _ in x.shape])]
    axes = list(range(x.rank)) if axes is None else [axis_of(a, x.rank) for a in axes]
    if pads is not None and len(pads) != 2 * len(axes):
        ctx.error(f"pads has {len(pads)} entries; {len(axes)} padded axes need {2 * len(axes)} (begins, then ends)")
    shape = list(x.shape)
    for i, a in enumerate(axes):
        if pads is None:
            shape[a] = ctx.fresh("pad")
            continue
        shape[a] = d = shape[a] + pads[i] + pads[len(axes) + i]
        # negative pads crop: never below an empty axis (checked per call when the dim is symbolic)
        if is_static(d):
            if d < 0:
                ctx.error(f"pads {pads} crop axis {a} ({x.shape[a]}) to {d} < 0")
        else:
            ctx.require(d >= 0, f"negative pads {pads} must not crop axis {a} of the input below 0")
    return [out_type(x.dtype, shape)]


register("Pad", reference=_pad_ref, infer=_pad_infer)

# ----------------------------------------------------------------------------------------------------
# DepthToSpace, SpaceToDepth, Trilu, OneHot, EyeLike, ReverseSequence
# ----------------------------------------------------------------------------------------------------
def _depth_to_space_ref(inputs: list, attrs: dict) -> list:
    x, b = inputs[0], int(attrs["blocksize"])
    n, c, h, w = x.shape
    if attrs.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [y.reshape(n, c // (b * b), h * b, w * b)]


def _depth_to_space_infer(ctx: InferCtx) -> list:
    x, b = ctx.inputs[0], int(ctx.attr("blocksize", 1))
    n, c, h, w = x.shape
    require_divides(ctx, b * b, c, "channels")
    return [out_type(x.dtype, (n, c // (b * b), h * b, w * b))]


register("DepthToSpace", reference=_depth_to_space_ref, infer=_depth_to_space_infer)


def _space_to_depth_ref(inputs: list, attrs: dict) -> list:
    x, b = inputs[0], int(attrs["blocksize"])
    n, c, h, w = x.shape
    perm = (0, 3, 5, 1, 2, 4) if attrs.get("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)  # CRD: opset 27+
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(perm)
    return [y.reshape(n, c * b * b, h // b, w // b)]


def _space_to_depth_infer(ctx: InferCtx) -> list:
    x, b = ctx.inputs[0], int(ctx.attr("blocksize", 1))
    n, c, h, w = x.shape
    require_divides(ctx, b, h, "height")
    require_divides(ctx, b, w, "width")
    return [out_type(x.dtype, (n, c * b * b, h // b, w // b))]


register("SpaceToDepth", reference=_space_to_depth_ref, infer=_space_to_depth_infer)


def _trilu_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    k = int(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else 0
    return [np.triu(x, k) if attrs.get("upper", 1) else np.tril(x, k)]


register("Trilu", reference=_trilu_ref, infer=same_as_input_infer)


def _reverse_sequence_ref(inputs: list, attrs: dict) -> list:
    x, lens = inputs
    ta, ba = int(attrs.get("time_axis", 0)), int(attrs.get("batch_axis", 1))
    t = np.arange(x.shape[ta])[:, None]
    src = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)  # (time, batch)
    if ta > ba:
        src = src.T
    shape = [1] * x.ndim
    shape[ta], shape[ba] = x.shape[ta], x.shape[ba]
    return [np.take_along_axis(x, np.broadcast_to(src.reshape(shape), x.shape), axis=ta)]


def _reverse_sequence_infer(ctx: InferCtx) -> list:
    x, lens = ctx.inputs
    if x.rank < 2 or lens.rank != 1:
        ctx.error(f"input must have rank >= 2 and sequence_lens be 1-D, got {x.shape} and {lens.shape}")
    ctx.unify(lens.shape[0], x.shape[axis_of(ctx.attr("batch_axis", 1), x.rank)])
    return [out_type(x.dtype, x.shape)]


register("ReverseSequence", reference=_reverse_sequence_ref, infer=_reverse_sequence_infer)
