/* One row of LayerNormalization; x and y may be the same row (the fused products normalise in place).
   Included by the row-kernel library and by the packed-GEMM library, which exports it to generated kernels. */
#ifndef DS_LAYERNORM_ROW_H
#define DS_LAYERNORM_ROW_H
#include <math.h>
#include <stdint.h>

static inline void ds_layernorm_row_inline(const float *x, float *y, const float *restrict scale,
                                           const float *restrict bias, int64_t n, float eps) {
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
#endif
