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
"""

from __future__ import annotations

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import lookup, register
from dynshape.ir.types import TensorType

DOMAIN = "dynshape"


def reference(inputs: list, attrs: dict) -> list:
    x, w, wzp, wscale = inputs
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
