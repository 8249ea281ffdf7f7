"""The ops a dynamically quantized convolution becomes, so that it runs as a float32 convolution, exactly.

onnxruntime's `quantize_dynamic` writes each Conv as

    q, s, z = DynamicQuantizeLinear(x)                         (uint8, one scale and zero point over all of x)
    acc = ConvInteger(q, w, z, w_zero_point)                   (int32)
    b = Cast(Floor(bias / (s * w_scale)), int32)               (the bias, rounded per call)
    y = Cast(acc + b, float32) * (s * w_scale)

`passes/qconv.py` rewrites the chain into float32 ops that compute the same values bit for bit:

    s, z = dynshape::DynamicQuantParams(x)                     (the scale and zero point DynamicQuantizeLinear picks)
    c = dynshape::QuantizeCentered(x, s, z)                    (float32(q) - float32(z): integers in -255..255)
    f = Conv(c, float32(w - w_zero_point))                     (every partial sum an integer below 2^24: exact)
    y = dynshape::IntegerAdd(f, b) * (s * w_scale)             (float32(int32(f) + b), wrapping as int32 does)

Why exact: the products of integers below 2^8 are exact in float32, and so is every sum of them while its magnitude
stays below 2^24, whatever the order of the additions. The rewrite takes a ConvInteger only when 255 times the
largest sum of |w - w_zero_point| over one output channel is below 2^24, which bounds every partial sum. Then the
float convolution (packed, channels last, in any summation order) equals the int32 one.

`DynamicQuantParams` reads every element and nothing of their order (`Layout.ORDER_FREE`): it reads a
channels-last activation where it lies. NaN in x makes the scale NaN and the quantized values unspecified, as the
ONNX spec and onnxruntime leave them.
"""

from __future__ import annotations

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import Layout, lookup, register
from dynshape.ir.types import TensorType

DOMAIN = "dynshape"
F32, U8, I32 = np.dtype(np.float32), np.dtype(np.uint8), np.dtype(np.int32)


def _params_ref(inputs: list, attrs: dict) -> list:
    _, s, z = lookup("DynamicQuantizeLinear").reference([inputs[0]], {})
    return [s, z]


def _params_infer(ctx: InferCtx) -> list[TensorType]:
    if ctx.inputs[0].dtype != F32:
        ctx.error(f"DynamicQuantParams takes float32, got {ctx.inputs[0].dtype}")
    return [TensorType(F32, ()), TensorType(U8, ())]


def centered(x: np.ndarray, s: np.ndarray, z: np.ndarray) -> np.ndarray:
    """float32(q) - float32(z) for q = DynamicQuantizeLinear's quantized x under its scale s and zero point z."""
    s32, zf = np.float32(s), np.float32(z)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.clip(np.rint(np.asarray(x, F32) / s32) + zf, 0, 255)
    return (q - zf).astype(F32)


def _centered_ref(inputs: list, attrs: dict) -> list:
    return [centered(*inputs)]


def _centered_infer(ctx: InferCtx) -> list[TensorType]:
    x, s, z = ctx.inputs
    if x.dtype != F32 or s.dtype != F32 or z.dtype != U8 or s.shape != () or z.shape != ():
        ctx.error(f"QuantizeCentered takes float32 x, a float32 scalar scale and a uint8 scalar zero point, got "
                  f"{x.dtype} {s.dtype}{list(s.shape)} {z.dtype}{list(z.shape)}")
    return [TensorType(F32, x.shape)]


def _integer_add_ref(inputs: list, attrs: dict) -> list:
    a, b = inputs
    acc = np.asarray(a, F32).astype(np.int64) + np.asarray(b).astype(np.int64)
    return [acc.astype(np.int32).astype(F32)]  # int64 -> int32 wraps modulo 2^32, as int32 addition does


def _integer_add_infer(ctx: InferCtx) -> list[TensorType]:
    a, b = ctx.inputs
    if a.dtype != F32 or b.dtype != I32:
        ctx.error(f"IntegerAdd takes a float32 holding integers and an int32, got {a.dtype} and {b.dtype}")
    return [TensorType(F32, ctx.broadcast(a.shape, b.shape))]


register("DynamicQuantParams", reference=_params_ref, infer=_params_infer, domain=DOMAIN, layout=Layout.ORDER_FREE)
register("QuantizeCentered", reference=_centered_ref, infer=_centered_infer, domain=DOMAIN, elementwise=True,
         layout=Layout.ELEMENTWISE, permuted_inputs=1)
register("IntegerAdd", reference=_integer_add_ref, infer=_integer_add_infer, domain=DOMAIN, elementwise=True,
         layout=Layout.ELEMENTWISE)
