"""Row-wise C kernels for the reductions transformers spend time in: softmax and layer norm on the last axis.

numpy needs five to eight passes with temporaries for these; one row at a time in C keeps the row in
cache. The row length is a runtime argument, so one build serves every shape. Built once per process
(and cached on disk by `cc.compile_c`); without a C compiler the callers fall back to numpy.
"""

from __future__ import annotations

import ctypes

import numpy as np

from dynshape.codegen.cgen import prelude

# One row of LayerNormalization; x and y may be the same row (the fused products normalise in place).
# Shared with codegen/packed_gemm.py, whose library exports it: @STORAGE@ is how each library declares it.
LAYERNORM_ROW = r"""
@STORAGE@ void ds_layernorm_row(const float *x, float *y, const float *restrict scale, const float *restrict bias,
                                int64_t n, float eps) {
    float s = 0.0f;
    #pragma omp simd reduction(+:s)
    for (int64_t i = 0; i < n; i++) s += x[i];
    const float mean = s / (float)n;
    float v = 0.0f;
    #pragma omp simd reduction(+:v)
    for (int64_t i = 0; i < n; i++) { float d = x[i] - mean; v += d * d; }
    const float rstd = 1.0f / sqrtf(v / (float)n + eps);
    if (bias) {
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * rstd * scale[i] + bias[i];
    } else {
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * rstd * scale[i];
    }
}
"""

_SRC = LAYERNORM_ROW.replace("@STORAGE@", "static inline") + r"""
void ds_softmax_f32(const float *restrict x, float *restrict y, int64_t rows, int64_t n) {
    #pragma omp parallel for schedule(static) if(rows * n >= 32768)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float m = -INFINITY;
        #pragma omp simd reduction(max:m)
        for (int64_t i = 0; i < n; i++) m = xr[i] > m ? xr[i] : m;
        float s = 0.0f;
        #pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < n; i++) { float e = ds_expf_nonpos(xr[i] - m); yr[i] = e; s += e; }
        const float inv = 1.0f / s;
        for (int64_t i = 0; i < n; i++) yr[i] *= inv;
    }
}

void ds_layernorm_f32(const float *restrict x, const float *restrict scale, const float *restrict bias,
                      float *restrict y, int64_t rows, int64_t n, float eps) {
    #pragma omp parallel for schedule(static) if(rows * n >= 32768)
    for (int64_t r = 0; r < rows; r++) ds_layernorm_row(x + r * n, y + r * n, scale, bias, n, eps);
}

/* The same with every argument in one int64 array (eps as the bits of a float): a plan's program can call it. */
void ds_layernorm_args(const int64_t *a) {
    float eps;
    memcpy(&eps, &a[6], sizeof eps);
    ds_layernorm_f32((const float *)a[0], (const float *)a[1], (const float *)a[2], (float *)a[3], a[4], a[5], eps);
}
"""

_lib: ctypes.CDLL | None | bool = None


def spec() -> dict:
    """How this helper library is built (shared with artefacts, which ship it)."""
    from dynshape.codegen.cc import DEFAULT_FLAGS

    # -fopenmp: rows split over threads for large inputs, and the reductions vectorise (reassociated sums)
    return {"source": prelude() + _SRC, "name": "row_kernels", "flags": (*DEFAULT_FLAGS, "-fopenmp"),
            "symbols": ["ds_softmax_f32", "ds_layernorm_f32", "ds_layernorm_args"]}


def library() -> ctypes.CDLL | None:
    """The row-kernel library, or None when no C compiler is available."""
    global _lib
    if _lib is None:
        try:
            from dynshape.codegen.cc import compile_c

            lib = compile_c(**spec())
            p, i64 = ctypes.c_void_p, ctypes.c_int64
            lib.ds_softmax_f32.argtypes, lib.ds_softmax_f32.restype = [p, p, i64, i64], None
            lib.ds_layernorm_f32.argtypes = [p, p, p, p, i64, i64, ctypes.c_float]
            lib.ds_layernorm_f32.restype = None
            lib.ds_layernorm_args.argtypes, lib.ds_layernorm_args.restype = [p], None
            _lib = lib
        except Exception:  # noqa: BLE001 - no compiler: numpy lowering instead
            _lib = False
    return _lib or None


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
