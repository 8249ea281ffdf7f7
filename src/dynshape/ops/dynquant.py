"""DynamicQuantizeMatMul: a float32 activation quantized per call, times constant int8 weights, dequantized.

`passes/quant.py` rewrites what onnxruntime's `quantize_dynamic` writes for each MatMul (DynamicQuantizeLinear on
the activation -> MatMulInteger by int8 weights -> Cast to float -> Mul by activation scale * weight scale) into
one `dynshape::DynamicQuantizeMatMul(x, w, w_zero_point, w_scale)` node, which the compiler runs as one int8 kernel
(codegen/lower/qproduct.py). Its semantics are exactly the chain's:

    q, s, z = DynamicQuantizeLinear(x)                      (one scale and zero point over all of x)
    acc = MatMulInteger(q, w, z, w_zero_point)              (int32, wrapping)
    y = float32(acc) * float32(s * w_scale)                 (per output column j: w_scale[j], w_zero_point[j])

`w` is int8 (k, n); `w_zero_point` int32 (n,); `w_scale` float32 (n,): the rewrite shifts uint8 weights into int8
(with their zero points) and broadcasts per-tensor parameters to one per column, which changes no value.

With `per_token=1` (what `ds.quantize_dynamic` writes, passes/quant.py) the activation is quantized per row of its
last axis instead, symmetrically: s_i = max|x_i| / 127, q = saturate(rint(x / s_i)) into -127..127 (a row of zeros:
q = 0), and y = (float32(acc) * w_scale[j]) * s_i, rounded in that order.
"""

from __future__ import annotations

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import lookup, register
from dynshape.ir.types import TensorType

DOMAIN = "dynshape"


def _per_token(x: np.ndarray, w: np.ndarray, wzp: np.ndarray, wscale: np.ndarray) -> np.ndarray:
    k = w.shape[0]
    rows = x.reshape(-1, k)
    s = (np.max(np.abs(rows), axis=1, initial=np.float32(0)) / np.float32(127)).astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s > 0, np.clip(np.rint(rows / np.where(s > 0, s, np.float32(1))), -127, 127), 0)
    acc = (q.astype(np.int64) @ (w.astype(np.int64) - wzp.astype(np.int64))).astype(np.int32)
    y = (acc.astype(np.float32) * np.asarray(wscale, np.float32)).astype(np.float32) * s
    return y.astype(np.float32).reshape(*x.shape[:-1], w.shape[1])


def reference(inputs: list, attrs: dict) -> list:
    x, w, wzp, wscale = inputs
    if attrs.get("per_token", 0):
        return [_per_token(x, w, wzp, wscale)]
    q, s, z = lookup("DynamicQuantizeLinear").reference([x], {})
    acc = lookup("MatMulInteger").reference([q, w, z, wzp.astype(np.int32)], {})[0]
    scale = (np.float32(s) * np.asarray(wscale, np.float32)).astype(np.float32)
    return [(acc.astype(np.float32) * scale).astype(np.float32)]


def _infer(ctx: InferCtx) -> list[TensorType]:
    x, w, wzp, wscale = ctx.inputs
    if x.dtype != np.float32 or w.dtype != np.int8 or len(w.shape) != 2 or not x.shape:
        ctx.error(f"DynamicQuantizeMatMul takes float32 (..., k) by int8 (k, n), got {x.dtype} {x.shape} by "
                  f"{w.dtype} {w.shape}")
    ctx.unify(x.shape[-1], w.shape[0])
    return [TensorType(np.dtype(np.float32), (*x.shape[:-1], w.shape[1]))]


register("DynamicQuantizeMatMul", reference=reference, infer=_infer, domain=DOMAIN)
