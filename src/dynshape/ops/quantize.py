"""Quantization: QuantizeLinear / DequantizeLinear (per-tensor, per-axis, blocked; every integer, float8, float6
and float4 type), DynamicQuantizeLinear, QLinearMatMul, QLinearConv, ConvInteger.

The granularity is read from the scale's shape exactly as the spec defines it: a scalar (or one element) is per
tensor, a 1-D scale runs along `axis`, a scale of the input's rank is blocked along `axis` with `block_size`
(each scale covers that many consecutive elements; the rule ties ceil(D / block_size) to the scale's dim).
Quantization divides in the scale's precision (or `precision`), rounds half to even, adds the zero point and
saturates into the target range; float targets saturate only when `saturate=1` (and always for the types that
have no infinity). Integer products run in exact integer arithmetic (int64), then requantize in float64.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType
from dynshape.ops import conv
from dynshape.ops import dtypes as dt
from dynshape.ops.dims import ceil_div, is_static

U8, I32, F32 = np.dtype(np.uint8), np.dtype(np.int32), np.dtype(np.float32)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_NO_INF = {np.dtype(t) for t in (ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn)}


def _scale_f(s: np.ndarray) -> np.ndarray:
    """A scale as a float array (float8_e8m0 scales are powers of two: 2**(bits - 127))."""
    if s.dtype == _E8M0:
        return np.ldexp(np.float32(1), s.view(np.uint8).astype(np.int32) - 127).astype(F32)
    return s


def _expand(p: np.ndarray, x_shape: tuple, axis: int, block: int) -> np.ndarray:
    """Broadcast a scale / zero point to x's shape: per tensor, per axis, or blocked along `axis`."""
    if p.size == 1 and (p.ndim == 0 or block == 0):
        return p.reshape(())
    rank = len(x_shape)
    if p.ndim == 1 and block == 0:
        return p.reshape([-1 if a == axis else 1 for a in range(rank)])
    if p.ndim != rank:
        raise ValueError(f"scale of shape {p.shape} is neither per-tensor, per-axis nor blocked for input "
                         f"{x_shape}")
    if block <= 0:
        raise ValueError("a scale of the input's rank needs a positive block_size (blocked quantization)")
    return np.repeat(p, block, axis=axis)[tuple(slice(0, n) if a == axis else slice(None)
                                                for a, n in enumerate(x_shape))]


def _int_range(dtype: np.dtype) -> tuple[int, int] | None:
    if not dt.is_int(dtype):
        return None
    info = ml_dtypes.iinfo(dtype) if dtype.kind == "V" else np.iinfo(dtype)
    return int(info.min), int(info.max)


def _saturate(v: np.ndarray, dtype: np.dtype, saturate: bool) -> np.ndarray:
    """Round-half-even values (float64) into `dtype`: clip for integers, cast (maybe saturating) for floats."""
    r = _int_range(dtype)
    if r is not None:
        return np.clip(np.rint(v), *r).astype(dtype)
    if dtype in _NO_INF:
        m = float(ml_dtypes.finfo(dtype).max)
        return np.where(np.isnan(v), v, np.clip(v, -m, m)).astype(F32).astype(dtype)
    return dt.cast(v.astype(F32), dtype, saturate=saturate)


def _axis(attrs: dict, rank: int) -> int:
    return attrs.get("axis", 1) % rank if rank else 0


def _quantize_ref(inputs: list, attrs: dict) -> list:
    x, scale = inputs[:2]
    zp = inputs[2] if len(inputs) > 2 else None
    out = _q_dtype(attrs.get("output_dtype", 0), zp)
    axis, block = _axis(attrs, x.ndim), int(attrs.get("block_size", 0))
    prec = attrs.get("precision", 0)
    s = _scale_f(scale)
    work = dt.np_dtype(prec) if prec else (s.dtype if dt.is_float(s.dtype) else F32)
    s = _expand(s, x.shape, axis, block)
    q = np.asarray(x.astype(work) / s.astype(work)).astype(np.float64)
    is_int = _int_range(out) is not None
    if is_int:
        q = np.rint(q)
    if zp is not None:
        q = q + _expand(zp.astype(np.float64) if not is_int else zp.astype(np.int64), x.shape, axis, block)
    return [_saturate(q, out, bool(attrs.get("saturate", 1)))]


def _dequantize_ref(inputs: list, attrs: dict) -> list:
    x, scale = inputs[:2]
    zp = inputs[2] if len(inputs) > 2 else None
    out = dt.np_dtype(attrs["output_dtype"]) if attrs.get("output_dtype") else (
        scale.dtype if scale.dtype != _E8M0 else F32)
    axis, block = _axis(attrs, x.ndim), int(attrs.get("block_size", 0))
    integer = _int_range(x.dtype) is not None
    v = x.astype(np.int64) if integer else x.astype(F32)
    if zp is not None:
        v = v - _expand(zp.astype(np.int64) if integer else zp.astype(F32), x.shape, axis, block)
    s = _expand(_scale_f(scale).astype(F32), x.shape, axis, block)
    return [(v.astype(F32) * s).astype(out)]


def _q_dtype(code: int, zp: Any) -> np.dtype:
    if code:
        return dt.np_dtype(code)
    return np.dtype(zp.dtype) if zp is not None else U8


def _granularity_rule(ctx: InferCtx, x: TensorType, scale: TensorType, zp: TensorType | None) -> None:
    """The scale's shape must be one the spec allows for x; the zero point has the scale's shape (a
    one-element zero point also goes with a scalar scale, and a scalar one with a one-element scale, as exporters
    write them)."""
    rank = x.rank
    block = int(ctx.attr("block_size", 0))
    if zp is not None:
        if zp.rank == scale.rank:
            for a, b in zip(zp.shape, scale.shape):
                ctx.unify(a, b)
        elif scale.rank == 0:
            for a in zp.shape:
                ctx.unify(a, 1)
        elif zp.rank == 0 and all(is_static(a) and a == 1 for a in scale.shape):
            pass  # a scalar zero point with a one-element scale (onnxruntime's quantizer writes its biases so)
        else:
            ctx.error(f"the zero point's shape {zp.shape} differs from the scale's {scale.shape}")
    if scale.rank == 0 or (scale.rank == 1 and block == 0 and is_static(scale.shape[0]) and scale.shape[0] == 1):
        return  # per tensor: axis is not used
    axis = ctx.attr("axis", 1)
    if not -rank <= axis < rank:
        ctx.error(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    if scale.rank == 1 and block == 0:  # per axis; a length not known to be 1 may still be 1 (per tensor)
        if is_static(scale.shape[0]):
            ctx.unify(scale.shape[0], x.shape[axis])
        else:
            ctx.broadcast((scale.shape[0],), (x.shape[axis],))
        return
    if scale.rank != rank:
        ctx.error(f"the scale's shape {scale.shape} is neither a scalar, 1-D (per axis) nor of the input's rank "
                  "(blocked)")
    if block <= 0:
        ctx.error("a scale of the input's rank means blocked quantization, which needs block_size > 0")
    for a in range(rank):
        ctx.unify(scale.shape[a], ceil_div(x.shape[a], block) if a == axis else x.shape[a])


def _quantize_rule(ctx: InferCtx) -> list[TensorType]:
    x, scale = ctx.inputs[:2]
    zp = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    code = ctx.attr("output_dtype", 0)
    if code and zp is not None and dt.np_dtype(code) != zp.dtype:
        ctx.error(f"output_dtype {dt.np_dtype(code)} differs from the zero point's type {zp.dtype}")
    _granularity_rule(ctx, x, scale, zp)
    return [TensorType(_q_dtype(code, zp), x.shape)]


def _dequantize_rule(ctx: InferCtx) -> list[TensorType]:
    x, scale = ctx.inputs[:2]
    zp = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    if zp is not None and zp.dtype != x.dtype:
        ctx.error(f"the zero point's type {zp.dtype} differs from x's {x.dtype}")
    _granularity_rule(ctx, x, scale, zp)
    code = ctx.attr("output_dtype", 0)
    out = dt.np_dtype(code) if code else (scale.dtype if scale.dtype != _E8M0 else F32)
    return [TensorType(out, x.shape)]


register("QuantizeLinear", reference=_quantize_ref, infer=_quantize_rule)
register("DequantizeLinear", reference=_dequantize_ref, infer=_dequantize_rule)


# ---------------------------------------------------------------------------------------------------------
# DynamicQuantizeLinear: uint8 with a scale and zero point chosen from the data (range widened to hold 0)
# ---------------------------------------------------------------------------------------------------------
def _dynamic_quantize_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0].astype(F32)
    lo = min(float(x.min(initial=0.0)), 0.0)
    hi = max(float(x.max(initial=0.0)), 0.0)
    if hi == lo:  # all zeros (or empty): onnxruntime's scale 1 and zero point 0 (the spec's formula divides by 0),
        # so what a bias is divided by stays finite (ops/dynquant_conv.py); onnx's own reference takes 1 / 255
        return [np.zeros(x.shape, U8), np.array(1.0, F32), np.array(0, U8)]
    scale = np.float32((np.float32(hi) - np.float32(lo)) / np.float32(255))
    zp = np.clip(np.rint(np.float32(0) - np.float32(lo) / scale), 0, 255)
    y = np.clip(np.rint(x / scale) + zp, 0, 255).astype(U8)
    return [y, np.array(scale, F32), np.array(zp, U8)]


def _dynamic_quantize_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    if x.dtype != F32:
        ctx.error(f"DynamicQuantizeLinear takes float32, got {x.dtype}")
    return [TensorType(U8, x.shape), TensorType(F32, ()), TensorType(U8, ())]


register("DynamicQuantizeLinear", reference=_dynamic_quantize_ref, infer=_dynamic_quantize_rule)


# ---------------------------------------------------------------------------------------------------------
# integer products: QLinearMatMul, MatMulInteger (nn.py), QLinearConv, ConvInteger
# ---------------------------------------------------------------------------------------------------------
def _centered(x: np.ndarray, zp: np.ndarray | None, zp_shape: tuple | None = None) -> np.ndarray:
    """x - zero_point, exactly: int64 for integer types, float64 for float8 ones."""
    integer = _int_range(x.dtype) is not None
    v = x.astype(np.int64) if integer else x.astype(np.float64)
    if zp is None:
        return v
    z = zp.astype(np.int64) if integer else zp.astype(np.float64)
    return v - (z.reshape(zp_shape) if zp_shape is not None and z.size > 1 else z.reshape(()) if z.size == 1 else z)


def _requantize(acc: np.ndarray, multiplier: np.ndarray, y_zp: np.ndarray | None, out: np.dtype) -> np.ndarray:
    v = acc.astype(np.float64) * multiplier.astype(np.float64)
    if y_zp is not None:
        v = v + y_zp.astype(np.float64)
    return _saturate(v if _int_range(out) is None else np.rint(v), out, True)


def _qlinear_matmul_ref(inputs: list, attrs: dict) -> list:
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = inputs
    rows = (-1, 1)  # a per-row scale / zero point runs along a's rows, b's along its columns
    a_c = _centered(a, a_zp, rows if a.ndim >= 2 else None)
    b_c = _centered(b, b_zp)
    acc = np.matmul(a_c, b_c)
    a_sf = a_s.reshape(rows) if a_s.size > 1 and a.ndim >= 2 else a_s
    mult = (a_sf * b_s / y_s).astype(a_s.dtype)  # in the scales' own precision, as the spec computes it
    return [_requantize(acc, mult, y_zp, y_zp.dtype)]


def _qlinear_matmul_rule(ctx: InferCtx) -> list[TensorType]:
    from dynshape.ops.nn import matmul_shape

    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = ctx.inputs
    for name, s in (("a_scale", a_s), ("b_scale", b_s), ("y_scale", y_s)):
        if s.rank > 1:
            ctx.error(f"{name} must be a scalar or 1-D, got shape {s.shape}")
    if y_zp is None:
        ctx.error("y_zero_point is required (it fixes the output type)")
    return [TensorType(y_zp.dtype, matmul_shape(ctx, tuple(a.shape), tuple(b.shape)))]


register("QLinearMatMul", reference=_qlinear_matmul_ref, infer=_qlinear_matmul_rule)


def _int_conv(x: np.ndarray, w: np.ndarray, attrs: dict) -> np.ndarray:
    """Convolution of integer-valued arrays, exact (float64 holds every partial sum of 8-bit products)."""
    attrs = {k: v for k, v in attrs.items() if k in ("auto_pad", "dilations", "group", "kernel_shape", "pads",
                                                     "strides")}
    (y,) = conv._conv_ref([x.astype(np.float64), w.astype(np.float64)], attrs)
    return np.rint(y).astype(np.int64)


def _per_channel(w: np.ndarray) -> tuple:
    return (-1,) + (1,) * (w.ndim - 1)


def _conv_integer_ref(inputs: list, attrs: dict) -> list:
    x, w = inputs[:2]
    x_zp, w_zp = (list(inputs[2:]) + [None, None])[:2]
    y = _int_conv(_centered(x, x_zp), _centered(w, w_zp, _per_channel(w)), attrs)
    return [y.astype(I32)]


def _qlinear_conv_ref(inputs: list, attrs: dict) -> list:
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    acc = _int_conv(_centered(x, x_zp), _centered(w, w_zp, _per_channel(w)), attrs)
    if bias is not None:
        acc = acc + bias.astype(np.int64).reshape((1, -1) + (1,) * (x.ndim - 2))
    w_sf = w_s.reshape((1, -1) + (1,) * (x.ndim - 2)) if w_s.size > 1 else w_s
    mult = (x_s * w_sf / y_s).astype(x_s.dtype)
    out = y_zp.dtype if y_zp is not None else x.dtype
    return [_requantize(acc, mult, y_zp, out)]


def _conv_integer_rule(ctx: InferCtx) -> list[TensorType]:
    x, w = ctx.inputs[:2]
    (y,) = conv._conv_infer(_ConvView(ctx, [x, w]))
    return [TensorType(I32, y.shape)]


def _qlinear_conv_rule(ctx: InferCtx) -> list[TensorType]:
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = (list(ctx.inputs) + [None] * 9)[:8]
    bias = ctx.inputs[8] if len(ctx.inputs) > 8 else None
    if w_s.rank == 1 and not (is_static(w_s.shape[0]) and w_s.shape[0] == 1):
        ctx.unify(w_s.shape[0], w.shape[0])  # per output channel
    (y,) = conv._conv_infer(_ConvView(ctx, [x, w, bias]))
    return [TensorType(y_zp.dtype if y_zp is not None else x.dtype, y.shape)]


class _ConvView:
    """The conv shape rule seen through another op's input list (x, w[, bias])."""

    def __init__(self, ctx: InferCtx, inputs: list):
        self._ctx, self.inputs = ctx, inputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


register("ConvInteger", reference=_conv_integer_ref, infer=_conv_integer_rule)
register("QLinearConv", reference=_qlinear_conv_ref, infer=_qlinear_conv_rule)
