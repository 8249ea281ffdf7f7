/* Depthwise and Winograd convolutions, channels last (see ds_conv.h for the contract): a library of their own,
   compiled beside ds_conv.c's dense tiles (whose ds_conv_tile2 they call for their products) rather than in one
   file with them: on a CNN's first build the two compile on both cores at once. */
#include <stdint.h>

#include "ds_conv_common.h"

/* Winograd's tiles per chunk, DS_WINO_TILES and DS_WINO4_TILES: ds_shared.h's (codegen/cshared.py's WINO_TILES,
   which also sizes the scratch its kernels allocate) */

/* The Winograd transforms' vectors: 16 floats with AVX-512; without it the machine's 8 (a 64-byte ds_v16 lives in
   memory there: the transforms' every add a round trip through the stack, which kept Winograd off AVX2 below 32
   channels), 8 channels a block. */
#ifdef __AVX512F__
typedef ds_v16 ds_wv;
#define DS_WL 16
#define ds_wld ds_load16
#define ds_wst ds_store16
/* A Winograd output tile's finish: + bias, then the activation (ds_conv.c's dense tiles finish theirs in registers,
   row by row: DS_FIN_ROWS) */
static inline ds_wv ds_wfin(ds_wv c, ds_wv b, int64_t act) { return ds_act(c + b, act); }
#define DS_WACT(act) (act) /* the activation the output transforms apply per vector: every one */
#else
typedef ds_v8 ds_wv;
#define DS_WL 8
#define ds_wld ds_ld8n
#define ds_wst(p, v, n) ds_st8n(p, v, n)
/* the lighter activations only: a SiLU takes a pass over the tile's stored pixels (ds_silu_rows8), as the dense
   tiles' does (per vector, a call and a chain through its division: YOLOv8-style nets 10% slower) */
static inline ds_wv ds_wfin(ds_wv c, ds_wv b, int64_t act) { return ds_act_light8(c + b, act); }
#define DS_WACT(act) ((act) == DS_ACT_SILU ? DS_ACT_NONE : (act)) /* all but a SiLU */
#endif
/* The bias: n values from p, zeros past them and for no bias. */
static inline ds_wv ds_wbias(const float *p, int64_t n) { return p ? ds_wld(p, n) : (ds_wv){0}; }

/* ---- depthwise ------------------------------------------------------------------------------------------
   One output row (image n, row ho) of a depthwise convolution (one input and one output channel per group),
   every channel, channels last. Vectorised over 16 channels at a time (the last block masked: C = 8 or 40 does
   no work on padding and never reads past the row); the interior columns, whose taps all fall inside the
   input, eight pixels at once in eight accumulators (independent FMA chains), their weight vector loaded once
   per tap for all eight; the border columns one by one with their taps checked. The weights are (KH*KW, C):
   tap-major, channels contiguous. */

/* The depthwise blocks' vectors: 16 floats with AVX-512; without it the machine's 8 (ds_simd.h's ds_v8: a 64-byte
   ds_v16 lives in memory there, every multiply-add a round trip through the stack), 8 channels a block. */
#ifdef __AVX512F__
typedef ds_v16 ds_dwv;
#define DS_DWL 16
#define ds_dw_ld ds_load16
#define ds_dw_ldf ds_ld16
#define ds_dw_stf ds_st16
#define ds_dw_st ds_store16
#define ds_dw_act ds_act_light
#else
typedef ds_v8 ds_dwv;
#define DS_DWL 8
#define ds_dw_ld ds_ld8n
#define ds_dw_ldf ds_ld8
#define ds_dw_stf ds_st8
#define ds_dw_st(p, v, n) ds_st8n(p, v, n)
#define ds_dw_act ds_act_light8
#endif

#define DS_DW_CHUNK 128
#define DS_DW_ACC(i) ds_dwv d##i = b0;
#define DS_DW_FMA(i) d##i += ds_dw_ld(xr + ((wo + (i)) * SW + kw * DW) * C, nl) * wv;
#define DS_DW_STORE(i) ds_dw_st(y + (wo + (i)) * LDY + c0, ds_dw_act(d##i, act), nl);
/* NP interior pixels from wo, every channel block: taps unchecked. */
#define DS_DW_BLOCK(NP)                                                                                     \
    static void ds_dw_block##NP(const int64_t *geo, const float *restrict xn, const float *restrict w,      \
                                const float *restrict bias, float *restrict y, int64_t ih0, int64_t kh0,    \
                                int64_t kh1, int64_t wo, int64_t cb, int64_t ce) {                          \
        GEO_LOCALS;                                                                                         \
        const int64_t act = geo[DS_CONV_ACT];                                                              \
        (void)CG; (void)OH; (void)OW; (void)KH; (void)H; (void)PT; (void)SH;                                \
        for (int64_t c0 = cb; c0 < ce; c0 += DS_DWL) {                                                          \
            const int64_t nl = ce - c0 < DS_DWL ? ce - c0 : DS_DWL;                                                 \
            const ds_dwv b0 = bias ? ds_dw_ld(bias + c0, nl) : (ds_dwv){0};                                   \
            DS_ROWS##NP(DS_DW_ACC)                                                                           \
            for (int64_t kh = kh0; kh < kh1; kh++) {                                                        \
                const float *xr = xn + ((ih0 + kh * DH) * W - PL) * C + c0;                                 \
                for (int64_t kw = 0; kw < KW; kw++) {                                                       \
                    const ds_dwv wv = ds_dw_ld(w + (kh * KW + kw) * C + c0, nl);                              \
                    DS_ROWS##NP(DS_DW_FMA)                                                                   \
                }                                                                                           \
            }                                                                                               \
            DS_ROWS##NP(DS_DW_STORE)                                                                         \
        }                                                                                                   \
    }
DS_DW_BLOCK(8)
DS_DW_BLOCK(4)

/* Eight interior pixels from wo, every channel block, for a stride SWc and KWc columns known when compiled
   (undilated): per kernel row each input column the eight read is loaded once, (8 - 1) * SWc + KWc loads, and
   feeds every accumulator that reads it, where DS_DW_BLOCK loads each tap of each pixel (8 * KWc loads: the
   block was load-bound at one 512-bit load per cycle, 0.33 ns per output value on Zen 4 against onnxruntime's
   0.2). The taps reach each accumulator in the same order (kernel row, then column), so the sums are the
   same bit for bit. */
static inline __attribute__((always_inline)) void ds_dw_slide(
    const int64_t *geo, const float *restrict xn, const float *restrict w, ds_dwv b0, float *restrict y,
    int64_t ih0, int64_t kh0, int64_t kh1, int64_t wo, int64_t c0, int64_t nl, const int SWc, const int KWc) {
    GEO_LOCALS;
    (void)CG; (void)OH; (void)OW; (void)KH; (void)KW; (void)H; (void)PT; (void)SH; (void)SW; (void)DW;
    const int64_t act = geo[DS_CONV_ACT];
    ds_dwv d[8];
    for (int i = 0; i < 8; i++) d[i] = b0;
    for (int64_t kh = kh0; kh < kh1; kh++) {
        const float *xr = xn + ((ih0 + kh * DH) * W + wo * SWc - PL) * C + c0;
        ds_dwv wv[KWc];
        for (int kw = 0; kw < KWc; kw++) wv[kw] = ds_dw_ld(w + (kh * KWc + kw) * C + c0, nl);
#pragma GCC unroll 64
        for (int j = 0; j < 7 * SWc + KWc; j++) {
            const ds_dwv xv = ds_dw_ld(xr + j * C, nl);
#pragma GCC unroll 16
            for (int kw = 0; kw < KWc; kw++)
                if ((j - kw) % SWc == 0 && j - kw >= 0 && (j - kw) / SWc < 8) d[(j - kw) / SWc] += xv * wv[kw];
        }
    }
    for (int i = 0; i < 8; i++) ds_dw_st(y + (wo + i) * LDY + c0, ds_dw_act(d[i], act), nl);
}

/* DS_DW_BLOCK(8) by ds_dw_slide for stride 1, kernels 3, 5 or 7 wide, undilated (on Zen 4: 5x5 17% faster, 3x3
   2%; stride 2 gained nothing, so it keeps DS_DW_BLOCK): the full channel blocks with a constant lane count (no
   masks), then the tail. */
#define DS_DW_SLIDE(S, K)                                                                                    \
    static void ds_dw_slide_##S##_##K(const int64_t *geo, const float *restrict xn, const float *restrict w, \
                                      const float *restrict bias, float *restrict y, int64_t ih0, int64_t kh0,\
                                      int64_t kh1, int64_t wo, int64_t cb, int64_t ce) {                   \
        int64_t c0 = cb;                                                                                    \
        for (; c0 + DS_DWL <= ce; c0 += DS_DWL)                                                             \
            ds_dw_slide(geo, xn, w, bias ? ds_dw_ldf(bias + c0) : (ds_dwv){0}, y, ih0, kh0, kh1, wo, c0, DS_DWL,   \
                        S, K);                                                                              \
        if (c0 < ce)                                                                                        \
            ds_dw_slide(geo, xn, w, bias ? ds_dw_ld(bias + c0, ce - c0) : (ds_dwv){0}, y, ih0, kh0, kh1, wo, \
                        c0, ce - c0, S, K);                                                                 \
    }
DS_DW_SLIDE(1, 3)
DS_DW_SLIDE(1, 5)
DS_DW_SLIDE(1, 7)
#ifndef __AVX512F__
/* Stride 2 too on 8-float vectors: DS_DW_BLOCK's loads there are ds_ld8n's, a lane-count test each (its masks
   are AVX-512's), and it loads 24 (3 wide) or 40 (5 wide) input vectors a kernel row where the slide loads 17 or
   19 (Zen 3, hot: a 3x3 stride-2 depthwise of 96 channels on 112x112 1.33-1.35x onnxruntime's time -> 1.00-1.09x;
   a 5x5 of 144 channels on 56x56, 5 runs each, 193-303 -> 161-234 us) */
DS_DW_SLIDE(2, 3)
DS_DW_SLIDE(2, 5)
#endif

typedef void (*ds_dw_block_fn)(const int64_t *, const float *restrict, const float *restrict, const float *restrict,
                               float *restrict, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);

static ds_dw_block_fn ds_dw_slider(const int64_t *geo) {
    GEO_LOCALS;
    (void)H; (void)W; (void)C; (void)KH; (void)SH; (void)DH; (void)PT; (void)PL; (void)CG; (void)LDY;
    if (DW != 1) return 0;
#ifndef __AVX512F__
    if (SW == 2) return KW == 3 ? ds_dw_slide_2_3 : KW == 5 ? ds_dw_slide_2_5 : 0;
#endif
    if (SW != 1) return 0;
    return KW == 3 ? ds_dw_slide_1_3 : KW == 5 ? ds_dw_slide_1_5 : KW == 7 ? ds_dw_slide_1_7 : 0;
}

/* One pixel o, interior or border: its taps' columns narrowed to those inside the input (kw0..kw1), every
   channel block of cb..ce, four blocks at a time. Why four: one block's sum is a chain of KH * KW dependent
   multiply-adds, latency-bound (a 5x5 tap chain ~100 cycles per 8 channels on Zen 3): MobileNetV3's 5x5
   depthwise convs on 7x7 maps, where 4 of 7 columns are border and 3 take this path too, ran at 10 GF/s against
   onnxruntime's 24. The taps reach each sum in the same order as before (kernel row, then column, from the
   bias), so the sums are the same bit for bit. */
static void ds_dw_pixel(const int64_t *geo, const float *restrict xn, const float *restrict w,
                        const float *restrict bias, float *restrict y, int64_t ih0, int64_t kh0, int64_t kh1,
                        int64_t o, int64_t cb, int64_t ce) {
    GEO_LOCALS;
    (void)CG; (void)OH; (void)OW; (void)KH; (void)H; (void)PT; (void)SH;
    const int64_t act = geo[DS_CONV_ACT];
    const int64_t iw0 = o * SW - PL;
    int64_t kw0 = 0, kw1 = KW;
    while (kw0 < KW && iw0 + kw0 * DW < 0) kw0++;
    while (kw1 > kw0 && iw0 + (kw1 - 1) * DW >= W) kw1--;
    int64_t c0 = cb;
    for (; c0 + 4 * DS_DWL <= ce; c0 += 4 * DS_DWL) {
        ds_dwv a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        if (bias) {
            a0 = ds_dw_ldf(bias + c0); a1 = ds_dw_ldf(bias + c0 + DS_DWL);
            a2 = ds_dw_ldf(bias + c0 + 2 * DS_DWL); a3 = ds_dw_ldf(bias + c0 + 3 * DS_DWL);
        }
        for (int64_t kh = kh0; kh < kh1; kh++) {
            const float *xr = xn + ((ih0 + kh * DH) * W + iw0) * C + c0;
            const float *wr = w + kh * KW * C + c0;
            for (int64_t kw = kw0; kw < kw1; kw++) {
                const float *xp = xr + kw * DW * C, *wp = wr + kw * C;
                a0 += ds_dw_ldf(xp) * ds_dw_ldf(wp);
                a1 += ds_dw_ldf(xp + DS_DWL) * ds_dw_ldf(wp + DS_DWL);
                a2 += ds_dw_ldf(xp + 2 * DS_DWL) * ds_dw_ldf(wp + 2 * DS_DWL);
                a3 += ds_dw_ldf(xp + 3 * DS_DWL) * ds_dw_ldf(wp + 3 * DS_DWL);
            }
        }
        float *yo = y + o * LDY + c0;
        ds_dw_stf(yo, ds_dw_act(a0, act)); ds_dw_stf(yo + DS_DWL, ds_dw_act(a1, act));
        ds_dw_stf(yo + 2 * DS_DWL, ds_dw_act(a2, act)); ds_dw_stf(yo + 3 * DS_DWL, ds_dw_act(a3, act));
    }
    for (; c0 < ce; c0 += DS_DWL) {
        const int64_t nl = ce - c0 < DS_DWL ? ce - c0 : DS_DWL;
        ds_dwv acc = bias ? ds_dw_ld(bias + c0, nl) : (ds_dwv){0};
        for (int64_t kh = kh0; kh < kh1; kh++) {
            const float *xr = xn + ((ih0 + kh * DH) * W + iw0) * C + c0;
            for (int64_t kw = kw0; kw < kw1; kw++)
                acc += ds_dw_ld(xr + kw * DW * C, nl) * ds_dw_ld(w + (kh * KW + kw) * C + c0, nl);
        }
        ds_dw_st(y + o * LDY + c0, ds_dw_act(acc, act), nl);
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
    if (C >= DS_DWL || DS_DWL % C || SW != 1 || LDY != C || KH * KW > DS_DWF_TAPS) return 0;
    const int64_t act = geo[DS_CONV_ACT];
    ds_dwv wt[DS_DWF_TAPS], bt = {0};
    for (int64_t t = 0; t < KH * KW; t++)
        for (int l = 0; l < DS_DWL; l++) wt[t][l] = w[t * C + l % C];
    if (bias)
        for (int l = 0; l < DS_DWL; l++) bt[l] = bias[l % C];
    for (int64_t o = 0; o < lo; o++) ds_dw_pixel(geo, xn, w, bias, y, ih0, kh0, kh1, o, 0, C);
    const int64_t f1 = hi * C;
    int64_t f = lo * C;
    for (; f + 4 * DS_DWL <= f1; f += 4 * DS_DWL) {
        ds_dwv a0 = bt, a1 = bt, a2 = bt, a3 = bt;
        for (int64_t kh = kh0; kh < kh1; kh++) {
            const float *xr = xn + (ih0 + kh * DH) * W * C + f - PL * C;
            for (int64_t kw = 0; kw < KW; kw++) {
                const float *xp = xr + kw * DW * C;
                const ds_dwv wv = wt[kh * KW + kw];
                a0 += ds_dw_ldf(xp) * wv; a1 += ds_dw_ldf(xp + DS_DWL) * wv; a2 += ds_dw_ldf(xp + 2 * DS_DWL) * wv;
                a3 += ds_dw_ldf(xp + 3 * DS_DWL) * wv;
            }
        }
        ds_dw_stf(y + f, ds_dw_act(a0, act)); ds_dw_stf(y + f + DS_DWL, ds_dw_act(a1, act));
        ds_dw_stf(y + f + 2 * DS_DWL, ds_dw_act(a2, act)); ds_dw_stf(y + f + 3 * DS_DWL, ds_dw_act(a3, act));
    }
    for (; f < f1; f += DS_DWL) { /* the last vectors, the very last masked: never past the interior's end */
        const int64_t nl = f1 - f < DS_DWL ? f1 - f : DS_DWL;
        ds_dwv a0 = bt;
        for (int64_t kh = kh0; kh < kh1; kh++) {
            const float *xr = xn + (ih0 + kh * DH) * W * C + f - PL * C;
            for (int64_t kw = 0; kw < KW; kw++) a0 += ds_dw_ld(xr + kw * DW * C, nl) * wt[kh * KW + kw];
        }
        ds_dw_st(y + f, ds_dw_act(a0, act), nl);
    }
    for (int64_t o = hi; o < OW; o++) ds_dw_pixel(geo, xn, w, bias, y, ih0, kh0, kh1, o, 0, C);
    return 1;
}

static void ds_dwconv_row_act(const int64_t *geo, const float *restrict x, const float *restrict w,
                              const float *restrict bias, float *restrict y, int64_t n, int64_t ho);

/* SiLU over a finished output row (OW pixels of C channels, LDY floats apart), out of the blocks' loops (see
   ds_act in ds_conv_common.h). */
static __attribute__((noinline)) void ds_silu_pixels(float *restrict y, int64_t pixels, int64_t c, int64_t ldy) {
#ifndef __AVX512F__ /* the dense tiles' pass, on the machine's vectors (a ds_v16 lives in memory without AVX-512) */
    ds_silu_rows8(y, ldy, pixels, c);
    return;
#endif
    for (int64_t o = 0; o < pixels; o++)
        for (int64_t c0 = 0; c0 < c; c0 += 16) {
            float *p = y + o * ldy + c0;
            const ds_cmask m = ds_cmask16(c - c0);
            const ds_v16 v = ds_mld16(p, m);
            ds_mst16(p, v * ds_sigmoid16(v), m);
        }
}

void ds_dwconv_row(const int64_t *geo, const float *restrict x, const float *restrict w,
                   const float *restrict bias, float *restrict y, int64_t n, int64_t ho) {
    if (geo[DS_CONV_ACT] != DS_ACT_SILU) {
        ds_dwconv_row_act(geo, x, w, bias, y, n, ho);
        return;
    }
    int64_t plain[DS_CONV_GEO];
    ds_geo_without_act(geo, plain);
    ds_dwconv_row_act(plain, x, w, bias, y, n, ho);
    ds_silu_pixels(y, geo[DS_CONV_OW], geo[DS_CONV_C], geo[DS_CONV_LDY]);
}

/* ds_dwconv_row for the activations applied in the blocks' stores (none, Relu, HardSwish). */
static void ds_dwconv_row_act(const int64_t *geo, const float *restrict x, const float *restrict w,
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
    const ds_dw_block_fn slide = ds_dw_slider(geo);
    /* chunks of DS_DW_CHUNK channels: a chunk's weights (KH * KW * 128 floats) stay in L1 over the row's pixel
       blocks, and within a block the chunk's input pixels are read contiguously */
    for (int64_t cb = 0; cb < C; cb += DS_DW_CHUNK) {
        const int64_t ce = C - cb < DS_DW_CHUNK ? C : cb + DS_DW_CHUNK;
        for (int64_t o = 0; o < lo; o++) ds_dw_pixel(geo, xn, w, bias, y, ih0, kh0, kh1, o, cb, ce);
        int64_t wo = lo;
        const ds_dw_block_fn block8 = slide ? slide : ds_dw_block8;
        for (; wo + 8 <= hi; wo += 8) block8(geo, xn, w, bias, y, ih0, kh0, kh1, wo, cb, ce);
        for (; wo + 4 <= hi; wo += 4) ds_dw_block4(geo, xn, w, bias, y, ih0, kh0, kh1, wo, cb, ce);
        for (; wo < hi; wo++) ds_dw_pixel(geo, xn, w, bias, y, ih0, kh0, kh1, wo, cb, ce);
        for (int64_t o = hi; o < OW; o++) ds_dw_pixel(geo, xn, w, bias, y, ih0, kh0, kh1, o, cb, ce);
    }
}

/* A 1x1 conv's (or a Winograd position's) product in another precision: ds_conv_tile2's contract plus the memo's
   epoch (csrc/ds_gemm_bf16.c's ds_conv_tile2_bf16, whose address the generated kernel passes: this library does
   not link against that one). */
typedef void (*ds_wino_tile_fn)(const int64_t *, const float *restrict, const void *, float *restrict,
                                const float *restrict, int64_t, int64_t, int64_t, int64_t, const float *restrict,
                                const float *restrict, int64_t);

/* ---- a 1x1 conv into a depthwise one ------------------------------------------------------------------------
   Output rows ho0..ho1 of image n of the depthwise conv (geometry gd) over the 1x1 conv's (gp) result, of which
   only the rows these need are computed, into `scratch` (the caller's: ds_conv.h says how large):
   the 1x1's tiles over those rows' pixels (finished in registers: bias, activation), then the depthwise rows
   reading them there, in cache, instead of the whole expanded map going out to memory and back. Scratch row r
   holds input row r0 + r; the depthwise kernel addresses an image's rows from its start, which therefore lies
   r0 rows before the scratch (never read: every row it reads is one of r0..r1). */
static void ds_pwdw_run(const int64_t *gp, const int64_t *gd, const float *restrict x, const void *bp,
                        const float *restrict bias_p, const float *restrict wd, const float *restrict bias_d,
                        float *restrict y, const float *restrict zeros, float *restrict scratch, int64_t n,
                        int64_t ho0, int64_t ho1, ds_wino_tile_fn tile, int64_t ep) {
    const int64_t H = gd[DS_CONV_H], W = gd[DS_CONV_W], C = gd[DS_CONV_C], OH = gd[DS_CONV_OH];
    const int64_t OW = gd[DS_CONV_OW], LDY = gd[DS_CONV_LDY];
    const int64_t first = ho0 * gd[DS_CONV_SH] - gd[DS_CONV_PT];
    const int64_t last = (ho1 - 1) * gd[DS_CONV_SH] - gd[DS_CONV_PT] + (gd[DS_CONV_KH] - 1) * gd[DS_CONV_DH];
    const int64_t r0 = first > 0 ? first : 0, r1 = last + 1 < H ? last + 1 : H;
    if (r0 < r1) {
        const int64_t p0 = (n * H + r0) * W, p1 = (n * H + r1) * W, pairs = (C + 63) / 64;
        float *ys = (float *)((uintptr_t)scratch - (uintptr_t)(p0 * C) * sizeof(float));
        for (int64_t q = 0; q < pairs; q++) {
            if (tile)
                tile(gp, x, bp, ys, zeros, p0, p1, 0, 2 * q, bias_p, 0, ep);
            else
                ds_conv_tile2(gp, x, (const float *)bp, ys, zeros, p0, p1, 0, 2 * q, bias_p, 0);
        }
    }
    const float *xs = (const float *)((uintptr_t)scratch - (uintptr_t)((n * H + r0) * W * C) * sizeof(float));
    for (int64_t ho = ho0; ho < ho1; ho++) ds_dwconv_row(gd, xs, wd, bias_d, y + (n * OH + ho) * OW * LDY, n, ho);
}

void ds_pwdw_rows(const int64_t *gp, const int64_t *gd, const float *restrict x, const float *restrict bp,
                  const float *restrict bias_p, const float *restrict wd, const float *restrict bias_d,
                  float *restrict y, const float *restrict zeros, float *restrict scratch, int64_t n, int64_t ho0,
                  int64_t ho1) {
    ds_pwdw_run(gp, gd, x, bp, bias_p, wd, bias_d, y, zeros, scratch, n, ho0, ho1, 0, 0);
}

/* ds_pwdw_rows with the 1x1's product by `tile` (an address: ds_conv_tile2_bf16_addr()) on weights in that tile's
   packing (codegen/bf16.py's conv_bf16 / conv_bf16e); `ep`: the kernel call's ds_bf16_epoch(). A thread's rounded
   rows are reused under it across the 1x1's panels of one chunk; the rows are the call's input x, constant for the
   whole call, so one epoch serves every chunk. The depthwise rows stay float32. */
void ds_pwdw_rows_t(const int64_t *gp, const int64_t *gd, const float *restrict x, const void *bp,
                    const float *restrict bias_p, const float *restrict wd, const float *restrict bias_d,
                    float *restrict y, const float *restrict zeros, float *restrict scratch, int64_t n, int64_t ho0,
                    int64_t ho1, int64_t tile, int64_t ep) {
    ds_pwdw_run(gp, gd, x, bp, bias_p, wd, bias_d, y, zeros, scratch, n, ho0, ho1, (ds_wino_tile_fn)(intptr_t)tile,
                ep);
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
    for (int64_t c = 0; c < C; c += DS_WL) {
        const int64_t nl = C - c < DS_WL ? C - c : DS_WL; /* a partial tail block: C need not be a multiple of it */
        ds_wv d[4][4], s[4][4];
        for (int64_t a = 0; a < 4; a++)
            for (int64_t b = 0; b < 4; b++) d[a][b] = row[a * 4 + b] ? ds_wld(row[a * 4 + b] + c, nl) : (ds_wv){0};
        for (int64_t b = 0; b < 4; b++) { /* B^T d: over rows */
            s[0][b] = d[0][b] - d[2][b]; s[1][b] = d[1][b] + d[2][b];
            s[2][b] = d[2][b] - d[1][b]; s[3][b] = d[1][b] - d[3][b];
        }
        for (int64_t a = 0; a < 4; a++) { /* (B^T d) B: over columns */
            float *o = vt + a * 4 * XI + c;
            ds_wst(o, s[a][0] - s[a][2], nl);
            ds_wst(o + XI, s[a][1] + s[a][2], nl);
            ds_wst(o + 2 * XI, s[a][2] - s[a][1], nl);
            ds_wst(o + 3 * XI, s[a][1] - s[a][3], nl);
        }
    }
}

/* Tile i of the chunk: Y = A^T M A from M[xi][i][oc], its pixels that fall inside the output stored. */
static void ds_wino_output(const int64_t *geo, const float *restrict m, float *restrict y, int64_t t0, int64_t i,
                           int64_t nt, const float *restrict bias) {
    const int64_t OH = geo[DS_CONV_OH], OW = geo[DS_CONV_OW], OC = geo[DS_CONV_OC], LDY = geo[DS_CONV_LDY];
    const int64_t act = DS_WACT(geo[DS_CONV_ACT]);
    const int64_t XI = nt * OC;
    int64_t n, oh, ow;
    ds_wino_tile(geo, t0 + i, 2, &n, &oh, &ow);
    const int two_rows = oh + 1 < OH, two_cols = ow + 1 < OW;
    float *y00 = y + ((n * OH + oh) * OW + ow) * LDY;
    const float *mt = m + i * OC;
    for (int64_t c = 0; c < OC; c += DS_WL) {
        const int64_t nl = OC - c < DS_WL ? OC - c : DS_WL;
        ds_wv q[4][4], s[2][4];
        for (int64_t a = 0; a < 4; a++)
            for (int64_t b = 0; b < 4; b++) q[a][b] = ds_wld(mt + (a * 4 + b) * XI + c, nl);
        for (int64_t b = 0; b < 4; b++) { /* A^T M: over rows */
            s[0][b] = q[0][b] + q[1][b] + q[2][b];
            s[1][b] = q[1][b] - q[2][b] - q[3][b];
        }
        const ds_wv f = ds_wbias(bias ? bias + c : 0, nl);
        for (int64_t a = 0; a < 2; a++) {
            if (a == 1 && !two_rows) break;
            float *o = y00 + a * OW * LDY + c;
            ds_wv o0 = s[a][0] + s[a][1] + s[a][2], o1 = s[a][1] - s[a][2] - s[a][3];
            if (bias || act) { o0 = ds_wfin(o0, f, act); o1 = ds_wfin(o1, f, act); }
            ds_wst(o, o0, nl);
            if (two_cols) ds_wst(o + LDY, o1, nl);
        }
    }
#ifndef __AVX512F__
    if (act != geo[DS_CONV_ACT]) /* the SiLU left out above */
        for (int64_t a = 0; a < 1 + two_rows; a++) ds_silu_rows8(y00 + a * OW * LDY, LDY, 1 + two_cols, OC);
#endif
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
    for (int64_t c = 0; c < C; c += DS_WL) {
        const int64_t nl = C - c < DS_WL ? C - c : DS_WL;
        ds_wv s[6][6];
        for (int64_t b = 0; b < 6; b++) { /* B^T d: over rows, one column of the patch at a time */
            ds_wv d[6];
            for (int64_t a = 0; a < 6; a++) d[a] = row[a * 6 + b] ? ds_wld(row[a * 6 + b] + c, nl) : (ds_wv){0};
            s[0][b] = 4 * d[0] - 5 * d[2] + d[4];
            s[1][b] = d[3] + d[4] - 4 * (d[1] + d[2]);
            s[2][b] = d[4] - d[3] + 4 * (d[1] - d[2]);
            s[3][b] = d[4] - d[2] + 2 * (d[3] - d[1]);
            s[4][b] = d[4] - d[2] - 2 * (d[3] - d[1]);
            s[5][b] = 4 * d[1] - 5 * d[3] + d[5];
        }
        for (int64_t a = 0; a < 6; a++) { /* (B^T d) B: over columns */
            const ds_wv *e = s[a];
            float *o = vt + a * 6 * XI + c;
            ds_wst(o, 4 * e[0] - 5 * e[2] + e[4], nl);
            ds_wst(o + XI, e[3] + e[4] - 4 * (e[1] + e[2]), nl);
            ds_wst(o + 2 * XI, e[4] - e[3] + 4 * (e[1] - e[2]), nl);
            ds_wst(o + 3 * XI, e[4] - e[2] + 2 * (e[3] - e[1]), nl);
            ds_wst(o + 4 * XI, e[4] - e[2] - 2 * (e[3] - e[1]), nl);
            ds_wst(o + 5 * XI, 4 * e[1] - 5 * e[3] + e[5], nl);
        }
    }
}

/* Tile i of the chunk: Y = A^T M A (4x4) from M[xi][i][oc], its pixels inside the output stored. */
static void ds_wino4_output(const int64_t *geo, const float *restrict m, float *restrict y, int64_t t0, int64_t i,
                            int64_t nt, const float *restrict bias) {
    const int64_t OH = geo[DS_CONV_OH], OW = geo[DS_CONV_OW], OC = geo[DS_CONV_OC], LDY = geo[DS_CONV_LDY];
    const int64_t act = DS_WACT(geo[DS_CONV_ACT]);
    const int64_t XI = nt * OC;
    int64_t n, oh, ow;
    ds_wino_tile(geo, t0 + i, 4, &n, &oh, &ow);
    const int64_t nr = OH - oh < 4 ? OH - oh : 4, nc = OW - ow < 4 ? OW - ow : 4;
    float *y00 = y + ((n * OH + oh) * OW + ow) * LDY;
    const float *mt = m + i * OC;
    for (int64_t c = 0; c < OC; c += DS_WL) {
        const int64_t nl = OC - c < DS_WL ? OC - c : DS_WL;
        ds_wv s[4][6];
        for (int64_t b = 0; b < 6; b++) { /* A^T M: over rows */
            ds_wv q[6];
            for (int64_t a = 0; a < 6; a++) q[a] = ds_wld(mt + (a * 6 + b) * XI + c, nl);
            const ds_wv p12 = q[1] + q[2], m12 = q[1] - q[2], p34 = q[3] + q[4], m34 = q[3] - q[4];
            s[0][b] = q[0] + p12 + p34;
            s[1][b] = m12 + 2 * m34;
            s[2][b] = p12 + 4 * p34;
            s[3][b] = m12 + 8 * m34 + q[5];
        }
        const ds_wv f = ds_wbias(bias ? bias + c : 0, nl);
        for (int64_t a = 0; a < nr; a++) {
            const ds_wv *e = s[a];
            const ds_wv p12 = e[1] + e[2], m12 = e[1] - e[2], p34 = e[3] + e[4], m34 = e[3] - e[4];
            ds_wv out[4] = {e[0] + p12 + p34, m12 + 2 * m34, p12 + 4 * p34, m12 + 8 * m34 + e[5]};
            if (bias || act)
                for (int64_t b = 0; b < 4; b++) out[b] = ds_wfin(out[b], f, act);
            float *o = y00 + a * OW * LDY + c;
            for (int64_t b = 0; b < nc; b++) ds_wst(o + b * LDY, out[b], nl);
        }
    }
#ifndef __AVX512F__
    if (act != geo[DS_CONV_ACT]) /* the SiLU left out above */
        for (int64_t a = 0; a < nr; a++) ds_silu_rows8(y00 + a * OW * LDY, LDY, nc, OC);
#endif
}

typedef void (*ds_wino_in_fn)(const int64_t *, const float *restrict, float *restrict, int64_t, int64_t, int64_t);
typedef void (*ds_wino_out_fn)(const int64_t *, const float *restrict, float *restrict, int64_t, int64_t, int64_t,
                               const float *restrict);

/* The chunk driver of both: `np` positions (16 or 36), chunks of `chunk` tiles. `tile` NULL: float32 products on
   packed panels; else that tile function on weights packed as bf16 pairs (ceil(C / 2) rows of 64 halves a panel),
   with `ep` * 2^20 + the chunk's number as the epoch under which a thread's rounded inputs are reused. */
static void ds_wino_run(const int64_t *geo, const float *restrict x, const float *restrict up, float *restrict y,
                        const float *restrict zeros, int64_t t0, int64_t t1, int64_t par, float *restrict scratch,
                        int64_t np, int64_t chunk, ds_wino_in_fn in, ds_wino_out_fn out, const float *restrict bias,
                        ds_wino_tile_fn tile, int64_t ep, int64_t half) {
    const int64_t C = geo[DS_CONV_C], OC = geo[DS_CONV_OC], pairs = (OC + 63) / 64;
    /* one position's packed weights, in floats */
    const int64_t per_xi = (OC + 31) / 32 * 32 * (half ? (C + 1) / 2 : C);
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
                if (tile)
                    tile(g1, v + xi * nt * C, up + xi * per_xi, m + xi * nt * OC, zeros, 0, nt, 0, 2 * pq, 0, 0,
                         (ep << 20) + (u0 - t0) / chunk + 1);
                else
                    ds_conv_tile2(g1, v + xi * nt * C, up + xi * per_xi, m + xi * nt * OC, zeros, 0, nt, 0, 2 * pq, 0,
                                  0);
            }
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < nt; i++) out(geo, m, y, u0, i, nt, bias);
    }
}

void ds_wino_f2(const int64_t *geo, const float *restrict x, const float *restrict up, float *restrict y,
                const float *restrict zeros, int64_t t0, int64_t t1, int64_t par, float *restrict scratch,
                const float *restrict bias) {
    ds_wino_run(geo, x, up, y, zeros, t0, t1, par, scratch, 16, DS_WINO_TILES, ds_wino_input, ds_wino_output, bias,
                0, 0, 0);
}

void ds_wino_f4(const int64_t *geo, const float *restrict x, const float *restrict up, float *restrict y,
                const float *restrict zeros, int64_t t0, int64_t t1, int64_t par, float *restrict scratch,
                const float *restrict bias) {
    ds_wino_run(geo, x, up, y, zeros, t0, t1, par, scratch, 36, DS_WINO4_TILES, ds_wino4_input, ds_wino4_output, bias,
                0, 0, 0);
}

/* ds_wino_f2 / _f4 with each position's product computed by `tile` (an address: ds_conv_tile2_bf16_addr()) on
   weights packed as bf16 pairs (`half`: codegen/bf16.py's winograd_bf16 layouts) or as float32 panels of rounded
   values (the emulated tile); `ep`: the kernel call's ds_bf16_epoch(). */
void ds_wino_f2_t(const int64_t *geo, const float *restrict x, const void *up, float *restrict y,
                  const float *restrict zeros, int64_t t0, int64_t t1, int64_t par, float *restrict scratch,
                  const float *restrict bias, int64_t tile, int64_t ep, int64_t half) {
    ds_wino_run(geo, x, up, y, zeros, t0, t1, par, scratch, 16, DS_WINO_TILES, ds_wino_input, ds_wino_output, bias,
                (ds_wino_tile_fn)(intptr_t)tile, ep, half);
}

void ds_wino_f4_t(const int64_t *geo, const float *restrict x, const void *up, float *restrict y,
                  const float *restrict zeros, int64_t t0, int64_t t1, int64_t par, float *restrict scratch,
                  const float *restrict bias, int64_t tile, int64_t ep, int64_t half) {
    ds_wino_run(geo, x, up, y, zeros, t0, t1, par, scratch, 36, DS_WINO4_TILES, ds_wino4_input, ds_wino4_output, bias,
                (ds_wino_tile_fn)(intptr_t)tile, ep, half);
}
