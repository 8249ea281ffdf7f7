/* The int8 products' entry points, for generated kernels (csrc/ds_gemm_int8.c; loaded before them, symbols global).
   A kernel quantizes its activations once per call (`ds_q8_quantize`, outside its parallel loop) and hands the
   descriptor it returns to every tile (`ds_q8_block`). */
#ifndef DS_GEMM_INT8_H
#define DS_GEMM_INT8_H
#include <stdint.h>

int ds_q8_native(void);
void ds_q8_params(float lo, float hi, float *scale, int32_t *zp);
const void *ds_q8_quantize(const float *restrict x, int64_t m, int64_t k);
void ds_q8_act_params(const void *act, float *scale, int32_t *zp);
void ds_q8_act_row(const void *act, int64_t i, uint8_t *row, int32_t *sum);
void ds_q8_block(const void *act, const void *bp, float *restrict c, int64_t ldc, int64_t i0, int64_t i1, int64_t q,
                 int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict wscale);
void ds_q8_block_e(const void *act, const void *bp, float *restrict c, int64_t ldc, int64_t i0, int64_t i1, int64_t q,
                   int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict wscale);
#endif
