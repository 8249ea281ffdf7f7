"""Static quantization's fused ops: what `passes/qdq.py` rewrites QDQ models and `QLinearMatMul` into.

`dynshape::QuantizedMatMul(x, x_scale, x_zero_point, w, w_zero_point, multiplier[, y_zero_point])`, one int8 product
by constant weights (codegen/lower/qproduct.py), with the scales known at compile time:

    q = x                                          when x is uint8 / int8 (QLinearMatMul's a)
    q = QuantizeLinear(x, x_scale, x_zero_point)   when x is float32 (a QDQ model's activation, quantized in the kernel)
    acc = (q - x_zero_point) @ (w - w_zero_point)  int32, wrapping (as MatMulInteger's and QLinearMatMul's int32)
    y = float32(acc) * multiplier                  without y_zero_point (float32; multiplier per column)
    y = saturate(rint(float64(acc) * multiplier + y_zero_point))
                                                   with it, of y_zero_point's type: what the ONNX reference's
                                                   QLinearMatMul computes (numpy: int32 * float32 -> float64)

`w` is int8 (k, n) and `w_zero_point` int32 (n,) (uint8 weights shifted by -128 with their zero points, as for
DynamicQuantizeMatMul: passes/quant.as_int8); `multiplier` float32 (n,): x_scale * w_scale[j] for a QDQ product,
x_scale * w_scale[j] / y_scale (in float32, as the spec's reference computes it) for QLinearMatMul; `x_scale` and
`x_zero_point` are one value each.

`dynshape::QuantizeDequantize(x, scale, zero_point)` is DequantizeLinear(QuantizeLinear(x, s, z), s, z) per tensor
(zero point uint8 or int8): `(clip(rint(x / s) + z, lo, hi) - z) * s`, one elementwise op that fuses into its
neighbours (a QDQ model puts such a pair on nearly every activation). Equal to the pair for every finite x; a NaN
stays NaN (the pair's cast of NaN to an integer is undefined).
"""

from __future__ import annotations

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import lookup, register
from dynshape.ir.types import TensorType

DOMAIN = "dynshape"
INT8_TYPES = (np.dtype(np.int8), np.dtype(np.uint8))


def quantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    """QuantizeLinear per tensor (its own reference)."""
    return lookup("QuantizeLinear").reference([x, np.asarray(scale), np.asarray(zp)], {})[0]


def _qmatmul_ref(inputs: list, attrs: dict) -> list:
    x, xs, xz, w, wz, mult = inputs[:6]
    yz = inputs[6] if len(inputs) > 6 else None
    q = x if np.dtype(x.dtype) in INT8_TYPES else quantize(x, xs, xz)
    a = q.astype(np.int64) - np.asarray(xz).astype(np.int64).reshape(())
    b = w.astype(np.int64) - np.asarray(wz).astype(np.int64).reshape(-1)
    acc = np.matmul(a, b).astype(np.int32)  # wraps as an int32 product does (int64 -> int32 keeps the low bits)
    m = np.asarray(mult, np.float32).reshape(-1)
    if yz is None:
        return [(acc.astype(np.float32) * m).astype(np.float32)]
    info = np.iinfo(yz.dtype)
    v = acc.astype(np.float64) * m.astype(np.float64) + np.float64(np.asarray(yz).reshape(()))
    return [np.clip(np.rint(v), info.min, info.max).astype(yz.dtype)]


def _qmatmul_infer(ctx: InferCtx) -> list[TensorType]:
    x, xs, xz, w, wz, mult = ctx.inputs[:6]
    yz = ctx.inputs[6] if len(ctx.inputs) > 6 else None
    if x.dtype not in (np.float32, *INT8_TYPES) or not x.shape or w.dtype != np.int8 or len(w.shape) != 2 \
            or xz.dtype not in INT8_TYPES or (yz is not None and yz.dtype not in INT8_TYPES):
        ctx.error(f"QuantizedMatMul takes float32 or 8-bit (..., k) by int8 (k, n) with 8-bit zero points, got "
                  f"{x.dtype} {x.shape} by {w.dtype} {w.shape}")
    if x.dtype != np.float32 and x.dtype != xz.dtype:
        ctx.error(f"x is {x.dtype} but its zero point {xz.dtype}")
    ctx.unify(x.shape[-1], w.shape[0])
    out = np.dtype(np.float32) if yz is None else yz.dtype
    return [TensorType(out, (*x.shape[:-1], w.shape[1]))]


def _qdq_ref(inputs: list, attrs: dict) -> list:
    x, s, z = inputs
    q = quantize(x, s, z)
    return [lookup("DequantizeLinear").reference([q, np.asarray(s), np.asarray(z)], {})[0]]


def _qdq_infer(ctx: InferCtx) -> list[TensorType]:
    x, s, z = ctx.inputs
    if x.dtype != np.float32 or s.dtype != np.float32 or z.dtype not in INT8_TYPES:
        ctx.error(f"QuantizeDequantize takes float32 values and scale and an 8-bit zero point, got {x.dtype}, "
                  f"{s.dtype}, {z.dtype}")
    return [TensorType(np.dtype(np.float32), x.shape)]


register("QuantizedMatMul", reference=_qmatmul_ref, infer=_qmatmul_infer, domain=DOMAIN)
# No op-table properties (elementwise, layout): those are the default domain's (tests/ir/test_opdef_properties.py);
# fusion groups it through its expression rule (codegen/lower/elementwise.py) all the same.
register("QuantizeDequantize", reference=_qdq_ref, infer=_qdq_infer, domain=DOMAIN)
