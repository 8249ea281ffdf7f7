/* dynshape's sgemm for products with a constant right operand (weights), with the epilogue fused in.

   Why our own: the weights are known at compile time, so they are packed once into 32-column panels
   (codegen/packed_gemm.py: pack_b), and a register-blocked micro-kernel streams them without the per-call
   packing a BLAS does. It matched MKL and beat OpenBLAS (bench/gemm_bench.py --packed: 130-157 GFLOP/s on
   one AVX-512 core at M = 7..4096). Generated kernels call ds_gemm_block for the tile (rows i0..i1, panel q)
   of C = A @ B, then apply their epilogue to that tile while it is in cache.

   Plain C with GCC vector extensions (no intrinsics): 16-float vectors become one zmm register with AVX-512,
   two ymm with AVX2, four xmm elsewhere. Micro-tiles are DS_MR rows x 32 columns in 2*DS_MR registers:
   12 rows with 32 vector registers (AVX-512; measured 6-10% over 8); with 16 (AVX2) 6 rows in 16-column halves. */
#include <stdint.h>
#include <stdlib.h>

#include "ds_gemm.h"
#include "ds_layernorm_row.h"
#include "ds_softmax_row.h"

#ifndef DS_ROW_BLOCK
#define DS_ROW_BLOCK 60 /* rows per block: a multiple of every micro-tile height */
#endif
#ifndef DS_PAR_MIN_FLOPS
#define DS_PAR_MIN_FLOPS (1 << 20) /* multiply-adds below which a product runs on one thread */
#endif
#include "ds_simd.h"

#ifdef __AVX512F__
/* One row: two independent accumulator pairs hide the FMA latency. The 32-wide rows of the B panel are ps
   floats apart (32 when packed, the matrix's row stride when read in place). */
static void ds_micro_1(const float *restrict a, int64_t lda, const float *restrict bp, int64_t ps, int64_t k,
                       float *restrict c, int64_t ldc, int64_t ncols) {
    (void)lda; (void)ldc;
    ds_v16 c00 = {0}, c01 = {0}, e0 = {0}, e1 = {0};
    int64_t p = 0;
    for (; p + 1 < k; p += 2) {
        const float *q = bp + p * ps, *q1 = q + ps;
        c00 += a[p] * ds_ld16(q); c01 += a[p] * ds_ld16(q + 16);
        e0 += a[p + 1] * ds_ld16(q1); e1 += a[p + 1] * ds_ld16(q1 + 16);
    }
    c00 += e0; c01 += e1;
    for (; p < k; p++) {
        const ds_v16 b0 = ds_ld16(bp + p * ps), b1 = ds_ld16(bp + p * ps + 16);
        c00 += a[p] * b0; c01 += a[p] * b1;
    }
    ds_store_row(c, c00, c01, ncols);
}

/* MR rows: each row r keeps its 32 columns in two named registers c<r>0, c<r>1 (`ds_micro_MR`). Narrow
   micro-tiles (`ds_nmicro_MR`): MR rows x the first 16 columns of a panel, one register a row. A panel whose
   columns end within 16 (a tail: 8 output channels, or 34 = 32 + 2) would otherwise run the 32-column kernel
   with half or more of its multiply-adds on zero padding; twice the rows keep as many accumulators busy. */
#define DS_ROW_INIT(r) ds_v16 c##r##0 = {0}, c##r##1 = {0}; const float *a##r = a + r * lda;
#define DS_ROW_FMA(r) { const float x = a##r[p]; c##r##0 += x * b0; c##r##1 += x * b1; }
#define DS_ROW_STORE(r) ds_store_row(c + r * ldc, c##r##0, c##r##1, ncols);
#define DS_NROW_INIT(r) ds_v16 c##r##0 = {0}; const float *a##r = a + r * lda;
#define DS_NROW_FMA(r) c##r##0 += a##r[p] * b0;
#define DS_NROW_STORE(r) ds_store16(c + r * ldc, c##r##0, ncols);
#define DS_GLOAD_B2 const ds_v16 b0 = ds_ld16(bp + p * ps), b1 = ds_ld16(bp + p * ps + 16);
#define DS_GLOAD_B1 const ds_v16 b0 = ds_ld16(bp + p * ps);
/* The first row block of a product reads each panel from L3 when the weights are out of L2 (each layer's are, once
   per call): its full micro-tiles (`ds_pmicro_12`) prefetch the panel 64 rows ahead, as the convolutions'
   do (ds_conv.c); the later blocks run without the prefetches. Only ds_gemm_block knows a first block. */
#define DS_GPREFETCH(p) { __builtin_prefetch(bp + ((p) + 64) * ps, 0, 2);                                  \
                          __builtin_prefetch(bp + ((p) + 64) * ps + 16, 0, 2); }
#define DS_GNO_PREFETCH(p)
/* One line of the next tile's panel into L2 an iteration (`nx`: this micro-tile's share of it), so that the next
   tile's first micro-tile need not read its panel from L3 (see ds_gemm_block). */
#define DS_GPREFETCH_NEXT(p) __builtin_prefetch(nx + (p) * 16, 0, 2);
#define DS_MICRO_OF(NAME, MR, INIT, LOAD_B, FMA, STORE, PREFETCH)                                         \
    static void NAME##_##MR(const float *restrict a, int64_t lda, const float *restrict bp, int64_t ps,   \
                            int64_t k, float *restrict c, int64_t ldc, int64_t ncols, const float *nx) {  \
        (void)nx;                                                                                         \
        DS_ROWS##MR(INIT)                                                                                 \
        _Pragma("GCC unroll 4")                                                                           \
        for (int64_t p = 0; p < k; p++) {                                                                 \
            LOAD_B                                                                                        \
            PREFETCH(p)                                                                                   \
            DS_ROWS##MR(FMA)                                                                              \
        }                                                                                                 \
        DS_ROWS##MR(STORE)                                                                                \
    }
#define DS_MICRO(MR) DS_MICRO_OF(ds_micro, MR, DS_ROW_INIT, DS_GLOAD_B2, DS_ROW_FMA, DS_ROW_STORE, DS_GNO_PREFETCH)
#define DS_NMICRO(MR)                                                                                     \
    DS_MICRO_OF(ds_nmicro, MR, DS_NROW_INIT, DS_GLOAD_B1, DS_NROW_FMA, DS_NROW_STORE, DS_GNO_PREFETCH)
DS_MICRO(2)
DS_MICRO(3)
DS_MICRO(4)
#if DS_MR > 4
DS_MICRO(5)
DS_MICRO(6)
DS_MICRO(7)
DS_MICRO(8)
DS_MICRO(9)
DS_MICRO(10)
DS_MICRO(11)
DS_MICRO(12)
/* Prefetching micro-tiles for a product's first row block: 12 rows (ds_gemm_rows' first tile), and 2..11 rows for
   a first block of fewer than 12 (a classifier or a CTC head over a few time steps), whose whole product is its
   panels streamed once from memory: without the prefetches only the hardware's stream prefetcher kept reads in
   flight (ddddocr_common's 1024 x 8210 head at 8 rows: 4.0 ms, 8.3 GB/s, where onnxruntime took 3.1). The same
   multiply-adds in the same order as ds_micro_MR: the same results. */
#define DS_PMICRO(MR) DS_MICRO_OF(ds_pmicro, MR, DS_ROW_INIT, DS_GLOAD_B2, DS_ROW_FMA, DS_ROW_STORE, DS_GPREFETCH)
DS_PMICRO(12)
DS_PMICRO(2)
DS_PMICRO(3)
DS_PMICRO(4)
DS_PMICRO(5)
DS_PMICRO(6)
DS_PMICRO(7)
DS_PMICRO(8)
DS_PMICRO(9)
DS_PMICRO(10)
DS_PMICRO(11)
DS_MICRO_OF(ds_xmicro, 12, DS_ROW_INIT, DS_GLOAD_B2, DS_ROW_FMA, DS_ROW_STORE, DS_GPREFETCH_NEXT)
#endif

/* One row of a narrow panel: the even and odd k summed apart and then added, as ds_micro_1 does for a full panel,
   so that a column sums in the same order whichever panel it falls in. Why: columns of equal data must give
   equal results (ONNX's light Inception v1 and ZFNet-512, as shipped, end in 1000 equal logits of 1.2e21 and a
   Softmax; the last panel's 8 columns, summed in one chain, came out 12 ulps above the others, and the Softmax
   gave them 1/8 each and the rest 0 where onnxruntime gives 1/1000 each). */
static void ds_nmicro_1(const float *restrict a, int64_t lda, const float *restrict bp, int64_t ps, int64_t k,
                        float *restrict c, int64_t ldc, int64_t ncols, const float *nx) {
    (void)lda; (void)ldc; (void)nx;
    ds_v16 c00 = {0}, e0 = {0};
    int64_t p = 0;
    for (; p + 1 < k; p += 2) {
        c00 += a[p] * ds_ld16(bp + p * ps);
        e0 += a[p + 1] * ds_ld16(bp + (p + 1) * ps);
    }
    c00 += e0;
    for (; p < k; p++) c00 += a[p] * ds_ld16(bp + p * ps);
    ds_store16(c, c00, ncols);
}
DS_NMICRO(2)
DS_NMICRO(4)
DS_NMICRO(8)
#else
/* Without AVX-512 (AVX2: Zen 2 / 3, Intel client cores, Haswell..Broadwell Xeons) the micro-kernels are written on
   8-float vectors, the machine's own: gcc 12 keeps a 64-byte ds_v16 that has no register mode in memory, every
   multiply-add a round trip through the stack (a 16 x 256 x 1024 product ran at 2 GFLOP/s on an AMD EPYC Zen 3,
   bert_small 25x slower than onnxruntime). A 32-column panel is two halves of 16 columns, each a micro-tile of
   MR rows x two 8-float vectors (4 rows: 8 accumulators, 2 panel vectors and a broadcast in the 16 ymm
   registers). Each output lane sums in the order of the AVX-512 kernels (one chain along k; one row: even and
   odd k apart, then added), so a column's result does not depend on which panel or half it falls in. */

/* One row, 16 columns: even and odd k in chains of their own, then added (ds_micro_1's order). */
static void ds_half_1(const float *restrict a, const float *restrict bp, int64_t ps, int64_t k, float *restrict c,
                      int64_t ncols) {
    ds_v8 c0 = {0}, c1 = {0}, e0 = {0}, e1 = {0};
    int64_t p = 0;
    for (; p + 1 < k; p += 2) {
        const float *q = bp + p * ps, *q1 = q + ps;
        c0 += a[p] * ds_ld8(q); c1 += a[p] * ds_ld8(q + 8);
        e0 += a[p + 1] * ds_ld8(q1); e1 += a[p + 1] * ds_ld8(q1 + 8);
    }
    c0 += e0; c1 += e1;
    for (; p < k; p++) { c0 += a[p] * ds_ld8(bp + p * ps); c1 += a[p] * ds_ld8(bp + p * ps + 8); }
    ds_store_half(c, c0, c1, ncols);
}
static void ds_micro_1(const float *restrict a, int64_t lda, const float *restrict bp, int64_t ps, int64_t k,
                       float *restrict c, int64_t ldc, int64_t ncols) {
    (void)lda; (void)ldc;
    ds_half_1(a, bp, ps, k, c, ncols);
    if (ncols > 16) ds_half_1(a, bp + 16, ps, k, c + 16, ncols - 16);
}
static void ds_nmicro_1(const float *restrict a, int64_t lda, const float *restrict bp, int64_t ps, int64_t k,
                        float *restrict c, int64_t ldc, int64_t ncols, const float *nx) {
    (void)lda; (void)ldc; (void)nx;
    ds_half_1(a, bp, ps, k, c, ncols);
}

#define DS_HROW_INIT(r) ds_v8 c##r##0 = {0}, c##r##1 = {0}; const float *a##r = a + r * lda;
#define DS_HROW_FMA(r) { const float x = a##r[p]; c##r##0 += x * b0; c##r##1 += x * b1; }
#define DS_HROW_STORE(r) ds_store_half(c + r * ldc, c##r##0, c##r##1, ncols);
#define DS_HALF(MR)                                                                                       \
    static void ds_half_##MR(const float *restrict a, int64_t lda, const float *restrict bp, int64_t ps,  \
                             int64_t k, float *restrict c, int64_t ldc, int64_t ncols) {                  \
        DS_ROWS##MR(DS_HROW_INIT)                                                                         \
        _Pragma("GCC unroll 4")                                                                           \
        for (int64_t p = 0; p < k; p++) {                                                                 \
            const ds_v8 b0 = ds_ld8(bp + p * ps), b1 = ds_ld8(bp + p * ps + 8);                           \
            DS_ROWS##MR(DS_HROW_FMA)                                                                      \
        }                                                                                                 \
        DS_ROWS##MR(DS_HROW_STORE)                                                                        \
    }
#define DS_MICRO(MR)                                                                                      \
    DS_HALF(MR)                                                                                           \
    static void ds_micro_##MR(const float *restrict a, int64_t lda, const float *restrict bp, int64_t ps, \
                              int64_t k, float *restrict c, int64_t ldc, int64_t ncols, const float *nx) { \
        (void)nx;                                                                                         \
        ds_half_##MR(a, lda, bp, ps, k, c, ldc, ncols);                                                   \
        if (ncols > 16) ds_half_##MR(a, lda, bp + 16, ps, k, c + 16, ldc, ncols - 16);                    \
    }
DS_MICRO(2)
DS_MICRO(3)
DS_MICRO(4)
static void ds_nmicro_2(const float *restrict a, int64_t lda, const float *restrict bp, int64_t ps, int64_t k,
                        float *restrict c, int64_t ldc, int64_t ncols, const float *nx) {
    (void)nx;
    ds_half_2(a, lda, bp, ps, k, c, ldc, ncols);
}
static void ds_nmicro_4(const float *restrict a, int64_t lda, const float *restrict bp, int64_t ps, int64_t k,
                        float *restrict c, int64_t ldc, int64_t ncols, const float *nx) {
    (void)nx;
    ds_half_4(a, lda, bp, ps, k, c, ldc, ncols);
}
/* 6 rows: 12 accumulators, two panel vectors and the broadcast, 15 of the 16 ymm registers (4 rows left half of
   them idle); the tiles of 6 run first, as the 12-row ones do with AVX-512 */
DS_MICRO(6)
static void ds_nmicro_6(const float *restrict a, int64_t lda, const float *restrict bp, int64_t ps, int64_t k,
                        float *restrict c, int64_t ldc, int64_t ncols, const float *nx) {
    (void)nx;
    ds_half_6(a, lda, bp, ps, k, c, ldc, ncols);
}
#endif
#if DS_MR16 > 8
DS_NMICRO(24)
#endif

/* Rows i0..i1 of at most 16 columns: micro-tiles of DS_MR16 rows, the rest in halving steps. */
static void ds_gemm_narrow(const float *restrict a, int64_t lda, const float *restrict panel, int64_t ps,
                           float *restrict c, int64_t ldc, int64_t i0, int64_t i1, int64_t ncols, int64_t k) {
    int64_t i = i0;
#define DS_NSTEP(MR)                                                                                      \
    for (; i1 - i >= MR; i += MR) ds_nmicro_##MR(a + i * lda, lda, panel, ps, k, c + i * ldc, ldc, ncols, 0);
#if DS_MR16 > 8
    DS_NSTEP(24)
#endif
#ifdef __AVX512F__
    DS_NSTEP(8)
#else
    DS_NSTEP(6)
#endif
    DS_NSTEP(4) DS_NSTEP(2) DS_NSTEP(1)
#undef DS_NSTEP
}

/* ds_gemm_panel's rows, prefetching the panel when `pf`, and the `nl` floats at `next` (the next tile's panel)
   into L2 over the micro-tiles after the first. */
static void ds_gemm_rows(const float *restrict a, int64_t lda, const float *restrict panel, int64_t ps,
                         float *restrict c, int64_t ldc, int64_t i0, int64_t i1, int64_t ncols, int64_t k, int pf,
                         const float *next, int64_t nl) {
    if (ncols <= 16) {
        ds_gemm_narrow(a, lda, panel, ps, c, ldc, i0, i1, ncols, k);
        return;
    }
    int64_t i = i0;
    (void)pf; (void)next; (void)nl;
#if DS_MR > 4
    if (pf && i1 - i >= 12) { /* the panel's first use in this call: the first micro-tile prefetches it */
        ds_pmicro_12(a + i * lda, lda, panel, ps, k, c + i * ldc, ldc, ncols, 0);
        i += 12;
    } else if (pf && i1 - i >= 2) { /* a block of 2..11 rows: one micro-tile, prefetching (see DS_PMICRO) */
        const float *ai = a + i * lda;
        float *ci = c + i * ldc;
        switch (i1 - i) {
#define DS_PCASE(MR) case MR: ds_pmicro_##MR(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
        DS_PCASE(2) DS_PCASE(3) DS_PCASE(4) DS_PCASE(5) DS_PCASE(6) DS_PCASE(7) DS_PCASE(8) DS_PCASE(9) DS_PCASE(10)
        default: ds_pmicro_11(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
#undef DS_PCASE
        }
        return;
    }
    for (; nl > 0 && i1 - i >= 12; i += 12, next += k * 16, nl -= k * 16)
        ds_xmicro_12(a + i * lda, lda, panel, ps, k, c + i * ldc, ldc, ncols, next);
#else
    for (; i1 - i >= 6; i += 6) ds_micro_6(a + i * lda, lda, panel, ps, k, c + i * ldc, ldc, ncols, 0);
#endif
    for (; i < i1; i += DS_MR) {
        const int64_t mr = i1 - i < DS_MR ? i1 - i : DS_MR;
        const float *ai = a + i * lda;
        float *ci = c + i * ldc;
        switch (mr) {
        case 1: ds_micro_1(ai, lda, panel, ps, k, ci, ldc, ncols); break;
        case 2: ds_micro_2(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
        case 3: ds_micro_3(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
#if DS_MR > 4
        case 4: ds_micro_4(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
        case 5: ds_micro_5(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
        case 6: ds_micro_6(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
        case 7: ds_micro_7(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
        case 8: ds_micro_8(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
        case 9: ds_micro_9(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
        case 10: ds_micro_10(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
        case 11: ds_micro_11(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
        default: ds_micro_12(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
#else
        default: ds_micro_4(ai, lda, panel, ps, k, ci, ldc, ncols, 0); break;
#endif
        }
    }
}

/* Rows i0..i1 of C (row stride ldc) = A (row stride lda) @ one panel of B: ncols <= 32 columns whose rows are
   ps floats apart. Micro-tiles of DS_MR rows down the block, a shorter one at the bottom. Tiles are
   independent, so a parallel loop over them needs no synchronisation. Callers pass rows relative to their own
   pointers (i0 is often 0 for every call), so nothing here can tell a panel's first use: no prefetching. */
void ds_gemm_panel(const float *restrict a, int64_t lda, const float *restrict panel, int64_t ps,
                   float *restrict c, int64_t ldc, int64_t i0, int64_t i1, int64_t ncols, int64_t k) {
    ds_gemm_rows(a, lda, panel, ps, c, ldc, i0, i1, ncols, k, 0, 0, 0);
}

/* Packs this large (VGG-19's classifier: 103 M floats) are compile-time weights: both cores share the copy and
   its first touch of fresh pages (a warm load_onnx + compile of VGG-19 is mostly these two passes over memory). */
#define DS_PAR_PACK_FLOATS (1 << 22)

/* B (k x n, row stride ldb) into panels of 32 columns, zero padded: the layout pack_b makes, at run time. */
static void ds_pack_panel(const float *restrict b, int64_t ldb, int64_t k, int64_t n, float *restrict bp, int64_t q) {
    const int64_t nc = n - q * 32 < 32 ? n - q * 32 : 32;
    float *dst = bp + q * k * 32;
    for (int64_t p = 0; p < k; p++) {
        const float *src = b + p * ldb + q * 32;
        int64_t j = 0;
        for (; j < nc; j++) dst[p * 32 + j] = src[j];
        for (; j < 32; j++) dst[p * 32 + j] = 0.0f;
    }
}

typedef void (*ds_panel_packer)(const float *restrict, int64_t, int64_t, int64_t, float *restrict, int64_t);

/* Every panel by `pack`; below DS_PAR_PACK_FLOATS without an OpenMP region: attention packs per batch matrix from
   inside its own parallel loop, where even an `if(0)` region costs a nested team's setup (0.2 us a call). */
static void ds_pack_each(ds_panel_packer pack, const float *restrict src, int64_t ld, int64_t k, int64_t n,
                         float *restrict bp) {
    const int64_t panels = (n + 31) / 32;
    if (n * k < DS_PAR_PACK_FLOATS) {
        for (int64_t q = 0; q < panels; q++) pack(src, ld, k, n, bp, q);
        return;
    }
    #pragma omp parallel for schedule(static)
    for (int64_t q = 0; q < panels; q++) pack(src, ld, k, n, bp, q);
}

void ds_pack_panels(const float *restrict b, int64_t ldb, int64_t k, int64_t n, float *restrict bp) {
    ds_pack_each(ds_pack_panel, b, ldb, k, n, bp);
}

/* The same panels for B = transpose(A), A n x k with row stride lda (a Gemm's transB weights, attention's K as
   the model stores it): blocks of 64 rows of a panel at a time, so the block being written (8 KB) stays in L1
   while each of the panel's 32 source rows contributes its 64 contiguous floats. */
#ifdef __AVX512F__
/* out[l] = column l of the 16 x 16 block at src (rows lda floats apart): four rounds of shuffles in registers. */
static inline void ds_transpose16(const float *restrict src, int64_t lda, __m512 out[16]) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * lda);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = (__m512)_mm512_unpacklo_pd((__m512d)t[i], (__m512d)t[i + 2]);
        r[i + 1] = (__m512)_mm512_unpackhi_pd((__m512d)t[i], (__m512d)t[i + 2]);
        r[i + 2] = (__m512)_mm512_unpacklo_pd((__m512d)t[i + 1], (__m512d)t[i + 3]);
        r[i + 3] = (__m512)_mm512_unpackhi_pd((__m512d)t[i + 1], (__m512d)t[i + 3]);
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        out[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        out[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
    }
}
#endif

static void ds_pack_panel_t(const float *restrict a, int64_t lda, int64_t k, int64_t n, float *restrict bp,
                            int64_t q) {
    const int64_t nc = n - q * 32 < 32 ? n - q * 32 : 32;
    float *dst = bp + q * k * 32;
    for (int64_t p0 = 0; p0 < k; p0 += 64) {
        const int64_t p1 = p0 + 64 < k ? p0 + 64 : k;
        int64_t j = 0;
#ifdef __AVX512F__
        /* 16 x 16 blocks transposed in registers (attention packs K per call: mobilevit's 144 x 16 took 1.4 us
           element by element, a tenth of its products), the rest element by element */
        for (; j + 16 <= nc; j += 16) {
            int64_t p = p0;
            for (; p + 16 <= p1; p += 16) {
                __m512 o[16];
                ds_transpose16(a + (q * 32 + j) * lda + p, lda, o);
                for (int l = 0; l < 16; l++) _mm512_storeu_ps(dst + (p + l) * 32 + j, o[l]);
            }
            for (; p < p1; p++)
                for (int64_t i = 0; i < 16; i++) dst[p * 32 + j + i] = a[(q * 32 + j + i) * lda + p];
        }
#endif
        for (; j < nc; j++) {
            const float *src = a + (q * 32 + j) * lda;
            for (int64_t p = p0; p < p1; p++) dst[p * 32 + j] = src[p];
        }
        if (nc < 32) /* the columns past n: zeros, each row's run at once */
            for (int64_t p = p0; p < p1; p++)
                for (int64_t jj = nc; jj < 32; jj++) dst[p * 32 + jj] = 0.0f;
    }
}

void ds_pack_panels_t(const float *restrict a, int64_t lda, int64_t k, int64_t n, float *restrict bp) {
    ds_pack_each(ds_pack_panel_t, a, lda, k, n, bp);
}

/* A convolution's weights w (co, cig, taps) (taps = KH * KW, OIHW order as ONNX stores them), each output channel
   o times scale[o] when `scale` is not NULL (a BatchNormalization folded in while packing), as per group g the
   panels [ceil(cog / 32)][taps * cig][32] whose row k = t * cig + c holds w[g * cog + q * 32 + j][c][t] in column
   j (zero past the group's cog channels), groups one after another: the layout ds_conv_tile reads. One pass
   (each panel, at most 32 * taps * cig floats, is written while it sits in L2; w read in order): a transposed
   copy and then a pack wrote every weight twice to fresh pages, and fresh pages cost ~2 us each here. */
void ds_pack_conv(const float *restrict w, int64_t co, int64_t cig, int64_t taps, int64_t groups,
                  const float *restrict scale, float *restrict out) {
    const int64_t cog = co / groups, panels = (cog + 31) / 32, k = taps * cig;
    #pragma omp parallel for schedule(static) if(co * k >= DS_PAR_PACK_FLOATS)
    for (int64_t gq = 0; gq < groups * panels; gq++) {
        const int64_t g = gq / panels, q = gq % panels;
        const int64_t nc = cog - q * 32 < 32 ? cog - q * 32 : 32;
        float *dst = out + gq * k * 32;
        int64_t j = 0;
        for (; j < nc; j++) {
            const int64_t o = g * cog + q * 32 + j;
            const float *src = w + o * k, s = scale ? scale[o] : 1.0f;
            for (int64_t c = 0; c < cig; c++)
                for (int64_t t = 0; t < taps; t++) dst[(t * cig + c) * 32 + j] = scale ? src[c * taps + t] * s
                                                                                        : src[c * taps + t];
        }
        for (; j < 32; j++)
            for (int64_t r = 0; r < k; r++) dst[r * 32 + j] = 0.0f;
    }
}

/* A 3x3 convolution's weights w (co, ci, 3, 3) as Winograd F(tile x tile, 3x3)'s transformed matrices: per
   position x of the (tile + 2)^2 patch, U_x (ci x co) in 32-column panels, out[x][q][c][j] = (G w[q * 32 + j][c]
   G^T)[x], zero past co; G is `g` (tile + 2 rows of 3, row-major), the products in double, rounded once. In C
   (each panel's columns written 32 at a time): numpy's einsum took 0.16 s for one 512 x 512 layer, and the
   packs are on the path of every warm compile. */
void ds_pack_winograd(const float *restrict w, int64_t co, int64_t ci, int64_t a, const double *restrict g,
                      float *restrict out) {
    const int64_t panels = (co + 31) / 32, np_ = a * a;
    #pragma omp parallel for schedule(static) if(co * ci >= (1 << 14))
    for (int64_t q = 0; q < panels; q++)
        for (int64_t c = 0; c < ci; c++)
            for (int64_t j = 0; j < 32; j++) {
                const int64_t o = q * 32 + j;
                double u[64];
                if (o < co) {
                    const float *k = w + (o * ci + c) * 9;
                    double t[8][3]; /* G k */
                    for (int64_t r = 0; r < a; r++)
                        for (int64_t s = 0; s < 3; s++)
                            t[r][s] = g[r * 3] * k[s] + g[r * 3 + 1] * k[3 + s] + g[r * 3 + 2] * k[6 + s];
                    for (int64_t r = 0; r < a; r++) /* (G k) G^T */
                        for (int64_t s = 0; s < a; s++)
                            u[r * a + s] = t[r][0] * g[s * 3] + t[r][1] * g[s * 3 + 1] + t[r][2] * g[s * 3 + 2];
                }
                for (int64_t x = 0; x < np_; x++)
                    out[((x * panels + q) * ci + c) * 32 + j] = o < co ? (float)u[x] : 0.0f;
            }
}

/* The tile (rows i0..i1, panel q) of C = A @ B with B packed by pack_b. */
void ds_gemm_tile(const float *restrict a, int64_t lda, const float *restrict bp, float *restrict c,
                  int64_t ldc, int64_t i0, int64_t i1, int64_t q, int64_t n, int64_t k) {
    ds_gemm_rows(a, lda, bp + q * k * 32, 32, c + q * 32, ldc, i0, i1, n - q * 32 < 32 ? n - q * 32 : 32, k, 0, 0,
                 0);
}

/* Packed weights from which ds_gemm_block prefetches the next tile's panel (the prefetch costs 2% on a product
   whose 256 KB of weights stay in L2: 2000 x 256 x 256). */
#define DS_GEMM_NEXT_MIN_BYTES (1 << 20)

/* ds_gemm_tile for a caller whose i0 is the row of the whole product (its row blocks over A and C from row 0) and
   whose tiles run block-major (a block's panels in order, then the next block's): the block at row 0 is each
   panel's first use in the call, and its first micro-tile prefetches it; every tile brings the next one's panel
   (q + 1, or the next block's first) into L2 while it computes. Weights over L2 (text recognition's 192 x 6625
   classifier: 5 MB) are otherwise read from L3 by every block's first micro-tile of each panel, ~4x slower than
   from L2 (see ds_conv.c's pairs). */
void ds_gemm_block(const float *restrict a, int64_t lda, const float *restrict bp, float *restrict c,
                   int64_t ldc, int64_t i0, int64_t i1, int64_t q, int64_t n, int64_t k) {
    const int64_t panels = (n + 31) / 32;
    const int64_t nl = panels * k * 32 * 4 > DS_GEMM_NEXT_MIN_BYTES ? k * 32 : 0; /* smaller weights stay in L2 */
    ds_gemm_rows(a, lda, bp + q * k * 32, 32, c + q * 32, ldc, i0, i1, n - q * 32 < 32 ? n - q * 32 : 32, k,
                 i0 == 0, bp + (q + 1 < panels ? q + 1 : 0) * k * 32, nl);
}

/* C = A @ B for B packed by pack_b, tiles in parallel: the product alone, without an epilogue. */
void ds_gemm_packed(const float *restrict a, int64_t lda, const float *restrict bp, float *restrict c,
                    int64_t ldc, int64_t m, int64_t n, int64_t k) {
    const int64_t blocks = (m + DS_ROW_BLOCK - 1) / DS_ROW_BLOCK, panels = (n + 31) / 32;
    #pragma omp parallel for collapse(2) schedule(static) if(m * n * k >= DS_PAR_MIN_FLOPS)
    for (int64_t rb = 0; rb < blocks; rb++)
        for (int64_t q = 0; q < panels; q++) {
            const int64_t r0 = rb * DS_ROW_BLOCK, r1 = r0 + DS_ROW_BLOCK < m ? r0 + DS_ROW_BLOCK : m;
            ds_gemm_block(a, lda, bp, c, ldc, r0, r1, q, n, k);
        }
}

/* ---- products reading a transposed weight in place ((n, k) rows, k contiguous: Gemm's transB) -------------
   For products of a few rows (a classifier at batch <= 8) the weights are streamed from memory once a call and
   nothing is reused: each output is a dot product of an A row with a B row. Reading B's rows in place, several
   rows at once, keeps more streams in flight than one packed panel does (one core, VGG-19's 25088 x 4096
   classifier at 1 row: 21.6 ms in place vs 31.2 ms packed; AlexNet's 9216 x 4096: 6.4 vs 10.7 ms), and the
   compile makes no packed copy (VGG-19: 411 MB and 0.16 s less). Micro-tiles: MR rows of A x NB rows of B,
   MR * NB vector accumulators along k, summed across lanes at the end; k's tail (k % DS_NTL) in scalars. */
/* The vectors along k: 16 floats with AVX-512, else the machine's 8 (ds_simd.h's ds_v8: a 64-byte ds_v16 lives in
   memory without AVX-512). */
#ifdef __AVX512F__
typedef ds_v16 ds_ntv;
#define DS_NTL 16
#define ds_nt_ld ds_ld16
#else
typedef ds_v8 ds_ntv;
#define DS_NTL 8
#define ds_nt_ld ds_ld8
#endif
static inline float ds_hsum_nt(ds_ntv v) {
    float s = 0.0f;
    for (int i = 0; i < DS_NTL; i++) s += v[i];
    return s;
}
#define DS_NT_MICRO(MR, NB)                                                                               \
    static void ds_nt_##MR##x##NB(const float *restrict a, int64_t lda, const float *restrict b, int64_t k, \
                                  float *restrict c, int64_t ldc) {                                       \
        ds_ntv acc[MR][NB];                                                                               \
        for (int r = 0; r < MR; r++)                                                                      \
            for (int j = 0; j < NB; j++) acc[r][j] = (ds_ntv){0};                                         \
        int64_t p = 0;                                                                                    \
        for (; p + DS_NTL <= k; p += DS_NTL) {                                                            \
            ds_ntv bv[NB];                                                                                \
            for (int j = 0; j < NB; j++) bv[j] = ds_nt_ld(b + j * k + p);                                 \
            for (int r = 0; r < MR; r++) {                                                                \
                const ds_ntv av = ds_nt_ld(a + r * lda + p);                                              \
                for (int j = 0; j < NB; j++) acc[r][j] += av * bv[j];                                     \
            }                                                                                             \
        }                                                                                                 \
        for (int r = 0; r < MR; r++)                                                                      \
            for (int j = 0; j < NB; j++) {                                                                \
                float s = ds_hsum_nt(acc[r][j]);                                                          \
                for (int64_t t = p; t < k; t++) s += a[r * lda + t] * b[j * k + t];                       \
                c[r * ldc + j] = s;                                                                       \
            }                                                                                             \
    }
DS_NT_MICRO(1, 8)
DS_NT_MICRO(2, 8)
DS_NT_MICRO(1, 1)
DS_NT_MICRO(2, 1)
#if DS_MR > 4
DS_NT_MICRO(4, 4)
DS_NT_MICRO(6, 4)
DS_NT_MICRO(4, 1)
DS_NT_MICRO(6, 1)
#endif

/* Rows i0..i1 of C = A @ B^T for B (n, k) row-major, the 32 columns of panel q (ds_gemm_block's tile). */
void ds_gemm_block_nt(const float *restrict a, int64_t lda, const float *restrict b, float *restrict c,
                      int64_t ldc, int64_t i0, int64_t i1, int64_t q, int64_t n, int64_t k) {
    const int64_t j0 = q * 32, j1 = n - j0 < 32 ? n : j0 + 32;
    int64_t i = i0;
#define DS_NT_STEP(MR, NB)                                                                                \
    for (; i1 - i >= MR; i += MR) {                                                                       \
        int64_t j = j0;                                                                                   \
        for (; j1 - j >= NB; j += NB) ds_nt_##MR##x##NB(a + i * lda, lda, b + j * k, k, c + i * ldc + j, ldc); \
        for (; j < j1; j++) ds_nt_##MR##x1(a + i * lda, lda, b + j * k, k, c + i * ldc + j, ldc);         \
    }
#if DS_MR > 4
    DS_NT_STEP(6, 4)
    DS_NT_STEP(4, 4)
#endif
    DS_NT_STEP(2, 8)
    DS_NT_STEP(1, 8)
#undef DS_NT_STEP
}

void ds_layernorm_row(const float *x, float *y, const float *restrict scale, const float *restrict bias,
                      int64_t n, float eps) {
    ds_layernorm_row_inline(x, y, scale, bias, n, eps);
}

/* ds_layernorm_row with its two sums in two 16-lane accumulators each, added as a tree (ds_tree_sum16): the same
   two-pass mean and variance, summed in another order, so its float32 results differ from ds_layernorm_row's in
   the last bits, which precision="bf16" products (the callers) allow. gcc's `omp simd reduction` loops there keep
   one accumulator (a chain of dependent adds) and end with the lanes added one by one: about 1.3 cycles a value on
   a 256-wide row on Zen 4, against the product's 8 multiply-adds a value per 256 output columns. Tails (n not a
   multiple of 32) are summed one by one. x and y may be the same row. */
void ds_layernorm_row_tree(const float *x, float *y, const float *restrict scale, const float *restrict bias,
                           int64_t n, float eps) {
    const int64_t n32 = n / 32 * 32;
    ds_v16 a0 = {0}, a1 = {0};
    for (int64_t i = 0; i < n32; i += 32) {
        a0 += ds_ld16(x + i);
        a1 += ds_ld16(x + i + 16);
    }
    float s = ds_tree_sum16(a0 + a1);
    for (int64_t i = n32; i < n; i++) s += x[i];
    const float mean = s / (float)n;
    ds_v16 b0 = {0}, b1 = {0};
    for (int64_t i = 0; i < n32; i += 32) {
        const ds_v16 d0 = ds_ld16(x + i) - mean, d1 = ds_ld16(x + i + 16) - mean;
        b0 += d0 * d0;
        b1 += d1 * d1;
    }
    float v = ds_tree_sum16(b0 + b1);
    for (int64_t i = n32; i < n; i++) v += (x[i] - mean) * (x[i] - mean);
    const float rstd = 1.0f / sqrtf(v / (float)n + eps);
    for (int64_t i = 0; i < n32; i += 16) {
        const ds_v16 t = (ds_ld16(x + i) - mean) * rstd * ds_ld16(scale + i);
        ds_st16(y + i, bias ? t + ds_ld16(bias + i) : t);
    }
    for (int64_t i = n32; i < n; i++) y[i] = (x[i] - mean) * rstd * scale[i] + (bias ? bias[i] : 0.0f);
}

/* A softmax row's second pass for generated kernels (ds_softmax_row.h says why it is not generated). */
float ds_softmax_exp_sum(float *restrict row, int64_t n, float mx) { return ds_softmax_exp_row(row, n, mx); }
/* ... with the exps a bf16 attention rounds before its product by V (ds_vmath.h's ds_expf_nonpos16_bf16). */
float ds_softmax_exp_sum_bf16(float *restrict row, int64_t n, float mx) {
    return ds_softmax_exp_to_as(row, row, n, mx, 1);
}

/* Attention at decode time: a few query rows against n keys. Packing K and V into panels (as the row blocks of a
   prefill do) reads and writes every key once more than the product itself, and with one query row that is most of
   the work: a decoder step at 2,048 past tokens spent its time packing. These read K's and V's rows where they lie.
   ds_dot_rows: out[j] = q . k[j] (k's rows of d floats), four keys at a time; ds_axpy_rows: o = sum_j p[j] v[j]
   (v's rows of dv floats), sixteen columns at a time in registers. */
#ifdef __AVX512F__
void ds_dot_rows(const float *restrict q, const float *restrict k, int64_t n, int64_t d, float *restrict out) {
    /* vector accumulators summed as trees (ds_tree_sum16): `omp simd reduction` ended each dot product with its
       16 lanes added one by one, 64 dependent scalar adds per four keys; d's tail masked, never read past */
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + j * d, *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
        ds_v16 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (int64_t p = 0; p < d; p += 16) {
            const int64_t m = d - p;
            const ds_v16 qv = ds_load16(q + p, m);
            s0 += qv * ds_load16(k0 + p, m); s1 += qv * ds_load16(k1 + p, m);
            s2 += qv * ds_load16(k2 + p, m); s3 += qv * ds_load16(k3 + p, m);
        }
        out[j] = ds_tree_sum16(s0); out[j + 1] = ds_tree_sum16(s1);
        out[j + 2] = ds_tree_sum16(s2); out[j + 3] = ds_tree_sum16(s3);
    }
    for (; j < n; j++) {
        const float *kj = k + j * d;
        ds_v16 s = {0};
        for (int64_t p = 0; p < d; p += 16) s += ds_load16(q + p, d - p) * ds_load16(kj + p, d - p);
        out[j] = ds_tree_sum16(s);
    }
}

void ds_axpy_rows(const float *restrict p, const float *restrict v, int64_t n, int64_t dv, float *restrict o) {
    /* 64 columns at a time in four independent accumulators: with one, each key's multiply-add waited for the
       previous one's (a chain of n FMA latencies per 16 columns) */
    int64_t c0 = 0;
    for (; c0 + 64 <= dv; c0 += 64) {
        ds_v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int64_t j = 0; j < n; j++) {
            const float pj = p[j];
            const float *vj = v + j * dv + c0;
            a0 += pj * ds_ld16(vj); a1 += pj * ds_ld16(vj + 16);
            a2 += pj * ds_ld16(vj + 32); a3 += pj * ds_ld16(vj + 48);
        }
        ds_st16(o + c0, a0); ds_st16(o + c0 + 16, a1); ds_st16(o + c0 + 32, a2); ds_st16(o + c0 + 48, a3);
    }
    for (; c0 < dv; c0 += 16) { /* the rest 16 at a time, two keys in flight */
        const int64_t w = dv - c0 < 16 ? dv - c0 : 16;
        ds_v16 a0 = {0}, a1 = {0};
        int64_t j = 0;
        for (; j + 2 <= n; j += 2) {
            a0 += p[j] * ds_load16(v + j * dv + c0, w);
            a1 += p[j + 1] * ds_load16(v + (j + 1) * dv + c0, w);
        }
        if (j < n) a0 += p[j] * ds_load16(v + j * dv + c0, w);
        ds_store16(o + c0, a0 + a1, w);
    }
}
#else
/* Without AVX-512: the same loops on the machine's 8-float vectors (ds_simd.h's ds_v8: a 64-byte ds_v16 lives in
   memory there; a decode step's attention over a 2048-token past ran 2.7x slower than onnxruntime's on Zen 3). */

void ds_dot_rows(const float *restrict q, const float *restrict k, int64_t n, int64_t d, float *restrict out) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + j * d, *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
        ds_v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, t0 = {0}, t1 = {0}, t2 = {0}, t3 = {0};
        int64_t p = 0;
        for (; p + 16 <= d; p += 16) {
            const ds_v8 ql = ds_ld8(q + p), qh = ds_ld8(q + p + 8);
            s0 += ql * ds_ld8(k0 + p); t0 += qh * ds_ld8(k0 + p + 8);
            s1 += ql * ds_ld8(k1 + p); t1 += qh * ds_ld8(k1 + p + 8);
            s2 += ql * ds_ld8(k2 + p); t2 += qh * ds_ld8(k2 + p + 8);
            s3 += ql * ds_ld8(k3 + p); t3 += qh * ds_ld8(k3 + p + 8);
        }
        if (p < d) {
            const int64_t m = d - p;
            const ds_v8 ql = ds_ld8n(q + p, m), qh = ds_ld8n(q + p + 8, m - 8);
            s0 += ql * ds_ld8n(k0 + p, m); t0 += qh * ds_ld8n(k0 + p + 8, m - 8);
            s1 += ql * ds_ld8n(k1 + p, m); t1 += qh * ds_ld8n(k1 + p + 8, m - 8);
            s2 += ql * ds_ld8n(k2 + p, m); t2 += qh * ds_ld8n(k2 + p + 8, m - 8);
            s3 += ql * ds_ld8n(k3 + p, m); t3 += qh * ds_ld8n(k3 + p + 8, m - 8);
        }
        out[j] = ds_hsum8(s0 + t0); out[j + 1] = ds_hsum8(s1 + t1);
        out[j + 2] = ds_hsum8(s2 + t2); out[j + 3] = ds_hsum8(s3 + t3);
    }
    for (; j < n; j++) {
        const float *kj = k + j * d;
        ds_v8 s = {0}, t = {0};
        for (int64_t p = 0; p < d; p += 16) {
            s += ds_ld8n(q + p, d - p) * ds_ld8n(kj + p, d - p);
            t += ds_ld8n(q + p + 8, d - p - 8) * ds_ld8n(kj + p + 8, d - p - 8);
        }
        out[j] = ds_hsum8(s + t);
    }
}

void ds_axpy_rows(const float *restrict p, const float *restrict v, int64_t n, int64_t dv, float *restrict o) {
    int64_t c0 = 0;
    for (; c0 + 32 <= dv; c0 += 32) { /* four independent accumulators, as the AVX-512 loop's */
        ds_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int64_t j = 0; j < n; j++) {
            const float pj = p[j];
            const float *vj = v + j * dv + c0;
            a0 += pj * ds_ld8(vj); a1 += pj * ds_ld8(vj + 8);
            a2 += pj * ds_ld8(vj + 16); a3 += pj * ds_ld8(vj + 24);
        }
        ds_st8(o + c0, a0); ds_st8(o + c0 + 8, a1); ds_st8(o + c0 + 16, a2); ds_st8(o + c0 + 24, a3);
    }
    for (; c0 < dv; c0 += 8) { /* the rest 8 at a time, two keys in flight */
        const int64_t w = dv - c0 < 8 ? dv - c0 : 8;
        ds_v8 a0 = {0}, a1 = {0};
        int64_t j = 0;
        for (; j + 2 <= n; j += 2) {
            a0 += p[j] * ds_ld8n(v + j * dv + c0, w);
            a1 += p[j + 1] * ds_ld8n(v + (j + 1) * dv + c0, w);
        }
        if (j < n) a0 += p[j] * ds_ld8n(v + j * dv + c0, w);
        ds_st8n(o + c0, a0 + a1, w);
    }
}
#endif
