"""Ops that make shape values: Shape, Size, Constant, ConstantOfShape, Range.

Exporters compute shapes at run time (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, Range, ConstantOfShape).
To keep those shapes exact, the rules here propagate `TensorType.value` (an array of `int | Expr`) whenever the
inputs' values are known; a dimension becomes a fresh symbol (`ctx.fresh`) only when it truly depends on data.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ops import dtypes as dt
from dynshape.ops.dims import (
    I64,
    MAX_VALUE_SIZE,
    ceil_div,
    dmax,
    ints,
    is_static,
    make_value,
    norm,
    out_type,
    prod,
    static_len,
    static_shape,
    value_list,
)


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


def _shape_infer(ctx: InferCtx) -> list:
    dims = ctx.inputs[0].shape
    s, e = _shape_bounds(len(dims), ctx.attr)
    return [out_type(I64, (e - s,), make_value(list(dims[s:e]), I64, (e - s,)))]


register("Shape", reference=_shape_ref, infer=_shape_infer)


def _size_ref(inputs: list, attrs: dict) -> list:
    return [np.array(inputs[0].size, dtype=np.int64)]


def _size_infer(ctx: InferCtx) -> list:
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


def _constant_infer(ctx: InferCtx) -> list:
    v = _constant_value(ctx.attr)
    return [out_type(v.dtype, v.shape, v)]


register("Constant", reference=_constant_ref, infer=_constant_infer)


def _fill_value(get: Any) -> np.ndarray:
    v = get("value", None)
    return np.zeros(1, dtype=np.float32) if v is None else np.asarray(v).reshape(-1)


def _constant_of_shape_ref(inputs: list, attrs: dict) -> list:
    v = _fill_value(attrs.get)
    return [np.full(ints(inputs[0]), v[0], dtype=v.dtype)]


def _constant_of_shape_infer(ctx: InferCtx) -> list:
    v = _fill_value(ctx.attr)
    shape = value_list(ctx.inputs[0])
    if shape is None:
        shape = [ctx.fresh("const_of_shape") for _ in range(static_len(ctx, ctx.inputs[0]))]
    value = None
    if static_shape(shape) and prod(shape) <= MAX_VALUE_SIZE:
        value = np.full(shape, v[0], dtype=v.dtype)
    return [out_type(v.dtype, shape, value)]



register("ConstantOfShape", reference=_constant_of_shape_ref, infer=_constant_of_shape_infer)


def _range_count(start: Any, limit: Any, delta: Any) -> int:
    """How many elements Range(start, limit, delta) has; a zero or non-finite delta is refused (the sequence
    would never reach its limit: onnxruntime refuses it too)."""
    if not math.isfinite(float(delta)) or float(delta) == 0:
        raise ValueError(f"Range's delta is {delta}: it must be a finite non-zero number")
    if np.asarray(start).dtype.kind in "iu":
        return max(-(-(int(limit) - int(start)) // int(delta)), 0)
    span = (float(limit) - float(start)) / float(delta)
    if not np.isfinite(span):
        raise ValueError(f"Range({start}, {limit}, {delta}) has no finite length")
    return max(math.ceil(span), 0)


def _range_ref(inputs: list, attrs: dict) -> list:
    start, limit, delta = (np.asarray(x).reshape(()) for x in inputs)
    n = _range_count(start, limit, delta)
    return [(start + np.arange(n, dtype=start.dtype) * delta).astype(start.dtype)]


def _integral_float(v: Any) -> Any:
    """An integer-valued float as int, a dim expression as itself; None for anything else."""
    if isinstance(v, (float, np.floating)):
        return int(v) if math.isfinite(v) and float(v).is_integer() else None
    return norm(v) if is_static(v) or hasattr(v, "free_symbols") else None


def _range_infer(ctx: InferCtx) -> list:
    dtype = ctx.inputs[0].dtype
    vals = [value_list(t) for t in ctx.inputs[:3]]
    if any(v is None for v in vals):
        return [out_type(dtype, (ctx.fresh("range"),))]
    start, limit, delta = (v[0] for v in vals)
    if all(isinstance(v, (int, float)) for v in (start, limit, delta)):
        arrs = [np.asarray(v, dtype=dtype) for v in (start, limit, delta)]
        try:
            n = _range_count(*arrs)
        except ValueError as e:
            ctx.error(str(e))
        if n > MAX_VALUE_SIZE:  # its length is all inference needs: never materialise it here
            return [out_type(dtype, (n,))]
        out = _range_ref(arrs, {})[0]
        return [out_type(dtype, out.shape, out)]
    if dt.is_float(dtype):
        # a float Range over a size (YOLO's anchor grid: arange(0.0, float(w), 1.0)): with an integral start and
        # delta, (limit - start) / delta is rounded exactly as in `ops/elementwise._Quotient`, so the count is
        # ceil_div while |limit - start| < 2**p, which is assumed (larger sizes: an exact-shape build)
        integral = [_integral_float(v) for v in (start, limit, delta)]
        if any(v is None for v in integral) or integral[2] == 0:
            return [out_type(dtype, (ctx.fresh("range"),))]
        start, limit, delta = integral
        top = dt.exact_int_limit(dtype) - 1
        ctx.assume(limit - start <= top, f"the Range span {limit - start} is exact in {np.dtype(dtype)}")
        ctx.assume(start - limit <= top, f"the Range span {start - limit} is exact in {np.dtype(dtype)}")
    if is_static(delta) and delta == 0:
        ctx.error("Range's delta is 0: it must be a finite non-zero number")
    if not is_static(delta):
        return [out_type(dtype, (ctx.fresh("range"),))]
    if delta > 0:
        n = dmax(ceil_div(limit - start, delta), 0)
    else:
        n = dmax(ceil_div(start - limit, -delta), 0)
    return [out_type(dtype, (n,))]


register("Range", reference=_range_ref, infer=_range_infer)
