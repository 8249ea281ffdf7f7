/* 16-float vectors with GCC's vector extensions (no intrinsics): one zmm register with AVX-512. Without it a
   ds_v16 has no register mode and gcc 12 keeps it in memory (it is not split into two ymm), so the hot loops there
   run on ds_v8 (below: the machine's 8-float vectors) and ds_v16 serves only code off the multiply-add paths.
   Shared by the micro-kernels of the products (ds_gemm.c) and the convolutions (ds_conv.c). DS_MR: rows per
   micro-tile, 12 with 32 vector registers (AVX-512: 24 accumulators), else 4, the tiles' generic steps; on 16
   registers both files run tiles of 6 rows first (per 16-column half, 12 accumulators), outside DS_MR. */
#ifndef DS_SIMD_H
#define DS_SIMD_H
#include <stdint.h>

#ifdef __AVX512F__
#define DS_MR 12
#define DS_MR16 24 /* rows per micro-tile of one vector's columns (a panel's <= 16-column tail) */
#else
#define DS_MR 4
#define DS_MR16 8
#endif

typedef float ds_v16 __attribute__((vector_size(64)));
typedef float ds_v16u __attribute__((vector_size(64), aligned(4), may_alias));
static inline ds_v16 ds_ld16(const float *p) { return *(const ds_v16u *)p; }
static inline void ds_st16(float *p, ds_v16 v) { *(ds_v16u *)p = v; }
/* The first n of 32 (or 16) columns stored: with AVX-512 as masked stores (a 24- or 40-channel layer's tail was a
   scalar loop per output row), else through a scratch row. */
#ifdef __AVX512F__
#include <immintrin.h>
static inline void ds_store16(float *c, ds_v16 x0, int64_t n) {
    if (n >= 16) { ds_st16(c, x0); return; }
    _mm512_mask_storeu_ps(c, (__mmask16)((1u << n) - 1), (__m512)x0);
}
/* The first n of 16 floats (n >= 16: all; n <= 0: none), zeros after them: never reads past p[n - 1]. */
static inline ds_v16 ds_load16(const float *p, int64_t n) {
    if (n >= 16) return ds_ld16(p);
    return n <= 0 ? (ds_v16){0} : (ds_v16)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}
static inline void ds_store_row(float *c, ds_v16 x0, ds_v16 x1, int64_t n) {
    if (n >= 32) { ds_st16(c, x0); ds_st16(c + 16, x1); return; }
    if (n <= 16) { ds_store16(c, x0, n); return; }
    ds_st16(c, x0);
    ds_store16(c + 16, x1, n - 16);
}
#else
/* The machine's own 8-float vectors, for the multiply-add loops of the micro-kernels (ds_gemm.c, ds_conv.c): gcc 12
   keeps a 64-byte ds_v16, which has no register mode without AVX-512, in memory, every operation a round trip
   through the stack (the products ran at 2 GFLOP/s on an AMD EPYC Zen 3). ds_v16 stays for code off those paths. */
typedef float ds_v8 __attribute__((vector_size(32)));
typedef float ds_v8u __attribute__((vector_size(32), aligned(4), may_alias));
static inline ds_v8 ds_ld8(const float *p) { return *(const ds_v8u *)p; }
static inline void ds_st8(float *p, ds_v8 v) { *(ds_v8u *)p = v; }
/* The first n of 8 floats (n >= 8: all), zeros after: never reads past p[n - 1]. */
static inline ds_v8 ds_ld8n(const float *p, int64_t n) {
    if (n >= 8) return ds_ld8(p);
    float t[8] = {0};
    for (int64_t j = 0; j < n; j++) t[j] = p[j];
    return ds_ld8(t);
}
/* The first n of 8 lanes stored (n >= 8: all; n <= 0: none). */
static inline void ds_st8n(float *p, ds_v8 v, int64_t n) {
    if (n >= 8) { ds_st8(p, v); return; }
    for (int64_t j = 0; j < n; j++) p[j] = v[j];
}
/* The sum of 8 lanes as a tree. */
static inline float ds_hsum8(ds_v8 v) { return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])); }
/* The first n of 16 columns (n >= 16: all; n <= 0: none). */
static inline void ds_store_half(float *c, ds_v8 x0, ds_v8 x1, int64_t n) {
    ds_st8n(c, x0, n);
    ds_st8n(c + 8, x1, n - 8);
}
static inline void ds_store_row(float *c, ds_v16 x0, ds_v16 x1, int64_t n) {
    if (n == 32) { ds_st16(c, x0); ds_st16(c + 16, x1); return; }
    float t[32];
    ds_st16(t, x0);
    ds_st16(t + 16, x1);
    for (int64_t j = 0; j < n; j++) c[j] = t[j];
}
static inline void ds_store16(float *c, ds_v16 x0, int64_t n) {
    if (n >= 16) { ds_st16(c, x0); return; }
    float t[16];
    ds_st16(t, x0);
    for (int64_t j = 0; j < n; j++) c[j] = t[j];
}
static inline ds_v16 ds_load16(const float *p, int64_t n) {
    if (n >= 16) return ds_ld16(p);
    float t[16] = {0};
    for (int64_t j = 0; j < n; j++) t[j] = p[j];
    return ds_ld16(t);
}
#endif

/* A micro-tile's column masks, made once per tile (`ds_cmask16(ncols)`): its stores, and the finish's loads of
   bias and residual, then take no branch per row. With ds_store_row's tests per row every micro-kernel's finish
   was a tree of blocks, most of ds_conv.c's compile time (which is on every CNN's cold build path). With
   AVX-512 a mask register (a masked store of all 16 lanes runs as fast as a plain one; lanes off the mask are
   never touched, past the end of a buffer included); else the column count. */
#ifdef __AVX512F__
typedef __mmask16 ds_cmask;
static inline ds_cmask ds_cmask16(int64_t n) {
    return n >= 16 ? (ds_cmask)0xFFFF : n <= 0 ? (ds_cmask)0 : (ds_cmask)((1u << n) - 1);
}
static inline ds_v16 ds_mld16(const float *p, ds_cmask m) { return (ds_v16)_mm512_maskz_loadu_ps(m, p); }
static inline void ds_mst16(float *p, ds_v16 v, ds_cmask m) { _mm512_mask_storeu_ps(p, m, (__m512)v); }
#else
typedef int64_t ds_cmask;
static inline ds_cmask ds_cmask16(int64_t n) { return n; }
static inline ds_v16 ds_mld16(const float *p, ds_cmask m) { return ds_load16(p, m); }
static inline void ds_mst16(float *p, ds_v16 v, ds_cmask m) { if (m > 0) ds_store16(p, v, m); }
#endif

/* The sum of 16 lanes as a tree, in four dependent steps: an `omp simd reduction(+:)` ends in gcc with the lanes
   added one after another from the stack (fifteen dependent adds). */
static inline float ds_tree_sum16(ds_v16 v) {
#ifdef __AVX512F__
    return _mm512_reduce_add_ps((__m512)v);
#else
    float s[16];
    for (int l = 0; l < 16; l++) s[l] = v[l];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) s[l] += s[l + w];
    return s[0];
#endif
}

/* Rows of a micro-tile written out as named registers (DS_ROWSn(M) expands M(0) .. M(n-1)), so the compiler
   sees straight-line code, not an array it might keep in memory. */
#define DS_ROWS1(M) M(0)
#define DS_ROWS2(M) DS_ROWS1(M) M(1)
#define DS_ROWS3(M) DS_ROWS2(M) M(2)
#define DS_ROWS4(M) DS_ROWS3(M) M(3)
#define DS_ROWS5(M) DS_ROWS4(M) M(4)
#define DS_ROWS6(M) DS_ROWS5(M) M(5)
#define DS_ROWS7(M) DS_ROWS6(M) M(6)
#define DS_ROWS8(M) DS_ROWS7(M) M(7)
#define DS_ROWS9(M) DS_ROWS8(M) M(8)
#define DS_ROWS10(M) DS_ROWS9(M) M(9)
#define DS_ROWS11(M) DS_ROWS10(M) M(10)
#define DS_ROWS12(M) DS_ROWS11(M) M(11)
#define DS_ROWS13(M) DS_ROWS12(M) M(12)
#define DS_ROWS14(M) DS_ROWS13(M) M(13)
#define DS_ROWS15(M) DS_ROWS14(M) M(14)
#define DS_ROWS16(M) DS_ROWS15(M) M(15)
#define DS_ROWS17(M) DS_ROWS16(M) M(16)
#define DS_ROWS18(M) DS_ROWS17(M) M(17)
#define DS_ROWS19(M) DS_ROWS18(M) M(18)
#define DS_ROWS20(M) DS_ROWS19(M) M(19)
#define DS_ROWS21(M) DS_ROWS20(M) M(20)
#define DS_ROWS22(M) DS_ROWS21(M) M(21)
#define DS_ROWS23(M) DS_ROWS22(M) M(22)
#define DS_ROWS24(M) DS_ROWS23(M) M(23)
#endif
