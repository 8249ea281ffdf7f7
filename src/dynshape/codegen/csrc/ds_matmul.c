/* MatMul / Gemm through the chosen BLAS, called from C: every float32 product is one ds_sgemm or one
   strided-batched call writing straight into its output buffer (numpy's matmul picks its own path per call
   and leaves BLAS for stacked or strided operands). */
#include "ds_blas.h"
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
