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
/* A few rows (batch-1 requests, decoders): BLAS call overhead dominates, so dot products / axpys here. */
static void ds_small_rows(const float *restrict a, const float *restrict b, float *restrict c, int64_t m,
                          int64_t n, int64_t k, int tb, float alpha, float beta) {
    for (int64_t i = 0; i < m; i++) {
        const float *ai = a + i * k;
        float *ci = c + i * n;
        if (tb) {  /* b is (n, k): one contiguous dot product per output */
            for (int64_t j = 0; j < n; j++) {
                const float *bj = b + j * k;
                float acc = 0.0f;
                #pragma omp simd reduction(+:acc)
                for (int64_t p = 0; p < k; p++) acc += ai[p] * bj[p];
                ci[j] = alpha * acc + (beta == 0.0f ? 0.0f : beta * ci[j]);
            }
        } else {   /* b is (k, n): accumulate rows of b */
            for (int64_t j = 0; j < n; j++) ci[j] = beta == 0.0f ? 0.0f : beta * ci[j];
            for (int64_t p = 0; p < k; p++) {
                const float s = alpha * ai[p];
                const float *bp = b + p * n;
                #pragma omp simd
                for (int64_t j = 0; j < n; j++) ci[j] += s * bp[j];
            }
        }
    }
}

void ds_matmul_f32(const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t n, int64_t k,
                   int64_t sa, int64_t sb, int ta, int tb, float alpha, float beta) {
    if (batch == 1 && m <= 4 && !ta && k > 0) {
        ds_small_rows(a, b, c, m, n, k, tb, alpha, beta);
        return;
    }
    ds_sgemm_batched(ta, tb, batch, m, n, k, alpha, a, ta ? m : k, sa, b, tb ? k : n, sb, beta, c, n, m * n);
}

/* The same with every argument in two arrays: one cheap foreign call from a pre-bound plan. */
void ds_matmul_packed(const int64_t *p, const float *f) {
    ds_matmul_f32((const float *)p[0], (const float *)p[1], (float *)p[2], p[3], p[4], p[5], p[6], p[7], p[8],
                  (int)p[9], (int)p[10], f[0], f[1]);
}
"""

_fn = None
_blas_name = ""
_packed: list = [None]


def spec() -> dict:
    """How this helper library is built (shared with artefacts, which ship it)."""
    from dynshape.codegen.cc import DEFAULT_FLAGS

    return {"source": _SRC, "name": "gemm", "flags": (*DEFAULT_FLAGS, "-fopenmp-simd"),
            "symbols": ["ds_matmul_f32", "ds_matmul_packed", "ds_bind_blas"]}


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
            packed = lib.ds_matmul_packed
            packed.argtypes, packed.restype = [p, p], None
            _fn, _blas_name = fn, blas.name
            _packed[0] = packed
        except Exception:  # noqa: BLE001 - no compiler or no usable BLAS: numpy's matmul instead
            _fn = False
    return _fn or None


def packed_call(a: int, b: int, c: int, batch: int, m: int, n: int, k: int, sa: int, sb: int, ta: int, tb: int,
                alpha: float, beta: float, keep: list):
    """A zero-argument callable for one pre-bound product (addresses fixed); None without a compiler."""
    if _kernel() is None:
        return None
    ints = np.array([a, b, c, batch, m, n, k, sa, sb, ta, tb], dtype=np.int64)
    floats = np.array([alpha, beta], dtype=np.float32)
    keep.extend((ints, floats))
    import functools

    return functools.partial(_packed[0], ints.ctypes.data, floats.ctypes.data)


def blas_name() -> str:
    _kernel()
    return _blas_name or "numpy"


def batch_layout(a_shape: tuple, b_shape: tuple) -> tuple | None:
    """(batch, m, n, k, sa, sb) that runs a @ b (numpy broadcasting) as strided GEMMs, or None when the batch
    dims broadcast in a way one element stride cannot express."""
    if len(a_shape) < 2 or len(b_shape) < 2 or b_shape[-2] != a_shape[-1]:
        return None
    k, n = a_shape[-1], b_shape[-1]
    if len(b_shape) == 2:  # every row of a against one matrix: a single GEMM
        return 1, math.prod(a_shape[:-1]), n, k, 0, 0
    m = a_shape[-2]
    if a_shape[:-2] == b_shape[:-2]:
        return math.prod(a_shape[:-2]), m, n, k, m * k, k * n
    if len(a_shape) == 2:
        return math.prod(b_shape[:-2]), m, n, k, 0, k * n
    return None


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """a @ b for float32 with numpy's broadcasting of batch dims (None: not covered, caller falls back)."""
    fn = _kernel()
    if fn is None or a.dtype != np.float32 or b.dtype != np.float32:
        return None
    layout = batch_layout(a.shape, b.shape)
    if layout is None:
        return None
    batch, m, n, k, sa, sb = layout
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    c = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], n), np.float32)
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
