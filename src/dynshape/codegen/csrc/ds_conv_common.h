/* What the convolution libraries share (ds_conv.c: the dense tiles; ds_conv_dw_wino.c: depthwise and Winograd):
   the activations their tiles apply in registers, and the geometry read out of geo[] (ds_conv.h's order).
   Static inline only: each library compiles its own copy. */
#ifndef DS_CONV_COMMON_H
#define DS_CONV_COMMON_H
#include <stdint.h>

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
   DS_ACT_SILU: c * sigmoid(c) (Mul(x, Sigmoid(x)): EfficientNet, YOLO, MobileViT).
   ds_act_light: the ones cheap enough to apply in a store inside loops (Relu, HardSwish; a SiLU passes through). */
static inline ds_v16 ds_act_light(ds_v16 c, int64_t act) {
    if (act == DS_ACT_RELU) return ds_max16(0.0f, c);
    if (act == DS_ACT_HARDSWISH) return c * ds_min16(1.0f, ds_max16(0.0f, c * (1.0f / 6.0f) + 0.5f));
    return c;
}

/* Every DS_ACT_*, for a tile's finish after its loops: SiLU's polynomial inlined inside loops (the depthwise
   blocks' stores) had its constants hoisted into registers across their multiply-adds, which then spilled (a 3x3
   depthwise row 385 -> 500 us with no SiLU applied): those take ds_act_light and SiLU as a pass after the row. */
static inline ds_v16 ds_act(ds_v16 c, int64_t act) {
    return act == DS_ACT_SILU ? c * ds_sigmoid16(c) : ds_act_light(c, act);
}

/* What a convolution tile applies to its rows of one panel as they are finished (ds_gemm_bf16.c's ds_conv_finish
   and ds_amx_rows' stores, ds_conv_amx.c's): a bias by column and a residual (rows `ldr` apart), both offset to
   the panel's first column, then an activation (DS_ACT_*). */
typedef struct {
    const float *bias, *res;
    int64_t ldr, act;
} ds_finish;

/* Row r of a tile: src's ncols values finished into dst (which may be src), 16 columns at a time (ds_act, as
   ds_conv.c's tiles finish theirs; a scalar loop here was 12% of resnet18's bf16 convolutions). */
static inline void ds_finish_row(float *dst, const float *src, int64_t ncols, const ds_finish *fin, int64_t r) {
    for (int64_t j = 0; j < ncols; j += 16) {
        const ds_cmask m = ds_cmask16(ncols - j);
        ds_v16 v = ds_mld16(src + j, m);
        if (fin->bias) v += ds_mld16(fin->bias + j, m);
        if (fin->res) v += ds_mld16(fin->res + r * fin->ldr + j, m);
        ds_mst16(dst + j, ds_act(v, fin->act), m);
    }
}

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
    f.light = fin && ncols == 32 && (fin->act == DS_ACT_NONE || fin->act == DS_ACT_RELU);
    f.b0 = f.light && fin->bias ? ds_ld16(fin->bias) : (ds_v16){0};
    f.b1 = f.light && fin->bias ? ds_ld16(fin->bias + 16) : (ds_v16){0};
    f.lo = f.light && fin->act == DS_ACT_RELU ? 0.0f : -__builtin_inff();
    return f;
}

static inline void ds_finish_row_fast(float *dst, const float *src, int64_t ncols, const ds_finish *fin,
                                      const ds_fast_finish *f, int64_t r) {
    if (!f->light) {
        ds_finish_row(dst, src, ncols, fin, r);
        return;
    }
    ds_v16 x0 = ds_ld16(src) + f->b0, x1 = ds_ld16(src + 16) + f->b1;
    if (fin->res) {
        x0 += ds_ld16(fin->res + r * fin->ldr);
        x1 += ds_ld16(fin->res + r * fin->ldr + 16);
    }
    ds_st16(dst, ds_max16(f->lo, x0));
    ds_st16(dst + 16, ds_max16(f->lo, x1));
}

/* the geometry's scalars, as locals named like ds_conv.h's fields */
#define GEO_LOCALS                                                                                          \
    const int64_t H = geo[DS_CONV_H], W = geo[DS_CONV_W], C = geo[DS_CONV_C], OH = geo[DS_CONV_OH];         \
    const int64_t OW = geo[DS_CONV_OW], KH = geo[DS_CONV_KH], KW = geo[DS_CONV_KW];                          \
    const int64_t SH = geo[DS_CONV_SH], SW = geo[DS_CONV_SW], DH = geo[DS_CONV_DH], DW = geo[DS_CONV_DW];    \
    const int64_t PT = geo[DS_CONV_PT], PL = geo[DS_CONV_PL], CG = geo[DS_CONV_CG];                          \
    const int64_t LDY = geo[DS_CONV_LDY];                                                                   \
    (void)OH; (void)OW
#endif
