/* A softmax row's exp-and-sum pass, for the attention and softmax kernels (ds_gemm.c exports it) and the native
   Softmax (ds_rows.c).

   The generated pass was `#pragma omp simd reduction(+:s)` over the row: gcc ends such a reduction with its 16
   lanes added one after another from the stack (16 dependent scalar adds, ~50 cycles a row), and a row whose
   length is not a multiple of 16 ends in a scalar loop, each element a scalar exp. On attention's short rows (a
   vision transformer's 66 keys, mobilevit's 144) that was half the softmax: 1.0 ns per score against
   onnxruntime's 0.5 on Zen 4. Here the row runs 16 lanes at a time, its tail masked (lanes past the row neither
   read nor written), and the lanes are summed as a tree. Each exp is ds_prelude.h's ds_expf_nonpos, lane by lane
   (with AVX-512, the same steps ending in VSCALEFPS: below). */
#ifndef DS_SOFTMAX_ROW_H
#define DS_SOFTMAX_ROW_H
#include <stdint.h>

#include "ds_prelude.h"
#include "ds_simd.h"

#ifdef __AVX512F__
/* ds_expf_nonpos on 16 lanes with AVX-512's VSCALEFPS for the 2^n: one instruction where the portable form takes
   four (convert, add the bias, shift, multiply) and two selects for the range, so the pass runs 17 vector ops
   per 16 values instead of 25. The same reduction and polynomial (ds_exp_poly, step by step with the same
   fused multiply-adds), so the same values for every result that is a normal float; below 2^-126 VSCALEFPS
   rounds to the subnormal where the portable form flushes to zero (x < -87.3: a difference under 1.2e-38).
   x is clamped at -104 (2^-150: zero), which keeps n finite; a NaN passes the clamp (MAXPS returns its second
   operand) and the polynomial, and stays NaN. */
static inline ds_v16 ds_expf_nonpos16(ds_v16 xv) {
    const __m512 x = _mm512_max_ps(_mm512_set1_ps(-104.0f), (__m512)xv), magic = _mm512_set1_ps(12582912.0f);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic), magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return (ds_v16)_mm512_scalef_ps(p, n);
}
#else
static inline ds_v16 ds_expf_nonpos16(ds_v16 x) {
    ds_v16 y;
    #pragma omp simd
    for (int l = 0; l < 16; l++) y[l] = ds_expf_nonpos(x[l]);
    return y;
}
#endif

/* y[i] = exp(x[i] - mx) for i < n (y may be x: in place); returns the sum of the results. A NaN or an infinity in
   the row makes the sum NaN (or inf - inf), as the generated pass's did: the caller's NaN clean-up reads it. */
static inline float ds_softmax_exp_to(const float *x, float *y, int64_t n, float mx) {
    ds_v16 a0 = {0}, a1 = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const ds_v16 e0 = ds_expf_nonpos16(ds_ld16(x + i) - mx), e1 = ds_expf_nonpos16(ds_ld16(x + i + 16) - mx);
        ds_st16(y + i, e0);
        ds_st16(y + i + 16, e1);
        a0 += e0;
        a1 += e1;
    }
    for (; i < n; i += 16) {
        const int64_t m = n - i;
        const ds_cmask k = ds_cmask16(m);
        ds_v16 e = ds_expf_nonpos16(ds_mld16(x + i, k) - mx);
#ifdef __AVX512F__
        e = (ds_v16)_mm512_maskz_mov_ps(k, (__m512)e); /* the lanes past the row (loaded as 0) add nothing */
#else
        for (int l = (int)(m < 16 ? m : 16); l < 16; l++) e[l] = 0.0f;
#endif
        ds_mst16(y + i, e, k);
        a0 += e;
    }
    return ds_tree_sum16(a0 + a1);
}

static inline float ds_softmax_exp_row(float *row, int64_t n, float mx) { return ds_softmax_exp_to(row, row, n, mx); }
#endif
