/* Channels-last convolution tiles: implicit GEMM on packed weights (see ds_conv.h for the contract).

   A micro-tile is MR consecutive output pixels of one output row times 32 output channels, accumulated in
   2*MR vector registers over every tap (kh, kw) and input channel of the group: per tap, each row's input
   pixel is found (or the zero row, where the tap falls in the padding), then the inner loop is the same
   broadcast-FMA loop as the product micro-kernels (ds_gemm.c) over the tap's CG packed rows. */
#include <stdint.h>

#include "ds_conv_common.h"
#include "ds_conv_flat.h"

/* The finish a micro-tile applies to its accumulators before storing them, instead of leaving it to the
   generated epilogue (in registers: a separate epilogue pass over the tile, for the 1x1 convs of few input
   channels, SqueezeNet's and MobileNet's, cost 15-20% of their time). Three passes over its rows, each taken or
   not as a whole: + `bias` (the tile's first column's; NULL: none), + a residual `res` (the tile's first column
   of a map of OC-float pixels, pixel p's row at res + p * OC), then geo[DS_CONV_ACT]'s activation: the
   reference's order, (c + bias) + residual. The column masks m0, m1 (ds_cmask16) are the tile's: one
   vector of columns (N = 1), two (2), or two full panels then the masked pair (4). One pass per fact keeps
   each micro-kernel's code small: with the activation and the masked loads inside a residual / no-residual
   branch per row, the finishes were a third of ds_conv.c's compile time. */
#define DS_ADDB1(r) c##r##0 += f0;
#define DS_ADDB2(r) DS_ADDB1(r) c##r##1 += f1;
#define DS_ADDB4(r) DS_ADDB2(r) c##r##2 += f2; c##r##3 += f3;
#define DS_RES(r) const float *rr##r = res + (p + (r)) * OC;
#define DS_ADDR1(r) { DS_RES(r) c##r##0 += ds_mld16(rr##r, m0); }
#define DS_ADDR2(r) { DS_RES(r) c##r##0 += ds_mld16(rr##r, m0); c##r##1 += ds_mld16(rr##r + 16, m1); }
#define DS_ADDR4(r)                                                                                         \
    { DS_RES(r) c##r##0 += ds_ld16(rr##r); c##r##1 += ds_ld16(rr##r + 16);                                  \
      c##r##2 += ds_mld16(rr##r + 32, m0); c##r##3 += ds_mld16(rr##r + 48, m1); }
#define DS_RELU1(r) c##r##0 = ds_max16(0.0f, c##r##0);
#define DS_RELU2(r) DS_RELU1(r) c##r##1 = ds_max16(0.0f, c##r##1);
#define DS_RELU4(r) DS_RELU2(r) c##r##2 = ds_max16(0.0f, c##r##2); c##r##3 = ds_max16(0.0f, c##r##3);
#define DS_HSW(v) v = ds_act(v, DS_ACT_HARDSWISH);
#define DS_HSWISH1(r) DS_HSW(c##r##0)
#define DS_HSWISH2(r) DS_HSWISH1(r) DS_HSW(c##r##1)
#define DS_HSWISH4(r) DS_HSWISH2(r) DS_HSW(c##r##2) DS_HSW(c##r##3)
#define DS_R6(v) v = ds_act_light(v, DS_ACT_RELU6);
#define DS_RELU61(r) DS_R6(c##r##0)
#define DS_RELU62(r) DS_RELU61(r) DS_R6(c##r##1)
#define DS_RELU64(r) DS_RELU62(r) DS_R6(c##r##2) DS_R6(c##r##3)
#define DS_SIL(v) v = ds_act(v, DS_ACT_SILU);
#define DS_SILU1(r) DS_SIL(c##r##0)
#define DS_SILU2(r) DS_SILU1(r) DS_SIL(c##r##1)
#define DS_SILU4(r) DS_SILU2(r) DS_SIL(c##r##2) DS_SIL(c##r##3)
#define DS_FIN_ROWS(MR, N)                                                                                  \
    { const int64_t act = geo[DS_CONV_ACT];                                                                \
      if (bias) { DS_BIAS##N DS_ROWS##MR(DS_ADDB##N) }                                                     \
      if (res) { const int64_t OC = geo[DS_CONV_OC]; DS_ROWS##MR(DS_ADDR##N) }                             \
      if (act == DS_ACT_RELU) { DS_ROWS##MR(DS_RELU##N) }                                                  \
      else if (act == DS_ACT_HARDSWISH) { DS_ROWS##MR(DS_HSWISH##N) }                                      \
      else if (act == DS_ACT_SILU) { DS_ROWS##MR(DS_SILU##N) }                                             \
      else if (act == DS_ACT_RELU6) { DS_ROWS##MR(DS_RELU6##N) } }
#define DS_BIAS1 const ds_v16 f0 = ds_mld16(bias, m0);
#define DS_BIAS2 const ds_v16 f0 = ds_mld16(bias, m0), f1 = ds_mld16(bias + 16, m1);
#define DS_BIAS4                                                                                            \
    const ds_v16 f0 = ds_ld16(bias), f1 = ds_ld16(bias + 16);                                               \
    const ds_v16 f2 = ds_mld16(bias + 32, m0), f3 = ds_mld16(bias + 48, m1);
#define DS_FIN_1(MR) DS_FIN_ROWS(MR, 1)
#define DS_FIN_2(MR) DS_FIN_ROWS(MR, 2)
#define DS_FIN_4(MR) DS_FIN_ROWS(MR, 4)
/* the masks of a micro-tile of `ncols` columns (of its last panel) */
#define DS_CMASKS const ds_cmask m0 = ds_cmask16(ncols), m1 = ds_cmask16(ncols - 16); (void)m1;

/* Row r of a micro-tile: its accumulators (two vectors: 32 columns; one: the first 16), its image and the
   top-left input position of its window. */
#define DS_CROW_POS(r)                                                                                      \
    const float *a##r, *x##r = xg + pn_ * H * W * C;                                                        \
    const int64_t ih##r = poh_ * SH - PT, iw##r = pow_ * SW - PL;                                           \
    DS_POS_NEXT
#define DS_CROW_INIT(r) ds_v16 c##r##0 = {0}, c##r##1 = {0}; DS_CROW_POS(r)
#define DS_NCROW_INIT(r) ds_v16 c##r##0 = {0}; DS_CROW_POS(r)
#define DS_CROW_PTR(r)                                                                                      \
    { const int64_t ih = ih##r + kh * DH, iw = iw##r + kw * DW;                                             \
      a##r = ((uint64_t)ih < (uint64_t)H && (uint64_t)iw < (uint64_t)W) ? x##r + (ih * W + iw) * C : zeros; }
#define DS_CROW_FMA(r) { const float v = a##r[c]; c##r##0 += v * b0; c##r##1 += v * b1; }
#define DS_NCROW_FMA(r) c##r##0 += a##r[c] * b0;
#define DS_CROW_STORE(r) { ds_mst16(yo + (r) * LDY, c##r##0, m0); ds_mst16(yo + (r) * LDY + 16, c##r##1, m1); }
#define DS_NCROW_STORE(r) ds_mst16(yo + (r) * LDY, c##r##0, m0);
#define DS_LOAD_B2 const ds_v16 b0 = ds_ld16(b + c * 32), b1 = ds_ld16(b + c * 32 + 16);
#define DS_LOAD_B1 const ds_v16 b0 = ds_ld16(b + c * 32);

/* A panel's first block reads the panel from L3 (a layer's weights are used once per call, and the hardware
   prefetcher falls behind a 32-column panel streamed at FMA speed: a 512-channel 3x3 conv on a 7x7 map ran
   1.6x slower with its weights out of L2). Its full-width micro-tiles (`ds_conv_pmicro_12`) prefetch the panel
   64 iterations (8 KB) ahead; the other blocks find it in L2 and run the loop without the prefetches (a flag
   tested in the loop cost 3-4% on large maps: gcc does not unswitch it). */
#define DS_PREFETCH_DIST (64 * 32)
#define DS_PREFETCH_B(b) { __builtin_prefetch((b) + DS_PREFETCH_DIST, 0, 2);                                 \
                           __builtin_prefetch((b) + DS_PREFETCH_DIST + 16, 0, 2); }

/* MR consecutive output pixels (flat over image, row, column: a micro-tile may span rows and images, so small
   feature maps still fill it) times one panel of 32 output channels (`ds_conv_micro_MR`), or its first 16
   (`ds_conv_nmicro_MR`, a group's <= 16-column tail such as 8 output channels: one register a pixel, so twice
   the pixels; see ds_gemm.c): per tap, each row's input pixel (or the zero row in the padding), then the
   broadcast-FMA loop over the tap's CG packed rows. */
#define DS_CONV_MICRO_OF(NAME, MR, INIT, LOAD_B, FMA, STORE, PREFETCH, FIN)                                 \
    static void NAME##_##MR(const int64_t *geo, const float *restrict xg, const float *restrict bp,         \
                            float *restrict yo, const float *restrict zeros, int64_t p, int64_t ncols,      \
                            const float *restrict bias, const float *restrict res) {                        \
        GEO_LOCALS;                                                                                         \
        DS_CMASKS                                                                                           \
        DS_POS_START                                                                                        \
        DS_ROWS##MR(INIT)                                                                                    \
        for (int64_t kh = 0; kh < KH; kh++)                                                                 \
            for (int64_t kw = 0; kw < KW; kw++) {                                                           \
                DS_ROWS##MR(DS_CROW_PTR)                                                                     \
                const float *b = bp + (kh * KW + kw) * CG * 32;                                             \
                _Pragma("GCC unroll 4")                                                                     \
                for (int64_t c = 0; c < CG; c++) {                                                          \
                    LOAD_B                                                                                  \
                    PREFETCH(b + c * 32)                                                                    \
                    DS_ROWS##MR(FMA)                                                                         \
                }                                                                                           \
            }                                                                                               \
        FIN(MR)                                                                                             \
        DS_ROWS##MR(STORE)                                                                                   \
    }
#define DS_NO_PREFETCH(b)
/* a pointwise panel's first block takes the prefetching tile above this many packed rows (16 KB of a panel) */
#define DS_FLAT_FIRST_MAX_K 128
#ifdef __AVX512F__
#define DS_CONV_MICRO(MR)                                                                                   \
    DS_CONV_MICRO_OF(ds_conv_micro, MR, DS_CROW_INIT, DS_LOAD_B2, DS_CROW_FMA, DS_CROW_STORE, DS_NO_PREFETCH,    \
                     DS_FIN_2)
#define DS_CONV_NMICRO(MR)                                                                                  \
    DS_CONV_MICRO_OF(ds_conv_nmicro, MR, DS_NCROW_INIT, DS_LOAD_B1, DS_NCROW_FMA, DS_NCROW_STORE,                \
                     DS_NO_PREFETCH, DS_FIN_1)
#else
#define DS_CONV_HALF(MR, HALF)                                                                              \
    {   DS_ROWS##MR(DS_HACC_ZERO)                                                                            \
        for (int64_t kh = 0; kh < KH; kh++)                                                                 \
            for (int64_t kw = 0; kw < KW; kw++) {                                                           \
                DS_ROWS##MR(DS_CROW_PTR)                                                                     \
                const float *b = bp + (kh * KW + kw) * CG * 32 + (HALF) * 16;                               \
                _Pragma("GCC unroll 4")                                                                     \
                for (int64_t c = 0; c < CG; c++) {                                                          \
                    const ds_v8 h0 = ds_ld8(b + c * 32), h1 = ds_ld8(b + c * 32 + 8);                       \
                    DS_ROWS##MR(DS_HFMA)                                                                     \
                }                                                                                           \
            }                                                                                               \
        { DS_HALF_FIN(HALF) DS_ROWS##MR(DS_HFIN) } }
#define DS_CONV_HMICRO_OF(NAME, MR, HALVES)                                                                 \
    static void NAME##_##MR(const int64_t *geo, const float *restrict xg, const float *restrict bp,         \
                            float *restrict yo, const float *restrict zeros, int64_t p, int64_t ncols,      \
                            const float *restrict bias, const float *restrict res) {                        \
        GEO_LOCALS;                                                                                         \
        const int64_t act_ = geo[DS_CONV_ACT];                                                              \
        DS_POS_START                                                                                        \
        DS_ROWS##MR(DS_CROW_POS)                                                                             \
        HALVES                                                                                              \
    }
#define DS_CONV_MICRO(MR)                                                                                   \
    DS_CONV_HMICRO_OF(ds_conv_micro, MR,                                                                    \
                      DS_CONV_HALF(MR, 0) if (ncols > 24) DS_CONV_HALF(MR, 1) else DS_CONV_QUARTER(MR, 16))
#define DS_CONV_NMICRO(MR) DS_CONV_HMICRO_OF(ds_conv_nmicro, MR, DS_CONV_HALF(MR, 0))
/* A panel whose columns end within 8 (a group of 34 output channels: 32 + 2; 24: 16 + 8): one 8-float vector a
   row, 12 rows; the 16-column half spent half or more of its multiply-adds on the zero padding. Same order. */
#define DS_QACC_ZERO(r) ds_v8 g##r##0 = {0};
#define DS_QFMA(r) g##r##0 += a##r[c] * h0;
/* OFF: the quarter's first column in the panel (0, or 16 for a panel of 17..24 columns: 24 or 40 channels) */
#define DS_QFIN(r)                                                                                          \
    { if (bias) g##r##0 += qb_;                                                                             \
      if (res) g##r##0 += ds_ld8n(res + (p + (r)) * geo[DS_CONV_OC] + off_, n_);                            \
      ds_st8n(yo + (r) * LDY + off_, ds_act_light8(g##r##0, act_), n_); }
/* The quarter's rows finished (as DS_HALF_FIN then DS_HFIN for a half): its columns from OFF, its bias loaded once. */
#define DS_QUARTER_FIN(MR, OFF)                                                                             \
    { const int64_t off_ = (OFF), n_ = ncols - off_;                                                        \
      const ds_v8 qb_ = bias ? ds_ld8n(bias + off_, n_) : (ds_v8){0};                                       \
      DS_ROWS##MR(DS_QFIN) }
#define DS_CONV_QUARTER(MR, OFF)                                                                            \
    {   DS_ROWS##MR(DS_QACC_ZERO)                                                                            \
        for (int64_t kh = 0; kh < KH; kh++)                                                                 \
            for (int64_t kw = 0; kw < KW; kw++) {                                                           \
                DS_ROWS##MR(DS_CROW_PTR)                                                                     \
                const float *b = bp + (kh * KW + kw) * CG * 32 + (OFF);                                     \
                _Pragma("GCC unroll 4")                                                                     \
                for (int64_t c = 0; c < CG; c++) {                                                          \
                    const ds_v8 h0 = ds_ld8(b + c * 32);                                                    \
                    DS_ROWS##MR(DS_QFMA)                                                                     \
                }                                                                                           \
            }                                                                                               \
        DS_QUARTER_FIN(MR, OFF) }
#define DS_CONV_QMICRO(MR) DS_CONV_HMICRO_OF(ds_conv_qmicro, MR, DS_CONV_QUARTER(MR, 0))
DS_CONV_QMICRO(1) /* (three heights: each variant costs compile time on every CNN's first build) */
DS_CONV_QMICRO(4)
DS_CONV_QMICRO(12)
#endif
DS_CONV_NMICRO(1)
DS_CONV_NMICRO(2)
DS_CONV_NMICRO(4)
#ifdef __AVX512F__
DS_CONV_NMICRO(8)
#else
/* 6 rows, not 8, on 16 ymm registers: 12 accumulators, two weight vectors and the broadcast (8 rows spilled) */
DS_CONV_NMICRO(6)
#endif
#if DS_MR16 > 8
DS_CONV_NMICRO(12)
DS_CONV_NMICRO(16)
DS_CONV_NMICRO(24)
#endif

DS_CONV_MICRO(1)
DS_CONV_MICRO(2)
DS_CONV_MICRO(4)
#ifndef __AVX512F__
DS_CONV_MICRO(3) /* with 5: the last pixels of a block (ds_conv_tile) */
DS_CONV_MICRO(5)
DS_CONV_MICRO(6) /* each half 6 rows x 2 ymm: 12 accumulators (4 rows used 8 of the 16 registers) */
#endif
/* Whether a conv is pointwise (1x1, any stride, no padding read: every output pixel's one input pixel inside the
   map): each pixel's input is a row of C floats (ds_pw_offsets). */
static inline int ds_conv_pointwise(const int64_t *geo) {
    return geo[DS_CONV_KH] == 1 && geo[DS_CONV_KW] == 1 && geo[DS_CONV_PT] == 0 && geo[DS_CONV_PL] == 0
           && (geo[DS_CONV_OH] - 1) * geo[DS_CONV_SH] < geo[DS_CONV_H]
           && (geo[DS_CONV_OW] - 1) * geo[DS_CONV_SW] < geo[DS_CONV_W];
}
#if DS_MR > 4
DS_CONV_MICRO(8)
DS_CONV_MICRO(12)
DS_CONV_MICRO_OF(ds_conv_pmicro, 12, DS_CROW_INIT, DS_LOAD_B2, DS_CROW_FMA, DS_CROW_STORE, DS_PREFETCH_B,
                 DS_FIN_2)
#endif


/* Runs: a dense convolution (one group) without column dilation reads, for one kernel row kh, the KW taps of a
   pixel as ONE contiguous run of KW * C floats (channels last: the pixels iw .. iw + KW - 1 are adjacent), in
   the packed rows' own order (k = (kh * KW + kw) * C + c). Few input channels (the RGB stem: C = 3) make the
   per-tap loop above mostly overhead; per kernel row there is one pointer and one long loop instead.
   A pixel whose window crosses the border has its whole patch (KH runs, zeros for the padding) gathered into
   its scratch first, so in the loop every row's kernel-row pointer is base + kh * stride: integer arithmetic
   only, and the accumulators stay in registers. */
#define DS_CONV_PATCH_MAX 512 /* KH * KW * C floats at most: a micro-tile's scratch stays small */

/* A patch that crosses the border, gathered into `s` (KH runs of KW * C floats, zeros for the padding). */
__attribute__((noinline)) static const float *ds_conv_gather(const int64_t *geo, const float *restrict x,
                                                             int64_t ih0, int64_t iw0, float *restrict s) {
    const int64_t H = geo[DS_CONV_H], W = geo[DS_CONV_W], C = geo[DS_CONV_C], KH = geo[DS_CONV_KH];
    const int64_t KW = geo[DS_CONV_KW], DH = geo[DS_CONV_DH], RUN = KW * C;
    for (int64_t kh = 0; kh < KH; kh++) {
        const int64_t ih = ih0 + kh * DH;
        for (int64_t kw = 0; kw < KW; kw++) {
            const int64_t iw = iw0 + kw;
            const int inside = (uint64_t)ih < (uint64_t)H && (uint64_t)iw < (uint64_t)W;
            for (int64_t c = 0; c < C; c++) s[kh * RUN + kw * C + c] = inside ? x[(ih * W + iw) * C + c] : 0.0f;
        }
    }
    return s;
}

/* Row r's patch: in place (kernel rows DH * W * C floats apart), or gathered (RUN apart). */
#define DS_RROW_BASE(r)                                                                                     \
    const float *base##r;                                                                                   \
    int64_t st##r;                                                                                          \
    { const float *x = xg + pn_ * H * W * C;                                                                \
      const int64_t ih0 = poh_ * SH - PT, iw0 = pow_ * SW - PL;                                             \
      if (ih0 >= 0 && ih0 + (KH - 1) * DH < H && iw0 >= 0 && iw0 + KW <= W) {                               \
          base##r = x + (ih0 * W + iw0) * C; st##r = DH * W * C;                                            \
      } else {                                                                                              \
          base##r = ds_conv_gather(geo, x, ih0, iw0, scratch + (r) * DS_CONV_PATCH_MAX); st##r = KW * C;    \
      } }                                                                                                   \
    DS_POS_NEXT
#define DS_RROW_PTR(r) const float *a##r = base##r + kh * st##r;
#define DS_RROW_ZERO2(r) ds_v16 c##r##0 = {0}, c##r##1 = {0};
#define DS_RROW_ZERO1(r) ds_v16 c##r##0 = {0};
#define DS_RROW_ZERO4(r) ds_v16 c##r##0 = {0}, c##r##1 = {0}, c##r##2 = {0}, c##r##3 = {0};
#ifdef __AVX512F__
#define DS_CONV_RMICRO(MR, NV, FMA, STORE)                                                                  \
    static void ds_conv_rmicro##NV##_##MR(const int64_t *geo, const float *restrict xg,                     \
                                          const float *restrict bp, float *restrict yo, int64_t p,          \
                                          int64_t ncols, const float *restrict bias,                         \
                                          const float *restrict res) {                                       \
        GEO_LOCALS;                                                                                         \
        const int64_t RUN = KW * C;                                                                         \
        float scratch[MR * DS_CONV_PATCH_MAX];                                                              \
        DS_CMASKS                                                                                           \
        (void)CG; (void)DW;                                                                                 \
        DS_POS_START                                                                                        \
        DS_ROWS##MR(DS_RROW_BASE)                                                                            \
        DS_ROWS##MR(DS_RROW_ZERO##NV)                                                                        \
        for (int64_t kh = 0; kh < KH; kh++) {                                                               \
            DS_ROWS##MR(DS_RROW_PTR)                                                                         \
            const float *b = bp + kh * RUN * 32;                                                            \
            _Pragma("GCC unroll 4")                                                                         \
            for (int64_t c = 0; c < RUN; c++) {                                                             \
                const ds_v16 b0 = ds_ld16(b + c * 32);                                                      \
                FMA                                                                                         \
            }                                                                                               \
        }                                                                                                   \
        DS_FIN_##NV(MR)                                                                                      \
        DS_ROWS##MR(STORE)                                                                                   \
    }
#define DS_RFMA2(MR) const ds_v16 b1 = ds_ld16(b + c * 32 + 16); DS_ROWS##MR(DS_CROW_FMA)
#define DS_RFMA1(MR) DS_ROWS##MR(DS_NCROW_FMA)
#define DS_CONV_RMICRO2(MR) DS_CONV_RMICRO(MR, 2, DS_RFMA2(MR), DS_CROW_STORE)
#define DS_CONV_RMICRO1(MR) DS_CONV_RMICRO(MR, 1, DS_RFMA1(MR), DS_NCROW_STORE)
#else
/* Without AVX-512: the halves on 8-float vectors, as DS_CONV_HALF (the same order of sums). */
#define DS_RHALF(MR, HALF)                                                                                  \
    {   DS_ROWS##MR(DS_HACC_ZERO)                                                                            \
        for (int64_t kh = 0; kh < KH; kh++) {                                                               \
            DS_ROWS##MR(DS_RROW_PTR)                                                                         \
            const float *b = bp + kh * RUN * 32 + (HALF) * 16;                                              \
            _Pragma("GCC unroll 4")                                                                         \
            for (int64_t c = 0; c < RUN; c++) {                                                             \
                const ds_v8 h0 = ds_ld8(b + c * 32), h1 = ds_ld8(b + c * 32 + 8);                           \
                DS_ROWS##MR(DS_HFMA)                                                                         \
            }                                                                                               \
        }                                                                                                   \
        { DS_HALF_FIN(HALF) DS_ROWS##MR(DS_HFIN) } }
/* The second half of a panel of 17..24 columns (24 output channels: an RGB stem's) as one vector a row. */
#define DS_RQUARTER(MR)                                                                                     \
    {   DS_ROWS##MR(DS_QACC_ZERO)                                                                            \
        for (int64_t kh = 0; kh < KH; kh++) {                                                               \
            DS_ROWS##MR(DS_RROW_PTR)                                                                         \
            const float *b = bp + kh * RUN * 32 + 16;                                                       \
            _Pragma("GCC unroll 4")                                                                         \
            for (int64_t c = 0; c < RUN; c++) {                                                             \
                const ds_v8 h0 = ds_ld8(b + c * 32);                                                        \
                DS_ROWS##MR(DS_QFMA)                                                                         \
            }                                                                                               \
        }                                                                                                   \
        DS_QUARTER_FIN(MR, 16) }
#define DS_CONV_RMICRO(MR, NV, HALVES)                                                                      \
    static void ds_conv_rmicro##NV##_##MR(const int64_t *geo, const float *restrict xg,                     \
                                          const float *restrict bp, float *restrict yo, int64_t p,          \
                                          int64_t ncols, const float *restrict bias,                         \
                                          const float *restrict res) {                                       \
        GEO_LOCALS;                                                                                         \
        const int64_t RUN = KW * C, act_ = geo[DS_CONV_ACT];                                                \
        float scratch[MR * DS_CONV_PATCH_MAX];                                                              \
        (void)CG; (void)DW;                                                                                 \
        DS_POS_START                                                                                        \
        DS_ROWS##MR(DS_RROW_BASE)                                                                            \
        HALVES                                                                                              \
    }
#define DS_CONV_RMICRO2(MR)                                                                                 \
    DS_CONV_RMICRO(MR, 2, DS_RHALF(MR, 0) if (ncols > 24) DS_RHALF(MR, 1) else DS_RQUARTER(MR))
#define DS_CONV_RMICRO1(MR) DS_CONV_RMICRO(MR, 1, DS_RHALF(MR, 0))
/* A tile of MR rows on the runs in one pass (as DS_CONV_FONE, ds_conv_flat.h, over each kernel row's run). */
#define DS_CONV_RONE(NAME, MR, ZERO, STEP, BIAS, FIN, NVAR, OFF)                                            \
    __attribute__((noinline)) static void NAME(const int64_t *geo, const float *restrict xg,                \
                                               const float *restrict bp, float *restrict yo, int64_t p,      \
                                               int64_t ncols, const float *restrict bias,                     \
                                               const float *restrict res) {                                   \
        GEO_LOCALS;                                                                                         \
        const int64_t RUN = KW * C, act_ = geo[DS_CONV_ACT], NVAR = ncols - (OFF);                          \
        float scratch[MR * DS_CONV_PATCH_MAX];                                                              \
        (void)CG; (void)DW;                                                                                 \
        DS_POS_START                                                                                        \
        DS_ROWS##MR(DS_RROW_BASE)                                                                            \
        DS_ROWS##MR(ZERO)                                                                                    \
        for (int64_t kh = 0; kh < KH; kh++) {                                                               \
            DS_ROWS##MR(DS_RROW_PTR)                                                                         \
            const float *b = bp + kh * RUN * 32;                                                            \
            _Pragma("GCC unroll 4")                                                                         \
            for (int64_t c = 0; c < RUN; c++) STEP(b + c * 32)                                              \
        }                                                                                                   \
        BIAS                                                                                                \
        DS_ROWS##MR(FIN)                                                                                     \
    }
/* A panel of 17..24 columns on the runs (an RGB stem of 24 outputs: ShuffleNet's, MobileNetV3's 16 + 8 aside) in one
   pass of 4 rows x 3 vectors, as ds_conv_fmicro3_4 for a pointwise conv, where a 16-column half then an 8-column
   quarter took 12 broadcasts per 18 multiply-adds (Zen 3, bench/conv_tile_bench.py --ab: 3 -> 24 3x3 stride 2 on
   224x224 501 -> 367 us, 3 -> 20 368 -> 287). The same sums in the same order. */
DS_CONV_RONE(ds_conv_rmicro3_4, 4, DS_F3ZERO, DS_F3COLS, DS_F3BIAS, DS_F3FIN, n2_, 16)
/* A panel of 25..32 columns on the runs in one pass of 3 rows x 4 vectors, as ds_conv_fmicro_3 (ds_conv_flat.h) for
   a pointwise conv: an RGB stem's kernel rows are runs of 9 floats, 27 multiply-adds an accumulator, and the two
   halves' broadcasts and finishes were a fifth of its time (Zen 3, bench/conv_tile_bench.py --ab, one process:
   3 -> 32 3x3 stride 2 on 224x224 514 -> 409 us, 3 -> 64 1023 -> 819). The same sums in the same order. */
DS_CONV_RONE(ds_conv_rmicro4_3, 3, DS_F4ZERO, DS_F4STEP, DS_F4BIAS, DS_F4FIN, n3_, 24)
#endif
DS_CONV_RMICRO2(1)
DS_CONV_RMICRO2(2)
DS_CONV_RMICRO2(4)
DS_CONV_RMICRO1(1)
DS_CONV_RMICRO1(2)
DS_CONV_RMICRO1(4)
#ifdef __AVX512F__
DS_CONV_RMICRO1(8)
#else
DS_CONV_RMICRO2(6) /* as DS_CONV_MICRO(6) and DS_CONV_NMICRO(6) */
DS_CONV_RMICRO1(6)
#endif
#if DS_MR > 4
DS_CONV_RMICRO2(8)
DS_CONV_RMICRO2(12)
DS_CONV_RMICRO1(12)
DS_CONV_RMICRO1(16)
DS_CONV_RMICRO1(24)
#endif

#ifdef __AVX512F__
DS_CONV_FWIDE(ds_conv_fwmicro_12, 12, DS_RROW_ZERO2, DS_LOAD_B2, DS_CROW_FMA, DS_FIN_2, DS_CROW_STORE)
DS_CONV_FWIDE(ds_conv_fwnmicro_24, 24, DS_RROW_ZERO1, DS_LOAD_B1, DS_NCROW_FMA, DS_FIN_1, DS_NCROW_STORE)
DS_CONV_RSMICRO(24, 1, 6, DS_LOAD_B1, DS_NCROW_STORE)
DS_CONV_RSMICRO(12, 2, 6, DS_LOAD_B2, DS_CROW_STORE)
#endif

/* The runs path over pixels p0..p1: micro-tiles of the widest height, the rest in halving steps. */
static void ds_conv_runs(const int64_t *geo, const float *restrict xg, const float *restrict panel,
                         float *restrict y0, int64_t p0, int64_t p1, int64_t ncols, const float *restrict bias,
                         const float *restrict res) {
    const int64_t LDY = geo[DS_CONV_LDY];
    int64_t p = p0;
#define DS_RSTEP(NV, MR)                                                                                    \
    for (; p1 - p >= MR; p += MR) ds_conv_rmicro##NV##_##MR(geo, xg, panel, y0 + p * LDY, p, ncols, bias, res);
#ifdef __AVX512F__
    const int one_row = geo[DS_CONV_C] * geo[DS_CONV_SW] == 6; /* ds_conv_rsmicro's instances */
/* micro-tiles of MR from p: the one-row tile where its pixels lie in one row inside the map, else the runs tile */
#define DS_ONE_ROW_STEP(NV, MR)                                                                             \
    for (; one_row && p1 - p >= MR; p += MR) {                                                             \
        float *yo = y0 + p * LDY;                                                                           \
        const int64_t at = ds_runs_interior(geo, p, MR);                                                    \
        if (at >= 0) ds_conv_rsmicro##NV##_##MR##_6(geo, xg + at, panel, yo, p, ncols, bias, res);             \
        else ds_conv_rmicro##NV##_##MR(geo, xg, panel, yo, p, ncols, bias, res);                              \
    }
#endif
    if (ncols <= 16) {
#ifdef __AVX512F__
        DS_ONE_ROW_STEP(1, 24)
#endif
#if DS_MR > 4
        DS_RSTEP(1, 24) DS_RSTEP(1, 16) DS_RSTEP(1, 12)
#endif
#ifdef __AVX512F__
        DS_RSTEP(1, 8)
#else
        DS_RSTEP(1, 6)
#endif
        DS_RSTEP(1, 4) DS_RSTEP(1, 2) DS_RSTEP(1, 1)
    } else {
#ifdef __AVX512F__
        DS_ONE_ROW_STEP(2, 12)
#endif
#if DS_MR > 4
        DS_RSTEP(2, 12) DS_RSTEP(2, 8)
#else
        if (ncols > 24) DS_RSTEP(4, 3)
        else DS_RSTEP(3, 4)
        DS_RSTEP(2, 6)
#endif
        DS_RSTEP(2, 4) DS_RSTEP(2, 2) DS_RSTEP(2, 1)
    }
#undef DS_RSTEP
#ifdef __AVX512F__
#undef DS_ONE_ROW_STEP
#endif
}

void ds_conv_tile(const int64_t *geo, const float *restrict x, const float *restrict bp, float *restrict y,
                  const float *restrict zeros, int64_t p0, int64_t p1, int64_t g, int64_t q,
                  const float *restrict bias, const float *restrict res) {
    const int64_t CG = geo[DS_CONV_CG], LDY = geo[DS_CONV_LDY], OCG = geo[DS_CONV_OCG];
    const float *bq = bias ? bias + g * OCG + q * 32 : 0, *rq = res ? res + g * OCG + q * 32 : 0;
    const int64_t K = geo[DS_CONV_KH] * geo[DS_CONV_KW] * CG, panels = (OCG + 31) / 32;
    const int64_t ncols = OCG - q * 32 < 32 ? OCG - q * 32 : 32;
#ifndef __AVX512F__
    if (geo[DS_CONV_ACT] == DS_ACT_SILU) { /* the block's tiles without it, then one pass over its rows */
        int64_t plain[DS_CONV_GEO];
        ds_geo_without_act(geo, plain);
        ds_conv_tile(plain, x, bp, y, zeros, p0, p1, g, q, bias, res);
        ds_silu_rows8(y + p0 * LDY + g * OCG + q * 32, LDY, p1 - p0, ncols);
        return;
    }
#endif
    const float *xg = x + g * CG;
    const float *panel = bp + (g * panels + q) * K * 32;
    if (geo[DS_CONV_G] == 1 && geo[DS_CONV_DW] == 1 && geo[DS_CONV_KW] > 1
        && geo[DS_CONV_KH] * geo[DS_CONV_KW] * geo[DS_CONV_C] <= DS_CONV_PATCH_MAX) {
        ds_conv_runs(geo, xg, panel, y + q * 32, p0, p1, ncols, bq, rq);
        return;
    }
    if (ncols <= 16) {
        int64_t p = p0;
#ifndef __AVX512F__
        if (ncols <= 8) {
#define DS_QSTEP(MR)                                                                                        \
            for (; p1 - p >= MR; p += MR)                                                                   \
                ds_conv_qmicro_##MR(geo, xg, panel, y + p * LDY + g * OCG + q * 32, zeros, p, ncols, bq, rq);
            DS_QSTEP(12) DS_QSTEP(4) DS_QSTEP(1)
#undef DS_QSTEP
            return;
        }
        if (ds_conv_pointwise(geo))
            for (; p1 - p >= 6; p += 6)
                ds_conv_fnmicro_6(geo, xg, panel, y + p * LDY + g * OCG + q * 32, p, ncols, bq, rq);
#endif
#define DS_NSTEP(MR)                                                                                        \
        for (; p1 - p >= MR; p += MR)                                                                       \
            ds_conv_nmicro_##MR(geo, xg, panel, y + p * LDY + g * OCG + q * 32, zeros, p, ncols, bq, rq);
#ifdef __AVX512F__
        if (ds_conv_pointwise(geo))
            for (; p1 - p >= 24; p += 24)
                ds_conv_fwnmicro_24(geo, xg, panel, 0, y + p * LDY + g * OCG + q * 32, p, ncols, bq, rq);
#endif
#if DS_MR16 > 8
        DS_NSTEP(24) DS_NSTEP(16) DS_NSTEP(12)
#endif
#ifdef __AVX512F__
        DS_NSTEP(8)
#else
        DS_NSTEP(6)
#endif
        DS_NSTEP(4) DS_NSTEP(2) DS_NSTEP(1)
#undef DS_NSTEP
        return;
    }
    /* the widest micro-tiles first, the rest in halving steps (few variants: this file's compile time is on
       the path of every CNN's first build) */
    int64_t p = p0;
#define DS_WSTEP(MR)                                                                                        \
    for (; p1 - p >= MR; p += MR)                                                                           \
        ds_conv_micro_##MR(geo, xg, panel, y + p * LDY + g * OCG + q * 32, zeros, p, ncols, bq, rq);
#if DS_MR > 4
    /* a pointwise conv's flat tiles, but where a panel's first block may read large weights from L3 (the
       prefetching tile's reason) */
    if (ds_conv_pointwise(geo) && (p0 > 0 || K <= DS_FLAT_FIRST_MAX_K))
        for (; p1 - p >= 12; p += 12)
            ds_conv_fwmicro_12(geo, xg, panel, 0, y + p * LDY + g * OCG + q * 32, p, ncols, bq, rq);
    if (p0 == 0) /* the panel's first block */
        for (; p1 - p >= 12; p += 12)
            ds_conv_pmicro_12(geo, xg, panel, y + p * LDY + g * OCG + q * 32, zeros, p, ncols, bq, rq);
    DS_WSTEP(12) DS_WSTEP(8)
    DS_WSTEP(4) DS_WSTEP(2) DS_WSTEP(1)
#else
    /* Tiles of 6, the last 7..9 pixels as 4 + 3, 4 + 4 and 5 + 4 rather than 6 + 1, 6 + 2 and 6 + 2 + 1: each
       tile streams the whole panel (590 KB for 512 channels 3x3: out of L2), and 1 or 2 rows keep 2-4
       multiply-add chains where the FMA latency wants 8 (a 3x3 map's 9 pixels ran three passes, the last two at
       a quarter of the rate: 0.73 -> 0.51 ms for 512 -> 512 channels; as 6 + 3, 0.56 ms) */
    if (ncols > 24 && ds_conv_pointwise(geo))
        for (; p1 - p >= 3; p += 3)
            ds_conv_fmicro_3(geo, xg, panel, y + p * LDY + g * OCG + q * 32, p, ncols, bq, rq);
    if (ncols <= 24 && ds_conv_pointwise(geo))
        for (; p1 - p >= 4; p += 4)
            ds_conv_fmicro3_4(geo, xg, panel, y + p * LDY + g * OCG + q * 32, p, ncols, bq, rq);
    for (; p1 - p >= 10 || p1 - p == 6; p += 6)
        ds_conv_micro_6(geo, xg, panel, y + p * LDY + g * OCG + q * 32, zeros, p, ncols, bq, rq);
    while (p < p1) {
        const int64_t left = p1 - p, mr = left > 6 ? (left + 1) / 2 : left;
        float *yo = y + p * LDY + g * OCG + q * 32;
        switch (mr) {
        case 1: ds_conv_micro_1(geo, xg, panel, yo, zeros, p, ncols, bq, rq); break;
        case 2: ds_conv_micro_2(geo, xg, panel, yo, zeros, p, ncols, bq, rq); break;
        case 3: ds_conv_micro_3(geo, xg, panel, yo, zeros, p, ncols, bq, rq); break;
        case 4: ds_conv_micro_4(geo, xg, panel, yo, zeros, p, ncols, bq, rq); break;
        case 5: ds_conv_micro_5(geo, xg, panel, yo, zeros, p, ncols, bq, rq); break;
        default: ds_conv_micro_6(geo, xg, panel, yo, zeros, p, ncols, bq, rq); break;
        }
        p += mr;
    }
#endif
#undef DS_WSTEP
}

/* ---- two panels at once ------------------------------------------------------------------------------------
   6 output pixels times 64 output channels (panels q and q + 1, read where they lie: K * 32 floats apart):
   24 accumulators as in the 12 x 32 micro-tile, but each broadcast input value feeds four FMAs instead of two
   and a pixel block's input is read once for both panels. Measured on this machine (standalone tile sweep,
   1 thread): 1x1 convs with few input channels on large maps gain most (64 -> 256 channels on 56x56: 123 ->
   173 GFLOP/s; 128 -> 512 on 28x28: 145 -> 188), 3x3 convs 1-10%, 7x7 maps with 2048 channels are equal. The
   second panel may be a group's narrower tail (ncols < 32: its packed columns are zero, the store is cut). */
#define DS_C2ROW_INIT(r) ds_v16 c##r##0 = {0}, c##r##1 = {0}, c##r##2 = {0}, c##r##3 = {0}; DS_CROW_POS(r)
#define DS_C2ROW_FMA(r) { const float v = a##r[c]; c##r##0 += v * b0; c##r##1 += v * b1; c##r##2 += v * b2;       \
                          c##r##3 += v * b3; }
#define DS_C2ROW_STORE(r) { float *o_ = yo + (r) * LDY; ds_st16(o_, c##r##0); ds_st16(o_ + 16, c##r##1);           \
                            ds_mst16(o_ + 32, c##r##2, m0); ds_mst16(o_ + 48, c##r##3, m1); }
#define DS_PREFETCH_B2(b) { DS_PREFETCH_B(b) DS_PREFETCH_B((b) + pstride) }
/* NPF lines of the next pair's panels into L2 per iteration (`nx`: this micro-tile's share of them). */
#define DS_PREFETCH_NEXT1(b) __builtin_prefetch(nx + c * 16, 0, 2);
#define DS_PREFETCH_NEXT4(b) { __builtin_prefetch(nx + c * 64, 0, 2); __builtin_prefetch(nx + c * 64 + 16, 0, 2); \
                               __builtin_prefetch(nx + c * 64 + 32, 0, 2); __builtin_prefetch(nx + c * 64 + 48, 0, 2); }
#define DS_CONV_MICRO2_OF(NAME, PREFETCH, NPF)                                                             \
    static void NAME(const int64_t *geo, const float *restrict xg, const float *restrict bp, int64_t pstride, \
                     float *restrict yo, const float *restrict zeros, int64_t p, int64_t ncols,            \
                     const float *restrict bias, const float *restrict res, const float *nx) {             \
        GEO_LOCALS;                                                                                         \
        (void)nx;                                                                                           \
        DS_CMASKS                                                                                           \
        DS_POS_START                                                                                        \
        DS_ROWS6(DS_C2ROW_INIT)                                                                              \
        for (int64_t kh = 0; kh < KH; kh++)                                                                 \
            for (int64_t kw = 0; kw < KW; kw++) {                                                           \
                DS_ROWS6(DS_CROW_PTR)                                                                        \
                const float *b = bp + (kh * KW + kw) * CG * 32, *bb = b + pstride;                          \
                _Pragma("GCC unroll 4")                                                                     \
                for (int64_t c = 0; c < CG; c++) {                                                          \
                    const ds_v16 b0 = ds_ld16(b + c * 32), b1 = ds_ld16(b + c * 32 + 16);                   \
                    const ds_v16 b2 = ds_ld16(bb + c * 32), b3 = ds_ld16(bb + c * 32 + 16);                 \
                    PREFETCH(b + c * 32)                                                                    \
                    DS_ROWS6(DS_C2ROW_FMA)                                                                   \
                }                                                                                           \
                nx += CG * 16 * NPF;                                                                        \
            }                                                                                               \
        DS_FIN_4(6)                                                                                          \
        DS_ROWS6(DS_C2ROW_STORE)                                                                             \
    }
#if DS_MR > 4
#define DS_LOAD_B4 DS_LOAD_B2 const ds_v16 b2 = ds_ld16(bb + c * 32), b3 = ds_ld16(bb + c * 32 + 16);
DS_CONV_FWIDE(ds_conv_fwmicro2_6, 6, DS_RROW_ZERO4, DS_LOAD_B4, DS_C2ROW_FMA, DS_FIN_4, DS_C2ROW_STORE)
DS_CONV_MICRO2_OF(ds_conv_micro2_6, DS_NO_PREFETCH, 0)
DS_CONV_MICRO2_OF(ds_conv_pmicro2_6, DS_PREFETCH_B2, 0)
DS_CONV_MICRO2_OF(ds_conv_nmicro2_6_1, DS_PREFETCH_NEXT1, 1)
DS_CONV_MICRO2_OF(ds_conv_nmicro2_6_4, DS_PREFETCH_NEXT4, 4)
#endif

/* Packed weights from which a pair's last block prefetches the next pair (smaller ones stay in L2 and are run
   block-major: codegen/lower/conv.py's BLOCK_MAJOR_BYTES). */
#define DS_NEXT_PAIR_MIN_BYTES (256 << 10)

/* The runs path over two panels: 6 output pixels times 64 output channels, each kernel row's KW * C floats of a
   pixel one run (see DS_CONV_RMICRO). For the RGB stems, whose taps have 3 channels each, the per-tap loop
   above spends as much on its 6 pointers per tap as on the 3 iterations they feed. */
#define DS_R2FMA(r) { const float v = a##r[c]; c##r##0 += v * b0; c##r##1 += v * b1; c##r##2 += v * b2;           \
                      c##r##3 += v * b3; }
#if DS_MR > 4
static void ds_conv_rmicro2_6(const int64_t *geo, const float *restrict xg, const float *restrict bp,
                              int64_t pstride, float *restrict yo, int64_t p, int64_t ncols,
                              const float *restrict bias, const float *restrict res) {
    GEO_LOCALS;
    const int64_t RUN = KW * C;
    float scratch[6 * DS_CONV_PATCH_MAX];
    DS_CMASKS
    (void)CG; (void)DW;
    DS_POS_START
    DS_ROWS6(DS_RROW_BASE)
    DS_ROWS6(DS_RROW_ZERO4)
    for (int64_t kh = 0; kh < KH; kh++) {
        DS_ROWS6(DS_RROW_PTR)
        const float *b = bp + kh * RUN * 32, *bb = b + pstride;
        _Pragma("GCC unroll 4")
        for (int64_t c = 0; c < RUN; c++) {
            const ds_v16 b0 = ds_ld16(b + c * 32), b1 = ds_ld16(b + c * 32 + 16);
            const ds_v16 b2 = ds_ld16(bb + c * 32), b3 = ds_ld16(bb + c * 32 + 16);
            DS_ROWS6(DS_R2FMA)
        }
    }
    DS_FIN_4(6)
    DS_ROWS6(DS_C2ROW_STORE)
}
#endif

#ifdef __AVX512F__
#include <immintrin.h>
/* Lane i: the sum of a[i]'s 16 lanes (a tree of 128- and 32-bit shuffles: 45 operations for 16 sums). */
static inline __m512 ds_hsum16(const __m512 *a) {
    __m512 b[8], c[4], d[2];
    for (int j = 0; j < 8; j++)
        b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xEE));
    for (int k = 0; k < 4; k++)
        c[k] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0xDD));
    for (int l = 0; l < 2; l++)
        d[l] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * l], c[2 * l + 1], 0x44),
                             _mm512_shuffle_ps(c[2 * l], c[2 * l + 1], 0xEE));
    const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
    /* e's lane 4m + j holds the sum of a[4j + m] */
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), e);
}

/* A 1x1, stride-1, unpadded, ungrouped conv to at most DS_FEW_OC outputs from at most DS_FEW_MAX_C inputs (a
   segmentation head: 16 -> 2), pixels p0..p1: per block of 16 pixels and output, 16 dot products over the input
   channels summed across lanes by ds_hsum16, then finished (bias, residual, activation) as ds_conv_tile's, on
   whole vectors of the block's rows where they lie together (1, 2 or 4 outputs a dense row). Why: the
   micro-tiles compute a whole 32-column panel, 16x the products of 2 outputs (UNet's 16 -> 2 head on 160x192:
   247 us, bound by them). */
#define DS_FEW_OC 4
#define DS_FEW_MAX_C 1024
static void ds_conv_few(const int64_t *geo, const float *restrict x, const float *restrict bp, float *restrict y,
                        int64_t p0, int64_t p1, const float *restrict bias, const float *restrict res) {
    const int64_t C = geo[DS_CONV_C], OC = geo[DS_CONV_OC], LDY = geo[DS_CONV_LDY], act = geo[DS_CONV_ACT];
    const ds_finish fin = {bias, res, OC, act, 0, 0}; /* float32 rows: bf16 storage is the bf16 tiles' */
    float wt[DS_FEW_OC * DS_FEW_MAX_C]; /* the panel's columns as rows: output o's weights contiguous */
    for (int64_t o = 0; o < OC; o++)
        for (int64_t c = 0; c < C; c++) wt[o * C + c] = bp[c * 32 + o];
    const int flat = LDY == OC && 16 % OC == 0; /* a block's rows one dense run, the bias a repeating pattern */
    ds_v16 bpat = {0};
    for (int l = 0; l < 16 && flat && bias; l++) bpat[l] = bias[l % OC];
    _Alignas(64) float sums[DS_FEW_OC][16];
    _Alignas(64) float rows[DS_FEW_OC * 16];
    for (int64_t p = p0; p < p1; p += 16) {
        const int64_t n = p1 - p < 16 ? p1 - p : 16;
        for (int64_t o = 0; o < OC; o++) {
            __m512 acc[16];
            for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
            for (int64_t c = 0; c < C; c += 16) {
                const __mmask16 m = C - c >= 16 ? 0xFFFF : (__mmask16)((1u << (C - c)) - 1);
                const __m512 w = _mm512_maskz_loadu_ps(m, wt + o * C + c);
                for (int64_t i = 0; i < n; i++)
                    acc[i] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + (p + i) * C + c), w, acc[i]);
            }
            _mm512_store_ps(sums[o], ds_hsum16(acc));
        }
        if (flat) {
            const int64_t total = n * OC;
            for (int64_t i = 0; i < n; i++)
                for (int64_t o = 0; o < OC; o++) rows[i * OC + o] = sums[o][i];
            for (int64_t j = 0; j < total; j += 16) {
                const int64_t left = total - j;
                ds_v16 v = ds_load16(rows + j, left);
                if (bias) v += bpat;
                if (res) v += ds_load16(res + p * OC + j, left);
                ds_store16(y + p * OC + j, ds_act(v, act), left);
            }
        } else {
            for (int64_t i = 0; i < n; i++) {
                float row[DS_FEW_OC];
                for (int64_t o = 0; o < OC; o++) row[o] = sums[o][i];
                ds_finish_row(y + (p + i) * LDY, row, OC, &fin, p + i);
            }
        }
    }
}
#endif

void ds_conv_tile2(const int64_t *geo, const float *restrict x, const float *restrict bp, float *restrict y,
                   const float *restrict zeros, int64_t p0, int64_t p1, int64_t g, int64_t q,
                   const float *restrict bias, const float *restrict res) {
    const int64_t OCG = geo[DS_CONV_OCG], panels = (OCG + 31) / 32;
#if DS_MR > 4
    const int64_t CG = geo[DS_CONV_CG];
#endif
#ifdef __AVX512F__
    if (OCG <= DS_FEW_OC && CG <= DS_FEW_MAX_C && geo[DS_CONV_G] == 1 && geo[DS_CONV_KH] == 1 && geo[DS_CONV_KW] == 1
        && geo[DS_CONV_SH] == 1 && geo[DS_CONV_SW] == 1 && geo[DS_CONV_OH] == geo[DS_CONV_H]
        && geo[DS_CONV_OW] == geo[DS_CONV_W] && geo[DS_CONV_PT] == 0 && geo[DS_CONV_PL] == 0) {
        ds_conv_few(geo, x, bp, y, p0, p1, bias, res); /* (one panel: q is 0) */
        return;
    }
#endif
    /* also for few input channels, where one panel takes the runs path: over two panels the per-tap loop is
       faster (tile sweep: the 3 -> 64 7x7 stem 107 -> 156 GFLOP/s, 16 -> 64 3x3 181 -> 194) */
#if DS_MR > 4
    const int64_t LDY = geo[DS_CONV_LDY], K = geo[DS_CONV_KH] * geo[DS_CONV_KW] * CG;
    const int64_t ncols = OCG - (q + 1) * 32 < 32 ? OCG - (q + 1) * 32 : 32; /* the second panel's */
    if (q + 1 < panels && ncols > 16) {
        const float *xg = x + g * CG, *panel = bp + (g * panels + q) * K * 32;
        float *yq = y + g * OCG + q * 32;
        const float *bq = bias ? bias + g * OCG + q * 32 : 0, *rq = res ? res + g * OCG + q * 32 : 0;
        int64_t p = p0;
        if (geo[DS_CONV_G] == 1 && geo[DS_CONV_DW] == 1 && geo[DS_CONV_KW] > 1 && geo[DS_CONV_C] < 8
            && K <= DS_CONV_PATCH_MAX)
            for (; p1 - p >= 6; p += 6) ds_conv_rmicro2_6(geo, xg, panel, K * 32, yq + p * LDY, p, ncols, bq, rq);
        /* a pair's last block brings the next pair's weights (the next tile's, panel-major) from L3 into L2 while
           it computes, spread over its micro-tiles after the first, 1 or 4 lines an iteration so that they cover
           the pair: a micro-tile reading them from L3 itself (256 bytes an iteration) ran 3.9x slower than
           from L2, the whole block of a 7x7 map's 2048 -> 512 1x1 conv (8 micro-tiles a pair) at 60% of peak */
        const int64_t all = geo[DS_CONV_WREST] ? geo[DS_CONV_WREST] : geo[DS_CONV_G] * panels * K * 32;
        const int64_t at = (g * panels + q + 2) * K * 32;
        const float *nx = bp + at;
        const int64_t major = geo[DS_CONV_G] * (panels + 1) / 2 * 2 * K * 32 * 4; /* conv.py's weight_bytes */
        int64_t left = p1 == geo[DS_CONV_NPIX] && (major > DS_NEXT_PAIR_MIN_BYTES || geo[DS_CONV_WREST]) && at < all
                       ? (all - at < 2 * K * 32 ? all - at : 2 * K * 32) : 0;
        const int64_t later = (p1 - p) / 6 - (p0 == 0); /* micro-tiles that prefetch */
        const int64_t npf = later >= 4 ? 1 : 4; /* (each variant of the 6 x 64 kernel costs compile time) */
        const int flat = ds_conv_pointwise(geo);
        if (p0 == 0 && p1 - p >= 6) { /* the panels' first block: they may come from L3 */
            ds_conv_pmicro2_6(geo, xg, panel, K * 32, yq + p * LDY, zeros, p, ncols, bq, rq, nx);
            p += 6;
        }
        for (; p1 - p >= 6; p += 6) {
#define DS_NEXT_CASE(N)                                                                                     \
            case N: ds_conv_nmicro2_6_##N(geo, xg, panel, K * 32, yq + p * LDY, zeros, p, ncols, bq, rq, nx); break;
            if (left > 0) {
                switch (npf) { DS_NEXT_CASE(1) DS_NEXT_CASE(4) }
                nx += K * 16 * npf;
                left -= K * 16 * npf;
            } else if (flat)
                ds_conv_fwmicro2_6(geo, xg, panel, K * 32, yq + p * LDY, p, ncols, bq, rq);
            else
                ds_conv_micro2_6(geo, xg, panel, K * 32, yq + p * LDY, zeros, p, ncols, bq, rq, nx);
#undef DS_NEXT_CASE
        }
        if (p < p1) {
            ds_conv_tile(geo, x, bp, y, zeros, p, p1, g, q, bias, res);
            ds_conv_tile(geo, x, bp, y, zeros, p, p1, g, q + 1, bias, res);
        }
        return;
    }
#endif
    ds_conv_tile(geo, x, bp, y, zeros, p0, p1, g, q, bias, res);
    if (q + 1 < panels) ds_conv_tile(geo, x, bp, y, zeros, p0, p1, g, q + 1, bias, res);
}
