/* Float32 runs rounded to bf16 (VCVTNE2PS2BF16: round to nearest even) where a library reads activations: the bf16
   products' rows and patches (ds_gemm_bf16.c) and the direct AMX convs' padded copy (ds_conv_amx.c). Defined only
   where the compiler targets AVX512-BF16 (DS_BF16_ROUND 1); the callers keep their own fallbacks elsewhere. The
   scalar rounding and widening (ds_to_bf16, ds_from_bf16) are defined everywhere: one definition of the rounding. */
#ifndef DS_BF16_ROUND_H
#define DS_BF16_ROUND_H
#include <stdint.h>
#include <string.h>

/* x rounded to bf16 (the upper 16 bits of the float32 it stands for): nearest even; a denormal becomes a signed
   zero and a NaN stays a (quiet) NaN, as VCVTNE2PS2BF16 does. */
static inline uint16_t ds_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float ds_from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define DS_BF16_ROUND 1
#include <immintrin.h>

/* The load masks of 32 values of which the first `cnt` are there: the low 16 (*m0) and the high 16 (*m1). */
static inline void ds_bf16_masks(int64_t cnt, __mmask16 *m0, __mmask16 *m1) {
    *m0 = cnt >= 16 ? 0xFFFF : cnt <= 0 ? 0 : (__mmask16)((1u << cnt) - 1);
    *m1 = cnt >= 32 ? 0xFFFF : cnt <= 16 ? 0 : (__mmask16)((1u << (cnt - 16)) - 1);
}

/* 32 floats from p (the first `cnt`, zeros after) as 32 bf16 */
static inline __m512i ds_bf16x32(const float *p, int64_t cnt) {
    if (cnt >= 32) return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
    __mmask16 m0, m1;
    ds_bf16_masks(cnt, &m0, &m1);
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, p + 16), _mm512_maskz_loadu_ps(m0, p));
}

/* The first `cnt` of the 32 bf16 in v (all 32 from 32 on) at dst: nothing past them is touched. */
static inline void ds_put_bf16x32(uint16_t *dst, __m512i v, int64_t cnt) {
    if (cnt >= 32) _mm512_storeu_si512(dst, v);
    else _mm512_mask_storeu_epi16(dst, (__mmask32)((1ull << cnt) - 1), v);
}

/* n bf16 values from src to dst, 32 at a time (the last masked), inline: the runs a conv's patches copy from a
   bf16-stored map are a pixel's channels (16-64 values), for which a call of memcpy per pixel cost more than the
   copy (SqueezeNet's 1x1 convs on 55 x 55 maps). */
static inline void ds_copy_bf16(uint16_t *dst, const uint16_t *src, int64_t n) {
    for (int64_t c = 0; c < n; c += 32) {
        const __mmask32 m = n - c >= 32 ? 0xFFFFFFFFu : (__mmask32)((1ull << (n - c)) - 1);
        _mm512_mask_storeu_epi16(dst + c, m, _mm512_maskz_loadu_epi16(m, src + c));
    }
}

/* n floats from src as n bf16 at dst, 32 at a time (the last masked: nothing past either end is touched). */
static inline void ds_round_run(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t c = 0; c < n; c += 32) ds_put_bf16x32(dst + c, ds_bf16x32(src + c, n - c), n - c);
}
#else
#define DS_BF16_ROUND 0
#endif
#endif
