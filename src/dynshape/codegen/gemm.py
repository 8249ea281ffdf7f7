"""MatMul / Gemm through the chosen BLAS (MKL when installed, else numpy's OpenBLAS), called from C.

numpy's matmul picks its own path per call (and leaves BLAS for stacked or strided operands); here every
float32 product is one `ds_sgemm` or one strided-batched call writing straight into its output buffer.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from dynshape.codegen.blas import C_DECLS, bind, default_blas

_SRC = C_DECLS + r"""
void ds_matmul_f32(const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t n, int64_t k,
                   int64_t sa, int64_t sb, int ta, int tb, float alpha, float beta) {
    ds_sgemm_batched(ta, tb, batch, m, n, k, alpha, a, ta ? m : k, sa, b, tb ? k : n, sb, beta, c, n, m * n);
}
"""

_fn = None
_blas_name = ""


def spec() -> dict:
    """How this helper library is built (shared with artefacts, which ship it)."""
    return {"source": _SRC, "name": "gemm", "symbols": ["ds_matmul_f32", "ds_bind_blas"]}


def _kernel():
    global _fn, _blas_name
    if _fn is None:
        try:
            from dynshape.codegen.cc import compile_c

            lib = compile_c(**spec())
            blas = default_blas()
            bind(lib, blas)
            fn = lib.ds_matmul_f32
            p, i64 = ctypes.c_void_p, ctypes.c_int64
            fn.argtypes = [p, p, p, i64, i64, i64, i64, i64, i64, ctypes.c_int, ctypes.c_int, ctypes.c_float,
                           ctypes.c_float]
            fn.restype = None
            _fn, _blas_name = fn, blas.name
        except Exception:  # noqa: BLE001 - no compiler or no usable BLAS: numpy's matmul instead
            _fn = False
    return _fn or None


def blas_name() -> str:
    _kernel()
    return _blas_name or "numpy"


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """a @ b for float32 with numpy's broadcasting of batch dims (None: not covered, caller falls back)."""
    fn = _kernel()
    if fn is None or a.dtype != np.float32 or b.dtype != np.float32 or a.ndim < 2 or b.ndim < 2:
        return None
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    k = a.shape[-1]
    if b.shape[-2] != k:
        return None
    n = b.shape[-1]
    if b.ndim == 2:  # every row of a against one matrix: a single GEMM
        m = math.prod(a.shape[:-1])
        c = np.empty(a.shape[:-1] + (n,), np.float32)
        fn(a.ctypes.data, b.ctypes.data, c.ctypes.data, 1, m, n, k, 0, 0, 0, 0, 1.0, 0.0)
        return c
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    m = a.shape[-2]
    if batch_a == batch_b:
        sa, sb, batch = m * k, k * n, math.prod(batch_a)
    elif a.ndim == 2:
        sa, sb, batch = 0, k * n, math.prod(batch_b)
    else:
        return None
    c = np.empty(np.broadcast_shapes(batch_a, batch_b) + (m, n), np.float32)
    fn(a.ctypes.data, b.ctypes.data, c.ctypes.data, batch, m, n, k, sa, sb, 0, 0, 1.0, 0.0)
    return c


def gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray | None, alpha: float, beta: float, ta: int, tb: int):
    """ONNX Gemm: alpha * op(a) @ op(b) + beta * c, c broadcast to (m, n)."""
    fn = _kernel()
    if fn is None or a.dtype != np.float32 or b.dtype != np.float32 or a.ndim != 2 or b.ndim != 2:
        return None
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    m, k = (a.shape[1], a.shape[0]) if ta else a.shape
    n = b.shape[0] if tb else b.shape[1]
    if (b.shape[1] if tb else b.shape[0]) != k:
        return None
    if c is None or beta == 0.0:
        y = np.empty((m, n), np.float32)
        beta = 0.0
    else:
        y = np.empty((m, n), np.float32)
        y[...] = c  # broadcast the bias into the output, then accumulate onto it
    fn(a.ctypes.data, b.ctypes.data, y.ctypes.data, 1, m, n, k, 0, 0, ta, tb, alpha, beta)
    return y
