/* What the convolution libraries share (ds_conv.c: the dense tiles; ds_conv_dw_wino.c: depthwise and Winograd):
   the activations their tiles apply in registers, and the geometry read out of geo[] (ds_conv.h's order).
   Static inline only: each library compiles its own copy. */
#ifndef DS_CONV_COMMON_H
#define DS_CONV_COMMON_H
#include <stdint.h>

#include "ds_bf16_round.h"
#include "ds_conv.h"
#include "ds_simd.h"
#include "ds_vmath.h"

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
/* DS_ACT_RELU: max(0, c); DS_ACT_HARDSWISH: c * min(1, max(0, c / 6 + 1 / 2)) (ONNX's, alpha 1/6, beta 1/2);
   DS_ACT_SILU: c * sigmoid(c) (Mul(x, Sigmoid(x)): EfficientNet, YOLO, MobileViT); DS_ACT_RELU6: min(6, max(0, c))
   (Clip(c, 0, 6): MobileNetV2). ds_act_light: the ones cheap enough to apply in a store inside loops (Relu,
   HardSwish, Relu6; a SiLU passes through). */
static inline ds_v16 ds_act_light(ds_v16 c, int64_t act) {
    if (act == DS_ACT_RELU) return ds_max16(0.0f, c);
    if (act == DS_ACT_RELU6) return ds_min16(6.0f, ds_max16(0.0f, c));
    if (act == DS_ACT_HARDSWISH) return c * ds_min16(1.0f, ds_max16(0.0f, c * (1.0f / 6.0f) + 0.5f));
    return c;
}

/* Every DS_ACT_*, for a tile's finish after its loops: SiLU's polynomial inlined inside loops (the depthwise
   blocks' stores) had its constants hoisted into registers across their multiply-adds, which then spilled (a 3x3
   depthwise row 385 -> 500 us with no SiLU applied): those take ds_act_light and SiLU as a pass after the row. */
static inline ds_v16 ds_act(ds_v16 c, int64_t act) {
    return act == DS_ACT_SILU ? c * ds_sigmoid16(c) : ds_act_light(c, act);
}

#ifndef __AVX512F__
#ifdef __AVX__
#include <immintrin.h>
#endif
/* ds_act on the machine's 8-float vectors (ds_simd.h's ds_v8), for the AVX2 micro-tiles' finish: the same
   operations lane by lane, NaN kept as MAXPS / MINPS with c second keep it. */
#ifdef __AVX__
static inline ds_v8 ds_max8(float lo, ds_v8 c) { return (ds_v8)_mm256_max_ps(_mm256_set1_ps(lo), (__m256)c); }
static inline ds_v8 ds_min8(float hi, ds_v8 c) { return (ds_v8)_mm256_min_ps(_mm256_set1_ps(hi), (__m256)c); }
#else
static inline ds_v8 ds_max8(float lo, ds_v8 c) {
    for (int j = 0; j < 8; j++) c[j] = c[j] < lo ? lo : c[j];
    return c;
}
static inline ds_v8 ds_min8(float hi, ds_v8 c) {
    for (int j = 0; j < 8; j++) c[j] = c[j] > hi ? hi : c[j];
    return c;
}
#endif
static inline ds_v8 ds_act_light8(ds_v8 c, int64_t act) { /* ds_act_light's: Relu, HardSwish, Relu6; SiLU passes */
    if (act == DS_ACT_RELU) return ds_max8(0.0f, c);
    if (act == DS_ACT_RELU6) return ds_min8(6.0f, ds_max8(0.0f, c));
    if (act == DS_ACT_HARDSWISH) return c * ds_min8(1.0f, ds_max8(0.0f, c * (1.0f / 6.0f) + 0.5f));
    return c;
}
/* A SiLU over a block's finished rows where its tiles just stored them (in L1): `rows` rows `ldy` apart, their
   first n columns (ds_conv_tile, the depthwise rows and the Winograd outputs, without AVX-512). Why a pass, not
   the activation on each accumulator before its store: SiLU's polynomial is too long to inline beside 12 live
   accumulators, and called per 8-float vector (out of line: a call clobbers every ymm register) each call was one
   dependent chain through its division, with the other rows' accumulators spilled around it: a 16 -> 64 1x1 conv
   with SiLU on 80x80 spent 36% of its time there against 21% in the multiply-adds. Here the vectors are
   independent and the constants stay in registers, set once per block (a pass per 6-row tile made that conv 5%
   slower). The same values: v is stored as the finish computed it, then v * sigmoid(v). */
__attribute__((noinline, unused)) static void ds_silu_rows8(float *y, int64_t ldy, int64_t rows, int64_t n) {
    if (n == 32) /* a whole panel: four vectors a row, no remainder loop */
        for (int64_t r = 0; r < rows; r++) {
            float *o = y + r * ldy;
            #pragma omp simd
            for (int64_t j = 0; j < 32; j++) o[j] = o[j] * ds_sigmoidf(o[j]);
        }
    else
        for (int64_t r = 0; r < rows; r++) {
            float *o = y + r * ldy;
            #pragma omp simd
            for (int64_t j = 0; j < n; j++) o[j] = o[j] * ds_sigmoidf(o[j]);
        }
}

#endif

/* geo with its activation off (a copy in `plain`): the tiles that leave a SiLU to a pass after them run on it. */
static inline void ds_geo_without_act(const int64_t *geo, int64_t *plain) {
    for (int i = 0; i < DS_CONV_GEO; i++) plain[i] = geo[i];
    plain[DS_CONV_ACT] = DS_ACT_NONE;
}

/* What a convolution tile applies to its rows of one panel as they are finished (ds_gemm_bf16.c's ds_conv_finish
   and ds_amx_rows' stores, ds_conv_amx.c's): a bias by column and a residual (rows `ldr` apart), both offset to
   the panel's first column, then an activation (DS_ACT_*). Under bf16 storage (geo[DS_CONV_RBF] / [DS_CONV_YBF]:
   a value only bf16 convolutions read, codegen/lower/conv_storage.py) the residual's rows are bf16 (`rbf`) and the
   finished rows are stored as bf16 (`ybf`, rounded as the reading conv would round them: VCVTNE2PS2BF16, or
   ds_to_bf16 where the compiler does not target it); `dst` then points at bf16 values. */
typedef struct {
    const float *bias;
    const void *res; /* float32 rows, or bf16 rows (rbf) */
    int64_t ldr, act;
    int rbf, ybf;
} ds_finish;

/* The finish of a tile's rows under geo (its activation and bf16 storage flags): the bias from column col0, the
   residual from `at` values into res (bf16 values under geo[DS_CONV_RBF]), rows geo's OC apart. */
static inline ds_finish ds_finish_at(const int64_t *geo, const float *bias, const float *res, int64_t col0,
                                     int64_t at) {
    const int rbf = res && geo[DS_CONV_RBF];
    ds_finish f = {bias ? bias + col0 : 0,
                   !res ? 0 : rbf ? (const void *)((const uint16_t *)res + at) : (const void *)(res + at),
                   geo[DS_CONV_OC], geo[DS_CONV_ACT], rbf, geo[DS_CONV_YBF] != 0};
    return f;
}

/* How many lanes a column mask holds (ds_cmask16's masks are a run of the first lanes). */
static inline int64_t ds_cmask_lanes(ds_cmask m) {
#ifdef __AVX512F__
    return __builtin_popcount((unsigned)m);
#else
    return m < 0 ? 0 : m > 16 ? 16 : m;
#endif
}

/* 16 bf16 values at p (the first of `m`'s lanes, zeros in the others) as float32: exact. */
static inline ds_v16 ds_bf16_mld16(const uint16_t *p, ds_cmask m) {
#if DS_BF16_ROUND && defined(__AVX512VL__)
    return (ds_v16)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
#else
    float t[16];
    const int64_t n = ds_cmask_lanes(m);
    for (int64_t j = 0; j < 16; j++) t[j] = j < n ? ds_from_bf16(p[j]) : 0.0f;
    return ds_ld16(t);
#endif
}

/* v's lanes of `m` rounded to bf16 at p (nothing else written). */
static inline void ds_bf16_mst16(uint16_t *p, ds_v16 v, ds_cmask m) {
#if DS_BF16_ROUND && defined(__AVX512VL__)
    _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh((__m512)v));
#else
    float t[16];
    const int64_t n = ds_cmask_lanes(m);
    ds_st16(t, v);
    for (int64_t j = 0; j < n; j++) p[j] = ds_to_bf16(t[j]);
#endif
}

/* The residual's 16 values at row r, column j (float32 or bf16 rows). */
static inline ds_v16 ds_res16(const ds_finish *fin, int64_t r, int64_t j, ds_cmask m) {
    if (fin->rbf) return ds_bf16_mld16((const uint16_t *)fin->res + r * fin->ldr + j, m);
    return ds_mld16((const float *)fin->res + r * fin->ldr + j, m);
}

/* 16 finished values to the row at dst (float32, or bf16 where ybf), column j. */
static inline void ds_fin_st16(void *dst, int64_t j, ds_v16 v, ds_cmask m, const ds_finish *fin) {
    if (fin->ybf) ds_bf16_mst16((uint16_t *)dst + j, v, m);
    else ds_mst16((float *)dst + j, v, m);
}

/* The address of row r of a finished tile whose row 0 is at c, rows ldc values apart (bf16 values where ybf). */
static inline void *ds_fin_row(float *c, int64_t r, int64_t ldc, const ds_finish *fin) {
    return fin && fin->ybf ? (void *)((uint16_t *)c + r * ldc) : (void *)(c + r * ldc);
}

/* Row r of a tile: src's ncols values finished into dst (which may be src unless ybf), 16 columns at a time
   (ds_act, as ds_conv.c's tiles finish theirs; a scalar loop here was 12% of resnet18's bf16 convolutions). */
static inline void ds_finish_row(void *dst, const float *src, int64_t ncols, const ds_finish *fin, int64_t r) {
    for (int64_t j = 0; j < ncols; j += 16) {
        const ds_cmask m = ds_cmask16(ncols - j);
        ds_v16 v = ds_mld16(src + j, m);
        if (fin->bias) v += ds_mld16(fin->bias + j, m);
        if (fin->res) v += ds_res16(fin, r, j, m);
        ds_fin_st16(dst, j, ds_act(v, fin->act), m, fin);
    }
}

/* Whether the fast finish below reads bf16 residuals and stores bf16 rows in vectors (else such rows take
   ds_finish_row). */
#if DS_BF16_ROUND && defined(__AVX512VL__)
#define DS_FIN_BF16_FAST 1
#else
#define DS_FIN_BF16_FAST 0
#endif

/* ds_finish_row for the rows of many tiles alike, its constants hoisted: a whole panel (32 columns) with a bias and
   a Relu or nothing after it keeps its bias in two registers and takes no masks. Why: on AMX a pass's products are
   few where K is (a 1x1 conv on 64 channels: 8 tile products, ~130 cycles, for 32 rows), so its rows' finish is
   what costs (ds_finish_row, row by row, was 12% of ResNet-50's bf16 time). */
typedef struct {
    ds_v16 b0, b1;
    float lo; /* max(lo, x): 0 for a Relu, -inf for nothing (a NaN passes either way) */
    int light;
} ds_fast_finish;

static inline ds_fast_finish ds_fast_finish_of(const ds_finish *fin, int64_t ncols) {
    ds_fast_finish f;
    f.light = fin && ncols == 32 && (fin->act == DS_ACT_NONE || fin->act == DS_ACT_RELU)
              && (DS_FIN_BF16_FAST || (!fin->rbf && !fin->ybf));
    f.b0 = f.light && fin->bias ? ds_ld16(fin->bias) : (ds_v16){0};
    f.b1 = f.light && fin->bias ? ds_ld16(fin->bias + 16) : (ds_v16){0};
    f.lo = f.light && fin->act == DS_ACT_RELU ? 0.0f : -__builtin_inff();
    return f;
}

static inline void ds_finish_row_fast(void *dst, const float *src, int64_t ncols, const ds_finish *fin,
                                      const ds_fast_finish *f, int64_t r) {
    if (!f->light) {
        ds_finish_row(dst, src, ncols, fin, r);
        return;
    }
    ds_v16 x0 = ds_ld16(src) + f->b0, x1 = ds_ld16(src + 16) + f->b1;
    if (fin->res && fin->rbf) { /* (not ds_res16: its branch and masks per load cost light_resnet50's bf16 call
                                    ~5%, bench/step_profile.py, 1 thread) */
        const uint16_t *res = (const uint16_t *)fin->res + r * fin->ldr;
        x0 += ds_bf16_mld16(res, ds_cmask16(16));
        x1 += ds_bf16_mld16(res + 16, ds_cmask16(16));
    } else if (fin->res) {
        const float *res = (const float *)fin->res + r * fin->ldr;
        x0 += ds_ld16(res);
        x1 += ds_ld16(res + 16);
    }
    x0 = ds_max16(f->lo, x0);
    x1 = ds_max16(f->lo, x1);
#if DS_FIN_BF16_FAST
    if (fin->ybf) { /* 32 values rounded in one instruction, one 64-byte store */
        _mm512_storeu_si512(dst, (__m512i)_mm512_cvtne2ps_pbh((__m512)x1, (__m512)x0));
        return;
    }
#endif
    ds_st16((float *)dst, x0);
    ds_st16((float *)dst + 16, x1);
}

/* The output position (image, row, column) of a micro-tile's first pixel, found with two divisions, then
   stepped pixel by pixel: a division per row would cost as much as the multiply-adds of a narrow stem conv. */
#define DS_POS_START                                                                                        \
    int64_t pn_ = p / (OH * OW), poh_ = p % (OH * OW) / OW, pow_ = p % OW;
#define DS_POS_NEXT { if (++pow_ == OW) { pow_ = 0; if (++poh_ == OH) { poh_ = 0; pn_++; } } }
/* the geometry's scalars, as locals named like ds_conv.h's fields */
#define GEO_LOCALS                                                                                          \
    const int64_t H = geo[DS_CONV_H], W = geo[DS_CONV_W], C = geo[DS_CONV_C], OH = geo[DS_CONV_OH];         \
    const int64_t OW = geo[DS_CONV_OW], KH = geo[DS_CONV_KH], KW = geo[DS_CONV_KW];                          \
    const int64_t SH = geo[DS_CONV_SH], SW = geo[DS_CONV_SW], DH = geo[DS_CONV_DH], DW = geo[DS_CONV_DW];    \
    const int64_t PT = geo[DS_CONV_PT], PL = geo[DS_CONV_PL], CG = geo[DS_CONV_CG];                          \
    const int64_t LDY = geo[DS_CONV_LDY];                                                                   \
    (void)OH; (void)OW
#endif
