/* The int8 products' entry points, for generated kernels (csrc/ds_gemm_int8.c; loaded before them, symbols global).
   A kernel quantizes its activations once per call (`ds_q8_quantize`, `ds_q8_quantize_static`, or `ds_q8_load` when
   they arrive quantized; outside its parallel loop) and hands the descriptor it returns to every tile (`ds_q8_block`,
   or `ds_q8_block_rq` for an 8-bit result). */
#ifndef DS_GEMM_INT8_H
#define DS_GEMM_INT8_H
#include <stdint.h>

int ds_q8_native(void);
int ds_q8_avx2(void);
int ds_q8_use_amx(int want);
void ds_q8_params(float lo, float hi, float *scale, int32_t *zp);
const void *ds_q8_quantize(const float *restrict x, int64_t m, int64_t k);
void ds_q8_act_params(const void *act, float *scale, int32_t *zp);
void ds_q8_act_row(const void *act, int64_t i, uint8_t *row, int32_t *sum);
void ds_q8_block(const void *act, const void *bp, float *restrict c, int64_t ldc, int64_t i0, int64_t i1, int64_t q,
                 int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict wscale);
void ds_q8_block_e(const void *act, const void *bp, float *restrict c, int64_t ldc, int64_t i0, int64_t i1, int64_t q,
                   int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict wscale);
const void *ds_q8_quantize_static(const float *restrict x, int64_t m, int64_t k, float scale, int32_t zp,
                                  int32_t is_signed);
const void *ds_q8_quantize_tokens(const float *restrict x, int64_t m, int64_t k);
const void *ds_q8_load(const void *restrict x, int64_t m, int64_t k, int32_t zp, int32_t is_signed);
void ds_q8_block_rq(const void *act, const void *bp, void *restrict y, int64_t ldc, int64_t i0, int64_t i1,
                    int64_t q, int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict mult,
                    int32_t yzp, int32_t is_signed);
void ds_q8_block_rq_e(const void *act, const void *bp, void *restrict y, int64_t ldc, int64_t i0, int64_t i1,
                      int64_t q, int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict mult,
                      int32_t yzp, int32_t is_signed);
void ds_q8_block_avx2(const void *act, const void *bp, float *restrict c, int64_t ldc, int64_t i0, int64_t i1,
                      int64_t q, int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict wscale);
void ds_q8_block_rq_avx2(const void *act, const void *bp, void *restrict y, int64_t ldc, int64_t i0, int64_t i1,
                         int64_t q, int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict mult,
                         int32_t yzp, int32_t is_signed);
#endif
