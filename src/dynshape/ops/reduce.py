"""Reductions, arg-reductions, TopK and cumulative ops: numpy references and symbolic shape rules.

Axes arrive as an attribute in older opsets and as an optional input in newer ones (ReduceSum from 13, the
rest from 18); both are accepted whatever the opset, since only one of them can be present in a valid model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import Layout, register
from dynshape.ir.types import TensorType
from dynshape.ops import dtypes as dt
from dynshape.sym import is_expr


def _axes_of(inputs: list, attrs: dict) -> list[int] | None:
    """Axes from input 1 or the `axes` attribute; None when absent (or given as an empty list)."""
    axes = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attrs.get("axes")
    if axes is None or len(np.atleast_1d(axes)) == 0:
        return None
    return [int(a) for a in np.atleast_1d(axes)]


def _acc_dtype(dtype: np.dtype) -> np.dtype:
    """Accumulate narrow floats in float32; integers in their own type (they wrap, like ONNX runtimes)."""
    if dt.is_float(dtype):
        return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
    return np.dtype(np.int64) if dtype.kind == "V" else dtype


def _identity_of(dtype: np.dtype, largest: bool) -> Any:
    """Value of Max/Min over an empty set: -inf/+inf for floats, the type's extreme for integers."""
    if dtype == np.bool_:
        return not largest
    if dt.is_float(dtype):
        return -np.inf if largest else np.inf
    info = np.iinfo(dtype)
    return info.min if largest else info.max


def _reduce(fn: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]) -> Callable[[list, dict], list]:
    """Reference of a Reduce* op from `fn(x_in_acc_dtype, axes) -> keepdims result`."""

    def ref(inputs: list, attrs: dict) -> list:
        x = inputs[0]
        axes = _axes_of(inputs, attrs)
        if axes is None:
            if attrs.get("noop_with_empty_axes", 0):
                return [x.copy()]
            axes = list(range(x.ndim))
        axes_t = tuple(sorted({a % x.ndim for a in axes})) if x.ndim else ()
        with np.errstate(all="ignore"):
            y = fn(x.astype(_acc_dtype(x.dtype), copy=False), axes_t)
        if not attrs.get("keepdims", 1):
            y = np.squeeze(y, axis=axes_t)
        return [np.asarray(y).astype(x.dtype)]

    return ref


def _sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return np.sum(x, axis=axes, keepdims=True, dtype=x.dtype)


def _extreme(largest: bool) -> Callable[[np.ndarray, tuple[int, ...]], np.ndarray]:
    def fn(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        f = np.max if largest else np.min
        return f(x, axis=axes, keepdims=True, initial=_identity_of(x.dtype, largest))

    return fn


def _log_sum_exp(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Stable logsumexp: shift by the max (an empty or all -inf slice yields -inf)."""
    m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0)
    return m + np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True))


_REDUCERS: dict[str, Callable[[np.ndarray, tuple[int, ...]], np.ndarray]] = {
    "ReduceSum": _sum,
    "ReduceMean": lambda x, ax: np.mean(x, axis=ax, keepdims=True, dtype=x.dtype),
    "ReduceMax": _extreme(True),
    "ReduceMin": _extreme(False),
    "ReduceProd": lambda x, ax: np.prod(x, axis=ax, keepdims=True, dtype=x.dtype),
    "ReduceL1": lambda x, ax: _sum(np.abs(x), ax),
    "ReduceL2": lambda x, ax: np.sqrt(_sum(x * x, ax)),
    "ReduceLogSum": lambda x, ax: np.log(_sum(x, ax)),
    "ReduceLogSumExp": _log_sum_exp,
    "ReduceSumSquare": lambda x, ax: _sum(x * x, ax),
}


# ----------------------------------------------------------------------------------------------------
# shape rules
# ----------------------------------------------------------------------------------------------------
def _const_ints(t: TensorType | None) -> list | None:
    """Elements of a known 0-D/1-D value (ints or Exprs), or None when unknown."""
    if t is None or t.value is None:
        return None
    return [e.item() if isinstance(e, np.generic) else e for e in np.asarray(t.value).ravel()]


def _rule_axes(ctx: InferCtx) -> tuple[bool, list[int] | None]:
    """(known, axes) for a Reduce* node: axes None means "none given"; known False means "input, unknown"."""
    if len(ctx.inputs) > 1 and ctx.inputs[1] is not None:
        vals = _const_ints(ctx.inputs[1])
        if vals is None or not all(isinstance(v, (int, np.integer)) for v in vals):
            return (True, None) if tuple(ctx.inputs[1].shape) == (0,) else (False, None)
        return True, [int(v) for v in vals] or None
    axes = ctx.attr("axes", None)
    return True, [int(a) for a in axes] if axes is not None and len(axes) else None


def _unknown_axes_shape(ctx: InferCtx, x: TensorType, keep: bool, name: str) -> tuple:
    """Axes known only at run time: each kept dim is 1 or unchanged, so it becomes a fresh dim; without
    keepdims the rank is still known when the axes input has a static length (and no repeats)."""
    if keep:
        return tuple(ctx.fresh(f"{name}_dim") for _ in x.shape)
    (k,) = tuple(ctx.inputs[1].shape) or (1,)
    k = ctx.static(k, "the number of axes (keepdims=0)")
    if k > len(x.shape):
        ctx.error(f"the axes input has {k} entries for a rank-{len(x.shape)} input (keepdims=0)")
    return tuple(ctx.fresh(f"{name}_dim") for _ in range(len(x.shape) - int(k)))


def _norm_axes(ctx: InferCtx, axes: list[int], rank: int) -> list[int]:
    out = []
    for a in axes:
        if not -rank <= a < max(rank, 1):
            ctx.error(f"axis {a} is out of range for rank {rank}")
        out.append(a % rank if rank else 0)
    return sorted(set(out))


def _product(vals: list) -> Any:
    out: Any = 1
    for v in vals:
        out = out * v
    return out


def _reduce_rule(name: str) -> Callable[[InferCtx], list[TensorType]]:
    def infer(ctx: InferCtx) -> list[TensorType]:
        x = ctx.inputs[0]
        keep = bool(ctx.attr("keepdims", 1))
        known, axes = _rule_axes(ctx)
        rank = len(x.shape)
        if not known:
            return [TensorType(x.dtype, _unknown_axes_shape(ctx, x, keep, name))]
        if axes is None:
            if ctx.attr("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(rank))
        ax = _norm_axes(ctx, axes, rank)
        shape = tuple(1 if i in ax else d for i, d in enumerate(x.shape) if keep or i not in ax)
        value = None
        if name in ("ReduceProd", "ReduceSum") and x.value is not None and x.value.dtype == object and rank == 1:
            elems = _const_ints(x)
            total = _product(elems) if name == "ReduceProd" else sum(elems[1:], elems[0] if elems else 0)
            value = np.empty(shape, dtype=object)
            value.reshape(-1)[:] = [total]
            if not any(is_expr(e) for e in elems):
                value = value.astype(x.dtype)
        return [TensorType(x.dtype, shape, value)]

    return infer


# under the channels-last layout a reduction moves above a Transpose with its axes permuted (its input 1, the
# axes, is not data); ReduceLogSum keeps the order it was given, as before the op table said so
for _name, _fn in _REDUCERS.items():
    register(_name, reference=_reduce(_fn), infer=_reduce_rule(_name), permuted_inputs=1,
             layout=Layout.CHANNELS_FIRST if _name == "ReduceLogSum" else Layout.REDUCE)


# ----------------------------------------------------------------------------------------------------
# ArgMax / ArgMin
# ----------------------------------------------------------------------------------------------------
def _arg(largest: bool) -> Callable[[list, dict], list]:
    """ArgMax/ArgMin: first occurrence, or last with select_last_index=1 (found on the flipped axis)."""

    def ref(inputs: list, attrs: dict) -> list:
        x = inputs[0]
        xc = x.astype(_acc_dtype(x.dtype), copy=False) if x.dtype.kind == "V" else x
        axis = attrs.get("axis", 0) % max(x.ndim, 1)
        f = np.argmax if largest else np.argmin
        if attrs.get("select_last_index", 0):
            idx = x.shape[axis] - 1 - f(np.flip(xc, axis=axis), axis=axis)
        else:
            idx = f(xc, axis=axis)
        if attrs.get("keepdims", 1):
            idx = np.expand_dims(idx, axis)
        return [np.asarray(idx, dtype=np.int64)]

    return ref


def _arg_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    (axis,) = _norm_axes(ctx, [ctx.attr("axis", 0)], len(x.shape))
    keep = bool(ctx.attr("keepdims", 1))
    shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape) if keep or i != axis)
    return [TensorType(np.dtype(np.int64), shape)]


register("ArgMax", reference=_arg(True), infer=_arg_rule)
register("ArgMin", reference=_arg(False), infer=_arg_rule)


# ----------------------------------------------------------------------------------------------------
# TopK
# ----------------------------------------------------------------------------------------------------
def _topk(inputs: list, attrs: dict) -> list:
    """TopK with ONNX's tie order: equal values keep ascending index order, for largest and smallest alike."""
    x = inputs[0]
    k = int(np.asarray(inputs[1]).ravel()[0]) if len(inputs) > 1 and inputs[1] is not None else attrs["k"]
    axis = attrs.get("axis", -1) % x.ndim
    xc = x.astype(_acc_dtype(x.dtype), copy=False) if x.dtype.kind == "V" else x
    n = x.shape[axis]
    if attrs.get("largest", 1):
        # a stable ascending sort of the reversed axis, read backwards: descending values, ties by index
        order = np.flip(np.argsort(np.flip(xc, axis=axis), axis=axis, kind="stable"), axis=axis)
        order = n - 1 - order
    else:
        order = np.argsort(xc, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)]


def _topk_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    rank = len(x.shape)
    (axis,) = _norm_axes(ctx, [ctx.attr("axis", -1)], rank)
    if len(ctx.inputs) > 1 and ctx.inputs[1] is not None:
        vals = _const_ints(ctx.inputs[1])
        k = vals[0] if vals else ctx.fresh("topk_k")
    else:
        k = ctx.attr("k", None)
    d = x.shape[axis]
    if isinstance(k, (int, np.integer)) and isinstance(d, (int, np.integer)):
        if not 0 <= k <= d:
            ctx.error(f"k={k} is outside [0, {d}] (the size of axis {axis})")
    else:
        ctx.require(k <= d)
    shape = tuple(k if i == axis else s for i, s in enumerate(x.shape))
    return [TensorType(x.dtype, shape), TensorType(np.dtype(np.int64), shape)]


register("TopK", reference=_topk, infer=_topk_rule)


# ----------------------------------------------------------------------------------------------------
# CumSum / CumProd
# ----------------------------------------------------------------------------------------------------
def _cumulative(op: np.ufunc) -> Callable[[list, dict], list]:
    """CumSum/CumProd along the axis input; `exclusive` shifts in the identity, `reverse` runs backwards."""

    def ref(inputs: list, attrs: dict) -> list:
        x = inputs[0]
        a = np.asarray(inputs[1])
        if a.size != 1:
            raise ValueError(f"the axis input must be a scalar, got shape {a.shape}")
        axis = int(a.ravel()[0])
        if not -x.ndim <= axis < x.ndim:  # never wrapped modulo the rank: that would be a silent wrong result
            raise ValueError(f"axis {axis} is out of range for rank {x.ndim}")
        axis %= x.ndim
        xc = x.astype(_acc_dtype(x.dtype), copy=False)
        if attrs.get("reverse", 0):
            xc = np.flip(xc, axis=axis)
        y = op.accumulate(xc, axis=axis, dtype=xc.dtype)
        if attrs.get("exclusive", 0) and x.shape[axis]:
            pad = np.full_like(np.take(y, [0], axis=axis), op.identity)
            y = np.concatenate([pad, np.take(y, np.arange(x.shape[axis] - 1), axis=axis)], axis=axis)
        if attrs.get("reverse", 0):
            y = np.flip(y, axis=axis)
        return [y.astype(x.dtype)]

    return ref


def _cumulative_rule(ctx: InferCtx) -> list[TensorType]:
    x, a = ctx.inputs[0], ctx.inputs[1]
    if a is not None and a.shape is not None and len(a.shape) > 1:
        ctx.error(f"the axis input must be a scalar (or one element), it has shape {list(a.shape)}")
    if a is not None and a.value is not None and a.value.dtype != object and a.value.size == 1:
        axis = int(a.value.ravel()[0])
        if not -x.rank <= axis < x.rank:
            ctx.error(f"axis {axis} is out of range for rank {x.rank}")
    return [TensorType(x.dtype, x.shape)]


register("CumSum", reference=_cumulative(np.add), infer=_cumulative_rule)
register("CumProd", reference=_cumulative(np.multiply), infer=_cumulative_rule)
