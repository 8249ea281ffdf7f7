"""Shape-manipulation and shape-arithmetic ops: numpy references and exact symbolic shape rules.

Exporters compute shapes at run time (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, Shape -> Slice, Range,
ConstantOfShape). To keep those shapes exact, the rules here propagate `TensorType.value` (an array of
`int | Expr`) whenever the data input's value is known; a dimension becomes a fresh symbol (`ctx.fresh`) only
when its size truly depends on tensor data.

Dims are `int | Expr`; the helpers below use plain Python arithmetic on ints and the symbolic engine otherwise,
so every rule also works on fully static shapes.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from dynshape.errors import ShapeError
from dynshape.ir.types import TensorType
from dynshape.ops.registry import register
from dynshape.sym import ceil_div as sym_ceil_div
from dynshape.sym import divides, eq, max_, min_, prove

I64 = np.dtype(np.int64)
# An index at least this large (in magnitude) means "past the end": no array can have a dim this big.
HUGE = 2**62
# Largest value array a growing op (Expand, Tile, ConstantOfShape, Range) materialises in a shape rule.
MAX_VALUE_SIZE = 1 << 16


# ----------------------------------------------------------------------------------------------------
# dim helpers (int fast path, symbolic engine otherwise)
# ----------------------------------------------------------------------------------------------------
def is_static(d: Any) -> bool:
    return isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_))


def norm(x: Any) -> Any:
    """numpy ints -> int (Expr arithmetic only has to understand Python ints)."""
    return int(x) if isinstance(x, np.integer) else x


def decide(cond: Any) -> bool | None:
    """True / False / None (unknown) for a comparison built from ints or Exprs."""
    if isinstance(cond, (bool, np.bool_)):
        return bool(cond)
    return prove(cond)


def dim_eq(a: Any, b: Any) -> bool | None:
    if is_static(a) and is_static(b):
        return int(a) == int(b)
    return prove(eq(a, b))


def dmin(a: Any, b: Any) -> Any:
    return min(a, b) if is_static(a) and is_static(b) else min_(a, b)


def dmax(a: Any, b: Any) -> Any:
    return max(a, b) if is_static(a) and is_static(b) else max_(a, b)


def ceil_div(a: Any, b: Any) -> Any:
    return -(-a // b) if is_static(a) and is_static(b) else sym_ceil_div(a, b)


def prod(dims: Any) -> Any:
    out: Any = 1
    for d in dims:
        out = out * norm(d)
    return out


def require_eq(ctx: Any, a: Any, b: Any, what: str) -> None:
    """Record `a == b`; a plain-int mismatch is a node-named error."""
    if is_static(a) and is_static(b):
        if a != b:
            ctx.error(f"{what}: {a} != {b}")
    else:
        ctx.require(eq(a, b))


def require_divides(ctx: Any, k: Any, e: Any, what: str) -> None:
    """Record that `k` divides `e` (needed by an exact `e // k`)."""
    if is_static(k) and is_static(e):
        if k == 0 or e % k:
            ctx.error(f"{what}: {k} does not divide {e}")
    elif not (is_static(k) and k == 1):
        ctx.require(divides(k, e))


def axis_of(a: Any, rank: int) -> int:
    a = int(a)
    if not -rank <= a < max(rank, 1):
        raise ValueError(f"axis {a} out of range for rank {rank}")
    return a + rank if a < 0 else a


# ----------------------------------------------------------------------------------------------------
# value helpers
# ----------------------------------------------------------------------------------------------------
def value_list(t: TensorType | None) -> list | None:
    """The known contents of `t`, flattened, as `int | Expr` (or floats); None when unknown."""
    if t is None or t.value is None:
        return None
    return [norm(v) for v in np.asarray(t.value).reshape(-1).tolist()]


def make_value(items: Any, dtype: np.dtype, shape: Any = None) -> np.ndarray:
    """A value array: numeric when every item is a number, else an object array of `int | Expr`."""
    flat = [norm(v) for v in np.asarray(items, dtype=object).reshape(-1)]
    shape = np.shape(items) if shape is None else tuple(shape)
    if all(isinstance(v, (int, float, bool, np.generic)) for v in flat):
        return np.array(flat, dtype=dtype).reshape(shape)
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(shape)


def apply_value(t: TensorType | None, fn: Any, dtype: np.dtype) -> np.ndarray | None:
    """Run a pure data-movement numpy function on a known value (object arrays work unchanged)."""
    if t is None or t.value is None:
        return None
    return make_value(fn(np.asarray(t.value)), dtype)


def static_shape(shape: Any) -> bool:
    return all(is_static(d) for d in shape)


def out_type(dtype: Any, shape: Any, value: np.ndarray | None = None) -> TensorType:
    return TensorType(np.dtype(dtype), tuple(norm(d) for d in shape), value)


def ints(x: Any) -> list[int]:
    return [int(v) for v in np.asarray(x).reshape(-1)]


def _arg(ctx: Any, idx: int | None, attr: str | None = None) -> list | None:
    """Known values of an op parameter: input `idx` (newer opsets) or attribute `attr` (older ones)."""
    if idx is not None and len(ctx.inputs) > idx and ctx.inputs[idx] is not None:
        return value_list(ctx.inputs[idx])
    v = None if attr is None else ctx.attr(attr, None)
    return None if v is None else [norm(x) for x in np.asarray(v).reshape(-1).tolist()]


def _arg_given(ctx: Any, idx: int, attr: str | None = None) -> bool:
    return (len(ctx.inputs) > idx and ctx.inputs[idx] is not None) or (attr is not None and ctx.attr(attr) is not None)


def _ref_arg(inputs: list, idx: int, attrs: dict, attr: str | None = None) -> list[int] | None:
    if len(inputs) > idx and inputs[idx] is not None:
        return ints(inputs[idx])
    return None if attr is None or attrs.get(attr) is None else ints(attrs[attr])


# ----------------------------------------------------------------------------------------------------
# Shape, Size, Constant, ConstantOfShape, Range
# ----------------------------------------------------------------------------------------------------
def _shape_bounds(rank: int, attrs_get: Any) -> tuple[int, int]:
    start, end = int(attrs_get("start", 0)), attrs_get("end", None)
    end = rank if end is None else int(end)
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    return start, max(start, end)


def _shape_ref(inputs: list, attrs: dict) -> list:
    s, e = _shape_bounds(inputs[0].ndim, attrs.get)
    return [np.array(inputs[0].shape[s:e], dtype=np.int64)]


def _shape_infer(ctx: Any) -> list:
    dims = ctx.inputs[0].shape
    s, e = _shape_bounds(len(dims), ctx.attr)
    return [out_type(I64, (e - s,), make_value(list(dims[s:e]), I64, (e - s,)))]


register("Shape", reference=_shape_ref, infer=_shape_infer)


def _size_ref(inputs: list, attrs: dict) -> list:
    return [np.array(inputs[0].size, dtype=np.int64)]


def _size_infer(ctx: Any) -> list:
    return [out_type(I64, (), make_value(prod(ctx.inputs[0].shape), I64, ()))]


register("Size", reference=_size_ref, infer=_size_infer)


def _constant_value(get: Any) -> np.ndarray:
    """The tensor a Constant node holds, whichever `value*` attribute carries it."""
    if get("value", None) is not None:
        return np.asarray(get("value", None))
    if get("sparse_value", None) is not None:
        return np.asarray(get("sparse_value", None))
    for name, dtype in (("value_float", np.float32), ("value_int", np.int64), ("value_string", object)):
        if get(name, None) is not None:
            return np.array(get(name, None), dtype=dtype)
    for name, dtype in (("value_floats", np.float32), ("value_ints", np.int64), ("value_strings", object)):
        if get(name, None) is not None:
            return np.array(list(get(name, None)), dtype=dtype).reshape(-1)
    raise ValueError("Constant has no value attribute")


def _constant_ref(inputs: list, attrs: dict) -> list:
    return [_constant_value(attrs.get)]


def _constant_infer(ctx: Any) -> list:
    v = _constant_value(ctx.attr)
    return [out_type(v.dtype, v.shape, v)]


register("Constant", reference=_constant_ref, infer=_constant_infer)


def _fill_value(get: Any) -> np.ndarray:
    v = get("value", None)
    return np.zeros(1, dtype=np.float32) if v is None else np.asarray(v).reshape(-1)


def _constant_of_shape_ref(inputs: list, attrs: dict) -> list:
    v = _fill_value(attrs.get)
    return [np.full(ints(inputs[0]), v[0], dtype=v.dtype)]


def _constant_of_shape_infer(ctx: Any) -> list:
    v = _fill_value(ctx.attr)
    shape = value_list(ctx.inputs[0])
    if shape is None:
        shape = [ctx.fresh("const_of_shape") for _ in range(_static_len(ctx, ctx.inputs[0]))]
    value = None
    if static_shape(shape) and prod(shape) <= MAX_VALUE_SIZE:
        value = np.full(shape, v[0], dtype=v.dtype)
    return [out_type(v.dtype, shape, value)]


def _static_len(ctx: Any, t: TensorType) -> int:
    """Length of a 1-D parameter tensor, which fixes an output rank and so must be static."""
    n = t.shape[0] if t.shape else 1
    if not is_static(n):
        ctx.error("the length of a shape tensor must be static (dynamic rank is not supported)")
    return int(n)


register("ConstantOfShape", reference=_constant_of_shape_ref, infer=_constant_of_shape_infer)


def _range_ref(inputs: list, attrs: dict) -> list:
    start, limit, delta = (np.asarray(x).reshape(()) for x in inputs)
    n = max(math.ceil((float(limit) - float(start)) / float(delta)), 0)
    if np.issubdtype(start.dtype, np.integer):
        n = max(-(-(int(limit) - int(start)) // int(delta)), 0)
    return [(start + np.arange(n, dtype=start.dtype) * delta).astype(start.dtype)]


def _range_infer(ctx: Any) -> list:
    dtype = ctx.inputs[0].dtype
    vals = [value_list(t) for t in ctx.inputs[:3]]
    if any(v is None for v in vals):
        return [out_type(dtype, (ctx.fresh("range"),))]
    start, limit, delta = (v[0] for v in vals)
    if all(isinstance(v, (int, float)) for v in (start, limit, delta)):
        arrs = [np.asarray(v, dtype=dtype) for v in (start, limit, delta)]
        out = _range_ref(arrs, {})[0]
        return [out_type(dtype, out.shape, out if out.size <= MAX_VALUE_SIZE else None)]
    if not is_static(delta) or delta == 0:
        return [out_type(dtype, (ctx.fresh("range"),))]
    if delta > 0:
        n = dmax(ceil_div(limit - start, delta), 0)
    else:
        n = dmax(ceil_div(start - limit, -delta), 0)
    return [out_type(dtype, (n,))]


register("Range", reference=_range_ref, infer=_range_infer)


# ----------------------------------------------------------------------------------------------------
# Reshape, Flatten, Squeeze, Unsqueeze, Transpose
# ----------------------------------------------------------------------------------------------------
def _reshape_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    shape = _ref_arg(inputs, 1, attrs, "shape")
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


def quotient(ctx: Any, num: list, den: list, what: str) -> Any:
    """prod(num) // prod(den), exact: equal factors cancel first, and the divisibility it needs is recorded.

    A symbolic divisor that may be 0 cannot divide: the result is then a fresh dim q with q * divisor == num.
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
        q = ctx.fresh(what)
        ctx.require(eq(q * k, n))
        return q
    ctx.require(eq(r, 0))
    return q


def reshape_dims(ctx: Any, in_shape: tuple, target: list, allowzero: bool) -> list:
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
            # a symbolic entry that might be 0 or -1 would switch meaning at run time: pin it
            ctx.require(t >= 1)
        out.append(t)
    if infer_at is None:
        require_eq(ctx, *cancel(list(in_shape), out), "element count")
    else:
        out[infer_at] = quotient(ctx, list(in_shape), out[:infer_at] + out[infer_at + 1 :], "the -1 dim")
    return out


def _reshape_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    target = _arg(ctx, 1, "shape")
    if target is None:
        n = _static_len(ctx, ctx.inputs[1])
        return [out_type(x.dtype, [ctx.fresh("reshape") for _ in range(n)])]
    shape = reshape_dims(ctx, x.shape, target, bool(ctx.attr("allowzero", 0)))
    value = apply_value(x, lambda v: v.reshape(shape), x.dtype) if static_shape(shape) else None
    return [out_type(x.dtype, shape, value)]


register("Reshape", reference=_reshape_ref, infer=_reshape_infer)


def _flatten_axis(a: int, rank: int) -> int:
    """Flatten's axis lies in [-rank, rank] (rank itself meaning "everything in the first dim")."""
    return a + rank if a < 0 else a


def _flatten_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    a = _flatten_axis(attrs.get("axis", 1), x.ndim)
    return [x.reshape(int(np.prod(x.shape[:a])), int(np.prod(x.shape[a:])))]


def _flatten_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    a = _flatten_axis(ctx.attr("axis", 1), x.rank)
    shape = (prod(x.shape[:a]), prod(x.shape[a:]))
    value = apply_value(x, lambda v: v.reshape(shape), x.dtype) if static_shape(shape) else None
    return [out_type(x.dtype, shape, value)]


register("Flatten", reference=_flatten_ref, infer=_flatten_infer)


def _squeeze_ref(inputs: list, attrs: dict) -> list:
    axes = _ref_arg(inputs, 1, attrs, "axes")
    x = inputs[0]
    return [np.squeeze(x, axis=None if axes is None else tuple(axis_of(a, x.ndim) for a in axes))]


def _squeeze_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    if _arg_given(ctx, 1, "axes"):
        axes = _arg(ctx, 1, "axes")
        if axes is None or not all(is_static(a) for a in axes):  # which dims go is data: rank known, dims not
            n = x.rank - _static_len(ctx, ctx.inputs[1])
            return [out_type(x.dtype, [ctx.fresh("squeeze") for _ in range(n)])]
        axes = {axis_of(a, x.rank) for a in axes}
        for a in axes:
            require_eq(ctx, x.shape[a], 1, f"Squeeze: dim {a} must be 1")
    else:
        axes = set()
        for i, d in enumerate(x.shape):
            one = dim_eq(d, 1)
            if one is None:
                ctx.error(f"without axes, cannot tell whether dim {i} ({d}) is 1", fix="give axes")
            if one:
                axes.add(i)
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    return [out_type(x.dtype, shape, apply_value(x, lambda v: v.reshape(shape), x.dtype))]


register("Squeeze", reference=_squeeze_ref, infer=_squeeze_infer)


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
    return [x.reshape(_unsqueeze_shape(x.shape, _ref_arg(inputs, 1, attrs, "axes")))]


def _unsqueeze_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    axes = _arg(ctx, 1, "axes")
    if axes is None or not all(is_static(a) for a in axes):  # where the 1s go is data: rank known, dims not
        n = x.rank + _static_len(ctx, ctx.inputs[1])
        return [out_type(x.dtype, [ctx.fresh("unsqueeze") for _ in range(n)])]
    shape = _unsqueeze_shape(x.shape, axes)
    return [out_type(x.dtype, shape, apply_value(x, lambda v: v.reshape(shape), x.dtype))]


register("Unsqueeze", reference=_unsqueeze_ref, infer=_unsqueeze_infer)


def _perm(attrs_get: Any, rank: int) -> list[int]:
    p = attrs_get("perm", None)
    return list(range(rank))[::-1] if p is None else [axis_of(a, rank) for a in p]


def _transpose_ref(inputs: list, attrs: dict) -> list:
    return [np.transpose(inputs[0], _perm(attrs.get, inputs[0].ndim))]


def _transpose_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    perm = _perm(ctx.attr, x.rank)
    value = apply_value(x, lambda v: np.transpose(v, perm), x.dtype)
    return [out_type(x.dtype, [x.shape[p] for p in perm], value)]


register("Transpose", reference=_transpose_ref, infer=_transpose_infer)


# ----------------------------------------------------------------------------------------------------
# Concat, Split, Slice
# ----------------------------------------------------------------------------------------------------
def _concat_ref(inputs: list, attrs: dict) -> list:
    xs = [x for x in inputs if x is not None]
    return [np.concatenate(xs, axis=axis_of(attrs["axis"], xs[0].ndim))]


def _concat_infer(ctx: Any) -> list:
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


register("Concat", reference=_concat_ref, infer=_concat_infer)


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
    sizes = _split_sizes(x.shape[a], attrs.get, _ref_arg(inputs, 1, attrs, "split"), attrs.get("_num_outputs", 1))
    return np.split(x, np.cumsum(sizes)[:-1], axis=a)


def _split_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    a = axis_of(ctx.attr("axis", 0), x.rank)
    n_out = ctx.num_outputs
    split = _arg(ctx, 1, "split")
    if split is None and _arg_given(ctx, 1, "split"):
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


register("Split", reference=_split_ref, infer=_split_infer)


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
        axes, steps = _ref_arg(inputs, 3, attrs), _ref_arg(inputs, 4, attrs)
    index = [slice(None)] * x.ndim
    for a, s, e, t in _slice_params(x.ndim, starts, ends, axes, steps):
        s, e, _ = slice_bounds(x.shape[a], s, e, t)
        index[a] = slice(s, None if e < 0 else e, t)
    return [x[tuple(index)]]


def _slice_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    if ctx.opset < 10:
        params = [None] * 4
        starts, ends, axes, steps = _arg(ctx, None, "starts"), _arg(ctx, None, "ends"), _arg(ctx, None, "axes"), None
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
# Gather, GatherElements, GatherND, ScatterND, ScatterElements, Scatter
# ----------------------------------------------------------------------------------------------------
def _gather_ref(inputs: list, attrs: dict) -> list:
    x, idx = inputs
    return [np.take(x, idx.astype(np.int64), axis=axis_of(attrs.get("axis", 0), x.ndim))]


def _gather_infer(ctx: Any) -> list:
    x, idx = ctx.inputs[:2]
    a = axis_of(ctx.attr("axis", 0), x.rank)
    shape = list(x.shape[:a]) + list(idx.shape) + list(x.shape[a + 1 :])
    value = None
    iv = value_list(idx)
    if x.value is not None and iv is not None and all(is_static(i) for i in iv):
        taken = np.take(np.asarray(x.value), np.array(iv, dtype=np.int64).reshape(idx.shape), axis=a)
        value = make_value(taken, x.dtype)
    return [out_type(x.dtype, shape, value)]


register("Gather", reference=_gather_ref, infer=_gather_infer)


def _positive(idx: np.ndarray, dim: Any) -> np.ndarray:
    idx = idx.astype(np.int64)
    return np.where(idx < 0, idx + dim, idx)


def _gather_elements_ref(inputs: list, attrs: dict) -> list:
    x, idx = inputs
    a = axis_of(attrs.get("axis", 0), x.ndim)
    return [np.take_along_axis(x, _positive(idx, x.shape[a]), axis=a)]


def _indices_shaped_infer(ctx: Any) -> list:
    """Output shaped like input 1 (the indices), typed like input 0."""
    return [out_type(ctx.inputs[0].dtype, ctx.inputs[1].shape)]


register("GatherElements", reference=_gather_elements_ref, infer=_indices_shaped_infer)


def _gather_nd_ref(inputs: list, attrs: dict) -> list:
    x, idx = inputs
    b = int(attrs.get("batch_dims", 0))
    k = idx.shape[-1]
    idx = _positive(idx, np.array(x.shape[b : b + k]))
    nb = int(np.prod(x.shape[:b]))
    flat_x = x.reshape((nb, *x.shape[b:]))
    flat_i = idx.reshape(nb, -1, k)
    batch = np.arange(nb)[:, None]
    out = flat_x[(batch, *np.moveaxis(flat_i, -1, 0))]
    return [out.reshape(idx.shape[:-1] + x.shape[b + k :])]


def _gather_nd_infer(ctx: Any) -> list:
    x, idx = ctx.inputs[:2]
    b, k = int(ctx.attr("batch_dims", 0)), idx.shape[-1]
    if not is_static(k):
        ctx.error("the last indices dim must be static")
    return [out_type(x.dtype, list(idx.shape[:-1]) + list(x.shape[b + int(k) :]))]


register("GatherND", reference=_gather_nd_ref, infer=_gather_nd_infer)

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_into(x: np.ndarray, where: tuple, upd: np.ndarray, reduction: str) -> np.ndarray:
    out = x.copy()
    if reduction == "none":
        out[where] = upd
    else:
        _REDUCE[reduction].at(out, where, upd)
    return out


def _scatter_nd_ref(inputs: list, attrs: dict) -> list:
    x, idx, upd = inputs
    k = idx.shape[-1]
    idx = _positive(idx, np.array(x.shape[:k])).reshape(-1, k)
    where = tuple(idx.T)
    return [_scatter_into(x, where, upd.reshape((-1, *x.shape[k:])), attrs.get("reduction", "none"))]


def _scatter_elements_ref(inputs: list, attrs: dict) -> list:
    x, idx, upd = inputs
    a = axis_of(attrs.get("axis", 0), x.ndim)
    where = list(np.indices(idx.shape, sparse=True))
    where[a] = _positive(idx, x.shape[a])
    return [_scatter_into(x, tuple(where), upd, attrs.get("reduction", "none"))]


def _same_as_input_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    return [out_type(x.dtype, x.shape)]


register("ScatterND", reference=_scatter_nd_ref, infer=_same_as_input_infer)
register("ScatterElements", reference=_scatter_elements_ref, infer=_same_as_input_infer)
register("Scatter", reference=_scatter_elements_ref, infer=_same_as_input_infer)


# ----------------------------------------------------------------------------------------------------
# Expand, Tile, Pad
# ----------------------------------------------------------------------------------------------------
def _expand_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    return [np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(ints(inputs[1])))).copy()]


def _expand_infer(ctx: Any) -> list:
    x, s = ctx.inputs[:2]
    target = value_list(s)
    if target is None:  # a dim of x that cannot be 1 survives any broadcast; the others are data
        n = max(_static_len(ctx, s), x.rank)
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


def _tile_infer(ctx: Any) -> list:
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


def _pad_args(inputs: list, attrs: dict) -> tuple[list[int], Any, list[int] | None]:
    """(pads, constant value, axes): attributes before opset 11, inputs after."""
    if attrs.get("_opset", 18) < 11:
        pads = attrs.get("pads", attrs.get("paddings"))
        return ints(pads), attrs.get("value", 0.0), None
    value = inputs[2] if len(inputs) > 2 and inputs[2] is not None and inputs[2].size else 0
    return ints(inputs[1]), np.asarray(value).reshape(-1)[0], _ref_arg(inputs, 3, {})


def _pad_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    pads, value, axes = _pad_args(inputs, attrs)
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


def _pad_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    if ctx.opset < 11:
        pads, axes = _arg(ctx, None, "pads") or _arg(ctx, None, "paddings"), None
    else:
        pads, axes = value_list(ctx.inputs[1]), _arg(ctx, 3)
    if axes is None and _arg_given(ctx, 3):
        return [out_type(x.dtype, [ctx.fresh("pad") for _ in x.shape])]
    axes = list(range(x.rank)) if axes is None else [axis_of(a, x.rank) for a in axes]
    shape = list(x.shape)
    for i, a in enumerate(axes):
        shape[a] = ctx.fresh("pad") if pads is None else shape[a] + pads[i] + pads[len(axes) + i]
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


def _depth_to_space_infer(ctx: Any) -> list:
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


def _space_to_depth_infer(ctx: Any) -> list:
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


register("Trilu", reference=_trilu_ref, infer=_same_as_input_infer)


def _one_hot_ref(inputs: list, attrs: dict) -> list:
    idx, depth, values = inputs
    depth = int(np.asarray(depth).reshape(-1)[0])
    a = axis_of(attrs.get("axis", -1), idx.ndim + 1)
    idx = np.expand_dims(_positive(idx, depth), a)
    hot = np.arange(depth).reshape([depth if i == a else 1 for i in range(idx.ndim)]) == idx
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


def _one_hot_infer(ctx: Any) -> list:
    idx, depth, values = ctx.inputs[:3]
    d = value_list(depth)
    d = ctx.fresh("one_hot") if d is None else (int(d[0]) if isinstance(d[0], float) else d[0])
    shape = list(idx.shape)
    shape.insert(axis_of(ctx.attr("axis", -1), idx.rank + 1), d)
    return [out_type(values.dtype, shape)]


register("OneHot", reference=_one_hot_ref, infer=_one_hot_infer)


def _eye_dtype(get: Any, x_dtype: np.dtype) -> np.dtype:
    code = get("dtype", None)
    if code is None:
        return np.dtype(x_dtype)
    from onnx.helper import tensor_dtype_to_np_dtype

    return np.dtype(tensor_dtype_to_np_dtype(int(code)))


def _eye_like_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    return [np.eye(x.shape[0], x.shape[1], int(attrs.get("k", 0)), dtype=_eye_dtype(attrs.get, x.dtype))]


def _eye_like_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    return [out_type(_eye_dtype(ctx.attr, x.dtype), x.shape)]


register("EyeLike", reference=_eye_like_ref, infer=_eye_like_infer)


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


register("ReverseSequence", reference=_reverse_sequence_ref, infer=_same_as_input_infer)


# ----------------------------------------------------------------------------------------------------
# data-dependent sizes: NonZero, Compress, Unique
# ----------------------------------------------------------------------------------------------------
def _non_zero_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    if x.ndim == 0:
        return [np.zeros((0, int(bool(x))), dtype=np.int64)]
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


def _non_zero_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    return [out_type(I64, (x.rank, ctx.fresh("nonzero")))]


register("NonZero", reference=_non_zero_ref, infer=_non_zero_infer)


def _compress_ref(inputs: list, attrs: dict) -> list:
    x, cond = inputs
    a = attrs.get("axis")
    return [np.compress(cond.astype(bool), x, axis=None if a is None else axis_of(a, x.ndim))]


def _compress_infer(ctx: Any) -> list:
    x, cond = ctx.inputs[:2]
    cv = value_list(cond)
    n = ctx.fresh("compress") if cv is None else sum(bool(c) for c in cv)
    a = ctx.attr("axis", None)
    if a is None:
        return [out_type(x.dtype, (n,))]
    shape = list(x.shape)
    shape[axis_of(a, x.rank)] = n
    return [out_type(x.dtype, shape)]


register("Compress", reference=_compress_ref, infer=_compress_infer)


def _unique_ref(inputs: list, attrs: dict) -> list:
    x, a = inputs[0], attrs.get("axis")
    a = None if a is None else axis_of(a, x.ndim)
    y, first, inv, counts = np.unique(
        x.reshape(-1) if a is None else x, axis=a, return_index=True, return_inverse=True, return_counts=True
    )
    inv = inv.reshape(-1)
    if not attrs.get("sorted", 1):  # order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        y, first, inv, counts = np.take(y, order, axis=0 if a is None else a), first[order], rank[inv], counts[order]
    return [y, first.astype(np.int64), inv.astype(np.int64), counts.astype(np.int64)]


def _unique_infer(ctx: Any) -> list:
    x, a = ctx.inputs[0], ctx.attr("axis", None)
    u = ctx.fresh("unique")
    if a is None:
        y, n = (u,), prod(x.shape)
    else:
        a = axis_of(a, x.rank)
        y, n = tuple(u if i == a else d for i, d in enumerate(x.shape)), x.shape[a]
    return [out_type(x.dtype, y), out_type(I64, (u,)), out_type(I64, (n,)), out_type(I64, (u,))]


register("Unique", reference=_unique_ref, infer=_unique_infer)


# ----------------------------------------------------------------------------------------------------
# Resize, Upsample
# ----------------------------------------------------------------------------------------------------
def _source_coords(ctm: str, y: np.ndarray, scale: float, n_in: int, n_out: int, roi: Any) -> tuple:
    """Output index -> input coordinate for one axis (and, for tf_crop_and_resize, the out-of-input mask)."""
    width = scale * n_in
    if ctm == "align_corners":
        return (np.zeros_like(y) if width == 1 else y * (n_in - 1) / (width - 1)), None
    if ctm == "asymmetric":
        return y / scale, None
    if ctm == "pytorch_half_pixel":
        return (np.full_like(y, -0.5) if width == 1 else (y + 0.5) / scale - 0.5), None
    if ctm == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if ctm == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        return offset + (y + 0.5) / scale - 0.5, None
    if ctm == "tf_crop_and_resize":
        lo, hi = roi  # numpy scalars of roi's dtype: rounding as in the spec's reference
        if width == 1:
            x = np.full_like(y, (hi - lo) * (n_in - 1) / 2)
        else:
            x = y * (hi - lo) * (n_in - 1) / (width - 1)
        x = x + lo * (n_in - 1)
        return x, (x < 0) | (x > n_in - 1)
    raise ValueError(f"unknown coordinate_transformation_mode {ctm!r}")


def _cubic(r: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic weights of the 4 neighbours at fractional offset r (ONNX's formula, verbatim)."""
    s, t = r + 1, 2 - r
    return np.stack(
        [
            ((a * s - 5 * a) * s + 8 * a) * s - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
            ((a * t - 5 * a) * t + 8 * a) * t - 4 * a,
        ],
        axis=-1,
    )


def _antialias(r: np.ndarray, scale: float, support: int, kernel: Any) -> np.ndarray:
    """Weights of a filter stretched by 1/scale when downsampling, normalised per output position."""
    s = min(scale, 1.0)
    start = int(np.floor(-support / s) + 1)
    args = (np.arange(start, 2 - start)[None, :] - r[:, None]) * s
    w = kernel(np.abs(args))
    return w / w.sum(axis=1, keepdims=True)


def _cubic_kernel(a: float) -> Any:
    def k(x: np.ndarray) -> np.ndarray:
        near = (a + 2) * x**3 - (a + 3) * x**2 + 1
        far = a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a
        return np.where(x <= 1, near, np.where(x < 2, far, 0.0))

    return k


def _weights(mode: str, r: np.ndarray, scale: float, attrs: dict) -> np.ndarray:
    a = float(attrs.get("cubic_coeff_a", -0.75))
    if mode == "linear":
        if attrs.get("antialias", 0):
            return _antialias(r, scale, 1, lambda x: np.clip(1 - x, 0, 1))
        return np.stack([1 - r, r], axis=-1)
    if attrs.get("antialias", 0):
        return _antialias(r, scale, 2, _cubic_kernel(a))
    return _cubic(r, a)


_ROUND = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


def _resize_axis(x: np.ndarray, axis: int, scale: float, n_out: int, roi: Any, attrs: dict) -> np.ndarray:
    """Resize one axis; Resize is separable, so an N-d resize is one call per resized axis."""
    n_in = x.shape[axis]
    coords, outside = _source_coords(attrs["ctm"], np.arange(n_out, dtype=np.float64), scale, n_in, n_out, roi)
    mode = attrs.get("mode", "nearest")
    if mode == "nearest":
        src = np.where(coords == np.floor(coords), coords, _ROUND[attrs["nearest_mode"]](coords))
        y = np.take(x, np.clip(src, 0, n_in - 1).astype(np.intp), axis=axis)
    else:
        base = np.floor(coords)
        r = np.where(coords == base, 1.0, coords - base)  # ONNX prefers the left pixel: r in (0, 1]
        w = _weights(mode, r, scale, attrs)
        n = w.shape[1]
        # the n neighbours nearest to the coordinate, ties to the smaller index (ONNX's _get_neighbor_idxes)
        pw = -(-n // 2)
        p = np.floor(coords + pw)
        frac = coords + pw - p
        if n % 2 == 0:
            off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
        else:
            off = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
        nb = (p + off).astype(np.int64)[:, None] + np.arange(n)[None, :] - pw
        if attrs.get("exclude_outside", 0):
            w = np.where((nb < 0) | (nb >= n_in), 0.0, w)
            total = w.sum(axis=1, keepdims=True)
            w = w / np.where(total == 0, 1.0, total)
        g = np.take(x, np.clip(nb, 0, n_in - 1).astype(np.intp), axis=axis)
        y = (g * w.reshape((1,) * axis + w.shape + (1,) * (x.ndim - axis - 1))).sum(axis=axis + 1)
    if outside is not None and outside.any():
        mask = outside.reshape((1,) * axis + (n_out,) + (1,) * (x.ndim - axis - 1))
        y = np.where(mask, float(attrs.get("extrapolation_value", 0.0)), y)
    return y


def _resize_plan(shape: tuple, scales: list | None, sizes: list | None, axes: list, policy: str) -> tuple:
    """(output sizes, scale factors) for concrete dims, exactly as ONNX computes them."""
    r = len(shape)
    if sizes is not None:
        out = list(shape)
        for a, s in zip(axes, sizes):
            out[a] = int(s)
        factors = [out[i] / shape[i] if shape[i] else 1.0 for i in range(r)]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            k = pick(factors[a] for a in axes)
            factors = [k if i in axes else 1.0 for i in range(r)]
            out = [int(k * shape[i] + 0.5) if i in axes else shape[i] for i in range(r)]
        return out, factors
    factors = [1.0] * r
    for a, s in zip(axes, scales):
        factors[a] = float(s)
    return [_scaled(d, f) for d, f in zip(shape, factors)], factors


def _scaled(d: Any, scale: float) -> Any:
    """floor(d * scale), exact: the float scale is an exact binary fraction p/q, so this is (d*p)//q."""
    f = Fraction(scale)
    return (norm(d) * f.numerator) // f.denominator


def _resize_args(inputs: list, opset: int) -> tuple:
    """(roi, scales, sizes) by position; Resize-10 and Upsample-9 have only X, scales."""
    if opset < 11:
        return None, inputs[1], None

    def get(i: int) -> Any:
        v = inputs[i] if len(inputs) > i else None
        return None if v is None or v.size == 0 else v

    return get(1), get(2), get(3)


def _resize_ref(inputs: list, attrs: dict) -> list:
    x, opset = inputs[0], attrs.get("_opset", 19)
    roi, scales, sizes = _resize_args(inputs, opset)
    axes = attrs.get("axes")
    axes = list(range(x.ndim)) if axes is None else [axis_of(a, x.ndim) for a in axes]
    old = opset < 11
    attrs = {
        **attrs,
        "ctm": "asymmetric" if old else attrs.get("coordinate_transformation_mode", "half_pixel"),
        "nearest_mode": "floor" if old else attrs.get("nearest_mode", "round_prefer_floor"),
    }
    out, factors = _resize_plan(
        x.shape,
        None if scales is None else scales.tolist(),
        None if sizes is None else ints(sizes),
        axes,
        attrs.get("keep_aspect_ratio_policy", "stretch"),
    )
    roi = None if roi is None else np.asarray(roi).reshape(-1)
    y = x.astype(np.float64)
    for i, a in enumerate(axes):
        lohi = None if roi is None else (roi[i], roi[len(axes) + i])
        identity = math.isclose(factors[a], 1.0) and out[a] == y.shape[a]
        if identity and (lohi is None or (math.isclose(lohi[0], 0.0) and math.isclose(lohi[1], 1.0))):
            continue
        y = _resize_axis(y, a, factors[a], out[a], lohi, attrs)
    if np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        y = np.clip(np.round(y), info.min, info.max)
    return [y.astype(x.dtype)]


def _resize_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    idx = (1, None) if ctx.opset < 11 else (2, 3)
    axes = ctx.attr("axes", None)
    axes = list(range(x.rank)) if axes is None else [axis_of(a, x.rank) for a in axes]
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    shape = list(x.shape)

    def param(i: int | None) -> tuple[bool, list | None]:
        t = ctx.inputs[i] if i is not None and len(ctx.inputs) > i else None
        if t is None or (t.shape and is_static(t.shape[0]) and t.shape[0] == 0):
            return False, None
        return True, value_list(t)

    (has_scales, scales), (has_sizes, sizes) = param(idx[0]), param(idx[1])
    if ctx.opset < 9 and ctx.op_type == "Upsample":
        has_scales, scales = True, list(ctx.attr("scales", []))
    if has_sizes and sizes is not None and policy == "stretch":
        for a, s in zip(axes, sizes):
            shape[a] = s
    elif has_sizes and sizes is not None and static_shape(shape) and all(is_static(s) for s in sizes):
        shape = _resize_plan(tuple(shape), None, sizes, axes, policy)[0]
    elif not has_sizes and has_scales and scales is not None:
        for a, s in zip(axes, scales):
            shape[a] = _scaled(shape[a], float(s))
    else:
        for a in axes:
            shape[a] = ctx.fresh("resize")
    return [out_type(x.dtype, shape)]


register("Resize", reference=_resize_ref, infer=_resize_infer)


def _upsample_ref(inputs: list, attrs: dict) -> list:
    scales = np.asarray(attrs["scales"], dtype=np.float32) if attrs.get("_opset", 9) < 9 else inputs[1]
    return _resize_ref([inputs[0], scales], {**attrs, "_opset": 10})


register("Upsample", reference=_upsample_ref, infer=_resize_infer)
