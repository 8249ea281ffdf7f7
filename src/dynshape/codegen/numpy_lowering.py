"""Fast numpy lowerings of the hot ops, used by compiled executables instead of the references.

The references favour exactness over speed (float64 internals, every dtype, every attribute). A lowering
is specialised at compile time for one node's attributes (and the build's options) and returns
`fn(inputs) -> outputs`, or None when
that node needs something it does not cover (then the reference runs). Every lowering computes in the
input's own dtype; tests compare them with the references.
"""

from __future__ import annotations

import math

import numpy as np

from dynshape.codegen import gemm, row_kernels
from dynshape.codegen.clib import I64, P, declare
from dynshape.codegen.lowering import register_lowering
from dynshape.ir import opdef
from dynshape.options import Options

_FLOATS = (np.float32, np.float64)


def _is_float(x: np.ndarray) -> bool:
    return x.dtype.type in _FLOATS


def _matmul(attrs: dict, options: Options):
    def fn(args):
        a, b = args
        if not (_is_float(a) and a.dtype == b.dtype):
            return None
        y = gemm.matmul(a, b, options.blas)
        if y is not None:
            return [y]
        if b.ndim == 2 and a.ndim > 2:  # one BLAS call over all rows instead of numpy's per-matrix loop
            a = np.ascontiguousarray(a)
            return [(a.reshape(-1, a.shape[-1]) @ b).reshape(*a.shape[:-1], b.shape[-1])]
        # numpy's stacked matmul leaves BLAS for strided operands (20x slower): copy them once
        return [np.matmul(np.ascontiguousarray(a), np.ascontiguousarray(b))]

    return fn


def _gemm(attrs: dict, options: Options):
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    ta, tb = int(bool(attrs.get("transA", 0))), int(bool(attrs.get("transB", 0)))

    def fn(args):
        a, b = args[0], args[1]
        c = args[2] if len(args) > 2 else None
        if not _is_float(a):
            return None
        y = gemm.gemm(a, b, c, alpha, beta, ta, tb, options.blas)
        if y is not None:
            return [y]
        y = (a.T if ta else a) @ (b.T if tb else b)
        if alpha != 1.0:
            y *= a.dtype.type(alpha)
        if c is not None:
            y += c if beta == 1.0 else a.dtype.type(beta) * c
        return [y]

    return fn


def _gather(attrs: dict, options: Options):
    axis = attrs.get("axis", 0)

    def fn(args):
        data, idx = args
        if idx.dtype.kind not in "iu" or data.dtype == object:
            return None
        return [np.take(data, idx, axis=axis)]  # negative indices wrap as ONNX says; out of range raises

    return fn


def _isnan(attrs: dict, options: Options):
    def fn(args):
        return [np.isnan(args[0])] if _is_float(args[0]) else None

    return fn


def _erf32(x: np.ndarray) -> np.ndarray:
    """erf with |error| < 1.2e-7 (Numerical Recipes erfc Chebyshev fit), vectorised in numpy."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    r = 1.0 - t * np.exp(poly)
    return np.copysign(r, x).astype(x.dtype, copy=False)


ERF_LIBRARY = declare("erf_f32", "ds_erf.c", {"ds_erf_f32": (P, P, I64)})


def _erf_native(x: np.ndarray) -> np.ndarray:
    """erf through a vectorised C kernel (the prelude's ds_erff); numpy fallback without a compiler."""
    lib = ERF_LIBRARY.try_load() if x.dtype == np.float32 else None
    if lib is None:
        return _erf32(x)
    x = np.ascontiguousarray(x)
    y = np.empty_like(x)
    lib.ds_erf_f32(x.ctypes.data, y.ctypes.data, x.size)
    return y


def _unary(f):
    def lower(attrs: dict, options: Options):
        def fn(args):
            x = args[0]
            return [f(x)] if _is_float(x) else None

        return fn

    return lower


def _binary(ufunc):
    def lower(attrs: dict, options: Options):
        def fn(args):
            a, b = args
            if not (_is_float(a) and a.dtype == b.dtype):
                return None
            return [ufunc(a, b)]

        return fn

    return lower


def _softmax(attrs: dict, options: Options):
    if attrs.get("_opset", 13) < 13:
        return None
    axis = attrs.get("axis", -1)

    def fn(args):
        x = args[0]
        if not _is_float(x):
            return None
        if axis in (-1, x.ndim - 1):
            y = row_kernels.softmax_last(x)
            if y is not None:
                return [y]
        y = x - x.max(axis=axis, keepdims=True)
        np.exp(y, out=y)
        y /= y.sum(axis=axis, keepdims=True)
        return [y]

    return fn


def _layernorm(attrs: dict, options: Options):
    axis, eps = attrs.get("axis", -1), attrs.get("epsilon", 1e-5)
    if attrs.get("_num_outputs", 1) > 1:  # Mean / InvStdDev requested: the reference provides them
        return None

    def fn(args):
        x, scale = args[0], args[1]
        bias = args[2] if len(args) > 2 else None
        if not _is_float(x) or (axis != -1 and axis != x.ndim - 1):
            return None
        y = row_kernels.layernorm_last(x, scale, bias, eps)
        if y is not None:
            return [y]
        mean = x.mean(axis=-1, keepdims=True)
        d = x - mean
        var = np.mean(d * d, axis=-1, keepdims=True)
        y = d / np.sqrt(var + x.dtype.type(eps))
        y *= scale
        if bias is not None:
            y += bias
        return [y]

    return fn


def _gelu(attrs: dict, options: Options):
    if attrs.get("approximate", "none") != "none":
        return None
    inv = 1.0 / math.sqrt(2.0)

    def fn(args):
        x = args[0]
        return [0.5 * x * (1 + _erf32(x * x.dtype.type(inv)))] if _is_float(x) else None

    return fn


def _with_fallback(lower, op: str):
    """Wrap a lowering so that inputs it does not cover (dtype, layout) go to the op's reference."""

    def make(attrs: dict, options: Options):
        reference = opdef.lookup(op).reference
        fast = lower(attrs, options)
        if fast is None:
            return None

        def fn(args):
            out = fast(args)
            return reference(args, attrs) if out is None else out

        return fn

    return make


register_lowering("MatMul", "numpy", _with_fallback(_matmul, "MatMul"))
register_lowering("Gemm", "numpy", _with_fallback(_gemm, "Gemm"))
register_lowering("Erf", "numpy", _with_fallback(_unary(_erf_native), "Erf"))
register_lowering("Tanh", "numpy", _with_fallback(_unary(np.tanh), "Tanh"))
register_lowering("Sqrt", "numpy", _with_fallback(_unary(np.sqrt), "Sqrt"))
register_lowering("Exp", "numpy", _with_fallback(_unary(np.exp), "Exp"))
register_lowering("Relu", "numpy", _with_fallback(_unary(lambda x: np.maximum(x, 0)), "Relu"))
register_lowering("Add", "numpy", _with_fallback(_binary(np.add), "Add"))
register_lowering("Sub", "numpy", _with_fallback(_binary(np.subtract), "Sub"))
register_lowering("Mul", "numpy", _with_fallback(_binary(np.multiply), "Mul"))
register_lowering("Div", "numpy", _with_fallback(_binary(np.divide), "Div"))
register_lowering("Softmax", "numpy", _with_fallback(_softmax, "Softmax"))
register_lowering("LayerNormalization", "numpy", _with_fallback(_layernorm, "LayerNormalization"))
register_lowering("Gelu", "numpy", _with_fallback(_gelu, "Gelu"))
register_lowering("Gather", "numpy", _with_fallback(_gather, "Gather"))
register_lowering("IsNaN", "numpy", _with_fallback(_isnan, "IsNaN"))
