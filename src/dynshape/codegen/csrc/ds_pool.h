/* Channels-last windowed pools (MaxPool, AveragePool) by output row, for generated kernels (see ds_pool.c). */
#ifndef DS_POOL_INCLUDED
#define DS_POOL_INCLUDED
#include <stdint.h>

/* geo[]: the pool's geometry, in this order (H = KH = 1 for 1-D). */
enum {
    DS_POOL_H, DS_POOL_W, DS_POOL_C, DS_POOL_OH, DS_POOL_OW, DS_POOL_KH, DS_POOL_KW, DS_POOL_SH, DS_POOL_SW,
    DS_POOL_DH, DS_POOL_DW,
    DS_POOL_PT, DS_POOL_PL, DS_POOL_PB, DS_POOL_PR, /* begin and end pads (the end ones: count_include_pad's) */
    DS_POOL_MODE,                                  /* DS_POOL_MAX, DS_POOL_AVG, DS_POOL_AVG_PADS */
    DS_POOL_GEO
};
enum { DS_POOL_MAX, DS_POOL_AVG, DS_POOL_AVG_PADS };

/* Output row (n, ho), every column and channel: y points at the row's first pixel (OW * C floats). MaxPool keeps
   a NaN (as numpy's reference does); AveragePool divides by the taps inside the input (DS_POOL_AVG) or inside
   the padded input (DS_POOL_AVG_PADS, count_include_pad: never ceil_mode's overhang). */
void ds_pool_row(const int64_t *geo, const float *restrict x, float *restrict y, int64_t n, int64_t ho);
#endif
