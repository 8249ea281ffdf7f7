/* The sgemm that C calls, through function pointers installed once per loaded library (ds_bind_blas).

   Code never links against a BLAS: one compiled library works with numpy's bundled OpenBLAS (always present)
   or MKL (optional extra), and the disk-cache key does not depend on where numpy lives. Only ILP64 CBLAS entry
   points are used (int64 dims), so dynamic sizes never overflow a 32-bit int. ds_sgemm is row-major:
   C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C. It handles the degenerate sizes dynamic shapes produce
   (m, n or k == 0), which reference BLAS rejects (lda < max(1, k) is an xerbla error that silently skips the
   product) or where k == 0 must still scale C. */
#ifndef DS_BLAS_H
#define DS_BLAS_H
#include <stdint.h>
typedef void (*ds_sgemm_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                            const float *, int64_t, float, float *, int64_t);
typedef void (*ds_sgemm_strided_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                                    int64_t, const float *, int64_t, int64_t, float, float *, int64_t, int64_t,
                                    int64_t);
static ds_sgemm_fn ds_sgemm_ptr;
static ds_sgemm_strided_fn ds_sgemm_strided_ptr;

/* Called once after loading, with the addresses of the chosen library's ILP64 cblas_sgemm and
   cblas_sgemm_batch_strided (NULL: loop over sgemm). */
void ds_bind_blas(void *sgemm, void *sgemm_strided) {
    ds_sgemm_ptr = (ds_sgemm_fn)sgemm;
    ds_sgemm_strided_ptr = (ds_sgemm_strided_fn)sgemm_strided;
}

static inline int64_t ds_ld(int64_t x) { return x > 1 ? x : 1; }

static void ds_scale_rows(int64_t m, int64_t n, float beta, float *c, int64_t ldc) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
}

/* Row-major GEMM; ta/tb: nonzero = transpose that operand. */
static inline void ds_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                            const float *a, int64_t lda, const float *b, int64_t ldb,
                            float beta, float *c, int64_t ldc) {
    if (m == 0 || n == 0) return;
    if (k == 0) { ds_scale_rows(m, n, beta, c, ldc); return; }
    ds_sgemm_ptr(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, alpha, a, ds_ld(lda), b, ds_ld(ldb),
                 beta, c, ds_ld(ldc));
}

/* `batch` independent row-major GEMMs at fixed element strides (sa/sb may be 0 to broadcast one operand). */
static inline void ds_sgemm_batched(int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                                    const float *a, int64_t lda, int64_t sa, const float *b, int64_t ldb,
                                    int64_t sb, float beta, float *c, int64_t ldc, int64_t sc) {
    if (batch == 0 || m == 0 || n == 0) return;
    if (ds_sgemm_strided_ptr && k > 0) {
        ds_sgemm_strided_ptr(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, alpha, a, ds_ld(lda), sa,
                             b, ds_ld(ldb), sb, beta, c, ds_ld(ldc), sc, batch);
        return;
    }
    for (int64_t i = 0; i < batch; i++)
        ds_sgemm(ta, tb, m, n, k, alpha, a + i * sa, lda, b + i * sb, ldb, beta, c + i * sc, ldc);
}
#endif
