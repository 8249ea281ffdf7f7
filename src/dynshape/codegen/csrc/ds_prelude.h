/* What every generated kernel includes: headers, Python-semantics integer helpers for symbolic dims, and
   branch-free float32 transcendental functions.

   Why these exist: generated code must reproduce Python semantics exactly. Dims use floor division and a
   modulo with the divisor's sign (C truncates), and the transcendental functions must vectorise (glibc's
   expf/erff/tanhf only do under -ffast-math, which would also break NaN/Inf semantics), hence our own
   branch-free versions, accurate to a few float ulp. Define DS_LIBM_MATH for libm's instead. */
#ifndef DS_PRELUDE_H
#define DS_PRELUDE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The printer's branch around each parallel construct asks it (codegen/printer.py: Printer.team); libgomp
   defines it (every generated kernel links it), as omp.h would declare it. */
int omp_get_max_threads(void);

/* Python semantics for // and % (floor; the remainder takes the divisor's sign). Division by zero is
   undefined here as in C; the runtime's shape checks rule it out before any kernel runs. */
static inline int64_t ds_floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t ds_mod(int64_t a, int64_t b) {
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t ds_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t ds_max(int64_t a, int64_t b) { return a > b ? a : b; }

/* exp's constants (Cephes' expf): the scalar form below and the 16-lane one of ds_vmath.h share them, so both
   compute the same reduction and polynomial. Outside DS_LIBM_MATH: the libraries use ds_vmath.h either way. */
#define DS_EXP_LOG2E 1.44269504088896341f
#define DS_EXP_ROUND 12582912.0f /* 1.5 * 2^23: adding and subtracting it rounds to the nearest integer */
#define DS_EXP_LN2_HI 0.693359375f
#define DS_EXP_LN2_LO -2.12194440e-4f
#define DS_EXP_P0 1.9875691500e-4f
#define DS_EXP_P1 1.3981999507e-3f
#define DS_EXP_P2 8.3334519073e-3f
#define DS_EXP_P3 4.1665795894e-2f
#define DS_EXP_P4 1.6666665459e-1f
#define DS_EXP_P5 5.0000001201e-1f
/* Below 2^-60 a square is taken at 2^-60: x^2 would be a subnormal for |x| < 2^-63, and every operation on a
   subnormal takes a microcode assist (~100 cycles) without DAZ, while a polynomial in x^2 that small is its
   constant term either way (erf's x * P(x^2), tanh's x * (1 + x^2 R(x^2))). exp's r^2 is avoided by the form of
   its last step instead (ds_exp_poly): a softmax of near-equal tiny scores (mobilevit_hf's attention on random
   weights, scores ~1e-19) ran 4.3 ms where its twin layer ran 0.59. One max, where a test and a select cost ~6%
   of a vision transformer's call. */
#define DS_TINY_SQUARE_ROOT 8.673617379884035e-19f /* 2^-60 */

#ifndef DS_LIBM_MATH
/* Coefficients: exp is Cephes' expf polynomial; the erf and tanh polynomials were fitted for dynshape
   (iteratively reweighted least squares toward minimax relative error in float64): erf(x) = x*P(x^2) on
   |x| < 1 (rel. err 2e-9), erf = 1 - exp(-Q(|x|)) on [1, 4] (abs. err of erfc 1e-9), tanh(x) =
   x*(1 + x^2*R(x^2)) on |x| < 0.55 (rel. err 3e-9). Measured in float32 against float64 references by
   tests/codegen/test_cgen.py: max relative error < 1e-6 over [-100, 100]. */
static inline float ds_bits_to_float(int32_t i) { float f; __builtin_memcpy(&f, &i, 4); return f; }

/* e^r for the reduced r in [-ln 2 / 2, ln 2 / 2]: Cephes' polynomial. */
static inline float ds_exp_reduced(float r) {
    float p = DS_EXP_P0;
    p = p * r + DS_EXP_P1;
    p = p * r + DS_EXP_P2;
    p = p * r + DS_EXP_P3;
    p = p * r + DS_EXP_P4;
    p = p * r + DS_EXP_P5;
    return (p * r) * r + r + 1.0f; /* p r, then one multiply-add: no r * r rounded alone, subnormal for a tiny r */
}

/* exp(xc) = 2^n * P(r): n = round(xc / ln 2), r = xc - n ln 2 (Cody-Waite, two parts), P Cephes' polynomial. */
static inline float ds_exp_poly(float xc, float *n) {
    *n = (xc * DS_EXP_LOG2E + DS_EXP_ROUND) - DS_EXP_ROUND; /* round to nearest integer */
    float r = xc - *n * DS_EXP_LN2_HI;
    r = r - *n * DS_EXP_LN2_LO;
    return ds_exp_reduced(r);
}

static inline float ds_expf(float x) {
    float n, p = ds_exp_poly(x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x), &n);
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1; /* two steps: 2^n may be subnormal or 2^128 */
    float y = p * ds_bits_to_float((n1 + 127) << 23) * ds_bits_to_float((n2 + 127) << 23);
    y = x < -103.972084f ? 0.0f : y;
    return x != x ? x : y;
}

/* exp(x) for x in [-87.3, 88]: 2^n is a normal number, so one scale and no range checks. */
static inline float ds_exp_normal(float x) {
    float n, p = ds_exp_poly(x, &n);
    return p * ds_bits_to_float(((int32_t)n + 127) << 23);
}

/* exp of x <= 0 (softmax after subtracting the row maximum): one 2^n scale instead of two, and results that
   would be subnormal (x < -87.3, below 1.2e-38 next to the row maximum's 1) are flushed to zero. The flush zeroes
   the scale, not the result: `x < -87.3 ? 0 : exp(max(x, -87.3))` let gcc (if-converting under
   -fno-trapping-math) drop the clamp as dead for the zeroed lanes and compute the subnormal p * 2^-126 there,
   a microcode assist per lane on Intel; a scale of 0 keeps the clamp live (it decides -inf's 0, not NaN). */
static inline float ds_expf_nonpos(float x) {
    float n, p = ds_exp_poly(x < -87.3f ? -87.3f : x, &n);
    const int32_t scale = x < -87.3f ? 0 : ((int32_t)n + 127) << 23;
    const float y = p * ds_bits_to_float(scale);
    return x != x ? x : y;
}

/* The logistic, as SiLU / Swish epilogues use it (YOLO, EfficientNet, MobileViT): e = e^-|x| by ds_expf_nonpos,
   then 1 / (1 + e) for x >= 0 and e / (1 + e) below. No subnormal operation or result: e^-|x| is 0 below
   e^-87.3 (the exact logistic there is below 1.3e-38, at most that far from the 0 returned) and normal above it
   (a subnormal's every later use, SiLU's product by x, would take a microcode assist). The former form,
   1 / (1 + e^-x) with -x clamped to [-87.3, 87.3], let gcc fold the clamped lanes to a constant and compute the
   unclamped 1 / (1 + e^88) beside it, a subnormal, once selects if-convert (-fno-trapping-math). NaN propagates
   (e is NaN through the polynomial, whatever the scale). ds_expf_nonpos's steps written out, 17% faster on AVX2
   (AMD EPYC Zen 3: 0.63 -> 0.54 ns a SiLU, the same bits over [-100, 100]): 2^n from the rounding sum's own bits
   (big = t log2(e) + 1.5 * 2^23 holds n in its low mantissa bits, and the rest shifts out: no float -> int
   conversion), no separate NaN select, and the numerator chosen by x's sign bit (-0's e is 1 either way). */
static inline float ds_sigmoidf(float x) {
    const float t = -fabsf(x), tc = t < -87.3f ? -87.3f : t;
    const float big = tc * DS_EXP_LOG2E + DS_EXP_ROUND, n = big - DS_EXP_ROUND;
    float r = tc - n * DS_EXP_LN2_HI;
    r = r - n * DS_EXP_LN2_LO;
    const float p = ds_exp_reduced(r);
    int32_t bits;
    __builtin_memcpy(&bits, &big, 4);
    const int32_t scale = t < -87.3f ? 0 : (int32_t)((uint32_t)(bits + 127) << 23);
    const float e = p * ds_bits_to_float(scale);
    int32_t xb;
    __builtin_memcpy(&xb, &x, 4);
    return (xb < 0 ? e : 1.0f) / (1.0f + e);
}

static inline float ds_erff(float x) {
    float t = fabsf(x), tz = t > DS_TINY_SQUARE_ROOT ? t : DS_TINY_SQUARE_ROOT, z = tz * tz; /* DS_TINY_SQUARE_ROOT */
    float p = 7.820643e-05f;
    p = p * z + -7.999558e-04f;
    p = p * z + 5.1870267e-03f;
    p = p * z + -2.6853057e-02f;
    p = p * z + 1.12835646e-01f;
    p = p * z + -3.7612623e-01f;
    p = p * z + 1.1283791e+00f;
    float tc = t < 4.0f ? t : 4.0f;
    float q = -1.8514993e-04f;
    q = q * tc + 2.9355406e-03f;
    q = q * tc + -2.178941e-02f;
    q = q * tc + 1.0300486e-01f;
    q = q * tc + 6.3826233e-01f;
    q = q * tc + 1.1270185e+00f;
    q = q * tc + 3.5893323e-04f;
    float y = t < 1.0f ? x * p : copysignf(1.0f - ds_exp_normal(-q), x);  /* -q in [-16.5, 0) */
    return x != x ? x : y;
}

/* erf for precision="bf16" product epilogues (BERT's GELU): absolute error < 2e-6 (measured 1.5e-6 against float64
   over [-7, 7] and down to 1e-30), where the value it takes carries the bf16 operands' rounding (2^-9 relative) and
   its result is rounded to bf16 again by the next product. One polynomial: erf(t) = t * R(u) for t = min(|x|, 3.6),
   u = t / 1.8 - 1 in [-1, 1] (R of degree 12, fitted toward minimax absolute error of t * R in float64; erf(3.6) is
   1 - 3.6e-7), at most 1, sign restored, NaN kept: about half the operations of ds_erff's two polynomials and exp, which
   made the GELU epilogue a fifth of an FFN product's time on Zen 4 (bert_small, 1 thread). */
static inline float ds_erff_bf16(float x) {
    float t = fabsf(x);
    t = t < 3.6f ? t : 3.6f;
    const float u = t * 0.555555582f - 1.0f;
    float p = 0.000312368502f;
    p = p * u + 0.0141574834f;
    p = p * u + -0.0310012046f;
    p = p * u + -0.0256153829f;
    p = p * u + 0.11982207f;
    p = p * u + -0.0732778758f;
    p = p * u + -0.128428355f;
    p = p * u + 0.265590757f;
    p = p * u + -0.169350296f;
    p = p * u + -0.100811057f;
    p = p * u + 0.362182796f;
    p = p * u + -0.505297303f;
    p = p * u + 0.549494088f;
    p *= t;
    const float y = copysignf(p < 1.0f ? p : 1.0f, x); /* the fit ends at 1 + 1.1e-6: never above 1 */
    return x != x ? x : y;
}

/* ln x, vectorisable (libm's logf is a call per element): x = 2^e m with m in [sqrt(1/2), sqrt(2)), ln x =
   e ln 2 + ln m, ln(1 + f) = f - f^2 / 2 + f^3 P(f) with Cephes' logf polynomial, ln 2 in two parts. A subnormal x
   is scaled by 2^23 first (its exponent field is 0); ln 0 = -inf, ln of a negative number or NaN is NaN, ln inf =
   inf (libm's). Measured in float32 against float64 by tests/codegen/test_cgen.py. (A log mel spectrogram's
   log ran on numpy every call: no kernel had it.) */
static inline float ds_logf(float x) {
    const float scale = x < 1.17549435e-38f ? 8388608.0f : 1.0f; /* 2^23 for subnormals */
    float xs = x * scale;
    int32_t i;
    __builtin_memcpy(&i, &xs, 4);
    float e = (float)(((i >> 23) & 0xff) - 127) - (scale == 1.0f ? 0.0f : 23.0f);
    float m = ds_bits_to_float((i & 0x007fffff) | 0x3f800000); /* [1, 2) */
    const int big = m > 1.41421356f;
    m = big ? 0.5f * m : m;
    e = big ? e + 1.0f : e;
    const float f = m - 1.0f, z = f * f;
    float p = 7.0376836292e-2f;
    p = p * f + -1.1514610310e-1f;
    p = p * f + 1.1676998740e-1f;
    p = p * f + -1.2420140846e-1f;
    p = p * f + 1.4249322787e-1f;
    p = p * f + -1.6668057665e-1f;
    p = p * f + 2.0000714765e-1f;
    p = p * f + -2.4999993993e-1f;
    p = p * f + 3.3333331174e-1f;
    float y = f * z * p + e * -2.12194440e-4f - 0.5f * z;
    y = (f + y) + e * 0.693359375f;
    y = x == INFINITY ? x : y;
    y = x == 0.0f ? -INFINITY : y;
    return (x < 0.0f || x != x) ? (x != x ? x : NAN) : y;
}

static inline float ds_tanhf(float x) {
    float t = fabsf(x), tz = t > DS_TINY_SQUARE_ROOT ? t : DS_TINY_SQUARE_ROOT, z = tz * tz; /* DS_TINY_SQUARE_ROOT */
    float p = -5.885589e-03f;
    p = p * z + 2.0787114e-02f;
    p = p * z + -5.3780954e-02f;
    p = p * z + 1.3331886e-01f;
    p = p * z + -3.3333296e-01f;
    float e = ds_exp_normal(2.0f * (t < 9.5f ? t : 9.5f));
    float y = t < 0.55f ? x * (1.0f + z * p) : copysignf(1.0f - 2.0f / (e + 1.0f), x);
    return x != x ? x : y;
}
#else
static inline float ds_expf(float x) { return expf(x); }
static inline float ds_logf(float x) { return logf(x); }
static inline float ds_expf_nonpos(float x) { return expf(x); }
static inline float ds_erff(float x) { return erff(x); }
static inline float ds_erff_bf16(float x) { return erff(x); }
static inline float ds_tanhf(float x) { return tanhf(x); }
static inline float ds_sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
#endif

#endif /* DS_PRELUDE_H */
