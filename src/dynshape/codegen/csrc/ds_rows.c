/* Row-wise kernels for the reductions transformers spend time in: softmax and layer norm on the last axis.

   numpy needs five to eight passes with temporaries for these; one row at a time in C keeps the row in
   cache. The row length is a runtime argument, so one build serves every shape. */
#include "ds_prelude.h"
#include "ds_layernorm_row.h"


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
    for (int64_t r = 0; r < rows; r++) ds_layernorm_row_inline(x + r * n, y + r * n, scale, bias, n, eps);
}

/* The same with every argument in one int64 array (eps as the bits of a float): a plan's program can call it. */
void ds_layernorm_args(const int64_t *a) {
    float eps;
    memcpy(&eps, &a[6], sizeof eps);
    ds_layernorm_f32((const float *)a[0], (const float *)a[1], (const float *)a[2], (float *)a[3], a[4], a[5], eps);
}

/* LRN over the last axis (channels last): y = x / (bias + alpha / size * sum of squares over the window
   [c - (size - 1) / 2, c + size / 2] clipped to the row)^beta. Per row: the squares into a scratch row padded
   with lo zeros before and hi after (so every window is `size` plain loads and the loop over channels
   vectorises: the clipped scalar loop made Inception v1's two LRNs 4.8 ms of a 34 ms call at 320x320), the
   window sums, then one vectorised pass; beta = 0.75 (AlexNet, GoogLeNet, ZFNet) as sqrt(v) * sqrt(sqrt(v))
   (correctly rounded square roots, within 2 ulp of powf, and vectorised), any other beta with powf. The sums
   add the window's squares in channel order, as before. */
void ds_lrn_f32(const float *restrict x, float *restrict y, int64_t rows, int64_t n, int64_t size, float alpha,
                float beta, float bias) {
    const int64_t lo = (size - 1) / 2;
    const float k = alpha / (float)size;
    #pragma omp parallel if(rows * n >= 32768)
    {
        float *d = (float *)malloc((size_t)n * sizeof(float));
        float *sq = (float *)calloc((size_t)(n + size), sizeof(float)); /* its padding stays zero */
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * n;
            float *yr = y + r * n;
            #pragma omp simd
            for (int64_t c = 0; c < n; c++) sq[lo + c] = xr[c] * xr[c];
            for (int64_t c = 0; c < n; c++) d[c] = 0.0f;
            for (int64_t j = 0; j < size; j++) { /* tap-major: the channel loop vectorises whatever the size */
                #pragma omp simd
                for (int64_t c = 0; c < n; c++) d[c] += sq[c + j];
            }
            #pragma omp simd
            for (int64_t c = 0; c < n; c++) d[c] = bias + k * d[c];
            if (beta == 0.75f) {
                #pragma omp simd
                for (int64_t c = 0; c < n; c++) { const float q = sqrtf(d[c]); yr[c] = xr[c] / (q * sqrtf(q)); }
            } else {
                for (int64_t c = 0; c < n; c++) yr[c] = xr[c] / powf(d[c], beta);
            }
        }
        free(sq);
        free(d);
    }
}
