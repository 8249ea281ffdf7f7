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

/* the geometry's scalars, as locals named like ds_conv.h's fields */
#define GEO_LOCALS                                                                                          \
    const int64_t H = geo[DS_CONV_H], W = geo[DS_CONV_W], C = geo[DS_CONV_C], OH = geo[DS_CONV_OH];         \
    const int64_t OW = geo[DS_CONV_OW], KH = geo[DS_CONV_KH], KW = geo[DS_CONV_KW];                          \
    const int64_t SH = geo[DS_CONV_SH], SW = geo[DS_CONV_SW], DH = geo[DS_CONV_DH], DW = geo[DS_CONV_DW];    \
    const int64_t PT = geo[DS_CONV_PT], PL = geo[DS_CONV_PL], CG = geo[DS_CONV_CG];                          \
    const int64_t LDY = geo[DS_CONV_LDY];                                                                   \
    (void)OH; (void)OW
#endif
