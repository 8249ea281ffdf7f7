/* MatMul / Gemm through the chosen BLAS, called from C: every float32 product is one ds_sgemm or one
   strided-batched call writing straight into its output buffer (numpy's matmul picks its own path per call
   and leaves BLAS for stacked or strided operands). */
#include "ds_blas.h"
#include <omp.h>

/* OpenBLAS's process-wide thread count (openblas_set_num_threads64_ / _get_), bound by ds_bind_blas_threads for
   numpy's OpenBLAS; NULL for MKL, which runs on the kernels' own GNU OpenMP pool (blas.mkl). */
typedef void (*ds_set_threads_fn)(int);
typedef int (*ds_get_threads_fn)(void);
static ds_set_threads_fn ds_blas_set_threads;
static ds_get_threads_fn ds_blas_get_threads;

void ds_bind_blas_threads(void *set, void *get) {
    ds_blas_set_threads = (ds_set_threads_fn)set;
    ds_blas_get_threads = (ds_get_threads_fn)get;
}

/* Products of at least this many multiply-adds split over the OpenMP team when OpenBLAS's own threads would
   otherwise run them (~5 us at this core's rate: below, OpenBLAS runs one thread anyway). */
#define DS_MATMUL_SPLIT_MACS (1 << 18)
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

/* With OpenBLAS and an OpenMP team of more than one thread: the products (each split into as many row blocks as
   the team, fewer when the batch alone fills it) run on the team, each block one single-threaded sgemm, with
   OpenBLAS's count set to 1 for the call and put back after. Why: OpenBLAS runs its own pthreads, which spin for
   a while after each product; the generated kernels' OpenMP team that runs next then waits at its join for a
   thread the spinning ones had descheduled (BEiT at 224x224, whose attention products go through BLAS: 18 ms at
   one thread, 58 ms at two). Each block keeps every dot product's order over k: the same values as one call. */
static void ds_matmul_team(const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t n, int64_t k,
                           int64_t sa, int64_t sb, int ta, int tb, float alpha, float beta, int team) {
    const int old = ds_blas_get_threads();
    if (old != 1) ds_blas_set_threads(1);
    const int64_t parts = batch >= team ? 1 : (team + batch - 1) / batch;
    const int64_t rows = (m + parts - 1) / parts;
    #pragma omp parallel for schedule(static) collapse(2)
    for (int64_t i = 0; i < batch; i++)
        for (int64_t part = 0; part < parts; part++) {
            const int64_t r0 = part * rows, r1 = r0 + rows < m ? r0 + rows : m;
            if (r0 >= r1) continue;
            const float *ai = a + i * sa + (ta ? r0 : r0 * k);  /* op(A)'s rows r0..r1: A's columns when ta */
            ds_sgemm(ta, tb, r1 - r0, n, k, alpha, ai, ta ? m : k, b + i * sb, tb ? k : n, beta,
                     c + i * m * n + r0 * n, n);
        }
    if (old != 1) ds_blas_set_threads(old);
}

void ds_matmul_f32(const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t n, int64_t k,
                   int64_t sa, int64_t sb, int ta, int tb, float alpha, float beta) {
    if (batch == 1 && m <= 4 && !ta && k > 0) {
        ds_small_rows(a, b, c, m, n, k, tb, alpha, beta);
        return;
    }
    const int team = ds_blas_set_threads ? omp_get_max_threads() : 1;
    if (team > 1 && !omp_in_parallel() && k > 0
            && (double)batch * (double)m * (double)n * (double)k >= DS_MATMUL_SPLIT_MACS) {
        ds_matmul_team(a, b, c, batch, m, n, k, sa, sb, ta, tb, alpha, beta, team);
        return;
    }
    ds_sgemm_batched(ta, tb, batch, m, n, k, alpha, a, ta ? m : k, sa, b, tb ? k : n, sb, beta, c, n, m * n);
}

/* The same with every argument in two arrays: one cheap foreign call from a pre-bound plan. */
void ds_matmul_packed(const int64_t *p, const float *f) {
    ds_matmul_f32((const float *)p[0], (const float *)p[1], (float *)p[2], p[3], p[4], p[5], p[6], p[7], p[8],
                  (int)p[9], (int)p[10], f[0], f[1]);
}
