/* The packed-GEMM library's entry points, for generated kernels (resolved when they load: the library is
   loaded first, with its symbols global). See ds_gemm.c for the layout of packed panels. */
#ifndef DS_GEMM_H
#define DS_GEMM_H
#include <stdint.h>

#include "ds_shared.h" /* DS_NR: columns per packed panel (two 16-float vectors) */

void ds_pack_panels(const float *restrict b, int64_t ldb, int64_t k, int64_t n, float *restrict bp);
void ds_pack_panels_t(const float *restrict a, int64_t lda, int64_t k, int64_t n, float *restrict bp);
void ds_pack_conv(const float *restrict w, int64_t co, int64_t cig, int64_t taps, int64_t groups,
                  const float *restrict scale, float *restrict out);
void ds_pack_winograd(const float *restrict w, int64_t co, int64_t ci, int64_t a, const double *restrict g,
                      float *restrict out);
void ds_gemm_panel(const float *restrict a, int64_t lda, const float *restrict panel, int64_t ps,
                   float *restrict c, int64_t ldc, int64_t i0, int64_t i1, int64_t ncols, int64_t k);
void ds_gemm_tile(const float *restrict a, int64_t lda, const float *restrict bp, float *restrict c,
                  int64_t ldc, int64_t i0, int64_t i1, int64_t q, int64_t n, int64_t k);
void ds_gemm_block(const float *restrict a, int64_t lda, const float *restrict bp, float *restrict c,
                   int64_t ldc, int64_t i0, int64_t i1, int64_t q, int64_t n, int64_t k);
void ds_gemm_block_nt(const float *restrict a, int64_t lda, const float *restrict b, float *restrict c,
                      int64_t ldc, int64_t i0, int64_t i1, int64_t q, int64_t n, int64_t k);
void ds_gemm_packed(const float *restrict a, int64_t lda, const float *restrict bp, float *restrict c,
                    int64_t ldc, int64_t m, int64_t n, int64_t k);
float ds_softmax_exp_sum(float *restrict row, int64_t n, float mx);
float ds_softmax_exp_sum_bf16(float *restrict row, int64_t n, float mx);
void ds_dot_rows(const float *restrict q, const float *restrict k, int64_t n, int64_t d, float *restrict out);
void ds_axpy_rows(const float *restrict p, const float *restrict v, int64_t n, int64_t dv, float *restrict o);
void ds_layernorm_row(const float *x, float *y, const float *restrict scale, const float *restrict bias,
                      int64_t n, float eps);
void ds_layernorm_row_tree(const float *x, float *y, const float *restrict scale, const float *restrict bias,
                           int64_t n, float eps);
int omp_get_max_threads(void);
int omp_in_parallel(void); /* (libgomp's, as omp.h would declare them: ds_rnn.c asks both) */
#endif
