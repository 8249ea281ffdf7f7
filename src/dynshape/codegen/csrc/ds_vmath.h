/* 16-lane exp and logistic for the C libraries (softmax rows, conv tiles' SiLU), on ds_simd.h's vectors.

   ds_prelude.h's scalar forms are what generated kernels vectorise; these compute the same reduction and
   polynomial (ds_exp_poly's, from ds_prelude.h's DS_EXP_* constants, with the same fused multiply-adds) but, with AVX-512, end in VSCALEFPS for
   the 2^n: one instruction where the portable form takes four (convert, add the bias, shift, multiply) and two
   selects for its range. Every result that is a normal float is the same; below 2^-126 VSCALEFPS rounds to the
   subnormal where the portable form flushes to zero (a difference under 1.2e-38); the softmax exps and the
   logistic flush or avoid them as the portable forms do (a subnormal operand costs a microcode assist). The logistic divides by
   VRCP14PS and one Newton step (relative error ~2^-28: within an ulp of the quotient, which is not always the
   rounded one), where a 512-bit VDIVPS would take most of the time of a SiLU on Zen 4. Without AVX-512, lane by
   lane through the scalar forms. */
#ifndef DS_VMATH_H
#define DS_VMATH_H
#include <stdint.h>

#include "ds_prelude.h"
#include "ds_simd.h"

/* ds_expf_nonpos16_bf16's constants: ln 2 rounded to float32, and P's coefficients (r, r^2, r^3, r^4). */
#define DS_EXP_BF16_LN2 0.693147182f
#define DS_EXP_BF16_P1 0.9999668f
#define DS_EXP_BF16_P2 0.50003022f
#define DS_EXP_BF16_P3 0.167875916f
#define DS_EXP_BF16_P4 0.0415136851f

#ifdef __AVX512F__
/* exp(x) for x in [-104, 88.7] (callers clamp; a NaN passes through as NaN). */
static inline __m512 ds_exp_scalef16(__m512 x) {
    const __m512 magic = _mm512_set1_ps(DS_EXP_ROUND);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(DS_EXP_LOG2E), magic), magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(DS_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(DS_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(DS_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DS_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DS_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DS_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DS_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DS_EXP_P5));
    p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f)); /* as ds_exp_poly's */
    return _mm512_scalef_ps(p, n);
}

static inline ds_v16 ds_zero_below_normal16(ds_v16 x, __m512 y) { /* y, 0 in the lanes where x < -87.3 */
    return (ds_v16)_mm512_maskz_mov_ps(_mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-87.3f), _CMP_NLT_UQ), y);
}

/* ds_expf_nonpos: x clamped at -87.3 and the lanes below it zero, as the scalar form: no subnormal results. Why:
   a softmax row's subnormal exps went on into its product by V, and every multiply-add on a subnormal operand
   takes a microcode assist (~100 cycles) without DAZ: mobilevit_hf's attention on random weights ran 4.3 ms
   where its twin layer ran 0.59. MAXPS returns its second operand for a NaN, and NLT keeps a NaN lane. */
static inline ds_v16 ds_expf_nonpos16(ds_v16 x) {
    return ds_zero_below_normal16(x, ds_exp_scalef16(_mm512_max_ps(_mm512_set1_ps(-87.3f), (__m512)x)));
}

/* ds_expf_nonpos16 for a bf16 attention's softmax, where each exp is rounded to bf16 (2^-9 relative) before the
   product by V: relative error < 4e-6 (measured 3.1e-6 over [-87, 0] against float64), exp(0) = 1 exactly. One
   reduction constant (ln 2 rounded to float32: n * its error < 2e-6 here) and 1 + r * P(r), P of degree 3 (fitted
   toward minimax relative error on [-ln 2 / 2, ln 2 / 2]): 9 operations where the float32 form takes 14. */
static inline ds_v16 ds_expf_nonpos16_bf16(ds_v16 x) {
    const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-87.3f), (__m512)x);  /* (no subnormals: ds_expf_nonpos16) */
    const __m512 magic = _mm512_set1_ps(DS_EXP_ROUND);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(DS_EXP_LOG2E), magic), magic);
    const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(DS_EXP_BF16_LN2), xc);
    __m512 p = _mm512_set1_ps(DS_EXP_BF16_P4);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DS_EXP_BF16_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DS_EXP_BF16_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DS_EXP_BF16_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return ds_zero_below_normal16(x, _mm512_scalef_ps(p, n));
}

/* 1 / (1 + e^-x): e^-x on -x clamped to [-87.3, 87.3], as ds_sigmoidf (1 / (1 + e^87.3) ~ 1.27e-38 below
   x = -87.3, where the exact value is smaller still; 1 above x = 87.3, where 1 + e^-87.3 rounds to 1): no
   subnormal e^-x or result (see ds_expf_nonpos16); NaN kept by the operand order of MINPS / MAXPS. */
static inline ds_v16 ds_sigmoid16(ds_v16 x) {
    const __m512 t = _mm512_min_ps(_mm512_set1_ps(87.3f),
                                   _mm512_max_ps(_mm512_set1_ps(-87.3f), _mm512_sub_ps(_mm512_setzero_ps(), (__m512)x)));
    const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), ds_exp_scalef16(t));
    const __m512 r = _mm512_rcp14_ps(d);
    return (ds_v16)_mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
}
#else
static inline ds_v16 ds_expf_nonpos16(ds_v16 x) {
    ds_v16 y;
    #pragma omp simd
    for (int l = 0; l < 16; l++) y[l] = ds_expf_nonpos(x[l]);
    return y;
}

/* The same polynomial lane by lane, 2^n as ds_expf_nonpos's (results below 2^-126 flushed to zero). */
static inline ds_v16 ds_expf_nonpos16_bf16(ds_v16 x) {
    ds_v16 y;
    #pragma omp simd
    for (int l = 0; l < 16; l++) {
        const float xc = x[l] < -87.3f ? -87.3f : x[l];
        const float n = (xc * DS_EXP_LOG2E + DS_EXP_ROUND) - DS_EXP_ROUND, r = xc - n * DS_EXP_BF16_LN2;
        const float p = (((DS_EXP_BF16_P4 * r + DS_EXP_BF16_P3) * r + DS_EXP_BF16_P2) * r + DS_EXP_BF16_P1) * r + 1.0f;
        const int32_t bits = x[l] < -87.3f ? 0 : ((int32_t)n + 127) << 23; /* flushed by a 0 scale: ds_expf_nonpos */
        float scale;
        __builtin_memcpy(&scale, &bits, 4);
        y[l] = x[l] != x[l] ? x[l] : p * scale;
    }
    return y;
}

static inline ds_v16 ds_sigmoid16(ds_v16 x) {
    ds_v16 y;
    #pragma omp simd
    for (int l = 0; l < 16; l++) y[l] = ds_sigmoidf(x[l]);
    return y;
}
#endif
#endif
