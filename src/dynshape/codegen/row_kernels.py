"""Row-wise C kernels for the reductions transformers spend time in: softmax and layer norm on the last axis.

numpy needs five to eight passes with temporaries for these; one row at a time in C keeps the row in
cache. The row length is a runtime argument, so one build serves every shape (the C is csrc/ds_rows.c). Built
once per process (and cached on disk by `cc.compile_c`); without a C compiler the callers fall back to numpy.
"""

from __future__ import annotations

import ctypes

import numpy as np

from dynshape.codegen.clib import F32, I64, P, declare

LIBRARY = declare("row_kernels", "ds_rows.c", {"ds_softmax_f32": (P, P, I64, I64),
                                                "ds_layernorm_f32": (P, P, P, P, I64, I64, F32),
                                                "ds_layernorm_args": (P,)}, openmp=True)


def library() -> ctypes.CDLL | None:
    """The row-kernel library, or None when no C compiler is available."""
    return LIBRARY.try_load()


def softmax_last(x: np.ndarray) -> np.ndarray | None:
    lib = library()
    if lib is None or x.dtype != np.float32 or x.ndim == 0:
        return None
    x = np.ascontiguousarray(x)
    y = np.empty_like(x)
    n = x.shape[-1]
    if n:
        lib.ds_softmax_f32(x.ctypes.data, y.ctypes.data, x.size // n, n)
    return y


def layernorm_last(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray | None:
    lib = library()
    n = x.shape[-1] if x.ndim else 0
    if lib is None or x.dtype != np.float32 or not n or scale.size != n or (bias is not None and bias.size != n):
        return None
    x = np.ascontiguousarray(x)
    scale = np.ascontiguousarray(scale, dtype=np.float32)
    bias_ptr = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    y = np.empty_like(x)
    lib.ds_layernorm_f32(x.ctypes.data, scale.ctypes.data, None if bias_ptr is None else bias_ptr.ctypes.data,
                         y.ctypes.data, x.size // n, n, eps)
    return y
