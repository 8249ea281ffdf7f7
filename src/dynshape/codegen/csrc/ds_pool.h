/* Channels-last windowed pools (MaxPool, AveragePool) by output row, for generated kernels (see ds_pool.c). */
#ifndef DS_POOL_INCLUDED
#define DS_POOL_INCLUDED
#include <stdint.h>

/* geo[]: the pool's geometry, indexed by DS_POOL_<field> (H = KH = 1 for 1-D): H, W, C, OH, OW, KH, KW, SH, SW,
   DH, DW, the begin and end pads PT, PL, PB, PR (the end ones: count_include_pad's), and MODE (DS_POOL_MAX,
   DS_POOL_AVG, DS_POOL_AVG_PADS): from ds_shared.h, generated from codegen/cshared.py, which the lowering reads. */
#include "ds_shared.h"

/* Output row (n, ho), every column and channel: y points at the row's first pixel (OW * C floats). MaxPool keeps
   a NaN (as numpy's reference does); AveragePool divides by the taps inside the input (DS_POOL_AVG) or inside
   the padded input (DS_POOL_AVG_PADS, count_include_pad: never ceil_mode's overhang). */
void ds_pool_row(const int64_t *geo, const float *restrict x, float *restrict y, int64_t n, int64_t ho);
#endif
