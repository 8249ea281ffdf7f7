"""MatMul / Gemm through the chosen BLAS (MKL when installed, else numpy's OpenBLAS), called from C.

numpy's matmul picks its own path per call (and leaves BLAS for stacked or strided operands); here every
float32 product is one `ds_sgemm` or one strided-batched call writing straight into its output buffer
(csrc/ds_matmul.c, with the BLAS shim csrc/ds_blas.h).
"""

from __future__ import annotations

import math

import numpy as np

from dynshape.codegen.blas import bind, default_blas
from dynshape.codegen.clib import F32, I64, INT, P, declare

LIBRARY = declare("gemm", "ds_matmul.c", {
    "ds_matmul_f32": (P, P, P, I64, I64, I64, I64, I64, I64, INT, INT, F32, F32),
    "ds_matmul_packed": (P, P), "ds_bind_blas": (P, P)}, flags=("-fopenmp-simd",))

_fn = None
_blas_name = ""
_packed: list = [None]


def _kernel():
    global _fn, _blas_name
    if _fn is None:
        try:
            lib = LIBRARY.load()
            blas = default_blas()
            bind(lib, blas)
            _fn, _blas_name = lib.ds_matmul_f32, blas.name
            _packed[0] = lib.ds_matmul_packed
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
