/* int8 products by a constant matrix, for models quantized dynamically the way onnxruntime's quantize_dynamic writes
   them (DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul by the scales): what a `dynshape::DynamicQuantizeMatMul`
   node (passes/quant.py) lowers to (codegen/lower/qproduct.py); and the products of statically quantized models
   (`dynshape::QuantizedMatMul`: QDQ products under precision="int8", QLinearMatMul; ops/qstatic.py), whose
   activation is quantized with a scale and zero point fixed at compile time (`ds_q8_quantize_static`) or arrives
   quantized (`ds_q8_load`), and whose result is either dequantized (`ds_q8_block` with the per-column
   multipliers) or requantized to 8 bits (`ds_q8_block_rq`).

   Exact by construction. The activations are quantized here with DynamicQuantizeLinear's own arithmetic (one scale
   and zero point over the whole tensor, its range widened to hold 0, x / scale rounded half to even and saturated
   to 0..255), the products are accumulated in int32 with the zero-point corrections applied in int32 (wrapping, as
   MatMulInteger's int32 result does), and only then is the sum cast to float32 and multiplied by
   (activation scale * weight scale), rounded to float32 once as the graph's Mul of the two scales rounds it. So the
   integer part equals MatMulInteger's and the float part the graph's to the last bit.

   Layouts. Weights are int8 (uint8 weights are shifted by -128, with their zero points: codegen/int8.py), packed once
   at compile time into panels of 32 columns whose rows hold groups of 4 consecutive k: row p of a panel is 32 x 4
   bytes (B[4p..4p+3][j] for j = 0..31), what VPDPBUSD multiplies against a broadcast group (A[i][4p..4p+3]); after
   the panels, the column sums of the int8 weights (int32, one per padded column). Activations are quantized, once
   per kernel call, into the calling thread's scratch: rows padded to a multiple of 4 bytes with zeros (the padded
   weights are zeros too), and each row's sum of its quantized values.

   (A - za)(B - zb) = AB - zb * rowsum(A) - za * colsum(B) + k * za * zb: the sums are what the epilogue corrects by.

   Two ways to run a tile, one layout:
   - native (compiled where the compiler targets AVX512-VNNI: Intel Cascade Lake and later, AMD Zen 4): MR x 32
     micro-tiles of VPDPBUSD (u8 x s8 -> s32, groups of 4, no intermediate saturation), 2 * MR accumulators; where
     the CPU has AMX-INT8 and Linux grants its tiles, blocks of 16 rows and more on TDPBUSD tiles (the same sums:
     ds_q8_amx_sums), finished by the same code;
   - AVX2 (`ds_q8_block_avx2`, compiled for x86-64-v3 CPUs without VNNI, e.g. AMD Zen 2/3): the bytes widened to
     int16 and summed in pairs by VPMADDWD, which, unlike VPMADDUBSW, cannot saturate;
   - portable (`ds_q8_block_e`, every CPU): the same sums in plain int32 C. All give identical results (integer
     arithmetic), and the tests check each against the ONNX reference. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds_amx.h"
#include "ds_gemm_int8.h"

#if defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define DS_Q8_NATIVE 1
#include <immintrin.h>
#else
#define DS_Q8_NATIVE 0
#endif
#if DS_Q8_NATIVE && DS_AMX && defined(__AMX_INT8__)
#define DS_Q8_AMX 1 /* TDPBUSD tiles (Sapphire Rapids and later): see ds_q8_amx_sums */
#else
#define DS_Q8_AMX 0
#endif

#define DS_Q8_NR 32
#define DS_Q8_PAR_MIN 65536 /* floats from which the quantizing pass runs on every thread */

int ds_q8_native(void) { return DS_Q8_NATIVE; }

/* The quantized activations of the current kernel call of this thread. */
typedef struct {
    uint8_t *q;
    int32_t *rowsum;
    float *rowscale; /* per-token quantization (ds_q8_quantize_tokens): each row's scale; else unused */
    int per_row;     /* whether rowscale applies */
    int64_t ldq, kpad, cap_q, cap_rows; /* row stride; k padded to 4 (what a row holds, zeros after k) */
    float scale;
    int32_t zp;
    int16_t *q16;    /* AVX2 without VNNI: q widened to int16 (same layout), what ds_q8_block_avx2 broadcasts */
    int64_t cap_q16; /* elements q16 holds */
    int has16;       /* whether q16 holds this call's activations */
} ds_q8_act;

static __thread ds_q8_act ds_q8_tls;

/* The row stride of k quantized values: groups of 4 (VPDPBUSD's); whole chunks of 64 where the tiles run on AMX,
   whose A tiles read 64 k at a time (the padding is zeros, as the padded weights' groups are). */
static int64_t ds_q8_ldq(int64_t k) {
#if DS_Q8_AMX
    if (ds_amx_on()) return (k + 63) / 64 * 64;
#endif
    return (k + 3) / 4 * 4;
}

/* The scratch for m rows of k quantized values (one row and 4 bytes at least), and the descriptor's layout: its row
   stride (ds_q8_ldq) and k padded to 4. Returns 0 when out of memory (the layout then left as it was). */
static int ds_q8_reserve(ds_q8_act *a, int64_t m, int64_t k) {
    const int64_t ldq = ds_q8_ldq(k);
    m = m > 0 ? m : 1;
    const int64_t bytes = m * (ldq > 0 ? ldq : 4);
    if (bytes > a->cap_q) {
        free(a->q);
        a->q = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
        a->cap_q = a->q ? bytes : 0;
    }
    if (m > a->cap_rows) {
        free(a->rowsum);
        free(a->rowscale);
        a->rowsum = aligned_alloc(64, (size_t)((m * 4 + 63) / 64 * 64));
        a->rowscale = aligned_alloc(64, (size_t)((m * 4 + 63) / 64 * 64));
        a->cap_rows = a->rowsum && a->rowscale ? m : 0;
    }
    a->per_row = 0;
    if (a->q == NULL || a->rowsum == NULL || a->rowscale == NULL) return 0;
    a->ldq = ldq;
    a->kpad = (k + 3) / 4 * 4;
    return 1;
}

/* DynamicQuantizeLinear's scale and zero point of values whose minimum is lo and maximum hi (lo <= 0 <= hi), in
   float32 as the operator defines them: scale = (hi - lo) / 255, zero point = saturate(round(0 - lo / scale)). */
void ds_q8_params(float lo, float hi, float *scale, int32_t *zp) {
    const float s = (hi - lo) / 255.0f;
    *scale = s;
    if (s == 0.0f) { /* all zeros (or empty): runtimes pick 0 */
        *zp = 0;
        return;
    }
    float z = rintf(0.0f - lo / s);
    z = z < 0.0f ? 0.0f : z > 255.0f ? 255.0f : z;
    *zp = (int32_t)z;
}

/* The quantized activations also as int16 where the tiles run on AVX2 without VNNI (ds_q8_block_avx2 then loads a
   group's 4 values as one 8-byte broadcast instead of widening them per panel: 3 shuffle uops less per group and
   row); returns a, or NULL when out of memory. Every entry point that quantizes ends here. */
static const void *ds_q8_ready(ds_q8_act *a, int64_t m) {
    a->has16 = 0;
#if !DS_Q8_NATIVE && defined(__AVX2__)
    const int64_t n = (m > 0 ? m : 1) * a->ldq;
    if (n > a->cap_q16) {
        free(a->q16);
        a->q16 = aligned_alloc(64, (size_t)((n * 2 + 63) / 64 * 64));
        a->cap_q16 = a->q16 ? n : 0;
        if (a->q16 == NULL) return NULL;
    }
    const uint8_t *restrict q = a->q;
    int16_t *restrict w = a->q16;
    #pragma omp parallel for schedule(static) if(n >= DS_Q8_PAR_MIN)
    for (int64_t i = 0; i < n; i++) w[i] = q[i];
    a->has16 = 1;
#else
    (void)m;
#endif
    return a;
}

/* x (m rows of k floats, contiguous) quantized the DynamicQuantizeLinear way into this thread's scratch; returns the
   scratch's descriptor, which the tiles of the same call read (from any thread), or NULL when out of memory. */
const void *ds_q8_quantize(const float *restrict x, int64_t m, int64_t k) {
    ds_q8_act *a = &ds_q8_tls;
    if (!ds_q8_reserve(a, m, k)) return NULL;
    const int64_t ldq = a->ldq;
    float lo = 0.0f, hi = 0.0f; /* the range always holds 0 */
    const int64_t total = m * k;
    #pragma omp parallel for reduction(min : lo) reduction(max : hi) schedule(static) if(total >= DS_Q8_PAR_MIN)
    for (int64_t i = 0; i < total; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    ds_q8_params(lo, hi, &a->scale, &a->zp);
    const float s = a->scale;
    const float zf = (float)a->zp;
    uint8_t *q = a->q;
    int32_t *rowsum = a->rowsum;
    #pragma omp parallel for schedule(static) if(total >= DS_Q8_PAR_MIN)
    for (int64_t i = 0; i < m; i++) {
        const float *xi = x + i * k;
        uint8_t *qi = q + i * ldq;
        int32_t sum = 0;
        if (s == 0.0f) {
            memset(qi, 0, (size_t)ldq);
        } else {
            for (int64_t j = 0; j < k; j++) {
                float v = rintf(xi[j] / s) + zf;
                v = v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v;
                const int32_t u = (int32_t)v;
                qi[j] = (uint8_t)u;
                sum += u;
            }
            for (int64_t j = k; j < ldq; j++) qi[j] = 0;
        }
        rowsum[i] = sum;
    }
    return ds_q8_ready(a, m);
}

/* QuantizeLinear per tensor with a scale and zero point fixed at compile time, of x (m rows of k floats) into this
   thread's scratch, as ds_q8_quantize: q = saturate(rint(x / scale) + zp) into 0..255 (uint8) or -128..127 (int8,
   stored shifted by +128 as uint8 with its zero point: q - zp is unchanged); the descriptor's scale is 1 (the
   product's multipliers carry the scales). A NaN quantizes to the range's low end. */
const void *ds_q8_quantize_static(const float *restrict x, int64_t m, int64_t k, float scale, int32_t zp,
                                  int32_t is_signed) {
    ds_q8_act *a = &ds_q8_tls;
    if (!ds_q8_reserve(a, m, k)) return NULL;
    const int64_t ldq = a->ldq;
    a->scale = 1.0f;
    const int32_t shift = is_signed ? 128 : 0;
    a->zp = zp + shift;
    const float lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f, zf = (float)zp;
    uint8_t *q = a->q;
    int32_t *rowsum = a->rowsum;
    #pragma omp parallel for schedule(static) if(m * k >= DS_Q8_PAR_MIN)
    for (int64_t i = 0; i < m; i++) {
        const float *xi = x + i * k;
        uint8_t *qi = q + i * ldq;
        int32_t sum = 0;
        for (int64_t j = 0; j < k; j++) {
            float v = rintf(xi[j] / scale) + zf;
            v = v >= lo ? (v <= hi ? v : hi) : lo;
            const int32_t u = (int32_t)v + shift;
            qi[j] = (uint8_t)u;
            sum += u;
        }
        for (int64_t j = k; j < ldq; j++) qi[j] = 0;
        rowsum[i] = sum;
    }
    return ds_q8_ready(a, m);
}

/* Activations already quantized (m rows of k uint8, or int8 shifted by +128), with their zero point, into this
   thread's scratch (rows padded to 4 bytes, their sums); the descriptor's scale is 1. */
const void *ds_q8_load(const void *restrict x, int64_t m, int64_t k, int32_t zp, int32_t is_signed) {
    ds_q8_act *a = &ds_q8_tls;
    if (!ds_q8_reserve(a, m, k)) return NULL;
    const int64_t ldq = a->ldq;
    a->scale = 1.0f;
    a->zp = zp + (is_signed ? 128 : 0);
    const uint8_t flip = is_signed ? 0x80 : 0; /* int8 v + 128 as uint8: its top bit flipped */
    #pragma omp parallel for schedule(static) if(m * k >= DS_Q8_PAR_MIN)
    for (int64_t i = 0; i < m; i++) {
        const uint8_t *xi = (const uint8_t *)x + i * k;
        uint8_t *qi = a->q + i * ldq;
        int32_t sum = 0;
        for (int64_t j = 0; j < k; j++) {
            qi[j] = xi[j] ^ flip;
            sum += qi[j];
        }
        for (int64_t j = k; j < ldq; j++) qi[j] = 0;
        a->rowsum[i] = sum;
    }
    return ds_q8_ready(a, m);
}

/* Per-token symmetric quantization (ds.quantize_dynamic, passes/quant.py): row i's scale s_i = max|x_i| / 127 (float32
   division), q = saturate(rint(x / s_i)) into -127..127 (a zero row: scale 0, q = 0), stored shifted by +128 as
   uint8 with zero point 128 (every row's). The tiles multiply each row by its scale after the columns' (wscale). */
const void *ds_q8_quantize_tokens(const float *restrict x, int64_t m, int64_t k) {
    ds_q8_act *a = &ds_q8_tls;
    if (!ds_q8_reserve(a, m, k)) return NULL;
    const int64_t ldq = a->ldq;
    a->scale = 1.0f;
    a->zp = 128;
    a->per_row = 1;
    #pragma omp parallel for schedule(static) if(m * k >= DS_Q8_PAR_MIN)
    for (int64_t i = 0; i < m; i++) {
        const float *xi = x + i * k;
        uint8_t *qi = a->q + i * ldq;
        float amax = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            const float v = fabsf(xi[j]);
            amax = v > amax ? v : amax;
        }
        const float s = amax / 127.0f;
        int32_t sum = 0;
        for (int64_t j = 0; j < k; j++) {
            float v = s > 0.0f ? rintf(xi[j] / s) : 0.0f;
            v = v >= -127.0f ? (v <= 127.0f ? v : 127.0f) : -127.0f;
            const int32_t u = (int32_t)v + 128;
            qi[j] = (uint8_t)u;
            sum += u;
        }
        for (int64_t j = k; j < ldq; j++) qi[j] = 0;
        a->rowsum[i] = sum;
        a->rowscale[i] = s;
    }
    return ds_q8_ready(a, m);
}

/* The scale and zero point the last ds_q8_quantize of `act` chose (for tests). */
void ds_q8_act_params(const void *act, float *scale, int32_t *zp) {
    const ds_q8_act *a = act;
    *scale = a->scale;
    *zp = a->zp;
}

/* The quantized row i of `act` (k padded to 4 bytes) and its sum (for tests). */
void ds_q8_act_row(const void *act, int64_t i, uint8_t *row, int32_t *sum) {
    const ds_q8_act *a = act;
    memcpy(row, a->q + i * a->ldq, (size_t)a->kpad);
    *sum = a->rowsum[i];
}

/* The panels' column sums follow them. */
static inline const int32_t *ds_q8_colsums(const void *bp, int64_t n, int64_t k) {
    const int64_t panels = (n + DS_Q8_NR - 1) / DS_Q8_NR, k4 = (k + 3) / 4;
    return (const int32_t *)((const int8_t *)bp + panels * k4 * DS_Q8_NR * 4);
}

/* Panel q of the packed weights: its bytes, its columns' sums, its first column and how many columns it has (32,
   or fewer for the last), and k in groups of 4. Every block entry point reads the layout through this one place. */
typedef struct {
    const int8_t *panel;
    const int32_t *colsum;
    int64_t k4, j0, cols;
} ds_q8_panel_at;

static inline ds_q8_panel_at ds_q8_panel(const void *bp, int64_t q, int64_t n, int64_t k) {
    ds_q8_panel_at p;
    p.k4 = (k + 3) / 4;
    p.j0 = q * DS_Q8_NR;
    p.cols = n - p.j0 < DS_Q8_NR ? n - p.j0 : DS_Q8_NR;
    p.panel = (const int8_t *)bp + q * p.k4 * DS_Q8_NR * 4;
    p.colsum = ds_q8_colsums(bp, n, k) + p.j0;
    return p;
}

/* One row's 32 (or fewer: cols) sums finished: corrected by the zero points (in int32, wrapping as MatMulInteger's
   int32 result does: unsigned arithmetic), cast to float32 and multiplied by scale * wscale[j] (per-token: by
   wscale[j], then by the row's scale rs). */
static inline void ds_q8_finish_row(const int32_t *acc, int32_t rsum, const ds_q8_act *a, const int32_t *wzp,
                                    const float *wscale, const int32_t *colsum, int64_t k, float *c, int64_t cols,
                                    float rs) {
    const uint32_t za = (uint32_t)a->zp;
    for (int64_t j = 0; j < cols; j++) {
        const uint32_t zb = (uint32_t)wzp[j];
        const uint32_t v = (uint32_t)acc[j] - zb * (uint32_t)rsum - za * (uint32_t)colsum[j] + (uint32_t)k * za * zb;
        if (a->per_row) {
            c[j] = (float)(int32_t)v * wscale[j] * rs;
        } else {
            const float sc = a->scale * wscale[j];
            c[j] = (float)(int32_t)v * sc;
        }
    }
}

/* One row's int32 sums requantized to 8 bits the way the ONNX reference's QLinearMatMul computes it (numpy:
   int32 * float32 -> float64): saturate(rint(double(acc) * double(mult[j]) + yzp)). No FMA contraction: the
   reference rounds the product before adding the zero point. */
__attribute__((optimize("fp-contract=off"))) static void ds_q8_requant_row(const int32_t *restrict acc,
                                                                          const float *restrict mult, int32_t yzp,
                                                                          int32_t is_signed, void *restrict y,
                                                                          int64_t cols) {
    const double z = (double)yzp, lo = is_signed ? -128.0 : 0.0, hi = is_signed ? 127.0 : 255.0;
    if (is_signed) {
        int8_t *o = y;
        for (int64_t j = 0; j < cols; j++) {
            double v = rint((double)acc[j] * (double)mult[j] + z);
            v = v < lo ? lo : v > hi ? hi : v;
            o[j] = (int8_t)(int32_t)v;
        }
    } else {
        uint8_t *o = y;
        for (int64_t j = 0; j < cols; j++) {
            double v = rint((double)acc[j] * (double)mult[j] + z);
            v = v < lo ? lo : v > hi ? hi : v;
            o[j] = (uint8_t)(int32_t)v;
        }
    }
}

/* The zero-point corrected int32 sums of one row (ds_q8_finish_row's integer part). */
static inline void ds_q8_correct_row(int32_t *acc, int32_t rsum, const ds_q8_act *a, const int32_t *wzp,
                                     const int32_t *colsum, int64_t k, int64_t cols) {
    const uint32_t za = (uint32_t)a->zp;
    for (int64_t j = 0; j < cols; j++) {
        const uint32_t zb = (uint32_t)wzp[j];
        acc[j] = (int32_t)((uint32_t)acc[j] - zb * (uint32_t)rsum - za * (uint32_t)colsum[j] + (uint32_t)k * za * zb);
    }
}

/* ---- portable --------------------------------------------------------------------------------------------------- */
/* One row's raw int32 sums against a panel of DS_Q8_NR columns (k in groups of 4, as VPDPBUSD takes them). */
static inline void ds_q8_dot_row(const uint8_t *ai, const int8_t *panel, int64_t k4, int32_t *acc) {
    for (int j = 0; j < DS_Q8_NR; j++) acc[j] = 0;
    for (int64_t p = 0; p < k4; p++) {
        const int8_t *b = panel + p * DS_Q8_NR * 4;
        const int32_t a0 = ai[4 * p], a1 = ai[4 * p + 1], a2 = ai[4 * p + 2], a3 = ai[4 * p + 3];
        for (int j = 0; j < DS_Q8_NR; j++)
            acc[j] += a0 * b[4 * j] + a1 * b[4 * j + 1] + a2 * b[4 * j + 2] + a3 * b[4 * j + 3];
    }
}

void ds_q8_block_e(const void *act, const void *bp, float *restrict c, int64_t ldc, int64_t i0, int64_t i1, int64_t q,
                   int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict wscale) {
    const ds_q8_act *a = act;
    const ds_q8_panel_at p = ds_q8_panel(bp, q, n, k);
    for (int64_t i = i0; i < i1; i++) {
        const uint8_t *ai = a->q + i * a->ldq;
        int32_t acc[DS_Q8_NR];
        ds_q8_dot_row(ai, p.panel, p.k4, acc);
        ds_q8_finish_row(acc, a->rowsum[i], a, wzp + p.j0, wscale + p.j0, p.colsum, k, c + i * ldc + p.j0, p.cols,
                         a->per_row ? a->rowscale[i] : 1.0f);
    }
}

/* Rows i0..i1 of panel q requantized to 8 bits into y (row stride ldc elements), portable sums. */
void ds_q8_block_rq_e(const void *act, const void *bp, void *restrict y, int64_t ldc, int64_t i0, int64_t i1,
                      int64_t q, int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict mult,
                      int32_t yzp, int32_t is_signed) {
    const ds_q8_act *a = act;
    const ds_q8_panel_at p = ds_q8_panel(bp, q, n, k);
    for (int64_t i = i0; i < i1; i++) {
        const uint8_t *ai = a->q + i * a->ldq;
        int32_t acc[DS_Q8_NR];
        ds_q8_dot_row(ai, p.panel, p.k4, acc);
        ds_q8_correct_row(acc, a->rowsum[i], a, wzp + p.j0, p.colsum, k, p.cols);
        ds_q8_requant_row(acc, mult + p.j0, yzp, is_signed, (uint8_t *)y + i * ldc + p.j0, p.cols);
    }
}

/* ---- AVX2: VPMADDWD (every x86-64-v3 CPU) ---------------------------------------------------------------------
   Without VNNI, onnxruntime multiplies u8 x s8 with VPMADDUBSW, whose 16-bit pair sums saturate (255 * -128 twice is
   -65280): its results drift from MatMulInteger's. Here the bytes are widened to int16 first (activations zero-,
   weights sign-extended) and VPMADDWD sums pairs into int32, which cannot saturate: the sums are exactly the
   portable ones (int32 addition wraps the same in any order). A panel row of 4 k x 32 columns is 8 groups of
   4 columns; one VPMADDWD of a group against the row's 4 activations (repeated) gives each column's two pair sums,
   added across k and joined at the end. Two rows x 16 columns at a time: 8 accumulators, 2 activation vectors, the
   weight vector and the product in 12 of the 16 ymm registers. Compiled wherever AVX2 is (on a VNNI machine too,
   where the tests run it beside the VPDPBUSD tiles). */
#if defined(__AVX2__)
#include <immintrin.h>
#define DS_Q8_AVX2 1

static inline __m256i ds_q8_bcast4(const uint8_t *a) {
    int32_t g;
    memcpy(&g, a, 4);
    return _mm256_cvtepu8_epi16(_mm_set1_epi32(g));
}

/* The 8 columns' sums of pair-sum accumulators u (columns 0..3) and v (4..7), in column order. */
static inline __m256i ds_q8_join_pairs(__m256i u, __m256i v) {
    return _mm256_permute4x64_epi64(_mm256_hadd_epi32(u, v), 0xD8);
}

static inline __m256i ds_q8_bcast4w(const int16_t *a) {
    int64_t g;
    memcpy(&g, a, 8);
    return _mm256_set1_epi64x(g);
}

/* Raw int32 sums of rows i and j (j may equal i: then acc1 is a copy) against the 32 columns of a panel; the
   activations from their int16 copy (`wide`: ds_q8_ready made one) or widened here. */
static inline __attribute__((always_inline)) void ds_q8_dot_rows2(const ds_q8_act *a, int64_t i, int64_t j,
                                                                  const int8_t *panel, int64_t k4, int32_t *acc0,
                                                                  int32_t *acc1, const int wide) {
    const uint8_t *a0 = a->q + i * a->ldq, *a1 = a->q + j * a->ldq;
    const int16_t *w0 = wide ? a->q16 + i * a->ldq : 0, *w1 = wide ? a->q16 + j * a->ldq : 0;
    for (int h = 0; h < 2; h++) {
        /* the eight accumulators as named values, one asm block per group of 4 k: with intrinsics gcc 12 spilled an
           accumulator and copied the others every step (it does not add into the accumulator's own register), and
           with an asm statement per multiply-add it still kept ~6 register copies per group among 20 instructions:
           the loop ran at half the VPMADDWDs' rate (two a cycle on Zen 3) */
        __m256i c00 = _mm256_setzero_si256(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00,
                c13 = c00, w, t;
        const int8_t *b = panel + 64 * h;
        for (int64_t p = 0; p < k4; p++) {
            const __m256i x0 = wide ? ds_q8_bcast4w(w0 + 4 * p) : ds_q8_bcast4(a0 + 4 * p);
            const __m256i x1 = wide ? ds_q8_bcast4w(w1 + 4 * p) : ds_q8_bcast4(a1 + 4 * p);
            __asm__("vpmovsxbw (%[b]), %[w]\n\t"
                    "vpmaddwd %[x0], %[w], %[t]\n\tvpaddd %[t], %[c00], %[c00]\n\t"
                    "vpmaddwd %[x1], %[w], %[t]\n\tvpaddd %[t], %[c10], %[c10]\n\t"
                    "vpmovsxbw 16(%[b]), %[w]\n\t"
                    "vpmaddwd %[x0], %[w], %[t]\n\tvpaddd %[t], %[c01], %[c01]\n\t"
                    "vpmaddwd %[x1], %[w], %[t]\n\tvpaddd %[t], %[c11], %[c11]\n\t"
                    "vpmovsxbw 32(%[b]), %[w]\n\t"
                    "vpmaddwd %[x0], %[w], %[t]\n\tvpaddd %[t], %[c02], %[c02]\n\t"
                    "vpmaddwd %[x1], %[w], %[t]\n\tvpaddd %[t], %[c12], %[c12]\n\t"
                    "vpmovsxbw 48(%[b]), %[w]\n\t"
                    "vpmaddwd %[x0], %[w], %[t]\n\tvpaddd %[t], %[c03], %[c03]\n\t"
                    "vpmaddwd %[x1], %[w], %[t]\n\tvpaddd %[t], %[c13], %[c13]"
                    : [c00] "+x"(c00), [c01] "+x"(c01), [c02] "+x"(c02), [c03] "+x"(c03), [c10] "+x"(c10),
                      [c11] "+x"(c11), [c12] "+x"(c12), [c13] "+x"(c13), [w] "=&x"(w), [t] "=&x"(t)
                    : [b] "r"(b + p * 128), [x0] "x"(x0), [x1] "x"(x1)
                    : "memory");
        }
        _mm256_storeu_si256((__m256i *)(acc0 + 16 * h), ds_q8_join_pairs(c00, c01));
        _mm256_storeu_si256((__m256i *)(acc0 + 16 * h + 8), ds_q8_join_pairs(c02, c03));
        _mm256_storeu_si256((__m256i *)(acc1 + 16 * h), ds_q8_join_pairs(c10, c11));
        _mm256_storeu_si256((__m256i *)(acc1 + 16 * h + 8), ds_q8_join_pairs(c12, c13));
    }
}

/* Rows i .. i + rows (1 or 2) of panel p: their raw sums, from the int16 copy where the call made one. */
static void ds_q8_sums_avx2(const ds_q8_act *a, const ds_q8_panel_at *p, int64_t i, int64_t rows,
                            int32_t acc[2][DS_Q8_NR]) {
    if (a->has16) ds_q8_dot_rows2(a, i, i + rows - 1, p->panel, p->k4, acc[0], acc[1], 1);
    else ds_q8_dot_rows2(a, i, i + rows - 1, p->panel, p->k4, acc[0], acc[1], 0);
}

/* ds_q8_block_e and ds_q8_block_rq_e on VPMADDWD, two rows at a time. */
void ds_q8_block_avx2(const void *act, const void *bp, float *restrict c, int64_t ldc, int64_t i0, int64_t i1,
                      int64_t q, int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict wscale) {
    const ds_q8_act *a = act;
    const ds_q8_panel_at p = ds_q8_panel(bp, q, n, k);
    for (int64_t i = i0; i < i1; i += 2) {
        const int64_t rows = i1 - i < 2 ? i1 - i : 2;
        int32_t acc[2][DS_Q8_NR];
        ds_q8_sums_avx2(a, &p, i, rows, acc);
        for (int64_t r = 0; r < rows; r++)
            ds_q8_finish_row(acc[r], a->rowsum[i + r], a, wzp + p.j0, wscale + p.j0, p.colsum, k,
                             c + (i + r) * ldc + p.j0, p.cols, a->per_row ? a->rowscale[i + r] : 1.0f);
    }
}

void ds_q8_block_rq_avx2(const void *act, const void *bp, void *restrict y, int64_t ldc, int64_t i0, int64_t i1,
                         int64_t q, int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict mult,
                         int32_t yzp, int32_t is_signed) {
    const ds_q8_act *a = act;
    const ds_q8_panel_at p = ds_q8_panel(bp, q, n, k);
    for (int64_t i = i0; i < i1; i += 2) {
        const int64_t rows = i1 - i < 2 ? i1 - i : 2;
        int32_t acc[2][DS_Q8_NR];
        ds_q8_sums_avx2(a, &p, i, rows, acc);
        for (int64_t r = 0; r < rows; r++) {
            ds_q8_correct_row(acc[r], a->rowsum[i + r], a, wzp + p.j0, p.colsum, k, p.cols);
            ds_q8_requant_row(acc[r], mult + p.j0, yzp, is_signed, (uint8_t *)y + (i + r) * ldc + p.j0, p.cols);
        }
    }
}
#else
#define DS_Q8_AVX2 0
/* Without AVX2 the entry points exist (one symbol table on every CPU) and run the portable sums; ds_q8_avx2 says so. */
void ds_q8_block_avx2(const void *act, const void *bp, float *restrict c, int64_t ldc, int64_t i0, int64_t i1,
                      int64_t q, int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict wscale) {
    ds_q8_block_e(act, bp, c, ldc, i0, i1, q, n, k, wzp, wscale);
}

void ds_q8_block_rq_avx2(const void *act, const void *bp, void *restrict y, int64_t ldc, int64_t i0, int64_t i1,
                         int64_t q, int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict mult,
                         int32_t yzp, int32_t is_signed) {
    ds_q8_block_rq_e(act, bp, y, ldc, i0, i1, q, n, k, wzp, mult, yzp, is_signed);
}
#endif

int ds_q8_avx2(void) { return DS_Q8_AVX2; }

/* ---- native: VPDPBUSD ------------------------------------------------------------------------------------------- */
#if DS_Q8_NATIVE
#define DS_Q8_MR 12

/* A panel's per-column terms of the epilogue: zb, k * za * zb - za * colsum (int32, wrapping), scale * wscale
   (float32, rounded once), and the masks of its columns. Kept in memory, not registers: the 24 accumulators, two
   weight vectors and the broadcast take 27 of the 32 vector registers while the sums run. */
/* acc += u8 x s8 groups of 4. In asm because gcc 12 copies the accumulator of _mm512_dpbusd_epi32 through another
   register (it does not tie the destructive operand): every VPDPBUSD came with two moves, halving the rate. */
#define DS_DPBUSD(acc, a, b) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))

typedef struct {
    __m512i zb[2], ct[2];
    __m512 sc[2];
    __mmask16 m[2];
} ds_q8_cols;

/* Row i's sums of one panel (columns 0..15 and 16..31) finished: corrected by the zero points (int32, wrapping),
   then stored as int32 (`ints`: for requantization) or dequantized; c: the row's first column (4-byte elements). */
static inline __attribute__((always_inline)) void ds_q8_finish_vec(const ds_q8_act *a, __m512i acc0, __m512i acc1,
                                                                   int64_t i, void *c, const ds_q8_cols *cv,
                                                                   const int ints) {
    const __m512i rs = _mm512_set1_epi32(a->rowsum[i]);
    const __m512i acc[2] = {acc0, acc1};
    for (int h = 0; h < 2; h++) {
        const __m512i v = _mm512_add_epi32(_mm512_sub_epi32(acc[h], _mm512_mullo_epi32(cv->zb[h], rs)), cv->ct[h]);
        if (ints)
            _mm512_mask_storeu_epi32((int32_t *)c + 16 * h, cv->m[h], v);
        else if (a->per_row)
            _mm512_mask_storeu_ps((float *)c + 16 * h, cv->m[h],
                                  _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v), cv->sc[h]),
                                                _mm512_set1_ps(a->rowscale[i])));
        else
            _mm512_mask_storeu_ps((float *)c + 16 * h, cv->m[h], _mm512_mul_ps(_mm512_cvtepi32_ps(v), cv->sc[h]));
    }
}

/* Rows i..i+mr of one panel: mr x 32 int32 sums in 2 * mr registers, then finished 16 columns at a time. */
/* c: row i's first column (row stride ldc); `ints`: store the corrected int32 sums there instead (requantization). */
static inline __attribute__((always_inline)) void ds_q8_rows(const ds_q8_act *a, const int8_t *panel, int64_t k4,
                                                             int64_t i, const int mr, void *c, int64_t ldc,
                                                             const ds_q8_cols *cv, const int ints) {
    __m512i acc[DS_Q8_MR][2];
    _Pragma("GCC unroll 16") for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    const uint8_t *ai = a->q + i * a->ldq;
    const int64_t ldq = a->ldq;
    for (int64_t p = 0; p < k4; p++) {
        const __m512i b0 = _mm512_load_si512((const void *)(panel + p * 128));
        const __m512i b1 = _mm512_load_si512((const void *)(panel + p * 128 + 64));
        _Pragma("GCC unroll 16") for (int r = 0; r < mr; r++) {
            int32_t g;
            memcpy(&g, ai + r * ldq + 4 * p, 4);
            const __m512i av = _mm512_set1_epi32(g);
            DS_DPBUSD(acc[r][0], av, b0);
            DS_DPBUSD(acc[r][1], av, b1);
        }
    }
    _Pragma("GCC unroll 16") for (int r = 0; r < mr; r++)
        ds_q8_finish_vec(a, acc[r][0], acc[r][1], i + r, (int32_t *)c + r * ldc, cv, ints);
}

/* A panel's per-column terms (ds_q8_cols) for the activations `a`. */
static inline void ds_q8_panel_cols(const ds_q8_act *a, const void *bp, int64_t q, int64_t n, int64_t k,
                                    const int32_t *restrict wzp, const float *restrict wscale, ds_q8_cols *cv) {
    const ds_q8_panel_at p = ds_q8_panel(bp, q, n, k);
    const int64_t j0 = p.j0, cols = p.cols;
    const int32_t *colsum = p.colsum;
    cv->m[0] = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
    cv->m[1] = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
    const __m512i za = _mm512_set1_epi32(a->zp), kza = _mm512_set1_epi32((int32_t)((uint32_t)k * (uint32_t)a->zp));
    const __m512 as = _mm512_set1_ps(a->scale);
    for (int h = 0; h < 2; h++) {
        cv->zb[h] = _mm512_maskz_loadu_epi32(cv->m[h], wzp + j0 + 16 * h);
        const __m512i cs = _mm512_maskz_loadu_epi32(cv->m[h], colsum + 16 * h);
        cv->ct[h] = _mm512_sub_epi32(_mm512_mullo_epi32(kza, cv->zb[h]), _mm512_mullo_epi32(za, cs));
        cv->sc[h] = wscale ? _mm512_mul_ps(as, _mm512_maskz_loadu_ps(cv->m[h], wscale + j0 + 16 * h)) : as;
    }
}

#if DS_Q8_AMX
/* Rows i..i + rows (16 or 32) of one panel: their raw int32 sums into `out` (rows x 32, 128 bytes a row) on TDPBUSD
   tiles (ds_amx.h: ds_amx_pass), u8 activations (16 rows x 64 k a tile) by s8 weights: a panel's rows of 32
   columns x 4 k are two B tiles side by side, as for bf16, its last short chunk from `tail` (ds_amx_tail). */
static void ds_q8_amx_sums(const ds_q8_act *a, const int8_t *panel, const uint8_t *tail, int64_t whole,
                           int64_t chunks, int64_t i, int rows, int32_t *out) {
    ds_amx_pass(a->q + i * a->ldq, a->ldq, (const uint8_t *)panel, tail, whole, chunks, rows, DS_AMX_U8S8);
    ds_amx_store_sums(out, rows, 32);
}
#endif

/* Rows i0.. of panel p on AMX tiles, 32 then 16 at a time, finished as VPDPBUSD's are (dequantized into c, or, with
   `mult`, requantized into the 8-bit y = c); returns the first row left to VPDPBUSD (all of them where the
   activations were not laid out for AMX, AMX is off, or there are fewer than 16 rows: a mostly empty tile is
   slower than the vector micro-tiles). */
static int64_t ds_q8_amx_block(const ds_q8_act *a, const ds_q8_panel_at *p, int64_t i0, int64_t i1, void *c,
                               int64_t ldc, const ds_q8_cols *cv, const float *mult, int32_t yzp, int32_t is_signed) {
#if DS_Q8_AMX
    if (i1 - i0 < 16 || a->ldq % 64 != 0 || !ds_amx_on()) return i0;
    _Alignas(64) uint8_t tail[16 * 128];
    _Alignas(64) int32_t sums[32 * 32];
    const int64_t chunks = a->ldq / 64, whole = p->k4 / 16;
    if (whole < chunks) ds_amx_tail((const uint8_t *)p->panel, whole, p->k4, tail);
    ds_amx_config();
    int64_t i = i0;
    while (i + 16 <= i1) {
        const int rows = i + 32 <= i1 ? 32 : 16;
        ds_q8_amx_sums(a, p->panel, tail, whole, chunks, i, rows, sums);
        for (int r = 0; r < rows; r++) {
            int32_t *s = sums + r * 32;
            const __m512i s0 = _mm512_load_si512(s), s1 = _mm512_load_si512(s + 16);
            if (!mult) {
                ds_q8_finish_vec(a, s0, s1, i + r, (float *)c + (i + r) * ldc + p->j0, cv, 0);
            } else {
                ds_q8_finish_vec(a, s0, s1, i + r, s, cv, 1);
                ds_q8_requant_row(s, mult + p->j0, yzp, is_signed, (uint8_t *)c + (i + r) * ldc + p->j0, p->cols);
            }
        }
        i += rows;
    }
    return i; /* (the tiles stay configured for the thread's next call: ds_amx_config) */
#else
    (void)a; (void)p; (void)i1; (void)c; (void)ldc; (void)cv; (void)mult; (void)yzp; (void)is_signed;
    return i0;
#endif
}

static void ds_q8_block_native(const ds_q8_act *a, const void *bp, float *restrict c, int64_t ldc, int64_t i0,
                               int64_t i1, int64_t q, int64_t n, int64_t k, const int32_t *restrict wzp,
                               const float *restrict wscale) {
    const ds_q8_panel_at p = ds_q8_panel(bp, q, n, k);
    const int64_t k4 = p.k4;
    const int8_t *panel = p.panel;
    ds_q8_cols cv;
    ds_q8_panel_cols(a, bp, q, n, k, wzp, wscale, &cv);
    float *cj = c + p.j0;
    int64_t i = ds_q8_amx_block(a, &p, i0, i1, c, ldc, &cv, NULL, 0, 0);
    for (; i + DS_Q8_MR <= i1; i += DS_Q8_MR) ds_q8_rows(a, panel, k4, i, DS_Q8_MR, cj + i * ldc, ldc, &cv, 0);
    if (i + 8 <= i1) {
        ds_q8_rows(a, panel, k4, i, 8, cj + i * ldc, ldc, &cv, 0);
        i += 8;
    }
    if (i + 4 <= i1) {
        ds_q8_rows(a, panel, k4, i, 4, cj + i * ldc, ldc, &cv, 0);
        i += 4;
    }
    for (; i < i1; i++) ds_q8_rows(a, panel, k4, i, 1, cj + i * ldc, ldc, &cv, 0);
}

/* Requantized rows: up to DS_Q8_MR rows of corrected int32 sums in a stack tile, then requantized. */
static void ds_q8_block_rq_native(const ds_q8_act *a, const void *bp, void *restrict y, int64_t ldc, int64_t i0,
                                  int64_t i1, int64_t q, int64_t n, int64_t k, const int32_t *restrict wzp,
                                  const float *restrict mult, int32_t yzp, int32_t is_signed) {
    const ds_q8_panel_at p = ds_q8_panel(bp, q, n, k);
    const int64_t k4 = p.k4, j0 = p.j0, cols = p.cols;
    const int8_t *panel = p.panel;
    ds_q8_cols cv;
    ds_q8_panel_cols(a, bp, q, n, k, wzp, NULL, &cv);
    int32_t tile[DS_Q8_MR * DS_Q8_NR] __attribute__((aligned(64)));
    for (int64_t i = ds_q8_amx_block(a, &p, i0, i1, y, ldc, &cv, mult, yzp, is_signed); i < i1;) {
        const int64_t left = i1 - i;
        const int mr = left >= DS_Q8_MR ? DS_Q8_MR : left >= 8 ? 8 : left >= 4 ? 4 : 1;
        if (mr == DS_Q8_MR) ds_q8_rows(a, panel, k4, i, DS_Q8_MR, tile, DS_Q8_NR, &cv, 1);
        else if (mr == 8) ds_q8_rows(a, panel, k4, i, 8, tile, DS_Q8_NR, &cv, 1);
        else if (mr == 4) ds_q8_rows(a, panel, k4, i, 4, tile, DS_Q8_NR, &cv, 1);
        else ds_q8_rows(a, panel, k4, i, 1, tile, DS_Q8_NR, &cv, 1);
        for (int r = 0; r < mr; r++)
            ds_q8_requant_row(tile + r * DS_Q8_NR, mult + j0, yzp, is_signed, (uint8_t *)y + (i + r) * ldc + j0, cols);
        i += mr;
    }
}
#endif

/* Rows i0..i1 of panel q (columns 32q .. min(32q + 32, n)) of the dequantized product, written to c (row stride
   ldc): VPDPBUSD where the library was compiled for it, else the portable sums. */
void ds_q8_block(const void *act, const void *bp, float *restrict c, int64_t ldc, int64_t i0, int64_t i1, int64_t q,
                 int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict wscale) {
#if DS_Q8_NATIVE
    ds_q8_block_native(act, bp, c, ldc, i0, i1, q, n, k, wzp, wscale);
#elif DS_Q8_AVX2
    ds_q8_block_avx2(act, bp, c, ldc, i0, i1, q, n, k, wzp, wscale);
#else
    ds_q8_block_e(act, bp, c, ldc, i0, i1, q, n, k, wzp, wscale);
#endif
}

/* Rows i0..i1 of panel q of the product requantized to 8 bits (uint8, or int8 when is_signed), written to y (row
   stride ldc elements): saturate(rint(double(acc) * mult[j] + yzp)). */
void ds_q8_block_rq(const void *act, const void *bp, void *restrict y, int64_t ldc, int64_t i0, int64_t i1,
                    int64_t q, int64_t n, int64_t k, const int32_t *restrict wzp, const float *restrict mult,
                    int32_t yzp, int32_t is_signed) {
#if DS_Q8_NATIVE
    ds_q8_block_rq_native(act, bp, y, ldc, i0, i1, q, n, k, wzp, mult, yzp, is_signed);
#elif DS_Q8_AVX2
    ds_q8_block_rq_avx2(act, bp, y, ldc, i0, i1, q, n, k, wzp, mult, yzp, is_signed);
#else
    ds_q8_block_rq_e(act, bp, y, ldc, i0, i1, q, n, k, wzp, mult, yzp, is_signed);
#endif
}

/* Whether the int8 tiles run on AMX (TDPBUSD) rather than VPDPBUSD alone: `want` 0 or 1 sets the wish (the tests run
   both paths on one machine), -1 only asks; 1 only where this library has AMX and Linux granted the tiles. The
   activations quantized under one wish are laid out for it: a call's quantizer and tiles see the same. */
int ds_q8_use_amx(int want) {
#if DS_Q8_AMX
    return ds_amx_use(want);
#else
    (void)want;
    return 0;
#endif
}
