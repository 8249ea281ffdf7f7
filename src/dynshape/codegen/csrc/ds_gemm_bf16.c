/* Products by a constant matrix in bfloat16: operands rounded to bf16 (round to nearest even, denormals to zero, as
   the hardware's VCVTNE2PS2BF16 does), products accumulated in float32. What `Options.precision` = "bf16" lowers a
   product by packed weights to; the epilogue of the generated kernel around it (bias, GELU, residual, a layer norm)
   stays float32.

   Why these shapes. Weights are rounded and packed once at compile time (codegen/bf16.py: pack_b_bf16) into
   panels of 32 columns whose rows hold pairs of consecutive k: row p of a panel is the 64 bf16
   (B[2p][j], B[2p+1][j]) for j = 0..31, what VDPBF16PS multiplies against a broadcast pair (A[i][2p], A[i][2p+1]).
   Activations are rounded as a tile's rows are converted into per-thread scratch, inside the call, never as a
   separate pass over memory; a thread converts a block of rows once for all the panels it computes in one kernel
   call (the memo is keyed by the call's epoch, `ds_bf16_epoch`, which a generated kernel takes once per call, so
   a converted block never outlives the call that made it).

   Two ways to run a product, one layout of weights:
   - native (compiled where the compiler targets AVX512-BF16: Zen 4, Cooper Lake, Sapphire Rapids):
     MR x 32 micro-tiles of VDPBF16PS, 2 * MR accumulators; and, where the CPU has AMX-BF16 and Linux grants its
     tiles, TDPBF16PS tiles for calls of 4 rows and more (chosen per call at run time, below);
   - emulated (`precision="bf16-emulated"`, every CPU): the same rounding of both operands, then dynshape's float32
     micro-kernels (ds_gemm.c) on the rounded values, whose products are exact in float32. Tests compare the native
     path with it, so a CPU without AVX512-BF16 still checks the rounding and the layout of the scratch. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds_conv.h"
#include "ds_conv_common.h"
#include "ds_gemm.h"
#include "ds_gemm_bf16.h"
#include "ds_prelude.h"
#include "ds_simd.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define DS_BF16_NATIVE 1
#else
#define DS_BF16_NATIVE 0
#endif
#include "ds_amx.h"
#include "ds_bf16_round.h"
#if DS_BF16_NATIVE && DS_AMX && defined(__AMX_BF16__)
#define DS_BF16_AMX 1
#else
#define DS_BF16_AMX 0
#endif

int ds_bf16_native(void) { return DS_BF16_NATIVE; }

static int64_t ds_bf16_calls;

/* A fresh value per kernel call: the key under which a thread's converted rows are valid. */
int64_t ds_bf16_epoch(void) { return __atomic_add_fetch(&ds_bf16_calls, 1, __ATOMIC_RELAXED); }

/* n floats as bf16 (for the packer and the tests: one definition of the rounding). */
void ds_round_bf16(const float *restrict x, int64_t n, uint16_t *restrict out) {
    for (int64_t i = 0; i < n; i++) out[i] = ds_to_bf16(x[i]);
}

/* A thread's scratch: the rows of A last converted, and what they were. */
static __thread void *ds_scratch;
static __thread int64_t ds_scratch_bytes, ds_memo_ep = -1, ds_memo_rows, ds_memo_lda, ds_memo_k, ds_memo_kind;
static __thread const float *ds_memo_a;

static void *ds_scratch_for(int64_t bytes) {
    if (bytes > ds_scratch_bytes) {
        free(ds_scratch);
        ds_scratch = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
        ds_scratch_bytes = ds_scratch ? bytes : 0;
        ds_memo_ep = -1;
    }
    return ds_scratch;
}

/* Whether rows (a, rows, lda, k) of `kind` are what the scratch holds for call `ep`; if not, it will. */
static int ds_memo_hit(const float *a, int64_t rows, int64_t lda, int64_t k, int64_t kind, int64_t ep) {
    if (ep > 0 && ds_memo_ep == ep && ds_memo_a == a && ds_memo_rows == rows && ds_memo_lda == lda &&
        ds_memo_k == k && ds_memo_kind == kind)
        return 1;
    ds_memo_ep = ep; ds_memo_a = a; ds_memo_rows = rows; ds_memo_lda = lda; ds_memo_k = k; ds_memo_kind = kind;
    return 0;
}

/* ---- emulated: rounded float32 operands on the float32 micro-kernels ------------------------------------------ */
static const float *ds_rows_rounded(const float *a, int64_t lda, int64_t rows, int64_t k, int64_t ep) {
    float *buf = ds_scratch_for(rows * k * 4);
    if (!buf) abort();
    if (ds_memo_hit(a, rows, lda, k, 1, ep)) return buf;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t p = 0; p < k; p++) buf[r * k + p] = ds_from_bf16(ds_to_bf16(a[r * lda + p]));
    return buf;
}

/* ds_gemm_block's tile (rows i0..i1, panel q) with both operands rounded to bf16: bp holds pack_b of the rounded
   weights (float32 panels). */
void ds_gemm_block_bf16e(const float *restrict a, int64_t lda, const void *bp, float *restrict c, int64_t ldc,
                         int64_t i0, int64_t i1, int64_t q, int64_t n, int64_t k, int64_t ep) {
    const float *ar = ds_rows_rounded(a + i0 * lda, lda, i1 - i0, k, ep);
    ds_gemm_tile(ar, k, (const float *)bp, c + i0 * ldc, ldc, 0, i1 - i0, q, n, k);
}

/* ds_gemm_panel (rows i0..i1 of one panel of at most 32 columns) with both operands rounded. */
void ds_gemm_panel_bf16e(const float *restrict a, int64_t lda, const void *panel, float *restrict c, int64_t ldc,
                         int64_t i0, int64_t i1, int64_t ncols, int64_t k, int64_t ep) {
    const float *ar = ds_rows_rounded(a + i0 * lda, lda, i1 - i0, k, ep);
    ds_gemm_panel(ar, k, (const float *)panel, 32, c + i0 * ldc, ldc, 0, i1 - i0, ncols, k);
}

/* ---- packing at run time (attention's K and V: activations, packed per call) ------------------------------------
   Scalar here (every CPU; the emulated path), vectorised below where the native path is compiled: attention packs K
   and V on every call, and a rounding per element in scalar code cost as much as the products it feeds. */
void ds_pack_panels_bf16_ref(const float *restrict b, int64_t ldb, int64_t k, int64_t n, void *out) {
    uint16_t *bp = out;
    const int64_t k2 = (k + 1) / 2;
    for (int64_t q = 0; q < (n + 31) / 32; q++)
        for (int64_t p = 0; p < k2; p++) {
            uint16_t *dst = bp + (q * k2 + p) * 64;
            for (int64_t j = 0; j < 32; j++) {
                const int64_t col = q * 32 + j;
                dst[2 * j] = col < n ? ds_to_bf16(b[2 * p * ldb + col]) : 0;
                dst[2 * j + 1] = col < n && 2 * p + 1 < k ? ds_to_bf16(b[(2 * p + 1) * ldb + col]) : 0;
            }
        }
}

void ds_pack_panels_t_bf16_ref(const float *restrict a, int64_t lda, int64_t k, int64_t n, void *out) {
    uint16_t *bp = out;
    const int64_t k2 = (k + 1) / 2;
    for (int64_t q = 0; q < (n + 31) / 32; q++)
        for (int64_t j = 0; j < 32; j++) {
            const int64_t col = q * 32 + j;
            const float *src = a + col * lda;
            for (int64_t p = 0; p < k2; p++) {
                uint16_t *dst = bp + (q * k2 + p) * 64 + 2 * j;
                dst[0] = col < n ? ds_to_bf16(src[2 * p]) : 0;
                dst[1] = col < n && 2 * p + 1 < k ? ds_to_bf16(src[(2 * p + 1)]) : 0;
            }
        }
}


/* B (k x n, row stride ldb) as bf16 panels: row p of panel q holds (B[2p][j], B[2p + 1][j]) for its 32 columns,
   zero past k and n (pack_b_bf16's layout). Native: two rows rounded 32 columns at a time, their bf16 interleaved
   (VPERMT2W). */
void ds_pack_panels_bf16(const float *restrict b, int64_t ldb, int64_t k, int64_t n, void *out) {
#if DS_BF16_NATIVE
    uint16_t *bp = out;
    const int64_t k2 = (k + 1) / 2;
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                        39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
                                        55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    for (int64_t q = 0; q < (n + 31) / 32; q++) {
        const int64_t cnt = n - q * 32;
        for (int64_t p = 0; p < k2; p++) {
            const __m512i r0 = ds_bf16x32(b + 2 * p * ldb + q * 32, cnt);
            const __m512i r1 = 2 * p + 1 < k ? ds_bf16x32(b + (2 * p + 1) * ldb + q * 32, cnt) : _mm512_setzero_si512();
            uint16_t *dst = bp + (q * k2 + p) * 64;
            _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(r0, lo, r1));
            _mm512_storeu_si512(dst + 32, _mm512_permutex2var_epi16(r0, hi, r1));
        }
    }
#else
    ds_pack_panels_bf16_ref(b, ldb, k, n, out);
#endif
}

/* The same panels for B = transpose(A), A n x k with row stride lda (attention's K as the model stores it): a
   column's pair of consecutive k is two neighbours in A's row. Native: each of a panel's 32 rows of A rounded 32
   values at a time into pairs, then the pairs written to their panel rows (32-bit copies: a transpose). */
void ds_pack_panels_t_bf16(const float *restrict a, int64_t lda, int64_t k, int64_t n, void *out) {
#if DS_BF16_NATIVE
    uint32_t *bp = out;
    const int64_t k2 = (k + 1) / 2;
    for (int64_t q = 0; q < (n + 31) / 32; q++) {
        uint32_t *panel = bp + q * k2 * 32;
        for (int64_t j = 0; j < 32; j++) {
            const int64_t col = q * 32 + j;
            if (col >= n) {
                for (int64_t p = 0; p < k2; p++) panel[p * 32 + j] = 0;
                continue;
            }
            const float *src = a + col * lda;
            for (int64_t p0 = 0; p0 < k; p0 += 32) {
                uint32_t pairs[16];
                _mm512_storeu_si512(pairs, ds_bf16x32(src + p0, k - p0));
                const int64_t np = (k - p0 + 1) / 2 < 16 ? (k - p0 + 1) / 2 : 16;
                for (int64_t t = 0; t < np; t++) panel[(p0 / 2 + t) * 32 + j] = pairs[t];
            }
        }
    }
#else
    ds_pack_panels_t_bf16_ref(a, lda, k, n, out);
#endif
}

static void ds_round_panels(float *bp, int64_t k, int64_t n) {
    const int64_t total = (n + 31) / 32 * 32 * k;
    for (int64_t i = 0; i < total; i++) bp[i] = ds_from_bf16(ds_to_bf16(bp[i]));
}

/* The emulated kernels' float32 panels (ds_pack_panels / _t), every value rounded to bf16. */
void ds_pack_panels_bf16e(const float *restrict b, int64_t ldb, int64_t k, int64_t n, void *out) {
    ds_pack_panels(b, ldb, k, n, out);
    ds_round_panels(out, k, n);
}

void ds_pack_panels_t_bf16e(const float *restrict a, int64_t lda, int64_t k, int64_t n, void *out) {
    ds_pack_panels_t(a, lda, k, n, out);
    ds_round_panels(out, k, n);
}

/* ---- native: VDPBF16PS ---------------------------------------------------------------------------------------- */
#if DS_BF16_NATIVE
#include <immintrin.h>

/* The rows the scratch of `rows` converted rows holds: 16 at least where they are laid out for AMX (`amx`:
   ds_pair_stride), whose last tile may read past them (ds_amx_rows); the rows after `rows` are zeros. */
static inline int64_t ds_padded_rows(int64_t rows, int amx) { return amx && rows < 16 ? 16 : rows; }

/* rows of A (k floats, row stride lda) as rows of `ls` >= k2 = ceil(k / 2) bf16 pairs, zero past k (ls = k2 for
   the VDPBF16PS micro-tiles; a multiple of 16 for AMX, whose tiles read 32 k at a time). */
static const uint32_t *ds_rows_bf16(const float *a, int64_t lda, int64_t rows, int64_t k, int64_t ls, int amx,
                                     int64_t ep) {
    const int64_t padded = ds_padded_rows(rows, amx);
    uint32_t *buf = ds_scratch_for(padded * ls * 4);
    if (!buf) abort();
    if (ds_memo_hit(a, rows, lda, k, 2 + 8 * ls + 4 * amx, ep)) return buf;
    memset(buf + rows * ls, 0, (size_t)((padded - rows) * ls * 4));
    for (int64_t r = 0; r < rows; r++) {
        const float *x = a + r * lda;
        uint16_t *y = (uint16_t *)(buf + r * ls);
        int64_t p = 0;
        for (; p + 32 <= k; p += 32)
            _mm512_storeu_si512(y + p, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + p + 16),
                                                                    _mm512_loadu_ps(x + p)));
        for (; p < k; p++) y[p] = ds_to_bf16(x[p]);
        for (; p < 2 * ls; p++) y[p] = 0;
    }
    return buf;
}

#define DS_B_INIT(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps();
#define DS_B_FMA(r)                                                                                       \
    { const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[(r) * ls + p]);                               \
      c##r##0 = _mm512_dpbf16_ps(c##r##0, x, b0); c##r##1 = _mm512_dpbf16_ps(c##r##1, x, b1); }
#define DS_B_STORE(r) ds_store_row(c + (r) * ldc, (ds_v16)c##r##0, (ds_v16)c##r##1, ncols);
/* MR rows x the 32 columns of one panel (its rows of 64 bf16 `bp`); a: MR rows of k2 pairs, ls apart. */
#define DS_BMICRO(MR)                                                                                     \
    static void ds_bmicro_##MR(const uint32_t *restrict a, int64_t ls, const uint16_t *restrict bp,      \
                               int64_t k2, float *restrict c, int64_t ldc, int64_t ncols) {               \
        DS_ROWS##MR(DS_B_INIT)                                                                            \
        _Pragma("GCC unroll 2")                                                                           \
        for (int64_t p = 0; p < k2; p++) {                                                                \
            const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * 64);                                \
            const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * 64 + 32);                           \
            DS_ROWS##MR(DS_B_FMA)                                                                         \
        }                                                                                                 \
        DS_ROWS##MR(DS_B_STORE)                                                                           \
    }
/* One row: DS_BMICRO(1)'s two accumulators would wait on each other's latency every pair (a row times a matrix is a
   chain of k2 dependent VDPBF16PS per column half); four chains of pairs p, p + 1, p + 2, p + 3 summed at the end
   keep the unit busy (a decode step's products, a recurrent layer's state times R at batch 1: ~2x). */
static void ds_bmicro_1(const uint32_t *restrict a, int64_t ls, const uint16_t *restrict bp, int64_t k2,
                        float *restrict c, int64_t ldc, int64_t ncols) {
    (void)ls; (void)ldc;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), t0 = _mm512_setzero_ps(), t1 = _mm512_setzero_ps();
    __m512 u0 = _mm512_setzero_ps(), u1 = _mm512_setzero_ps(), v0 = _mm512_setzero_ps(), v1 = _mm512_setzero_ps();
#define DS_B1(acc0, acc1, q)                                                                             \
    { const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[q]);                                         \
      acc0 = _mm512_dpbf16_ps(acc0, x, (__m512bh)_mm512_loadu_si512(bp + (q) * 64));                     \
      acc1 = _mm512_dpbf16_ps(acc1, x, (__m512bh)_mm512_loadu_si512(bp + (q) * 64 + 32)); }
    int64_t p = 0;
    for (; p + 4 <= k2; p += 4) {
        DS_B1(s0, s1, p) DS_B1(t0, t1, p + 1) DS_B1(u0, u1, p + 2) DS_B1(v0, v1, p + 3)
    }
    for (; p < k2; p++) DS_B1(s0, s1, p)
#undef DS_B1
    s0 = _mm512_add_ps(_mm512_add_ps(s0, t0), _mm512_add_ps(u0, v0));
    s1 = _mm512_add_ps(_mm512_add_ps(s1, t1), _mm512_add_ps(u1, v1));
    ds_store_row(c, (ds_v16)s0, (ds_v16)s1, ncols);
}
DS_BMICRO(2)
DS_BMICRO(3)
DS_BMICRO(4)
DS_BMICRO(5)
DS_BMICRO(6)
DS_BMICRO(7)
DS_BMICRO(8)
DS_BMICRO(9)
DS_BMICRO(10)
DS_BMICRO(11)
DS_BMICRO(12)

/* rows 0..m of C (row stride ldc) = the converted rows a (k2 pairs each, ls apart) @ one bf16 panel, ncols <= 32. */
static void ds_bgemm_rows(const uint32_t *a, int64_t ls, int64_t k2, const uint16_t *panel, float *c, int64_t ldc,
                          int64_t m, int64_t ncols) {
    int64_t i = 0;
    for (; m - i >= 12; i += 12) ds_bmicro_12(a + i * ls, ls, panel, k2, c + i * ldc, ldc, ncols);
    const uint32_t *ai = a + i * ls;
    float *ci = c + i * ldc;
    switch (m - i) {
    case 0: break;
    case 1: ds_bmicro_1(ai, ls, panel, k2, ci, ldc, ncols); break;
    case 2: ds_bmicro_2(ai, ls, panel, k2, ci, ldc, ncols); break;
    case 3: ds_bmicro_3(ai, ls, panel, k2, ci, ldc, ncols); break;
    case 4: ds_bmicro_4(ai, ls, panel, k2, ci, ldc, ncols); break;
    case 5: ds_bmicro_5(ai, ls, panel, k2, ci, ldc, ncols); break;
    case 6: ds_bmicro_6(ai, ls, panel, k2, ci, ldc, ncols); break;
    case 7: ds_bmicro_7(ai, ls, panel, k2, ci, ldc, ncols); break;
    case 8: ds_bmicro_8(ai, ls, panel, k2, ci, ldc, ncols); break;
    case 9: ds_bmicro_9(ai, ls, panel, k2, ci, ldc, ncols); break;
    case 10: ds_bmicro_10(ai, ls, panel, k2, ci, ldc, ncols); break;
    default: ds_bmicro_11(ai, ls, panel, k2, ci, ldc, ncols); break;
    }
}

#if DS_BF16_AMX
/* ---- native: AMX tiles (TDPBF16PS) ------------------------------------------------------------------------------
   Sapphire Rapids and later. One tile product multiplies 16 rows x 32 k of A by 32 k x 16 columns of B: a panel's
   rows of 64 bf16 are already two B tiles side by side (columns 0..15 in the first 64 bytes of each row, 16..31 in
   the next: pairs along k, what TDPBF16PS reads), so the packed weights serve both instruction paths. A's rows are
   converted with a row stride of a multiple of 16 pairs, zero past k, so every A tile is whole; B's last chunk of
   16 pairs is copied into a zeroed tile when k2 is not a multiple of 16 (the rows after a panel's end belong to the
   next panel or to no one). Rows are taken 32 at a time (four accumulator tiles: 2 x 2 of 16 x 16), then 16, then
   a last part under 16 rows as one more tile (ds_amx_rows); calls of fewer than DS_AMX_MIN_ROWS rows in all stay
   on the VDPBF16PS micro-tiles, faster than a mostly empty tile. The tiles' permission and configuration:
   ds_amx.h. */
/* Rows r0..r1 of a 16 x 32 accumulator pair (tiles T0, T1) to rows `at` + r0.. of C: in place when they are the
   whole of a whole panel with nothing to finish, else through `tmp`, finished (`fin`) as they are copied out (a
   convolution's bias, residual and activation: no second pass over C). */
#define DS_AMX_STORE(T0, T1, at, r0, r1)                                                                     \
    if (!fin && ncols == 32 && (r0) == 0 && (r1) == 16) {                                                   \
        _tile_stored(T0, c + (at) * ldc, ldc * 4); _tile_stored(T1, c + (at) * ldc + 16, ldc * 4);           \
    } else {                                                                                                 \
        _tile_stored(T0, tmp, 128); _tile_stored(T1, tmp + 16, 128);                                         \
        for (int64_t r = (r0); r < (r1); r++) {                                                              \
            if (fin) ds_finish_row_fast(ds_fin_row(c, (at) + r, ldc, fin), tmp + r * 32, ncols, fin, &fast, \
                                        (at) + r);                                                             \
            else memcpy(c + ((at) + r) * ldc, tmp + r * 32, (size_t)ncols * 4);                               \
        }                                                                                                    \
    }

/* rows 0..m of C = the converted rows a (ls pairs apart, ls a multiple of 16; at least 16 rows, zeros past m) @ one
   panel. A last part of r < 16 rows is one tile that ends at row m (its rows before the part were computed
   already, and are computed again rather than left to a slower path), or, under 16 rows in all, the tile over
   the zeroed rows after m, of which only the m rows are stored. */
static void ds_amx_rows(const uint32_t *a, int64_t ls, int64_t k2, const uint16_t *panel, float *c, int64_t ldc,
                        int64_t m, int64_t ncols, const ds_finish *fin) {
    _Alignas(64) uint16_t tail[16 * 64];
    _Alignas(64) float tmp[16 * 32];
    const int64_t chunks = ls / 16, whole = k2 / 16, sa = ls * 4;
    if (whole < chunks) ds_amx_tail((const uint8_t *)panel, whole, k2, (uint8_t *)tail);
    const ds_fast_finish fast = ds_fast_finish_of(fin, ncols);
    ds_amx_config();
    int64_t i = 0;
    for (; i + 32 <= m; i += 32) {
        ds_amx_pass((const uint8_t *)(a + i * ls), sa, (const uint8_t *)panel, (const uint8_t *)tail, whole, chunks,
                    32, DS_AMX_BF16);
        DS_AMX_STORE(0, 1, i, 0, 16)
        DS_AMX_STORE(2, 3, i + 16, 0, 16)
    }
    while (i < m) { /* 16 rows at s: whole, or ending at m, or over the zeroed rows after m */
        const int64_t s = i + 16 <= m ? i : m >= 16 ? m - 16 : 0, e = s + 16 < m ? s + 16 : m;
        ds_amx_pass((const uint8_t *)(a + s * ls), sa, (const uint8_t *)panel, (const uint8_t *)tail, whole, chunks,
                    16, DS_AMX_BF16);
        DS_AMX_STORE(0, 1, s, i - s, e - s)
        i = e;
    }
    /* (the tiles stay configured for the thread's next call: ds_amx_config) */
}
#endif

/* The stride in pairs that rows of k values are converted to for this call's path, and whether it is AMX's: AMX
   where granted and there are DS_AMX_MIN_ROWS rows or more (a tile of 16 rows computes 4 rows in the time
   VDPBF16PS takes for one at a panel's 32 columns; from 4 rows on the tile is the faster: resnet18 at 160 x 160
   sent a third of its Winograd products' work, the chunks' tails under 16 rows, to the vector path). */
#define DS_AMX_MIN_ROWS 4
static int64_t ds_pair_stride(int64_t k, int64_t rows, int *amx) {
    const int64_t k2 = (k + 1) / 2;
#if DS_BF16_AMX
    if (rows >= DS_AMX_MIN_ROWS && ds_amx_on()) { *amx = 1; return (k2 + 15) / 16 * 16; }
#else
    (void)rows;
#endif
    *amx = 0;
    return k2;
}

/* rows 0..m of C = the converted rows a (ls pairs apart) @ one panel, on AMX tiles (amx: ds_amx_rows' rows) or
   VDPBF16PS, each row then finished by `fin` where given (NULL: nothing). */
static void ds_bgemm_any(const uint32_t *a, int64_t ls, int amx, int64_t k2, const uint16_t *panel, float *c,
                         int64_t ldc, int64_t m, int64_t ncols, const ds_finish *fin) {
#if DS_BF16_AMX
    if (amx) {
        ds_amx_rows(a, ls, k2, panel, c, ldc, m, ncols, fin);
        return;
    }
#else
    (void)amx;
#endif
    if (fin && fin->ybf) { /* bf16 rows out: the float32 sums through `tmp`, 32 rows at a time */
        _Alignas(64) float tmp[32 * 32];
        for (int64_t i = 0; i < m; i += 32) {
            const int64_t rows = m - i < 32 ? m - i : 32;
            ds_bgemm_rows(a + i * ls, ls, k2, panel, tmp, 32, rows, ncols);
            for (int64_t r = 0; r < rows; r++)
                ds_finish_row(ds_fin_row(c, i + r, ldc, fin), tmp + r * 32, ncols, fin, i + r);
        }
        return;
    }
    ds_bgemm_rows(a, ls, k2, panel, c, ldc, m, ncols);
    if (fin)
        for (int64_t r = 0; r < m; r++) ds_finish_row(c + r * ldc, c + r * ldc, ncols, fin, r);
}
#endif

/* The tile (rows i0..i1, panel q) of C = A @ B, B packed by pack_b_bf16 (panels of ceil(k / 2) rows of 64 bf16). */
void ds_gemm_block_bf16(const float *restrict a, int64_t lda, const void *bp, float *restrict c, int64_t ldc,
                        int64_t i0, int64_t i1, int64_t q, int64_t n, int64_t k, int64_t ep) {
#if DS_BF16_NATIVE
    const int64_t k2 = (k + 1) / 2;
    int amx;
    const int64_t ls = ds_pair_stride(k, i1 - i0, &amx);
    const uint32_t *ar = ds_rows_bf16(a + i0 * lda, lda, i1 - i0, k, ls, amx, ep);
    ds_bgemm_any(ar, ls, amx, k2, (const uint16_t *)bp + q * k2 * 64, c + i0 * ldc + q * 32, ldc, i1 - i0,
                 n - q * 32 < 32 ? n - q * 32 : 32, NULL);
#else
    (void)a; (void)lda; (void)bp; (void)c; (void)ldc; (void)i0; (void)i1; (void)q; (void)n; (void)k; (void)ep;
    abort(); /* compile refuses precision="bf16" where this library has no native path (codegen/bf16.py) */
#endif
}

/* Rows i0..i1 of one bf16 panel (ncols <= 32 columns; `panel` its first row of pairs). */
void ds_gemm_panel_bf16(const float *restrict a, int64_t lda, const void *panel, float *restrict c, int64_t ldc,
                        int64_t i0, int64_t i1, int64_t ncols, int64_t k, int64_t ep) {
#if DS_BF16_NATIVE
    int amx;
    const int64_t ls = ds_pair_stride(k, i1 - i0, &amx);
    const uint32_t *ar = ds_rows_bf16(a + i0 * lda, lda, i1 - i0, k, ls, amx, ep);
    ds_bgemm_any(ar, ls, amx, (k + 1) / 2, (const uint16_t *)panel, c + i0 * ldc, ldc, i1 - i0, ncols, NULL);
#else
    (void)a; (void)lda; (void)panel; (void)c; (void)ldc; (void)i0; (void)i1; (void)ncols; (void)k; (void)ep;
    abort();
#endif
}

/* ---- convolutions: implicit GEMM on an im2col block in bf16 ---------------------------------------------------
   ds_conv_tile2's contract (ds_conv.h) with bf16 operands: a block of output pixels p0..p1 has its patches
   gathered once into per-thread scratch, rounded to bf16 as they are copied (k = (kh * KW + kw) * CG + c, the
   packed weights' row order; the padding's taps as zeros), then multiplied by the group's panels q and q + 1
   (pack_conv_bf16: pairs along k) with the products' micro-kernels; bias, residual and activation are applied to
   the tile while it is in cache. The patches are kept for the next tile of the same block in the same call (the
   epoch), so a block is gathered once per pair of panels at most, once in all where the loop runs block-major. */
/* The finish of a tile's rows p0.. at columns col0.. (NULL: nothing to apply). */
static inline const ds_finish *ds_conv_fin(const int64_t *geo, int64_t p0, int64_t col0, const float *bias,
                                           const float *res, ds_finish *fin) {
    *fin = ds_finish_at(geo, bias, res, col0, p0 * geo[DS_CONV_OC] + col0);
    return bias || res || fin->act != DS_ACT_NONE || fin->ybf ? fin : 0;
}

/* Where a tile's rows start in y: pixel p0, column col0 (bf16 values under geo[DS_CONV_YBF]), as the float pointer
   the products take (ds_fin_row steps through it by the values' size). */
static inline float *ds_conv_out(const int64_t *geo, float *y, int64_t p0, int64_t col0) {
    const int64_t at = p0 * geo[DS_CONV_LDY] + col0;
    return geo[DS_CONV_YBF] ? (float *)((uint16_t *)y + at) : y + at;
}

/* The emulated path's finish, in place on float32 rows: a bf16-stored output (geo[DS_CONV_YBF]) is kept as float32
   values rounded to bf16, and inputs and residuals are read as float32 (the emulated build stores every value as
   float32: the same values as the native build's bf16 storage, whose readers round their inputs anyway). */
static void ds_conv_finish(const int64_t *geo, float *y, int64_t p0, int64_t rows, int64_t col0, int64_t ncols,
                           const float *bias, const float *res) {
    ds_finish f;
    const ds_finish *fin = ds_conv_fin(geo, p0, col0, bias, res, &f);
    if (!fin) return;
    f.rbf = f.ybf = 0;
    f.res = res ? (const void *)(res + p0 * geo[DS_CONV_OC] + col0) : 0;
    const int64_t LDY = geo[DS_CONV_LDY];
    for (int64_t r = 0; r < rows; r++) {
        float *o = y + (p0 + r) * LDY + col0;
        ds_finish_row(o, o, ncols, fin, r);
        if (geo[DS_CONV_YBF])
            for (int64_t j = 0; j < ncols; j++) o[j] = ds_from_bf16(ds_to_bf16(o[j]));
    }
}

/* Where output pixel p's window starts: its image's first input pixel (at group g's channels) and the input row
   and column of its top-left tap (two divisions a pixel, none a tap). */
typedef struct { const float *img; int64_t ih, iw; } ds_window;

static inline ds_window ds_conv_window(const int64_t *geo, const float *x, int64_t p, int64_t g) {
    const int64_t OH = geo[DS_CONV_OH], OW = geo[DS_CONV_OW];
    const int64_t n = p / (OH * OW), oh = p % (OH * OW) / OW, ow = p % OW;
    ds_window w = {x + n * geo[DS_CONV_H] * geo[DS_CONV_W] * geo[DS_CONV_C] + g * geo[DS_CONV_CG],
                   oh * geo[DS_CONV_SH] - geo[DS_CONV_PT], ow * geo[DS_CONV_SW] - geo[DS_CONV_PL]};
    return w;
}

/* The input pixel (or NULL in the padding) that tap (kh, kw) of window w reads. */
static inline const float *ds_conv_src(const int64_t *geo, ds_window w, int64_t kh, int64_t kw) {
    const int64_t ih = w.ih + kh * geo[DS_CONV_DH], iw = w.iw + kw * geo[DS_CONV_DW];
    if ((uint64_t)ih >= (uint64_t)geo[DS_CONV_H] || (uint64_t)iw >= (uint64_t)geo[DS_CONV_W]) return 0;
    return w.img + (ih * geo[DS_CONV_W] + iw) * geo[DS_CONV_C];
}

/* A conv's prologue (ds_conv_tile2_bf16_pre): v -> max(v * scale[c] + shift[c], 0) per input channel c. */
typedef struct { const float *scale, *shift; int64_t relu; } ds_pre;

static inline float ds_pre_one(const ds_pre *pre, float v, int64_t c) {
    v = v * (pre->scale ? pre->scale[c] : 1.0f) + (pre->shift ? pre->shift[c] : 0.0f);
    return pre->relu && !(v > 0.0f) ? (v != v ? v : 0.0f) : v; /* Relu(NaN) is NaN, as the elementwise op's */
}

/* Patches of pixels p0..p1 as float32 rows of K values, rounded to bf16 (the emulated path); `pre` (or NULL)
   applied first. */
static const float *ds_patches_rounded(const int64_t *geo, const float *x, int64_t p0, int64_t p1, int64_t g,
                                       int64_t ep, const ds_pre *pre) {
    const int64_t KH = geo[DS_CONV_KH], KW = geo[DS_CONV_KW], CG = geo[DS_CONV_CG], K = KH * KW * CG;
    float *buf = ds_scratch_for((p1 - p0) * K * 4);
    if (!buf) abort();
    if (ds_memo_hit(x + g * CG, p1 - p0, p0, K, 3, ep)) return buf;
    for (int64_t p = p0; p < p1; p++) {
        const ds_window w = ds_conv_window(geo, x, p, g);
        for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++) {
                const float *src = ds_conv_src(geo, w, kh, kw);
                float *dst = buf + (p - p0) * K + (kh * KW + kw) * CG;
                for (int64_t c = 0; c < CG; c++)
                    dst[c] = src ? ds_from_bf16(ds_to_bf16(pre ? ds_pre_one(pre, src[c], g * CG + c) : src[c])) : 0.0f;
            }
    }
    return buf;
}

static void ds_conv_tile2_bf16e_of(const int64_t *geo, const float *restrict x, const void *bp, float *restrict y,
                                   int64_t p0, int64_t p1, int64_t g, int64_t q, const float *restrict bias,
                                   const float *restrict res, int64_t ep, const ds_pre *pre) {
    const int64_t CG = geo[DS_CONV_CG], OCG = geo[DS_CONV_OCG], LDY = geo[DS_CONV_LDY];
    const int64_t K = geo[DS_CONV_KH] * geo[DS_CONV_KW] * CG, panels = (OCG + 31) / 32;
    const float *a = ds_patches_rounded(geo, x, p0, p1, g, ep, pre);
    for (int64_t qq = q; qq < q + 2 && qq < panels; qq++) {
        const int64_t ncols = OCG - qq * 32 < 32 ? OCG - qq * 32 : 32, col0 = g * OCG + qq * 32;
        ds_gemm_panel(a, K, (const float *)bp + (g * panels + qq) * K * 32, 32, y + p0 * LDY + col0, LDY, 0, p1 - p0,
                      ncols, K);
        ds_conv_finish(geo, y, p0, p1 - p0, col0, ncols, bias, res);
    }
}

/* A tile implementation's two entries (ds_gemm_bf16.h): NAME without a prologue, NAME_pre with one. */
#define DS_CONV_TILE2_ENTRIES(NAME, IMPL)                                                                   \
    void NAME(const int64_t *geo, const float *restrict x, const void *bp, float *restrict y,                \
              const float *restrict zeros, int64_t p0, int64_t p1, int64_t g, int64_t q,                    \
              const float *restrict bias, const float *restrict res, int64_t ep) {                          \
        (void)zeros;                                                                                        \
        IMPL(geo, x, bp, y, p0, p1, g, q, bias, res, ep, NULL);                                             \
    }                                                                                                       \
    void NAME##_pre(const int64_t *geo, const float *restrict x, const void *bp, float *restrict y,         \
                    const float *restrict zeros, int64_t p0, int64_t p1, int64_t g, int64_t q,              \
                    const float *restrict bias, const float *restrict res, int64_t ep,                      \
                    const float *restrict scale, const float *restrict shift, int64_t relu) {               \
        (void)zeros;                                                                                        \
        const ds_pre pre = {scale, shift, relu};                                                            \
        IMPL(geo, x, bp, y, p0, p1, g, q, bias, res, ep, &pre);                                             \
    }
DS_CONV_TILE2_ENTRIES(ds_conv_tile2_bf16e, ds_conv_tile2_bf16e_of)

#if DS_BF16_NATIVE
/* ds_round_run of the values after `pre`, channels c0.. (scale, shift and Relu in registers, 32 at a time). */
static inline void ds_round_run_pre(uint16_t *dst, const float *src, int64_t n, const ds_pre *pre, int64_t c0) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (int64_t c = 0; c < n; c += 32) {
        const int64_t cnt = n - c;
        __mmask16 m[2];
        ds_bf16_masks(cnt, &m[0], &m[1]);
        __m512 v[2] = {_mm512_maskz_loadu_ps(m[0], src + c), _mm512_maskz_loadu_ps(m[1], src + c + 16)};
        for (int h = 0; h < 2; h++) {
            const int64_t at = c0 + c + 16 * h;
            const __m512 k = pre->scale ? _mm512_maskz_loadu_ps(m[h], pre->scale + at) : one;
            const __m512 t = pre->shift ? _mm512_maskz_loadu_ps(m[h], pre->shift + at) : zero;
            v[h] = _mm512_add_ps(_mm512_mul_ps(v[h], k), t); /* not fused: as the elementwise Mul then Add */
            /* Relu keeping NaN (max(NaN, 0) would give 0): zero where v < 0 only */
            if (pre->relu) v[h] = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v[h], zero, _CMP_LT_OQ), v[h], zero);
        }
        ds_put_bf16x32(dst + c, (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]), cnt);
    }
}

/* Patches of pixels p0..p1 as bf16 rows of k2 = ceil(K / 2) pairs. Wide groups (CG >= 32) are rounded tap by tap
   from the input; narrow ones (a stem's 3 channels, a UNet's 16) window row by window row: a row of the window
   inside the input (one group, undilated) is KW * CG contiguous floats, rounded where it lies; one that crosses
   the input's edge is first gathered as float32 into a row of KW * CG values (zeros for the padding). (Copying
   every window row into that buffer first cost 10% of unet_nn's bf16 call in memcpy: 3 copies of 192 bytes a
   pixel on its 16-channel 3x3 convs.) */
static const uint32_t *ds_patches_bf16(const int64_t *geo, const float *x, int64_t p0, int64_t p1, int64_t g,
                                       int64_t ls, int amx, int64_t ep, const ds_pre *pre) {
    const int64_t KH = geo[DS_CONV_KH], KW = geo[DS_CONV_KW], CG = geo[DS_CONV_CG], K = KH * KW * CG;
    const int64_t rows = p1 - p0, span = KW * CG;
    const int narrow = CG < 32;
    if (pre && narrow) abort(); /* a prologue only on 32 channels or more (rules.match_conv_prologue) */
    /* one group, undilated: a window row's KW pixels are KW * CG contiguous floats */
    const int whole_rows = geo[DS_CONV_G] == 1 && geo[DS_CONV_DW] == 1;
    /* the bf16 rows, then (narrow) one float32 window row of KW * CG + 32 values */
    const int64_t padded = ds_padded_rows(rows, amx);
    uint32_t *buf = ds_scratch_for(padded * ls * 4 + (narrow ? (span + 32) * 4 + 64 : 0));
    if (!buf) abort();
    if (ds_memo_hit(x + g * CG, rows, p0, K, 3 + 8 * ls + 4 * amx, ep)) return buf;
    memset(buf + rows * ls, 0, (size_t)((padded - rows) * ls * 4));
    float *tmp = narrow ? (float *)(((uintptr_t)(buf + padded * ls) + 63) & ~(uintptr_t)63) : 0;
    for (int64_t p = p0; p < p1; p++) {
        uint16_t *row = (uint16_t *)(buf + (p - p0) * ls);
        const ds_window w = ds_conv_window(geo, x, p, g);
        if (narrow) {
            for (int64_t kh = 0; kh < KH; kh++) {
                const int64_t ih = w.ih + kh * geo[DS_CONV_DH];
                uint16_t *dst = row + kh * span;
                if ((uint64_t)ih >= (uint64_t)geo[DS_CONV_H]) { memset(dst, 0, (size_t)span * 2); continue; }
                if (whole_rows && w.iw >= 0 && w.iw + KW <= geo[DS_CONV_W]) { /* the window's row, where it lies */
                    ds_round_run(dst, w.img + (ih * geo[DS_CONV_W] + w.iw) * CG, span);
                    continue;
                }
                for (int64_t kw = 0; kw < KW; kw++) {
                    const float *src = ds_conv_src(geo, w, kh, kw);
                    if (src) memcpy(tmp + kw * CG, src, (size_t)CG * 4);
                    else memset(tmp + kw * CG, 0, (size_t)CG * 4);
                }
                ds_round_run(dst, tmp, span);
            }
        } else {
            for (int64_t kh = 0; kh < KH; kh++)
                for (int64_t kw = 0; kw < KW; kw++) {
                    const float *src = ds_conv_src(geo, w, kh, kw);
                    uint16_t *dst = row + (kh * KW + kw) * CG;
                    if (!src) memset(dst, 0, (size_t)CG * 2);
                    else if (pre) ds_round_run_pre(dst, src, CG, pre, g * CG);
                    else ds_round_run(dst, src, CG);
                }
        }
        for (int64_t t = K; t < 2 * ls; t++) row[t] = 0;
    }
    return buf;
}

/* ds_patches_bf16 for a bf16-stored input (geo[DS_CONV_XBF]: pixels of C bf16 values): copied as they lie (they
   were rounded when stored), zeros for the padding: a window row inside the input (one group, undilated) as its
   KW * CG contiguous values at once, else tap by tap. */
static const uint32_t *ds_patches_from_bf16(const int64_t *geo, const uint16_t *x, int64_t p0, int64_t p1, int64_t g,
                                            int64_t ls, int amx, int64_t ep) {
    const int64_t KH = geo[DS_CONV_KH], KW = geo[DS_CONV_KW], CG = geo[DS_CONV_CG], K = KH * KW * CG;
    const int64_t H = geo[DS_CONV_H], W = geo[DS_CONV_W], C = geo[DS_CONV_C], OH = geo[DS_CONV_OH];
    const int64_t OW = geo[DS_CONV_OW], rows = p1 - p0, padded = ds_padded_rows(rows, amx);
    const int whole_rows = geo[DS_CONV_G] == 1 && geo[DS_CONV_DW] == 1; /* a window row: KW * C contiguous values */
    uint32_t *buf = ds_scratch_for(padded * ls * 4);
    if (!buf) abort();
    if (ds_memo_hit((const float *)(x + g * CG), rows, p0, K, 5 + 8 * ls + 4 * amx, ep)) return buf;
    memset(buf + rows * ls, 0, (size_t)((padded - rows) * ls * 4));
    for (int64_t p = p0; p < p1; p++) {
        uint16_t *row = (uint16_t *)(buf + (p - p0) * ls);
        const int64_t n = p / (OH * OW), oh = p % (OH * OW) / OW, ow = p % OW;
        const uint16_t *img = x + n * H * W * C + g * CG;
        const int64_t iw0 = ow * geo[DS_CONV_SW] - geo[DS_CONV_PL];
        for (int64_t kh = 0; kh < KH; kh++) {
            const int64_t ih = oh * geo[DS_CONV_SH] - geo[DS_CONV_PT] + kh * geo[DS_CONV_DH];
            if (whole_rows && (uint64_t)ih < (uint64_t)H && iw0 >= 0 && iw0 + KW <= W) {
                ds_copy_bf16(row + kh * KW * CG, img + (ih * W + iw0) * C, KW * CG);
                continue;
            }
            for (int64_t kw = 0; kw < KW; kw++) {
                const int64_t iw = ow * geo[DS_CONV_SW] - geo[DS_CONV_PL] + kw * geo[DS_CONV_DW];
                uint16_t *dst = row + (kh * KW + kw) * CG;
                if ((uint64_t)ih >= (uint64_t)H || (uint64_t)iw >= (uint64_t)W) memset(dst, 0, (size_t)CG * 2);
                else ds_copy_bf16(dst, img + (ih * W + iw) * C, CG);
            }
        }
        memset(row + K, 0, (size_t)(2 * ls - K) * 2);
    }
    return buf;
}
#endif

static void ds_conv_tile2_bf16_of(const int64_t *geo, const float *restrict x, const void *bp, float *restrict y,
                                  int64_t p0, int64_t p1, int64_t g, int64_t q, const float *restrict bias,
                                  const float *restrict res, int64_t ep, const ds_pre *pre) {
#if DS_BF16_NATIVE
    const int64_t OCG = geo[DS_CONV_OCG], LDY = geo[DS_CONV_LDY];
    const int64_t K = geo[DS_CONV_KH] * geo[DS_CONV_KW] * geo[DS_CONV_CG], k2 = (K + 1) / 2;
    const int64_t panels = (OCG + 31) / 32;
    int amx;
    const int64_t ls = ds_pair_stride(K, p1 - p0, &amx);
    if (geo[DS_CONV_XBF] && pre) abort(); /* a prologue reads float32 (conv_storage admits no such reader) */
    const uint32_t *a = geo[DS_CONV_XBF] ? ds_patches_from_bf16(geo, (const uint16_t *)x, p0, p1, g, ls, amx, ep)
                                         : ds_patches_bf16(geo, x, p0, p1, g, ls, amx, ep, pre);
    for (int64_t qq = q; qq < q + 2 && qq < panels; qq++) {
        const int64_t ncols = OCG - qq * 32 < 32 ? OCG - qq * 32 : 32, col0 = g * OCG + qq * 32;
        ds_finish f;
        ds_bgemm_any(a, ls, amx, k2, (const uint16_t *)bp + (g * panels + qq) * k2 * 64, ds_conv_out(geo, y, p0, col0),
                     LDY, p1 - p0, ncols, ds_conv_fin(geo, p0, col0, bias, res, &f));
    }
#else
    (void)geo; (void)x; (void)bp; (void)y; (void)p0; (void)p1; (void)g; (void)q; (void)bias; (void)res; (void)ep;
    (void)pre;
    abort();
#endif
}

DS_CONV_TILE2_ENTRIES(ds_conv_tile2_bf16, ds_conv_tile2_bf16_of)

/* The tiles' addresses, for ds_wino_f2_t / _f4_t (csrc/ds_conv_dw_wino.c), which a generated kernel hands them. */
int64_t ds_conv_tile2_bf16_addr(void) { return (int64_t)(intptr_t)&ds_conv_tile2_bf16; }
int64_t ds_conv_tile2_bf16e_addr(void) { return (int64_t)(intptr_t)&ds_conv_tile2_bf16e; }

/* For the tests: this thread's tiles configured as another library might leave them (palette 1, each tile `rows`
   rows of 64 bytes), to check that the next product loads its own configuration (ds_amx_config reads it back);
   returns whether it did (0 without the tiles). */
int ds_amx_configure_other(int rows) {
#if DS_BF16_AMX
    if (!ds_amx_on() || rows < 1 || rows > 16) return 0;
    ds_amx_load_config(rows);
    return 1;
#else
    (void)rows;
    return 0;
#endif
}

/* Whether bf16 products run on AMX tiles (Sapphire Rapids and later) rather than VDPBF16PS alone: `want` 0 or 1
   sets the wish (the tests run both paths on one machine), -1 only asks. 1 only where this library was compiled
   with AMX and Linux granted the tiles' state; a refusal leaves the VDPBF16PS path, which every AMX CPU has. */
int ds_bf16_use_amx(int want) {
#if DS_BF16_AMX
    return ds_amx_use(want);
#else
    (void)want;
    return 0;
#endif
}
