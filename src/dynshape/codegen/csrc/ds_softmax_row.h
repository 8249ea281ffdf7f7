/* A softmax row's exp-and-sum pass, for the attention and softmax kernels (ds_gemm.c exports it) and the native
   Softmax (ds_rows.c).

   The generated pass was `#pragma omp simd reduction(+:s)` over the row: gcc ends such a reduction with its 16
   lanes added one after another from the stack (16 dependent scalar adds, ~50 cycles a row), and a row whose
   length is not a multiple of 16 ends in a scalar loop, each element a scalar exp. On attention's short rows (a
   vision transformer's 66 keys, mobilevit's 144) that was half the softmax: 1.0 ns per score against
   onnxruntime's 0.5 on Zen 4. Here the row runs 16 lanes at a time, its tail masked (lanes past the row neither
   read nor written), and the lanes are summed as a tree. Each exp is ds_vmath.h's ds_expf_nonpos16. */
#ifndef DS_SOFTMAX_ROW_H
#define DS_SOFTMAX_ROW_H
#include <stdint.h>

#include "ds_simd.h"
#include "ds_vmath.h"

/* y[i] = exp(x[i] - mx) for i < n (y may be x: in place); returns the sum of the results. A NaN or an infinity in
   the row makes the sum NaN (or inf - inf), as the generated pass's did: the caller's NaN clean-up reads it. */
static inline ds_v16 ds_softmax_exp16(ds_v16 x, int bf16) { return bf16 ? ds_expf_nonpos16_bf16(x) : ds_expf_nonpos16(x); }

/* `bf16` (a constant where inlined): the exps are ds_vmath.h's bf16 attention form (relative error < 4e-6). */
static inline float ds_softmax_exp_to_as(const float *x, float *y, int64_t n, float mx, int bf16) {
#ifndef __AVX512F__
    if (!bf16) { /* (bf16 runs only where AVX512-BF16 is, so with AVX-512: the form below) */
        /* without AVX-512 a 64-byte ds_v16 lives in memory (ds_simd.h): 16 exps a step as a loop gcc vectorises
           on the machine's vectors, summed in two 8-float accumulators, the tail 8 at a time, then a tree */
        ds_v8 s0 = {0}, s1 = {0};
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            float e[16];
            for (int l = 0; l < 16; l++) e[l] = ds_expf_nonpos(x[i + l] - mx);
            for (int l = 0; l < 16; l++) y[i + l] = e[l];
            s0 += ds_ld8(e);
            s1 += ds_ld8(e + 8);
        }
        for (; i < n; i += 8) {
            const int64_t m = n - i < 8 ? n - i : 8;
            float e[8] = {0};
            for (int64_t l = 0; l < m; l++) e[l] = ds_expf_nonpos(x[i + l] - mx);
            for (int64_t l = 0; l < m; l++) y[i + l] = e[l];
            s0 += ds_ld8(e);
        }
        return ds_hsum8(s0 + s1);
    }
#endif
    ds_v16 a0 = {0}, a1 = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const ds_v16 e0 = ds_softmax_exp16(ds_ld16(x + i) - mx, bf16);
        const ds_v16 e1 = ds_softmax_exp16(ds_ld16(x + i + 16) - mx, bf16);
        ds_st16(y + i, e0);
        ds_st16(y + i + 16, e1);
        a0 += e0;
        a1 += e1;
    }
    for (; i < n; i += 16) {
        const int64_t m = n - i;
        const ds_cmask k = ds_cmask16(m);
        ds_v16 e = ds_softmax_exp16(ds_mld16(x + i, k) - mx, bf16);
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

static inline float ds_softmax_exp_to(const float *x, float *y, int64_t n, float mx) {
    return ds_softmax_exp_to_as(x, y, n, mx, 0);
}

static inline float ds_softmax_exp_row(float *row, int64_t n, float mx) { return ds_softmax_exp_to(row, row, n, mx); }
#endif
