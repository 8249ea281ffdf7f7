/* Channels-last convolution tiles: implicit GEMM on packed weights (see ds_conv.h for the contract).

   A micro-tile is MR consecutive output pixels of one output row times 32 output channels, accumulated in
   2*MR vector registers over every tap (kh, kw) and input channel of the group: per tap, each row's input
   pixel is found (or the zero row, where the tap falls in the padding), then the inner loop is the same
   broadcast-FMA loop as the product micro-kernels (ds_gemm.c) over the tap's CG packed rows. */
#include <stdint.h>

#include "ds_conv.h"
#include "ds_simd.h"

/* The finish a micro-tile applies to its accumulators before storing them, instead of leaving it to the
   generated epilogue: + `bias` (the tile's first column's; NULL: none), + a residual `res`, then
   geo[DS_CONV_ACT]'s activation (ds_act). In registers: a separate epilogue pass over the tile, for the 1x1
   convs of few input channels (SqueezeNet's, MobileNet's), cost 15-20% of their time. */
#ifdef __AVX512F__
#include <immintrin.h>
/* max(lo, c) and min(hi, c) with c second: MAXPS / MINPS return their second operand where either is NaN, so a NaN
   stays NaN, as in Relu and HardSwish */
static inline ds_v16 ds_max16(float lo, ds_v16 c) { return (ds_v16)_mm512_max_ps(_mm512_set1_ps(lo), (__m512)c); }
static inline ds_v16 ds_min16(float hi, ds_v16 c) { return (ds_v16)_mm512_min_ps(_mm512_set1_ps(hi), (__m512)c); }
#else
static inline ds_v16 ds_max16(float lo, ds_v16 c) {
    for (int j = 0; j < 16; j++) c[j] = c[j] < lo ? lo : c[j];
    return c;
}
static inline ds_v16 ds_min16(float hi, ds_v16 c) {
    for (int j = 0; j < 16; j++) c[j] = c[j] > hi ? hi : c[j];
    return c;
}
#endif
/* DS_ACT_RELU: max(0, c); DS_ACT_HARDSWISH: c * min(1, max(0, c / 6 + 1 / 2)) (ONNX's, alpha 1/6, beta 1/2) */
static inline ds_v16 ds_act(ds_v16 c, int64_t act) {
    if (act == DS_ACT_RELU) return ds_max16(0.0f, c);
    if (act == DS_ACT_HARDSWISH) return c * ds_min16(1.0f, ds_max16(0.0f, c * (1.0f / 6.0f) + 0.5f));
    return c;
}
static inline ds_v16 ds_fin(ds_v16 c, ds_v16 b, int64_t act) { return ds_act(c + b, act); }
/* n bias values from p, zeros past them (and for no bias) */
static inline ds_v16 ds_bias16(const float *p, int64_t n) { return p ? ds_load16(p, n) : (ds_v16){0}; }
#define DS_FINR1(r) c##r##0 = ds_fin(c##r##0, f0, act);
#define DS_FINR2(r) DS_FINR1(r) c##r##1 = ds_fin(c##r##1, f1, act);
#define DS_FINR4(r) DS_FINR2(r) c##r##2 = ds_fin(c##r##2, f2, act); c##r##3 = ds_fin(c##r##3, f3, act);
/* with a residual `res` (the tile's first column of a map of OC-float pixels, pixel p's row at res + p * OC):
   (c + bias) + residual, then the activation, the reference's order */
#define DS_RES(r) const float *rr##r = res + (p + (r)) * OC;
#define DS_FINQ1(r) DS_RES(r) c##r##0 = ds_act(c##r##0 + f0 + ds_load16(rr##r, ncols), act);
#define DS_FINQ2(r) DS_FINQ1(r) c##r##1 = ds_act(c##r##1 + f1 + ds_load16(rr##r + 16, ncols - 16), act);
#define DS_FINQ4(r)                                                                                         \
    DS_RES(r) c##r##0 = ds_act(c##r##0 + f0 + ds_ld16(rr##r), act);                                         \
    c##r##1 = ds_act(c##r##1 + f1 + ds_ld16(rr##r + 16), act);                                              \
    c##r##2 = ds_act(c##r##2 + f2 + ds_load16(rr##r + 32, ncols), act);                                     \
    c##r##3 = ds_act(c##r##3 + f3 + ds_load16(rr##r + 48, ncols - 16), act);
#define DS_FIN_ROWS(MR, N)                                                                                  \
    if (res) { const int64_t OC = geo[DS_CONV_OC]; DS_ROWS##MR(DS_FINQ##N) }                               \
    else { DS_ROWS##MR(DS_FINR##N) }
/* one vector of columns (ncols <= 16), two (ncols <= 32), or two panels (64: the second panel's ncols); nothing
   to do without a bias, a residual or an activation */
#define DS_FIN_1(MR)                                                                                        \
    { const int64_t act = geo[DS_CONV_ACT];                                                                \
      if (bias || res || act) { const ds_v16 f0 = ds_bias16(bias, ncols); DS_FIN_ROWS(MR, 1) } }
#define DS_FIN_2(MR)                                                                                        \
    { const int64_t act = geo[DS_CONV_ACT];                                                                \
      if (bias || res || act) {                                                                             \
          const ds_v16 f0 = ds_bias16(bias, ncols), f1 = ds_bias16(bias ? bias + 16 : 0, ncols - 16);       \
          DS_FIN_ROWS(MR, 2) } }
#define DS_FIN_4(MR)                                                                                        \
    { const int64_t act = geo[DS_CONV_ACT];                                                                \
      if (bias || res || act) {                                                                             \
          const ds_v16 f0 = ds_bias16(bias, 16), f1 = ds_bias16(bias ? bias + 16 : 0, 16);                  \
          const ds_v16 f2 = ds_bias16(bias ? bias + 32 : 0, ncols);                                         \
          const ds_v16 f3 = ds_bias16(bias ? bias + 48 : 0, ncols - 16);                                    \
          DS_FIN_ROWS(MR, 4) } }

/* Winograd's tiles per chunk: the library is built with codegen/lower/conv.py's WINO_TILES (which also sizes the
   scratch its kernels allocate); these defaults only serve a build of this file on its own, as ds_gemm.c's do */
#ifndef DS_WINO_TILES
#define DS_WINO_TILES 96
#endif
#ifndef DS_WINO4_TILES
#define DS_WINO4_TILES 48
#endif

#define GEO_LOCALS                                                                                          \
    const int64_t H = geo[DS_CONV_H], W = geo[DS_CONV_W], C = geo[DS_CONV_C], OH = geo[DS_CONV_OH];         \
    const int64_t OW = geo[DS_CONV_OW], KH = geo[DS_CONV_KH], KW = geo[DS_CONV_KW];                          \
    const int64_t SH = geo[DS_CONV_SH], SW = geo[DS_CONV_SW], DH = geo[DS_CONV_DH], DW = geo[DS_CONV_DW];    \
    const int64_t PT = geo[DS_CONV_PT], PL = geo[DS_CONV_PL], CG = geo[DS_CONV_CG];                          \
    const int64_t LDY = geo[DS_CONV_LDY];                                                                   \
    (void)OH; (void)OW

/* The output position (image, row, column) of a micro-tile's first pixel, found with two divisions, then
   stepped pixel by pixel: a division per row would cost as much as the multiply-adds of a narrow stem conv. */
#define DS_POS_START                                                                                        \
    int64_t pn_ = p / (OH * OW), poh_ = p % (OH * OW) / OW, pow_ = p % OW;
#define DS_POS_NEXT { if (++pow_ == OW) { pow_ = 0; if (++poh_ == OH) { poh_ = 0; pn_++; } } }
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
#define DS_CROW_STORE(r) ds_store_row(yo + (r) * LDY, c##r##0, c##r##1, ncols);
#define DS_NCROW_STORE(r) ds_store16(yo + (r) * LDY, c##r##0, ncols);
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
#define DS_CONV_MICRO(MR)                                                                                   \
    DS_CONV_MICRO_OF(ds_conv_micro, MR, DS_CROW_INIT, DS_LOAD_B2, DS_CROW_FMA, DS_CROW_STORE, DS_NO_PREFETCH,    \
                     DS_FIN_2)
#define DS_CONV_NMICRO(MR)                                                                                  \
    DS_CONV_MICRO_OF(ds_conv_nmicro, MR, DS_NCROW_INIT, DS_LOAD_B1, DS_NCROW_FMA, DS_NCROW_STORE,                \
                     DS_NO_PREFETCH, DS_FIN_1)
DS_CONV_NMICRO(1)
DS_CONV_NMICRO(2)
DS_CONV_NMICRO(4)
DS_CONV_NMICRO(8)
#if DS_MR16 > 8
DS_CONV_NMICRO(12)
DS_CONV_NMICRO(16)
DS_CONV_NMICRO(24)
#endif

DS_CONV_MICRO(1)
DS_CONV_MICRO(2)
DS_CONV_MICRO(4)
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
#define DS_CONV_RMICRO(MR, NV, FMA, STORE)                                                                  \
    static void ds_conv_rmicro##NV##_##MR(const int64_t *geo, const float *restrict xg,                     \
                                          const float *restrict bp, float *restrict yo, int64_t p,          \
                                          int64_t ncols, const float *restrict bias,                         \
                                          const float *restrict res) {                                       \
        GEO_LOCALS;                                                                                         \
        const int64_t RUN = KW * C;                                                                         \
        float scratch[MR * DS_CONV_PATCH_MAX];                                                              \
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
DS_CONV_RMICRO2(1)
DS_CONV_RMICRO2(2)
DS_CONV_RMICRO2(4)
DS_CONV_RMICRO1(1)
DS_CONV_RMICRO1(2)
DS_CONV_RMICRO1(4)
DS_CONV_RMICRO1(8)
#if DS_MR > 4
DS_CONV_RMICRO2(8)
DS_CONV_RMICRO2(12)
DS_CONV_RMICRO1(12)
DS_CONV_RMICRO1(16)
DS_CONV_RMICRO1(24)
#endif

/* The runs path over pixels p0..p1: micro-tiles of the widest height, the rest in halving steps. */
static void ds_conv_runs(const int64_t *geo, const float *restrict xg, const float *restrict panel,
                         float *restrict y0, int64_t p0, int64_t p1, int64_t ncols, const float *restrict bias,
                         const float *restrict res) {
    const int64_t LDY = geo[DS_CONV_LDY];
    int64_t p = p0;
#define DS_RSTEP(NV, MR)                                                                                    \
    for (; p1 - p >= MR; p += MR) ds_conv_rmicro##NV##_##MR(geo, xg, panel, y0 + p * LDY, p, ncols, bias, res);
    if (ncols <= 16) {
#if DS_MR > 4
        DS_RSTEP(1, 24) DS_RSTEP(1, 16) DS_RSTEP(1, 12)
#endif
        DS_RSTEP(1, 8) DS_RSTEP(1, 4) DS_RSTEP(1, 2) DS_RSTEP(1, 1)
    } else {
#if DS_MR > 4
        DS_RSTEP(2, 12) DS_RSTEP(2, 8)
#endif
        DS_RSTEP(2, 4) DS_RSTEP(2, 2) DS_RSTEP(2, 1)
    }
#undef DS_RSTEP
}

void ds_conv_tile(const int64_t *geo, const float *restrict x, const float *restrict bp, float *restrict y,
                  const float *restrict zeros, int64_t p0, int64_t p1, int64_t g, int64_t q,
                  const float *restrict bias, const float *restrict res) {
    const int64_t CG = geo[DS_CONV_CG], LDY = geo[DS_CONV_LDY], OCG = geo[DS_CONV_OCG];
    const float *bq = bias ? bias + g * OCG + q * 32 : 0, *rq = res ? res + g * OCG + q * 32 : 0;
    const int64_t K = geo[DS_CONV_KH] * geo[DS_CONV_KW] * CG, panels = (OCG + 31) / 32;
    const int64_t ncols = OCG - q * 32 < 32 ? OCG - q * 32 : 32;
    const float *xg = x + g * CG;
    const float *panel = bp + (g * panels + q) * K * 32;
    if (geo[DS_CONV_G] == 1 && geo[DS_CONV_DW] == 1 && geo[DS_CONV_KW] > 1
        && geo[DS_CONV_KH] * geo[DS_CONV_KW] * geo[DS_CONV_C] <= DS_CONV_PATCH_MAX) {
        ds_conv_runs(geo, xg, panel, y + q * 32, p0, p1, ncols, bq, rq);
        return;
    }
    if (ncols <= 16) {
        int64_t p = p0;
#define DS_NSTEP(MR)                                                                                        \
        for (; p1 - p >= MR; p += MR)                                                                       \
            ds_conv_nmicro_##MR(geo, xg, panel, y + p * LDY + g * OCG + q * 32, zeros, p, ncols, bq, rq);
#if DS_MR16 > 8
        DS_NSTEP(24) DS_NSTEP(16) DS_NSTEP(12)
#endif
        DS_NSTEP(8) DS_NSTEP(4) DS_NSTEP(2) DS_NSTEP(1)
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
    if (p0 == 0) /* the panel's first block */
        for (; p1 - p >= 12; p += 12)
            ds_conv_pmicro_12(geo, xg, panel, y + p * LDY + g * OCG + q * 32, zeros, p, ncols, bq, rq);
    DS_WSTEP(12) DS_WSTEP(8)
#endif
    DS_WSTEP(4) DS_WSTEP(2) DS_WSTEP(1)
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
                            ds_store_row(o_ + 32, c##r##2, c##r##3, ncols); }
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
#define DS_RROW_ZERO4(r) ds_v16 c##r##0 = {0}, c##r##1 = {0}, c##r##2 = {0}, c##r##3 = {0};
#if DS_MR > 4
static void ds_conv_rmicro2_6(const int64_t *geo, const float *restrict xg, const float *restrict bp,
                              int64_t pstride, float *restrict yo, int64_t p, int64_t ncols,
                              const float *restrict bias, const float *restrict res) {
    GEO_LOCALS;
    const int64_t RUN = KW * C;
    float scratch[6 * DS_CONV_PATCH_MAX];
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

void ds_conv_tile2(const int64_t *geo, const float *restrict x, const float *restrict bp, float *restrict y,
                   const float *restrict zeros, int64_t p0, int64_t p1, int64_t g, int64_t q,
                   const float *restrict bias, const float *restrict res) {
    const int64_t CG = geo[DS_CONV_CG], LDY = geo[DS_CONV_LDY], OCG = geo[DS_CONV_OCG];
    const int64_t K = geo[DS_CONV_KH] * geo[DS_CONV_KW] * CG, panels = (OCG + 31) / 32;
    const int64_t ncols = OCG - (q + 1) * 32 < 32 ? OCG - (q + 1) * 32 : 32; /* the second panel's */
    /* also for few input channels, where one panel takes the runs path: over two panels the per-tap loop is
       faster (tile sweep: the 3 -> 64 7x7 stem 107 -> 156 GFLOP/s, 16 -> 64 3x3 181 -> 194) */
#if DS_MR > 4
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
            } else
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

/* ---- depthwise ------------------------------------------------------------------------------------------
   One output row (image n, row ho) of a depthwise convolution (one input and one output channel per group),
   every channel, channels last. Vectorised over 16 channels at a time (the last block masked: C = 8 or 40 does
   no work on padding and never reads past the row); the interior columns, whose taps all fall inside the
   input, eight pixels at once in eight accumulators (independent FMA chains), their weight vector loaded once
   per tap for all eight; the border columns one by one with their taps checked. The weights are (KH*KW, C):
   tap-major, channels contiguous. */

#define DS_DW_CHUNK 128
#define DS_DW_ACC(i) ds_v16 d##i = b0;
#define DS_DW_FMA(i) d##i += ds_load16(xr + ((wo + (i)) * SW + kw * DW) * C, nl) * wv;
#define DS_DW_STORE(i) ds_store16(y + (wo + (i)) * LDY + c0, ds_act(d##i, act), nl);
/* NP interior pixels from wo, every channel block: taps unchecked. */
#define DS_DW_BLOCK(NP)                                                                                     \
    static void ds_dw_block##NP(const int64_t *geo, const float *restrict xn, const float *restrict w,      \
                                const float *restrict bias, float *restrict y, int64_t ih0, int64_t kh0,    \
                                int64_t kh1, int64_t wo, int64_t cb, int64_t ce) {                          \
        GEO_LOCALS;                                                                                         \
        const int64_t act = geo[DS_CONV_ACT];                                                              \
        (void)CG; (void)OH; (void)OW; (void)KH; (void)H; (void)PT; (void)SH;                                \
        for (int64_t c0 = cb; c0 < ce; c0 += 16) {                                                          \
            const int64_t nl = ce - c0 < 16 ? ce - c0 : 16;                                                 \
            const ds_v16 b0 = bias ? ds_load16(bias + c0, nl) : (ds_v16){0};                                   \
            DS_ROWS##NP(DS_DW_ACC)                                                                           \
            for (int64_t kh = kh0; kh < kh1; kh++) {                                                        \
                const float *xr = xn + ((ih0 + kh * DH) * W - PL) * C + c0;                                 \
                for (int64_t kw = 0; kw < KW; kw++) {                                                       \
                    const ds_v16 wv = ds_load16(w + (kh * KW + kw) * C + c0, nl);                              \
                    DS_ROWS##NP(DS_DW_FMA)                                                                   \
                }                                                                                           \
            }                                                                                               \
            DS_ROWS##NP(DS_DW_STORE)                                                                         \
        }                                                                                                   \
    }
DS_DW_BLOCK(8)
DS_DW_BLOCK(4)
DS_DW_BLOCK(1)

/* One border pixel: each tap checked against the input's columns. */
static void ds_dw_border(const int64_t *geo, const float *restrict xn, const float *restrict w,
                         const float *restrict bias, float *restrict y, int64_t ih0, int64_t kh0, int64_t kh1,
                         int64_t o, int64_t cb, int64_t ce) {
    GEO_LOCALS;
    (void)CG; (void)OH; (void)OW; (void)KH; (void)H; (void)PT; (void)SH;
    for (int64_t c0 = cb; c0 < ce; c0 += 16) {
        const int64_t nl = ce - c0 < 16 ? ce - c0 : 16;
        ds_v16 acc = bias ? ds_load16(bias + c0, nl) : (ds_v16){0};
        for (int64_t kh = kh0; kh < kh1; kh++) {
            const float *xr = xn + (ih0 + kh * DH) * W * C + c0;
            for (int64_t kw = 0; kw < KW; kw++) {
                const int64_t iw = o * SW - PL + kw * DW;
                if ((uint64_t)iw < (uint64_t)W) acc += ds_load16(xr + iw * C, nl) * ds_load16(w + (kh * KW + kw) * C + c0, nl);
            }
        }
        ds_store16(y + o * LDY + c0, ds_act(acc, geo[DS_CONV_ACT]), nl);
    }
}

/* Few channels (C = 1, 2, 4 or 8), stride 1, dense output: the interior of a row is one flat run of floats
   f = wo * C + c, each tap reading the input run shifted by (kw * DW - PL) * C, its weights tiled to 16 lanes
   (16 % C == 0: every vector sees the same channel pattern), four vectors at once: 16 / C pixels a vector
   instead of one pixel in a half-empty one (a detector's 8-channel 3x3 on 240x320: 0.68 ms, onnxruntime 0.35). */
#define DS_DWF_TAPS 64
static int ds_dw_flat(const int64_t *geo, const float *restrict xn, const float *restrict w,
                      const float *restrict bias, float *restrict y, int64_t ih0, int64_t kh0, int64_t kh1,
                      int64_t lo, int64_t hi) {
    GEO_LOCALS;
    (void)CG; (void)OH; (void)H; (void)PT; (void)SH;
    if (C >= 16 || 16 % C || SW != 1 || LDY != C || KH * KW > DS_DWF_TAPS) return 0;
    const int64_t act = geo[DS_CONV_ACT];
    ds_v16 wt[DS_DWF_TAPS], bt = {0};
    for (int64_t t = 0; t < KH * KW; t++)
        for (int l = 0; l < 16; l++) wt[t][l] = w[t * C + l % C];
    if (bias)
        for (int l = 0; l < 16; l++) bt[l] = bias[l % C];
    for (int64_t o = 0; o < lo; o++) ds_dw_border(geo, xn, w, bias, y, ih0, kh0, kh1, o, 0, C);
    const int64_t f1 = hi * C;
    int64_t f = lo * C;
    for (; f + 64 <= f1; f += 64) {
        ds_v16 a0 = bt, a1 = bt, a2 = bt, a3 = bt;
        for (int64_t kh = kh0; kh < kh1; kh++) {
            const float *xr = xn + (ih0 + kh * DH) * W * C + f - PL * C;
            for (int64_t kw = 0; kw < KW; kw++) {
                const float *xp = xr + kw * DW * C;
                const ds_v16 wv = wt[kh * KW + kw];
                a0 += ds_ld16(xp) * wv; a1 += ds_ld16(xp + 16) * wv; a2 += ds_ld16(xp + 32) * wv;
                a3 += ds_ld16(xp + 48) * wv;
            }
        }
        ds_st16(y + f, ds_act(a0, act)); ds_st16(y + f + 16, ds_act(a1, act));
        ds_st16(y + f + 32, ds_act(a2, act)); ds_st16(y + f + 48, ds_act(a3, act));
    }
    for (; f < f1; f += 16) { /* the last vectors, the very last masked: never past the interior's end */
        const int64_t nl = f1 - f < 16 ? f1 - f : 16;
        ds_v16 a0 = bt;
        for (int64_t kh = kh0; kh < kh1; kh++) {
            const float *xr = xn + (ih0 + kh * DH) * W * C + f - PL * C;
            for (int64_t kw = 0; kw < KW; kw++) a0 += ds_load16(xr + kw * DW * C, nl) * wt[kh * KW + kw];
        }
        ds_store16(y + f, ds_act(a0, act), nl);
    }
    for (int64_t o = hi; o < OW; o++) ds_dw_border(geo, xn, w, bias, y, ih0, kh0, kh1, o, 0, C);
    return 1;
}

void ds_dwconv_row(const int64_t *geo, const float *restrict x, const float *restrict w,
                   const float *restrict bias, float *restrict y, int64_t n, int64_t ho) {
    GEO_LOCALS;
    (void)CG; (void)LDY;
    const int64_t ih0 = ho * SH - PT;
    int64_t kh0 = 0, kh1 = KH;
    while (kh0 < KH && ih0 + kh0 * DH < 0) kh0++;
    while (kh1 > kh0 && ih0 + (kh1 - 1) * DH >= H) kh1--;
    /* interior columns: wo * SW - PL >= 0 and wo * SW - PL + (KW - 1) * DW <= W - 1 */
    const int64_t last = W - 1 + PL - (KW - 1) * DW;
    int64_t lo = (PL + SW - 1) / SW, hi = last >= 0 ? last / SW + 1 : 0;
    if (hi > OW) hi = OW;
    if (lo > hi) lo = hi;
    const float *xn = x + n * H * W * C;
    if (ds_dw_flat(geo, xn, w, bias, y, ih0, kh0, kh1, lo, hi)) return;
    /* chunks of DS_DW_CHUNK channels: a chunk's weights (KH * KW * 128 floats) stay in L1 over the row's pixel
       blocks, and within a block the chunk's input pixels are read contiguously */
    for (int64_t cb = 0; cb < C; cb += DS_DW_CHUNK) {
        const int64_t ce = C - cb < DS_DW_CHUNK ? C : cb + DS_DW_CHUNK;
        for (int64_t o = 0; o < lo; o++) ds_dw_border(geo, xn, w, bias, y, ih0, kh0, kh1, o, cb, ce);
        int64_t wo = lo;
        for (; wo + 8 <= hi; wo += 8) ds_dw_block8(geo, xn, w, bias, y, ih0, kh0, kh1, wo, cb, ce);
        for (; wo + 4 <= hi; wo += 4) ds_dw_block4(geo, xn, w, bias, y, ih0, kh0, kh1, wo, cb, ce);
        for (; wo < hi; wo++) ds_dw_block1(geo, xn, w, bias, y, ih0, kh0, kh1, wo, cb, ce);
        for (int64_t o = hi; o < OW; o++) ds_dw_border(geo, xn, w, bias, y, ih0, kh0, kh1, o, cb, ce);
    }
}

/* ---- a 1x1 conv into a depthwise one ------------------------------------------------------------------------
   Output rows ho0..ho1 of image n of the depthwise conv (geometry gd) over the 1x1 conv's (gp) result, of which
   only the rows these need are computed, into `scratch` (the caller's: ds_conv.h says how large):
   the 1x1's tiles over those rows' pixels (finished in registers: bias, activation), then the depthwise rows
   reading them there, in cache, instead of the whole expanded map going out to memory and back. Scratch row r
   holds input row r0 + r; the depthwise kernel addresses an image's rows from its start, which therefore lies
   r0 rows before the scratch (never read: every row it reads is one of r0..r1). */
void ds_pwdw_rows(const int64_t *gp, const int64_t *gd, const float *restrict x, const float *restrict bp,
                  const float *restrict bias_p, const float *restrict wd, const float *restrict bias_d,
                  float *restrict y, const float *restrict zeros, float *restrict scratch, int64_t n, int64_t ho0,
                  int64_t ho1) {
    const int64_t H = gd[DS_CONV_H], W = gd[DS_CONV_W], C = gd[DS_CONV_C], OH = gd[DS_CONV_OH];
    const int64_t OW = gd[DS_CONV_OW], LDY = gd[DS_CONV_LDY];
    const int64_t first = ho0 * gd[DS_CONV_SH] - gd[DS_CONV_PT];
    const int64_t last = (ho1 - 1) * gd[DS_CONV_SH] - gd[DS_CONV_PT] + (gd[DS_CONV_KH] - 1) * gd[DS_CONV_DH];
    const int64_t r0 = first > 0 ? first : 0, r1 = last + 1 < H ? last + 1 : H;
    if (r0 < r1) {
        const int64_t p0 = (n * H + r0) * W, p1 = (n * H + r1) * W, pairs = (C + 63) / 64;
        float *ys = (float *)((uintptr_t)scratch - (uintptr_t)(p0 * C) * sizeof(float));
        for (int64_t q = 0; q < pairs; q++) ds_conv_tile2(gp, x, bp, ys, zeros, p0, p1, 0, 2 * q, bias_p, 0);
    }
    const float *xs = (const float *)((uintptr_t)scratch - (uintptr_t)((n * H + r0) * W * C) * sizeof(float));
    for (int64_t ho = ho0; ho < ho1; ho++) ds_dwconv_row(gd, xs, wd, bias_d, y + (n * OH + ho) * OW * LDY, n, ho);
}

/* ---- Winograd F(2x2, 3x3) ------------------------------------------------------------------------------
   A 3x3 convolution of stride 1 (no dilation, one group; channel tails masked) as 16 products: every 2x2
   block of output pixels (a tile) reads a 4x4 input patch d, transformed to V = B^T d B (16 values per input
   channel); each of the 16 positions xi of V times that position's transformed weights U = G g G^T (C x OC,
   packed like a 1x1 convolution's) gives M, and Y = A^T M A is the 2x2 block. 16 products of C x OC per 4
   output pixels instead of 36: 2.25x fewer multiply-adds, for the cost of the two transforms (O(C) and O(OC) per
   pixel, against O(C * OC) for the products) and a round trip of V and M through L2.
   Tiles are flat over (image, tile row, tile column); a call takes tiles t0..t1 in chunks of DS_WINO_TILES,
   scratch holding 16 * DS_WINO_TILES * (C + OC) floats (V then M). The products run on ds_conv_tile2 (the
   6 x 64 micro-tiles) as 1x1 convolutions over the chunk's tiles.
   Threads share each chunk, phase by phase (tiles of the input transform, the 16 x pairs products, tiles of
   the output transform): splitting tiles between threads instead left a 28x28 map's three blocks of rows
   (or its 96 channels as 64 + 32) unevenly shared, and 2 threads ran its convolutions 1.2x faster than 1. */

/* Tile t of an m x m output tiling (flat over image, tile row, tile column): its image and first output pixel. */
static inline void ds_wino_tile(const int64_t *geo, int64_t t, int64_t m, int64_t *n, int64_t *oh, int64_t *ow) {
    const int64_t TW = (geo[DS_CONV_OW] + m - 1) / m, TH = (geo[DS_CONV_OH] + m - 1) / m;
    *n = t / (TH * TW);
    *oh = t % (TH * TW) / TW * m;
    *ow = t % TW * m;
}

/* The (m + 2) x (m + 2) input pixels tile t reads, row-major into `row`: NULL where the patch is in the padding. */
static void ds_wino_patch(const int64_t *geo, const float *restrict x, int64_t t, int64_t m, const float **row) {
    const int64_t H = geo[DS_CONV_H], W = geo[DS_CONV_W], C = geo[DS_CONV_C], a_ = m + 2;
    int64_t n, oh, ow;
    ds_wino_tile(geo, t, m, &n, &oh, &ow);
    const int64_t ih0 = oh - geo[DS_CONV_PT], iw0 = ow - geo[DS_CONV_PL];
    const float *xn = x + n * H * W * C;
    for (int64_t a = 0; a < a_; a++)
        for (int64_t b = 0; b < a_; b++) {
            const int64_t ih = ih0 + a, iw = iw0 + b;
            row[a * a_ + b] = ((uint64_t)ih < (uint64_t)H && (uint64_t)iw < (uint64_t)W) ? xn + (ih * W + iw) * C : 0;
        }
}

/* Tile i of the chunk from tile t0 (nt tiles): its 16 x C transformed values into V[xi][i][c]. */
static void ds_wino_input(const int64_t *geo, const float *restrict x, float *restrict v, int64_t t0, int64_t i,
                          int64_t nt) {
    const int64_t C = geo[DS_CONV_C], XI = nt * C;
    const float *row[16];
    ds_wino_patch(geo, x, t0 + i, 2, row);
    float *vt = v + i * C;
    for (int64_t c = 0; c < C; c += 16) {
        const int64_t nl = C - c < 16 ? C - c : 16; /* a masked tail block: C need not be a multiple of 16 */
        ds_v16 d[4][4], s[4][4];
        for (int64_t a = 0; a < 4; a++)
            for (int64_t b = 0; b < 4; b++) d[a][b] = row[a * 4 + b] ? ds_load16(row[a * 4 + b] + c, nl) : (ds_v16){0};
        for (int64_t b = 0; b < 4; b++) { /* B^T d: over rows */
            s[0][b] = d[0][b] - d[2][b]; s[1][b] = d[1][b] + d[2][b];
            s[2][b] = d[2][b] - d[1][b]; s[3][b] = d[1][b] - d[3][b];
        }
        for (int64_t a = 0; a < 4; a++) { /* (B^T d) B: over columns */
            float *o = vt + a * 4 * XI + c;
            ds_store16(o, s[a][0] - s[a][2], nl);
            ds_store16(o + XI, s[a][1] + s[a][2], nl);
            ds_store16(o + 2 * XI, s[a][2] - s[a][1], nl);
            ds_store16(o + 3 * XI, s[a][1] - s[a][3], nl);
        }
    }
}

/* Tile i of the chunk: Y = A^T M A from M[xi][i][oc], its pixels that fall inside the output stored. */
static void ds_wino_output(const int64_t *geo, const float *restrict m, float *restrict y, int64_t t0, int64_t i,
                           int64_t nt, const float *restrict bias) {
    const int64_t OH = geo[DS_CONV_OH], OW = geo[DS_CONV_OW], OC = geo[DS_CONV_OC], LDY = geo[DS_CONV_LDY];
    const int64_t act = geo[DS_CONV_ACT];
    const int64_t XI = nt * OC;
    int64_t n, oh, ow;
    ds_wino_tile(geo, t0 + i, 2, &n, &oh, &ow);
    const int two_rows = oh + 1 < OH, two_cols = ow + 1 < OW;
    float *y00 = y + ((n * OH + oh) * OW + ow) * LDY;
    const float *mt = m + i * OC;
    for (int64_t c = 0; c < OC; c += 16) {
        const int64_t nl = OC - c < 16 ? OC - c : 16;
        ds_v16 q[4][4], s[2][4];
        for (int64_t a = 0; a < 4; a++)
            for (int64_t b = 0; b < 4; b++) q[a][b] = ds_load16(mt + (a * 4 + b) * XI + c, nl);
        for (int64_t b = 0; b < 4; b++) { /* A^T M: over rows */
            s[0][b] = q[0][b] + q[1][b] + q[2][b];
            s[1][b] = q[1][b] - q[2][b] - q[3][b];
        }
        const ds_v16 f = ds_bias16(bias ? bias + c : 0, nl);
        for (int64_t a = 0; a < 2; a++) {
            if (a == 1 && !two_rows) break;
            float *o = y00 + a * OW * LDY + c;
            ds_v16 o0 = s[a][0] + s[a][1] + s[a][2], o1 = s[a][1] - s[a][2] - s[a][3];
            if (bias || act) { o0 = ds_fin(o0, f, act); o1 = ds_fin(o1, f, act); }
            ds_store16(o, o0, nl);
            if (two_cols) ds_store16(o + LDY, o1, nl);
        }
    }
}

/* ---- F(4x4, 3x3): 6x6 patches, 36 products per 16 output pixels (4x fewer multiply-adds than direct) -------
   B^T, G and A^T of Lavin and Gray (interpolation points 0, +-1, +-2, infinity). */

/* Tile i of the chunk: its 36 x C transformed values into V[xi][i][c] (xi = 6a + b). */
static void ds_wino4_input(const int64_t *geo, const float *restrict x, float *restrict v, int64_t t0, int64_t i,
                           int64_t nt) {
    const int64_t C = geo[DS_CONV_C], XI = nt * C;
    const float *row[36];
    ds_wino_patch(geo, x, t0 + i, 4, row);
    float *vt = v + i * C;
    for (int64_t c = 0; c < C; c += 16) {
        const int64_t nl = C - c < 16 ? C - c : 16;
        ds_v16 s[6][6];
        for (int64_t b = 0; b < 6; b++) { /* B^T d: over rows, one column of the patch at a time */
            ds_v16 d[6];
            for (int64_t a = 0; a < 6; a++) d[a] = row[a * 6 + b] ? ds_load16(row[a * 6 + b] + c, nl) : (ds_v16){0};
            s[0][b] = 4 * d[0] - 5 * d[2] + d[4];
            s[1][b] = d[3] + d[4] - 4 * (d[1] + d[2]);
            s[2][b] = d[4] - d[3] + 4 * (d[1] - d[2]);
            s[3][b] = d[4] - d[2] + 2 * (d[3] - d[1]);
            s[4][b] = d[4] - d[2] - 2 * (d[3] - d[1]);
            s[5][b] = 4 * d[1] - 5 * d[3] + d[5];
        }
        for (int64_t a = 0; a < 6; a++) { /* (B^T d) B: over columns */
            const ds_v16 *e = s[a];
            float *o = vt + a * 6 * XI + c;
            ds_store16(o, 4 * e[0] - 5 * e[2] + e[4], nl);
            ds_store16(o + XI, e[3] + e[4] - 4 * (e[1] + e[2]), nl);
            ds_store16(o + 2 * XI, e[4] - e[3] + 4 * (e[1] - e[2]), nl);
            ds_store16(o + 3 * XI, e[4] - e[2] + 2 * (e[3] - e[1]), nl);
            ds_store16(o + 4 * XI, e[4] - e[2] - 2 * (e[3] - e[1]), nl);
            ds_store16(o + 5 * XI, 4 * e[1] - 5 * e[3] + e[5], nl);
        }
    }
}

/* Tile i of the chunk: Y = A^T M A (4x4) from M[xi][i][oc], its pixels inside the output stored. */
static void ds_wino4_output(const int64_t *geo, const float *restrict m, float *restrict y, int64_t t0, int64_t i,
                            int64_t nt, const float *restrict bias) {
    const int64_t OH = geo[DS_CONV_OH], OW = geo[DS_CONV_OW], OC = geo[DS_CONV_OC], LDY = geo[DS_CONV_LDY];
    const int64_t act = geo[DS_CONV_ACT];
    const int64_t XI = nt * OC;
    int64_t n, oh, ow;
    ds_wino_tile(geo, t0 + i, 4, &n, &oh, &ow);
    const int64_t nr = OH - oh < 4 ? OH - oh : 4, nc = OW - ow < 4 ? OW - ow : 4;
    float *y00 = y + ((n * OH + oh) * OW + ow) * LDY;
    const float *mt = m + i * OC;
    for (int64_t c = 0; c < OC; c += 16) {
        const int64_t nl = OC - c < 16 ? OC - c : 16;
        ds_v16 s[4][6];
        for (int64_t b = 0; b < 6; b++) { /* A^T M: over rows */
            ds_v16 q[6];
            for (int64_t a = 0; a < 6; a++) q[a] = ds_load16(mt + (a * 6 + b) * XI + c, nl);
            const ds_v16 p12 = q[1] + q[2], m12 = q[1] - q[2], p34 = q[3] + q[4], m34 = q[3] - q[4];
            s[0][b] = q[0] + p12 + p34;
            s[1][b] = m12 + 2 * m34;
            s[2][b] = p12 + 4 * p34;
            s[3][b] = m12 + 8 * m34 + q[5];
        }
        const ds_v16 f = ds_bias16(bias ? bias + c : 0, nl);
        for (int64_t a = 0; a < nr; a++) {
            const ds_v16 *e = s[a];
            const ds_v16 p12 = e[1] + e[2], m12 = e[1] - e[2], p34 = e[3] + e[4], m34 = e[3] - e[4];
            ds_v16 out[4] = {e[0] + p12 + p34, m12 + 2 * m34, p12 + 4 * p34, m12 + 8 * m34 + e[5]};
            if (bias || act)
                for (int64_t b = 0; b < 4; b++) out[b] = ds_fin(out[b], f, act);
            float *o = y00 + a * OW * LDY + c;
            for (int64_t b = 0; b < nc; b++) ds_store16(o + b * LDY, out[b], nl);
        }
    }
}

typedef void (*ds_wino_in_fn)(const int64_t *, const float *restrict, float *restrict, int64_t, int64_t, int64_t);
typedef void (*ds_wino_out_fn)(const int64_t *, const float *restrict, float *restrict, int64_t, int64_t, int64_t,
                               const float *restrict);

/* The chunk driver of both: `np` positions (16 or 36), chunks of `chunk` tiles. */
static void ds_wino_run(const int64_t *geo, const float *restrict x, const float *restrict up, float *restrict y,
                        const float *restrict zeros, int64_t t0, int64_t t1, int64_t par, float *restrict scratch,
                        int64_t np, int64_t chunk, ds_wino_in_fn in, ds_wino_out_fn out, const float *restrict bias) {
    const int64_t C = geo[DS_CONV_C], OC = geo[DS_CONV_OC], pairs = (OC + 63) / 64;
    const int64_t per_xi = (OC + 31) / 32 * 32 * C; /* one position's packed weights */
    float *v = scratch, *m = scratch + np * chunk * C;
    #pragma omp parallel if(par)
    for (int64_t u0 = t0; u0 < t1; u0 += chunk) { /* every thread walks the chunks; they share each */
        const int64_t nt = t1 - u0 < chunk ? t1 - u0 : chunk;
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < nt; i++) in(geo, x, v, u0, i, nt);
        /* each position's product: a 1x1 convolution of the chunk's nt "pixels" */
        int64_t g1[DS_CONV_GEO] = {0};
        g1[DS_CONV_H] = 1; g1[DS_CONV_W] = nt; g1[DS_CONV_C] = C; g1[DS_CONV_OH] = 1; g1[DS_CONV_OW] = nt;
        g1[DS_CONV_OC] = OC; g1[DS_CONV_KH] = 1; g1[DS_CONV_KW] = 1; g1[DS_CONV_SH] = 1; g1[DS_CONV_SW] = 1;
        g1[DS_CONV_DH] = 1; g1[DS_CONV_DW] = 1; g1[DS_CONV_G] = 1; g1[DS_CONV_CG] = C; g1[DS_CONV_OCG] = OC;
        g1[DS_CONV_LDY] = OC;
        g1[DS_CONV_NPIX] = nt; /* one block a pair: each tile prefetches the next (pair, position)'s weights */
        #pragma omp for collapse(2) schedule(static)
        for (int64_t xi = 0; xi < np; xi++)
            for (int64_t pq = 0; pq < pairs; pq++) {
                g1[DS_CONV_WREST] = (np - xi) * per_xi;
                ds_conv_tile2(g1, v + xi * nt * C, up + xi * per_xi, m + xi * nt * OC, zeros, 0, nt, 0, 2 * pq, 0, 0);
            }
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < nt; i++) out(geo, m, y, u0, i, nt, bias);
    }
}

void ds_wino_f2(const int64_t *geo, const float *restrict x, const float *restrict up, float *restrict y,
                const float *restrict zeros, int64_t t0, int64_t t1, int64_t par, float *restrict scratch,
                const float *restrict bias) {
    ds_wino_run(geo, x, up, y, zeros, t0, t1, par, scratch, 16, DS_WINO_TILES, ds_wino_input, ds_wino_output, bias);
}

void ds_wino_f4(const int64_t *geo, const float *restrict x, const float *restrict up, float *restrict y,
                const float *restrict zeros, int64_t t0, int64_t t1, int64_t par, float *restrict scratch,
                const float *restrict bias) {
    ds_wino_run(geo, x, up, y, zeros, t0, t1, par, scratch, 36, DS_WINO4_TILES, ds_wino4_input, ds_wino4_output, bias);
}
