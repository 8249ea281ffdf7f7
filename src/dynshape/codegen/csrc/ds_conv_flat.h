/* The AVX2 tiles' 8-float halves (DS_HACC_ZERO, DS_HFMA, DS_HALF_FIN, DS_HFIN: ds_conv.c's per-tap tiles use them too)
   and the flat tiles of pointwise convs without AVX-512, for ds_conv.c's ds_conv_tile: a pointwise conv's pixel
   reads one row of C floats, so its micro-tiles take the pixels' offsets once (ds_pw_offsets) and run one loop over
   the channels, in a shape per panel width: 3 rows x 32 columns, 4 x 24, 6 x 16. Why a file of its own: ds_conv.c
   stays under the size where one reads it whole. */
#ifndef DS_CONV_FLAT_INCLUDED
#define DS_CONV_FLAT_INCLUDED
#include <stdint.h>

#include "ds_conv_common.h"

/* A pointwise conv (1x1, unpadded: ds_conv_pointwise) is a product: pixel p's input is one row of C floats (p * C
   at stride 1), so its micro-tiles need neither DS_POS_START's divisions per row nor border tests (a 16 -> 64 1x1
   conv's tile has 16 multiply-adds an accumulator: the divisions cost a quarter of that); at stride 2 (ResNet's
   shortcuts) one division a tile, then steps (16 -> 32 on 112x112, Zen 3: 89 -> 65 us, onnxruntime 62). */
static inline void ds_pw_offsets(const int64_t *geo, int64_t p, int n, int64_t *restrict off) {
    const int64_t C = geo[DS_CONV_C], H = geo[DS_CONV_H], W = geo[DS_CONV_W], OH = geo[DS_CONV_OH];
    const int64_t OW = geo[DS_CONV_OW], SH = geo[DS_CONV_SH], SW = geo[DS_CONV_SW];
    if (SH == 1 && SW == 1 && OH == H && OW == W) {
        for (int r = 0; r < n; r++) off[r] = (p + r) * C;
        return;
    }
    DS_POS_START
    for (int r = 0; r < n; r++) {
        off[r] = ((pn_ * H + poh_ * SH) * W + pow_ * SW) * C;
        DS_POS_NEXT
    }
}
#define DS_FROW(r) const float *a##r = xg + off_[r];
#ifdef __AVX512F__
/* AVX-512's flat tiles (ds_conv.c instantiates them: 12 rows x 32 columns, 24 x 16, and 6 x 64 over two panels
   `pstride` floats apart): the per-tap tiles' accumulators, loop and finish (ZERO, LOAD_B, FMA, FIN, STORE are
   theirs), without DS_POS_START's divisions and the border test of every row (Zen 5, tile sweep, the same bits:
   16 -> 32 on 112x112 1.32x, 32 -> 16 1.23x, 16 -> 96 1.23x, 24 -> 144 on 56x56 1.14x; 256 input channels and more
   within noise: the loop over them outweighs the setup). */
#define DS_CONV_FWIDE(NAME, MR, ZERO, LOAD_B, FMA, FIN, STORE)                                              \
    __attribute__((noinline, unused)) static void NAME(const int64_t *geo, const float *restrict xg,        \
                                               const float *restrict bp, int64_t pstride, float *restrict yo, \
                                               int64_t p, int64_t ncols, const float *restrict bias,         \
                                               const float *restrict res) {                                  \
        const int64_t CG = geo[DS_CONV_CG], LDY = geo[DS_CONV_LDY];                                          \
        const float *b = bp, *bb = bp + pstride;                                                            \
        (void)bb;                                                                                           \
        DS_CMASKS                                                                                           \
        int64_t off_[MR];                                                                                   \
        ds_pw_offsets(geo, p, MR, off_);                                                                    \
        DS_ROWS##MR(DS_FROW)                                                                                 \
        DS_ROWS##MR(ZERO)                                                                                    \
        _Pragma("GCC unroll 4")                                                                             \
        for (int64_t c = 0; c < CG; c++) { LOAD_B DS_ROWS##MR(FMA) }                                         \
        FIN(MR)                                                                                             \
        DS_ROWS##MR(STORE)                                                                                   \
    }
/* A runs micro-tile whose MR pixels lie in one output row and read no padding (ds_runs_interior, which finds row
   0's window at xg[0]): row r's run starts r * SW * C floats after row 0's, a constant (STEPV) where the runs path's tiles keep a pointer a row (24
   of them: spilled, a load of its pointer before every broadcast). Instantiated for SW * C = 6, the stride-2 RGB
   stems (Zen 5, tile sweep, --ab: 3 -> 16 on 224x224 1.20x, 3 -> 24 1.20x, 3 -> 32 1.18x, 3 -> 8 1.16x); at 3
   (stride 1) the same code ran 0.78-0.92x (its rows' runs overlap: 24 broadcasts share loads across the unrolled
   channels and spill). The same sums in the same order as ds_conv_rmicro: the same bits. */
#define DS_RSROW_FMA1(r) c##r##0 += a0_[c + (r) * step_] * b0;
#define DS_RSROW_FMA2(r) { const float v = a0_[c + (r) * step_]; c##r##0 += v * b0; c##r##1 += v * b1; }
/* (LOADB, STORE: the runs tiles' weight loads and stores of NV vectors) */
#define DS_CONV_RSMICRO(MR, NV, STEPV, LOADB, STORE)                                                        \
    __attribute__((noinline)) static void ds_conv_rsmicro##NV##_##MR##_##STEPV(const int64_t *geo,          \
        const float *restrict xg, const float *restrict bp, float *restrict yo, int64_t p, int64_t ncols,   \
        const float *restrict bias, const float *restrict res) {                                            \
        const int64_t W = geo[DS_CONV_W], C = geo[DS_CONV_C], KH = geo[DS_CONV_KH], KW = geo[DS_CONV_KW];   \
        const int64_t DH = geo[DS_CONV_DH], LDY = geo[DS_CONV_LDY], RUN = KW * C, step_ = STEPV;            \
        DS_CMASKS                                                                                           \
        DS_ROWS##MR(DS_RROW_ZERO##NV)                                                                        \
        for (int64_t kh = 0; kh < KH; kh++) {                                                               \
            const float *a0_ = xg + kh * DH * W * C;                                                        \
            const float *b = bp + kh * RUN * 32;                                                            \
            _Pragma("GCC unroll 4")                                                                         \
            for (int64_t c = 0; c < RUN; c++) {                                                             \
                LOADB                                                                                       \
                DS_ROWS##MR(DS_RSROW_FMA##NV)                                                                \
            }                                                                                               \
        }                                                                                                   \
        DS_FIN_##NV(MR)                                                                                      \
        DS_ROWS##MR(STORE)                                                                                   \
    }
/* Where the MR pixels from p lie in one output row and read no padding, the offset of pixel p's window (its top-left
   input) in the group's input; else -1. */
__attribute__((unused)) static inline int64_t ds_runs_interior(const int64_t *geo, int64_t p, int64_t MR) {
    const int64_t H = geo[DS_CONV_H], W = geo[DS_CONV_W], OH = geo[DS_CONV_OH], OW = geo[DS_CONV_OW];
    const int64_t pn = p / (OH * OW), poh = p % (OH * OW) / OW, pw = p % OW;
    const int64_t ih0 = poh * geo[DS_CONV_SH] - geo[DS_CONV_PT], iw0 = pw * geo[DS_CONV_SW] - geo[DS_CONV_PL];
    const int inside = pw + MR <= OW && ih0 >= 0 && ih0 + (geo[DS_CONV_KH] - 1) * geo[DS_CONV_DH] < H && iw0 >= 0
                       && iw0 + (MR - 1) * geo[DS_CONV_SW] + geo[DS_CONV_KW] <= W;
    return inside ? ((pn * H + ih0) * W + iw0) * geo[DS_CONV_C] : -1;
}
#endif
#ifndef __AVX512F__
/* Without AVX-512 the multiply-adds run on the machine's 8-float vectors (ds_simd.h's ds_v8: a 64-byte ds_v16
   lives in memory there), one 16-column half of the tile at a time (MR rows x 2 vectors: 8 accumulators at 4
   rows), each half finished and stored from its registers (DS_HFIN). Each lane sums in the same order as the
   AVX-512 kernel's (taps, then channels, one chain). */
#define DS_HACC_ZERO(r) ds_v8 g##r##0 = {0}, g##r##1 = {0};
#define DS_HFMA(r) { const float v = a##r[c]; g##r##0 += v * h0; g##r##1 += v * h1; }
/* Row r's finish on its 8-float accumulators, as DS_FIN_ROWS does it ((c + bias) + residual, then the
   activation), stored at once: the first n_ = ncols - 16 * HALF columns of the half (DS_HALF_FIN, before the rows,
   loads the half's bias once and sets n_ and HALF's offset off_). */
#define DS_HALF_FIN(HALF)                                                                                   \
    const int64_t off_ = (HALF) * 16, n_ = ncols - off_;                                                    \
    const ds_v8 hb0_ = bias ? ds_ld8n(bias + off_, n_) : (ds_v8){0};                                        \
    const ds_v8 hb1_ = bias ? ds_ld8n(bias + off_ + 8, n_ - 8) : (ds_v8){0};
#define DS_HFIN(r)                                                                                          \
    { if (bias) { g##r##0 += hb0_; g##r##1 += hb1_; }                                                       \
      if (res) { const float *rr_ = res + (p + (r)) * geo[DS_CONV_OC] + off_;                               \
                 g##r##0 += ds_ld8n(rr_, n_); g##r##1 += ds_ld8n(rr_ + 8, n_ - 8); }                        \
      ds_store_half(yo + (r) * LDY + off_, ds_act_light8(g##r##0, act_), ds_act_light8(g##r##1, act_), n_); }
/* A flat tile of MR rows in one pass over the channels (ds_conv_fmicro3_4, ds_conv_fmicro_3): ZERO its accumulators,
   STEP(w) one channel's multiply-adds from the weights at w, BIAS its bias vectors, FIN(r) row r's finish; NVAR the
   columns of its last, masked vector (ncols - OFF). Not inlined: inside ds_conv_tile the loop ran about twice as
   slow. */
#define DS_CONV_FONE(NAME, MR, ZERO, STEP, BIAS, FIN, NVAR, OFF)                                            \
    __attribute__((noinline, unused)) static void NAME(const int64_t *geo, const float *restrict xg,        \
                                               const float *restrict bp, float *restrict yo, int64_t p,      \
                                               int64_t ncols, const float *restrict bias,                     \
                                               const float *restrict res) {                                   \
        const int64_t CG = geo[DS_CONV_CG], LDY = geo[DS_CONV_LDY], act_ = geo[DS_CONV_ACT];                \
        const int64_t NVAR = ncols - (OFF);                                                                 \
        int64_t off_[MR];                                                                                   \
        ds_pw_offsets(geo, p, MR, off_);                                                                    \
        DS_ROWS##MR(DS_FROW)                                                                                 \
        DS_ROWS##MR(ZERO)                                                                                    \
        _Pragma("GCC unroll 4")                                                                             \
        for (int64_t c = 0; c < CG; c++) STEP(bp + c * 32)                                                  \
        BIAS                                                                                                \
        DS_ROWS##MR(FIN)                                                                                     \
    }
#define DS_CONV_FHALF(MR, HALF)                                                                             \
    {   DS_ROWS##MR(DS_HACC_ZERO)                                                                            \
        const float *b = bp + (HALF) * 16;                                                                  \
        _Pragma("GCC unroll 4")                                                                             \
        for (int64_t c = 0; c < CG; c++) {                                                                  \
            const ds_v8 h0 = ds_ld8(b + c * 32), h1 = ds_ld8(b + c * 32 + 8);                               \
            DS_ROWS##MR(DS_HFMA)                                                                             \
        }                                                                                                   \
        { DS_HALF_FIN(HALF) DS_ROWS##MR(DS_HFIN) } }
/* A flat 6-row tile of a panel's first 16 columns, for a panel of 9..16 (not inlined, as ds_conv_fmicro3_4; Zen 3,
   a 32 -> 16 1x1 on 112x112: 217 us per-tap, 180 here, onnxruntime 198). */
__attribute__((noinline, unused)) static void ds_conv_fnmicro_6(const int64_t *geo, const float *restrict xg,
                                                         const float *restrict bp, float *restrict yo, int64_t p,
                                                         int64_t ncols, const float *restrict bias,
                                                         const float *restrict res) {
    const int64_t CG = geo[DS_CONV_CG], LDY = geo[DS_CONV_LDY], act_ = geo[DS_CONV_ACT];
    int64_t off_[6];
    ds_pw_offsets(geo, p, 6, off_);
    DS_ROWS6(DS_FROW)
    DS_CONV_FHALF(6, 0)
}
/* A pointwise panel of 17..24 columns (24 output channels; 56 = 32 + 24) in one pass of 4 rows x 3 vectors: 12
   accumulators, 7 loads per 12 multiply-adds, where a half then a quarter took 8 per 12 and 7 per 6 (6 chains:
   the FMA units idle a quarter of the time; Zen 3, 144 -> 24 on 56x56: 303 -> 245 us, onnxruntime 245). The same
   sums in the same order: the same bits. Not inlined: inside ds_conv_tile the loop ran about twice as slow. */
#define DS_F3ZERO(r) ds_v8 t##r##0 = {0}, t##r##1 = {0}, t##r##2 = {0};
#define DS_F3FMA(r) { const float v = a##r[c]; t##r##0 += v * h0; t##r##1 += v * h1; t##r##2 += v * h2; }
/* the 3 weight vectors at w, then each of 4 rows' multiply-adds; and the bias's 3 vectors (the third masked) */
#define DS_F3COLS(w)                                                                                        \
    { const ds_v8 h0 = ds_ld8(w), h1 = ds_ld8((w) + 8), h2 = ds_ld8((w) + 16); DS_ROWS4(DS_F3FMA) }
#define DS_F3BIAS                                                                                           \
    const ds_v8 b0_ = bias ? ds_ld8(bias) : (ds_v8){0}, b1_ = bias ? ds_ld8(bias + 8) : (ds_v8){0};          \
    const ds_v8 b2_ = bias ? ds_ld8n(bias + 16, n2_) : (ds_v8){0};
#define DS_F3FIN(r)                                                                                         \
    { if (bias) { t##r##0 += b0_; t##r##1 += b1_; t##r##2 += b2_; }                                         \
      if (res) { const float *rr_ = res + (p + (r)) * geo[DS_CONV_OC];                                      \
                 t##r##0 += ds_ld8(rr_); t##r##1 += ds_ld8(rr_ + 8); t##r##2 += ds_ld8n(rr_ + 16, n2_); }    \
      float *o_ = yo + (r) * LDY;                                                                           \
      ds_st8(o_, ds_act_light8(t##r##0, act_)); ds_st8(o_ + 8, ds_act_light8(t##r##1, act_));               \
      ds_st8n(o_ + 16, ds_act_light8(t##r##2, act_), n2_); }
DS_CONV_FONE(ds_conv_fmicro3_4, 4, DS_F3ZERO, DS_F3COLS, DS_F3BIAS, DS_F3FIN, n2_, 16)
/* A pointwise panel of 25..32 columns in one pass of 3 rows x 4 vectors: 12 accumulators, 3 broadcasts and 4 loads
   per 12 multiply-adds, where two 6-row halves took 6 broadcasts and 2 loads per 12 (and read the rows' inputs
   twice): with few input channels the broadcasts and the finish filled the ports the multiply-adds needed (Zen 3,
   tile sweep, in L2: 16 -> 96 channels 38 -> 54 and 62 -> 76 GFLOP/s in a slow and a fast phase of the machine,
   24 -> 144 +13-27%, 32 -> 192 +13-25%; 256 channels and more in and out unchanged). Each broadcast is its own
   register (a vector of the one float: `(ds_v8){0} + x` made a scalar add, then spills) and each weight vector is
   loaded just before its 3 multiply-adds, so the 12 accumulators, 3 broadcasts and 1 weight vector fill the 16
   registers. The
   same sums in the same order: the same bits. */
#define DS_F4ZERO(r) ds_v8 u##r##0 = {0}, u##r##1 = {0}, u##r##2 = {0}, u##r##3 = {0};
#define DS_F4BC(r) const float s##r = a##r[c]; const ds_v8 v##r = {s##r, s##r, s##r, s##r, s##r, s##r, s##r, s##r};
#define DS_F4COL(r, j) u##r##j += v##r * h;
/* the 4 weight vectors at w, each loaded just before its 3 multiply-adds */
#define DS_F4COLS(w)                                                                                        \
    { const ds_v8 h = ds_ld8(w); DS_F4COL(0, 0) DS_F4COL(1, 0) DS_F4COL(2, 0) }                             \
    { const ds_v8 h = ds_ld8((w) + 8); DS_F4COL(0, 1) DS_F4COL(1, 1) DS_F4COL(2, 1) }                       \
    { const ds_v8 h = ds_ld8((w) + 16); DS_F4COL(0, 2) DS_F4COL(1, 2) DS_F4COL(2, 2) }                      \
    { const ds_v8 h = ds_ld8((w) + 24); DS_F4COL(0, 3) DS_F4COL(1, 3) DS_F4COL(2, 3) }
#define DS_F4STEP(w) { DS_ROWS3(DS_F4BC) DS_F4COLS(w) }
#define DS_F4BIAS                                                                                           \
    const ds_v8 b0_ = bias ? ds_ld8(bias) : (ds_v8){0}, b1_ = bias ? ds_ld8(bias + 8) : (ds_v8){0};          \
    const ds_v8 b2_ = bias ? ds_ld8(bias + 16) : (ds_v8){0}, b3_ = bias ? ds_ld8n(bias + 24, n3_) : (ds_v8){0};
#define DS_F4FIN(r)                                                                                         \
    { if (bias) { u##r##0 += b0_; u##r##1 += b1_; u##r##2 += b2_; u##r##3 += b3_; }                          \
      if (res) { const float *rr_ = res + (p + (r)) * geo[DS_CONV_OC];                                      \
                 u##r##0 += ds_ld8(rr_); u##r##1 += ds_ld8(rr_ + 8); u##r##2 += ds_ld8(rr_ + 16);           \
                 u##r##3 += ds_ld8n(rr_ + 24, n3_); }                                                       \
      float *o_ = yo + (r) * LDY;                                                                           \
      ds_st8(o_, ds_act_light8(u##r##0, act_)); ds_st8(o_ + 8, ds_act_light8(u##r##1, act_));               \
      ds_st8(o_ + 16, ds_act_light8(u##r##2, act_)); ds_st8n(o_ + 24, ds_act_light8(u##r##3, act_), n3_); }
DS_CONV_FONE(ds_conv_fmicro_3, 3, DS_F4ZERO, DS_F4STEP, DS_F4BIAS, DS_F4FIN, n3_, 24)
#endif
#endif
