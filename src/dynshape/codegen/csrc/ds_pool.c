/* Channels-last windowed pools by output row (see ds_pool.h for the contract).

   Per output pixel, the window's valid taps are found once (a range of rows and of columns), then each block of
   up to 64 channels is reduced in four vector registers over those taps and stored once. The loop nest this
   replaces kept a C-float accumulator row in memory and read, compared and wrote it back at every tap:
   SqueezeNet's 3x3 / stride-2 pools were ~10% of its time. */
#include <stdint.h>

#include "ds_pool.h"
#include "ds_simd.h"

#ifdef __AVX512F__
#include <immintrin.h>
typedef ds_v16 ds_pv;
#define DS_PL 16
#define ds_pv_ld ds_load16
#define ds_pv_st ds_store16
#define ds_pv_ldf ds_ld16
#define ds_pv_stf ds_st16
/* max keeping a NaN from either side: MAXPS(v, a) returns a where either is NaN, then a NaN v is put back */
static inline ds_v16 ds_pv_max(ds_v16 a, ds_v16 v) {
    const __m512 m = _mm512_max_ps((__m512)v, (__m512)a);
    return (ds_v16)_mm512_mask_mov_ps(m, _mm512_cmp_ps_mask((__m512)v, (__m512)v, _CMP_UNORD_Q), (__m512)v);
}
#elif defined(__AVX__)
#include <immintrin.h>
/* the pool on 8-float vectors: a 64-byte ds_v16 lives in memory without AVX-512 (ds_simd.h) */
typedef ds_v8 ds_pv;
#define DS_PL 8
#define ds_pv_ld ds_ld8n
#define ds_pv_st ds_st8n
#define ds_pv_ldf ds_ld8
#define ds_pv_stf ds_st8
/* as ds_pool_max: MAXPS(v, a) returns a where either is NaN, then a NaN v is put back */
static inline ds_v8 ds_pv_max(ds_v8 a, ds_v8 v) {
    const __m256 m = _mm256_max_ps((__m256)v, (__m256)a);
    return (ds_v8)_mm256_blendv_ps(m, (__m256)v, _mm256_cmp_ps((__m256)v, (__m256)v, _CMP_UNORD_Q));
}
#else
typedef ds_v16 ds_pv;
#define DS_PL 16
#define ds_pv_ld ds_load16
#define ds_pv_st ds_store16
#define ds_pv_ldf ds_ld16
#define ds_pv_stf ds_st16
static inline ds_v16 ds_pv_max(ds_v16 a, ds_v16 v) {
    for (int j = 0; j < 16; j++) a[j] = (a[j] != a[j] || a[j] >= v[j]) ? a[j] : v[j];
    return a;
}
#endif

/* The taps k (0 <= k < K) whose position o * S - P + k * D lies in [lo, hi): [*k0, *k1). */
static inline void ds_pool_taps(int64_t o, int64_t S, int64_t P, int64_t D, int64_t K, int64_t lo, int64_t hi,
                                int64_t *k0, int64_t *k1) {
    int64_t a = 0, b = K;
    const int64_t i0 = o * S - P;
    while (a < K && i0 + a * D < lo) a++;
    while (b > a && i0 + (b - 1) * D >= hi) b--;
    *k0 = a;
    *k1 = b;
}

/* NV whole channel vectors of a max pool's output pixel from c0 (ds_pool_row's locals), as long as NV fit. */
#define DS_PMAX_ACC(i) ds_pv a##i = (ds_pv){0} - __builtin_inff();
#define DS_PMAX_TAP(i) a##i = ds_pv_max(a##i, ds_pv_ldf(p + (i) * DS_PL));
#define DS_PMAX_ST(i) ds_pv_stf(yo + c0 + (i) * DS_PL, a##i);
#define DS_POOL_MAX_BLOCKS(NV)                                                                                  \
    for (; C - c0 >= (NV) * DS_PL; c0 += (NV) * DS_PL) {                                                        \
        DS_ROWS##NV(DS_PMAX_ACC)                                                                                \
        for (int64_t kh = kh0; kh < kh1; kh++) {                                                                \
            const float *xr = xn + (ih0 + kh * DH) * W * C + c0;                                                \
            for (int64_t kw = kw0; kw < kw1; kw++) {                                                            \
                const float *p = xr + (iw0 + kw * DW) * C;                                                      \
                DS_ROWS##NV(DS_PMAX_TAP)                                                                        \
            }                                                                                                   \
        }                                                                                                       \
        DS_ROWS##NV(DS_PMAX_ST)                                                                                 \
    }

void ds_pool_row(const int64_t *geo, const float *restrict x, float *restrict y, int64_t n, int64_t ho) {
    const int64_t H = geo[DS_POOL_H], W = geo[DS_POOL_W], C = geo[DS_POOL_C], OW = geo[DS_POOL_OW];
    const int64_t KH = geo[DS_POOL_KH], KW = geo[DS_POOL_KW], SH = geo[DS_POOL_SH], SW = geo[DS_POOL_SW];
    const int64_t DH = geo[DS_POOL_DH], DW = geo[DS_POOL_DW], PT = geo[DS_POOL_PT], PL = geo[DS_POOL_PL];
    const int64_t PB = geo[DS_POOL_PB], PR = geo[DS_POOL_PR], mode = geo[DS_POOL_MODE];
    int64_t kh0, kh1, ph0, ph1;
    ds_pool_taps(ho, SH, PT, DH, KH, 0, H, &kh0, &kh1);
    ds_pool_taps(ho, SH, PT, DH, KH, -PT, H + PB, &ph0, &ph1);
    const int64_t ih0 = ho * SH - PT;
    const float *xn = x + n * H * W * C;
    for (int64_t wo = 0; wo < OW; wo++) {
        int64_t kw0, kw1, pw0, pw1;
        ds_pool_taps(wo, SW, PL, DW, KW, 0, W, &kw0, &kw1);
        const int64_t iw0 = wo * SW - PL;
        float *yo = y + wo * C;
        float count = 1.0f; /* AveragePool's divisor */
        if (mode == DS_POOL_AVG) {
            count = (float)((kh1 - kh0) * (kw1 - kw0));
        } else if (mode == DS_POOL_AVG_PADS) {
            ds_pool_taps(wo, SW, PL, DW, KW, -PL, W + PR, &pw0, &pw1);
            count = (float)((ph1 - ph0) * (pw1 - pw0));
        }
        int64_t c0 = 0;
        /* whole channel vectors without lane counts, four, then three, then one at a time (independent chains):
           the lane-counted loop below kept the accumulators on the stack for its loads' tests and partial copies
           (3x onnxruntime's 3x3 / stride-2 max pool on 64 channels, and on ShuffleNet's 24); the taps in the same
           order as there, so the same bits. An average pool's whole vectors one at a time (its 3x3 pool on 24
           channels ran at 2.4x onnxruntime's time in the loop below). */
        if (mode == DS_POOL_MAX) {
            DS_POOL_MAX_BLOCKS(4)
            DS_POOL_MAX_BLOCKS(3)
            DS_POOL_MAX_BLOCKS(1)
        } else {
            for (; C - c0 >= DS_PL; c0 += DS_PL) {
                ds_pv a = (ds_pv){0};
                for (int64_t kh = kh0; kh < kh1; kh++) {
                    const float *xr = xn + (ih0 + kh * DH) * W * C + c0;
                    for (int64_t kw = kw0; kw < kw1; kw++) a += ds_pv_ldf(xr + (iw0 + kw * DW) * C);
                }
                ds_pv_stf(yo + c0, a / count);
            }
        }
        for (; c0 < C; c0 += 4 * DS_PL) { /* 4 * DS_PL channels in four vector accumulators */
            const int64_t nl = C - c0 < 4 * DS_PL ? C - c0 : 4 * DS_PL;
            const ds_pv start = mode == DS_POOL_MAX ? (ds_pv){0} - __builtin_inff() : (ds_pv){0};
            ds_pv a0 = start, a1 = start, a2 = start, a3 = start;
            for (int64_t kh = kh0; kh < kh1; kh++) {
                const float *xr = xn + (ih0 + kh * DH) * W * C + c0;
                for (int64_t kw = kw0; kw < kw1; kw++) {
                    const float *p = xr + (iw0 + kw * DW) * C;
                    if (mode == DS_POOL_MAX) {
                        a0 = ds_pv_max(a0, ds_pv_ld(p, nl));
                        if (nl > DS_PL) a1 = ds_pv_max(a1, ds_pv_ld(p + DS_PL, nl - DS_PL));
                        if (nl > 2 * DS_PL) a2 = ds_pv_max(a2, ds_pv_ld(p + 2 * DS_PL, nl - 2 * DS_PL));
                        if (nl > 3 * DS_PL) a3 = ds_pv_max(a3, ds_pv_ld(p + 3 * DS_PL, nl - 3 * DS_PL));
                    } else {
                        a0 += ds_pv_ld(p, nl);
                        if (nl > DS_PL) a1 += ds_pv_ld(p + DS_PL, nl - DS_PL);
                        if (nl > 2 * DS_PL) a2 += ds_pv_ld(p + 2 * DS_PL, nl - 2 * DS_PL);
                        if (nl > 3 * DS_PL) a3 += ds_pv_ld(p + 3 * DS_PL, nl - 3 * DS_PL);
                    }
                }
            }
            if (mode != DS_POOL_MAX) { a0 /= count; a1 /= count; a2 /= count; a3 /= count; }
            ds_pv_st(yo + c0, a0, nl);
            if (nl > DS_PL) ds_pv_st(yo + c0 + DS_PL, a1, nl - DS_PL);
            if (nl > 2 * DS_PL) ds_pv_st(yo + c0 + 2 * DS_PL, a2, nl - 2 * DS_PL);
            if (nl > 3 * DS_PL) ds_pv_st(yo + c0 + 3 * DS_PL, a3, nl - 3 * DS_PL);
        }
    }
}
