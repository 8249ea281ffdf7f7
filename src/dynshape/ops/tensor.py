"""Shape-manipulation and shape-arithmetic ops: numpy references and exact symbolic shape rules.

Exporters compute shapes at run time (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, Shape -> Slice, Range,
ConstantOfShape). To keep those shapes exact, the rules here propagate `TensorType.value` (an array of
`int | Expr`) whenever the data input's value is known; a dimension becomes a fresh symbol (`ctx.fresh`) only
when its size truly depends on tensor data.

Dims are `int | Expr`; the helpers below use plain Python arithmetic on ints and the symbolic engine otherwise,
so every rule also works on fully static shapes.
"""

from __future__ import annotations

import importlib
import math
from fractions import Fraction
from typing import Any

import numpy as np

from dynshape.ir.types import TensorType
from dynshape.ops.registry import register

I64 = np.dtype(np.int64)
# An index at least this large (in magnitude) means "past the end": no array can have a dim this big.
HUGE = 2**62
# Largest value array a growing op (Expand, Tile, ConstantOfShape, Range) materialises in a shape rule.
MAX_VALUE_SIZE = 1 << 16


# ---------------------------------------------------------------------------------------------------------------
# dim helpers (int fast path, symbolic engine otherwise)
# ---------------------------------------------------------------------------------------------------------------
def _sym() -> Any:
    """The symbolic engine, imported late: plain-int rules must not depend on it."""
    return importlib.import_module("dynshape.sym")


def is_static(d: Any) -> bool:
    return isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_))


def norm(x: Any) -> Any:
    """numpy ints -> int (Expr arithmetic only has to understand Python ints)."""
    return int(x) if isinstance(x, np.integer) else x


def decide(cond: Any) -> bool | None:
    """True / False / None (unknown) for a comparison built from ints or Exprs."""
    if isinstance(cond, (bool, np.bool_)):
        return bool(cond)
    return _sym().prove(cond)


def dim_eq(a: Any, b: Any) -> bool | None:
    if is_static(a) and is_static(b):
        return int(a) == int(b)
    return _sym().prove(_sym().eq(a, b))


def dmin(a: Any, b: Any) -> Any:
    return min(a, b) if is_static(a) and is_static(b) else _sym().min_(a, b)


def dmax(a: Any, b: Any) -> Any:
    return max(a, b) if is_static(a) and is_static(b) else _sym().max_(a, b)


def ceil_div(a: Any, b: Any) -> Any:
    return -(-a // b) if is_static(a) and is_static(b) else _sym().ceil_div(a, b)


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
        ctx.require(_sym().eq(a, b))


def require_divides(ctx: Any, k: Any, e: Any, what: str) -> None:
    """Record that `k` divides `e` (needed by an exact `e // k`)."""
    if is_static(k) and is_static(e):
        if k == 0 or e % k:
            ctx.error(f"{what}: {k} does not divide {e}")
    elif not (is_static(k) and k == 1):
        ctx.require(_sym().divides(k, e))


def axis_of(a: Any, rank: int) -> int:
    a = int(a)
    if not -rank <= a < max(rank, 1):
        raise ValueError(f"axis {a} out of range for rank {rank}")
    return a + rank if a < 0 else a


# ---------------------------------------------------------------------------------------------------------------
# value helpers
# ---------------------------------------------------------------------------------------------------------------
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


def _arg(ctx: Any, idx: int, attr: str, default: Any = None) -> list | None:
    """Values of an op parameter that moved from an attribute to input `idx` in newer opsets."""
    if len(ctx.inputs) > idx and ctx.inputs[idx] is not None:
        return value_list(ctx.inputs[idx])
    v = ctx.attr(attr, None)
    return default if v is None else [norm(x) for x in np.asarray(v).reshape(-1).tolist()]


def _arg_given(ctx: Any, idx: int, attr: str) -> bool:
    return (len(ctx.inputs) > idx and ctx.inputs[idx] is not None) or ctx.attr(attr, None) is not None


def _ref_arg(inputs: list, idx: int, attrs: dict, attr: str) -> list[int] | None:
    if len(inputs) > idx and inputs[idx] is not None:
        return ints(inputs[idx])
    return None if attrs.get(attr) is None else ints(attrs[attr])


def _n_outputs(ctx: Any) -> int:
    return int(getattr(ctx, "num_outputs", 1))


# ---------------------------------------------------------------------------------------------------------------
# Shape, Size, Constant, ConstantOfShape, Range
# ---------------------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------------------
# Reshape, Flatten, Squeeze, Unsqueeze, Transpose
# ---------------------------------------------------------------------------------------------------------------
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
    """prod(num) // prod(den), exact: equal factors cancel first, and the divisibility it needs is recorded."""
    n, k = cancel(num, den)
    if is_static(k) and k == 0:
        ctx.error(f"{what}: cannot infer a dim next to a zero-sized one")
    require_divides(ctx, k, n, what)
    return n // k


def reshape_dims(ctx: Any, in_shape: tuple, target: list, allowzero: bool) -> list:
    """ONNX Reshape semantics over `int | Expr`: 0 copies the input dim, -1 is inferred (exactly)."""
    out: list = []
    infer_at = None
    for i, t in enumerate(target):
        if is_static(t):
            if t == -1:
                if infer_at is not None:
                    ctx.error("Reshape: more than one -1 in the target shape")
                infer_at = i
            elif t == 0 and not allowzero:
                if i >= len(in_shape):
                    ctx.error(f"Reshape: 0 at position {i} copies a dim the input does not have")
                t = in_shape[i]
            elif t < 0:
                ctx.error(f"Reshape: invalid target dim {t}")
        elif not allowzero and not decide(t >= 1) and not (i < len(in_shape) and dim_eq(t, in_shape[i])):
            # a symbolic entry that might be 0 or -1 would switch meaning at run time: pin it
            ctx.require(t >= 1)
        out.append(t)
    if infer_at is None:
        require_eq(ctx, *cancel(list(in_shape), out), "Reshape element count")
    else:
        out[infer_at] = quotient(ctx, list(in_shape), out[:infer_at] + out[infer_at + 1 :], "Reshape -1")
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


def _flatten_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    a = axis_of(attrs.get("axis", 1), x.ndim + 1)
    return [x.reshape(int(np.prod(x.shape[:a])), int(np.prod(x.shape[a:])))]


def _flatten_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    a = axis_of(ctx.attr("axis", 1), x.rank + 1)
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
        if axes is None or not all(is_static(a) for a in axes):
            ctx.error("Squeeze: axes must be known at compile time")
        axes = {axis_of(a, x.rank) for a in axes}
        for a in axes:
            require_eq(ctx, x.shape[a], 1, f"Squeeze: dim {a} must be 1")
    else:
        axes = set()
        for i, d in enumerate(x.shape):
            one = dim_eq(d, 1)
            if one is None:
                ctx.error(f"Squeeze without axes: cannot tell whether dim {i} ({d}) is 1", fix="give axes")
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
    if axes is None or not all(is_static(a) for a in axes):
        ctx.error("Unsqueeze: axes must be known at compile time")
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


# ---------------------------------------------------------------------------------------------------------------
# Concat, Split, Slice
# ---------------------------------------------------------------------------------------------------------------
def _concat_ref(inputs: list, attrs: dict) -> list:
    xs = [x for x in inputs if x is not None]
    return [np.concatenate(xs, axis=axis_of(attrs["axis"], xs[0].ndim))]


def _concat_infer(ctx: Any) -> list:
    xs = [t for t in ctx.inputs if t is not None]
    a = axis_of(ctx.attr("axis", 0), xs[0].rank)
    shape = list(xs[0].shape)
    for t in xs[1:]:
        if t.rank != len(shape):
            ctx.error(f"Concat: rank {t.rank} != {len(shape)}")
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
    n_out = _n_outputs(ctx)
    split = _arg(ctx, 1, "split")
    if split is None and _arg_given(ctx, 1, "split"):
        sizes = [ctx.fresh("split") for _ in range(n_out)]
        ctx.require(_sym().eq(sum(sizes), x.shape[a]))
    else:
        sizes = _split_sizes(x.shape[a], ctx.attr, split, n_out)
        if split is not None:
            require_eq(ctx, sum(split, 0), x.shape[a], "Split sizes must add up to the dim")
        elif not ctx.attr("num_outputs", None):
            require_divides(ctx, len(sizes), x.shape[a], "Split into equal parts")
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
        axes, steps = _ref_arg(inputs, 3, attrs, "_"), _ref_arg(inputs, 4, attrs, "_")
    index = [slice(None)] * x.ndim
    for a, s, e, t in _slice_params(x.ndim, starts, ends, axes, steps):
        s, e, _ = slice_bounds(x.shape[a], s, e, t)
        index[a] = slice(s, None if e < 0 else e, t)
    return [x[tuple(index)]]


def _slice_infer(ctx: Any) -> list:
    x = ctx.inputs[0]
    if ctx.opset < 10:
        params = [None] * 4
        starts, ends, axes, steps = _arg(ctx, 99, "starts"), _arg(ctx, 99, "ends"), _arg(ctx, 99, "axes"), None
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
