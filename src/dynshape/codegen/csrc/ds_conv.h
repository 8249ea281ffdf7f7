/* Channels-last convolution tiles on dynshape's micro-kernels (csrc/ds_conv.c), for generated kernels.

   An output tile is up to DS_CONV_ROWS consecutive output pixels (flat over images, rows and columns), times one
   32-column panel of one group's output channels. The weights are packed once per graph into panels of 32 output channels
   whose rows run over k = (kh * KW + kw) * CG + c (the layout `pack_conv` makes), so a tile is an implicit
   GEMM: no im2col buffer, the input rows are read where they are, a zero row standing in for padding. */
#ifndef DS_CONV_INCLUDED
#define DS_CONV_INCLUDED
#include <stdint.h>

/* geo[]: the convolution's geometry, indexed by DS_CONV_<field> (H = KH = 1 for 1-D): input rows, columns and
   channels (a pixel is C floats) H, W, C; output rows, columns, channels OH, OW, OC; KH, KW, SH, SW, DH, DW; the
   begin pads (top, left) PT, PL; groups and the input and output channels per group G, CG, OCG; LDY, the output
   pixel stride in floats (>= OC: a concat slice); ACT, what the tiles apply after their bias (DS_ACT_*); NPIX, the
   output pixels in all (N * OH * OW: which block is a pair's last); WREST, the packed weight floats from bp on
   that the caller's tiles run through (0: the conv's own, G * panels * K * 32); XBF, YBF, RBF: 1 where the input,
   the output or the residual is stored as bf16 (the bf16 tiles only: codegen/lower/conv_storage.py), else 0. The
   fields' order, DS_ACT_*, and DS_CONV_ROWS (output pixels per block: a multiple of every micro-tile height) come
   from ds_shared.h, generated from codegen/cshared.py, which the lowerings read too. */
#include "ds_shared.h"

/* y[p][g * OCG + q * 32 + j] = sum_k x[...] * w[...] for the flat output pixels p0 <= p < p1 (p = (n * OH + ho)
   * OW + wo) and the columns of panel q of group g; `zeros` holds at least CG zero floats (what a padded tap
   reads). Each value is + bias[column] where `bias` (OC floats) is given, + res[p * OC + column] where `res` (a
   residual map like the output) is, then geo[DS_CONV_ACT]'s activation, in registers before the store. */
void ds_conv_tile(const int64_t *geo, const float *restrict x, const float *restrict bp, float *restrict y,
                  const float *restrict zeros, int64_t p0, int64_t p1, int64_t g, int64_t q,
                  const float *restrict bias, const float *restrict res);

/* Panels q and q + 1 (when the group has it) of the same tile: ds_conv_tile's result for both, computed as 6 x 64
   micro-tiles (each input value read once for 64 output channels). */
void ds_conv_tile2(const int64_t *geo, const float *restrict x, const float *restrict bp, float *restrict y,
                   const float *restrict zeros, int64_t p0, int64_t p1, int64_t g, int64_t q,
                   const float *restrict bias, const float *restrict res);

/* Output row (n, ho) of a depthwise convolution (G = C, one channel per group): y points at the row's first
   pixel (pixels LDY floats apart), w is (KH * KW, C), bias is C floats or NULL; geo[DS_CONV_ACT] applied. */
void ds_dwconv_row(const int64_t *geo, const float *restrict x, const float *restrict w,
                   const float *restrict bias, float *restrict y, int64_t n, int64_t ho);

/* Output rows ho0..ho1 of image n of a depthwise conv (geometry gd) over a 1x1 conv (gp, weights bp, bias_p; its
   activation in gp[DS_CONV_ACT]) of x: the 1x1's rows they read computed into `scratch` (at least
   ((ho1 - ho0 - 1) * SH + (KH - 1) * DH + 1) * W * C floats), then the depthwise rows from there; y is the
   depthwise output's start. gp[DS_CONV_NPIX] should be -1 (no next-pair prefetch: its weights stay in cache). */
void ds_pwdw_rows(const int64_t *gp, const int64_t *gd, const float *restrict x, const float *restrict bp,
                  const float *restrict bias_p, const float *restrict wd, const float *restrict bias_d,
                  float *restrict y, const float *restrict zeros, float *restrict scratch, int64_t n, int64_t ho0,
                  int64_t ho1);
/* The same with the 1x1's product by `tile` (ds_conv_tile2_bf16_addr(): weights packed for it), `ep` the call's
   ds_bf16_epoch(): a bf16 precision's chain. */
void ds_pwdw_rows_t(const int64_t *gp, const int64_t *gd, const float *restrict x, const void *bp,
                    const float *restrict bias_p, const float *restrict wd, const float *restrict bias_d,
                    float *restrict y, const float *restrict zeros, float *restrict scratch, int64_t n, int64_t ho0,
                    int64_t ho1, int64_t tile, int64_t ep);

/* Winograd F(2x2, 3x3) for a 3x3, stride-1, undilated, ungrouped convolution (any C and OC; tails masked):
   the 2x2 output tiles t0 <= t < t1 (flat over image, tile row, tile column; ceil(OH/2) x ceil(OW/2) tiles an
   image), `up` the 16 transformed weight matrices packed as 1x1 convolutions' (pack_winograd), `scratch`
   DS_WINO_SCRATCH(C, OC) floats of the caller's. With `par`, the call's own OpenMP team shares the work.
   `bias` as in ds_conv_tile: added (then geo[DS_CONV_ACT]) as each output tile is stored. */
/* DS_WINO_TILES / DS_WINO4_TILES, the tiles per chunk of F(2x2) / F(4x4): ds_shared.h's */
#define DS_WINO_SCRATCH(C, OC) (16 * DS_WINO_TILES * ((C) + (OC)))
void ds_wino_f2(const int64_t *geo, const float *restrict x, const float *restrict up, float *restrict y,
                const float *restrict zeros, int64_t t0, int64_t t1, int64_t par, float *restrict scratch,
                const float *restrict bias);

/* F(4x4, 3x3): the same contract with 4x4 output tiles (ceil(OH/4) x ceil(OW/4) an image), 36 transformed
   weight matrices, DS_WINO4_SCRATCH(C, OC) floats of scratch. */
#define DS_WINO4_SCRATCH(C, OC) (36 * DS_WINO4_TILES * ((C) + (OC)))
void ds_wino_f4(const int64_t *geo, const float *restrict x, const float *restrict up, float *restrict y,
                const float *restrict zeros, int64_t t0, int64_t t1, int64_t par, float *restrict scratch,
                const float *restrict bias);
/* Both with each position's product by `tile` (the address of a ds_conv_tile2-like function taking an epoch last:
   ds_conv_tile2_bf16_addr()) on weights in that function's packing; `ep`: the call's ds_bf16_epoch(). */
void ds_wino_f2_t(const int64_t *geo, const float *restrict x, const void *up, float *restrict y,
                  const float *restrict zeros, int64_t t0, int64_t t1, int64_t par, float *restrict scratch,
                  const float *restrict bias, int64_t tile, int64_t ep, int64_t half);
void ds_wino_f4_t(const int64_t *geo, const float *restrict x, const void *up, float *restrict y,
                  const float *restrict zeros, int64_t t0, int64_t t1, int64_t par, float *restrict scratch,
                  const float *restrict bias, int64_t tile, int64_t ep, int64_t half);
#endif
