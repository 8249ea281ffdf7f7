/* The recurrent product of an LSTM whose R ships as 8-bit integers (onnxruntime's DynamicQuantizeLSTM: int8 or
   uint8 weights with a scale and zero point per direction or per direction and gate row), for csrc/ds_rnn.c.

   Why: a batch-1 step is the product h [hidden] @ R^T, every weight used once. In float32, R of a hidden-512
   bidirectional layer is 8 MiB streamed per step pair and each weight costs one FMA; kept as the int8 values
   the file ships, it is 2 MiB, and VPDPBUSD multiplies 64 weight bytes per instruction. onnxruntime gets there
   by rounding h to 8 bits each step; this kernel instead splits h into three 8-bit digits, so the product is
   exact integer arithmetic on h rounded to 23 bits (relative to the row's largest |h|): its result differs
   from the float32 product on the dequantized weights by ~1e-7 of the output's magnitude, not by
   onnxruntime's ~1e-3, for three instructions per 64 weights (a third of the float kernel's per weight).

   The arithmetic. Per row j of R, d[j][k] = q - z (the dequantized weight is s_j * d[j][k]) lies in
   [-255, 255]; the packing (codegen/rnn_kernel.py) stores q'[j][k] = d[j][k] - z'_j in int8 with any z'_j
   that fits (so int8 and uint8 weights pack alike). Each step, a batch row h gets an exponent e (max|h| <
   2^e) and H_k = rint(h_k 2^(22-e)) in [-2^22, 2^22]; U_k = H_k + 2^23 < 2^24 is three unsigned bytes
   u0 + 2^8 u1 + 2^16 u2. Then, exactly (int32 sums per digit, below 255 * 128 * k < 2^31 for k <= 65536),
       sum_k H_k d[j][k] = A0 + 2^8 A1 + 2^16 A2 - 2^23 colsum_j(q') + z'_j sum_k H_k,   A_i = sum_k u_i q'[j][k]
   combined in double (every term an integer below 2^53, so no rounding) and scaled by s_j 2^(e-22) once.
   A row of zeros gives zeros; a row holding NaN or infinity runs a scalar float product on the integers (so
   +-inf and NaN come out per column as the float kernel's would; rare, so slow is fine).

   Three ways to run a panel, one layout: VPDPBUSD (where the compiler targets AVX512-VNNI); on AVX2 without it,
   VPMADDWD on the weights widened to int16 against U split into two 12-bit digits (U = lo + 2^12 hi; per-digit
   sums below 4095 * 128 * k < 2^31 for k <= 4096, deeper R runs the portable sums): two instructions per 16
   weights a digit where a byte pair would saturate in VPMADDUBSW; and plain int32 C (every CPU, and the tests'
   reference for the others: integer sums, the same epilogue, identical bits).

   Packed R of one direction, n = 4 * hidden columns, k = hidden deep, P = ceil(n / 32) panels, K4 = ceil(k / 4):
     int8   [P][K4][32][4]   byte i of column j of group g of panel p = q'[32p + j][4g + i] (0 past n or k)
     double [P * 32]         2^23 colsum_j(q')
     double [P * 32]         z'_j
     double [P * 32]         s_j
   Scratch per batch row: dsq_row_floats(k) floats (the digits, then its sum of H and exponent). */
#ifndef DS_RNN_Q8_H
#define DS_RNN_Q8_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define DSQ_NATIVE 1
#include <immintrin.h>
#elif defined(__AVX2__)
#define DSQ_NATIVE 2 /* VPMADDWD on two 12-bit digits (dsq_kernel_avx2) */
#include <immintrin.h>
#else
#define DSQ_NATIVE 0
#endif
/* The deepest R the AVX2 product takes: its 12-bit digit sums (4095 * 128 * k) stay below 2^31 up to here. */
#define DSQ_AVX2_MAX_K 4096

static inline int64_t dsq_panels(int64_t n) { return (n + 31) / 32; }
static inline int64_t dsq_groups(int64_t k) { return (k + 3) / 4; }
static inline int64_t dsq_dir_bytes(int64_t n, int64_t k) {
    return dsq_panels(n) * (dsq_groups(k) * 128 + 3 * 32 * 8);
}
/* the digits (3 * K4 words of bytes, or under AVX2 two planes of 4 * K4 int16), rounded to 64 bytes, then a
   64-byte header */
static inline int64_t dsq_digit_floats(int64_t k4) { return (4 * k4 + 15) / 16 * 16; }
static inline int64_t dsq_row_floats(int64_t k) { return dsq_digit_floats(dsq_groups(k)) + 16; }
/* Whether a row of depth k takes the AVX2 product (two 12-bit digits) rather than the three bytes. */
static inline int dsq_avx2(int64_t k, int portable) { return DSQ_NATIVE == 2 && !portable && k <= DSQ_AVX2_MAX_K; }

typedef struct {
    int64_t sh;   /* sum_k H_k */
    int32_t e;    /* max|h| < 2^e */
    int32_t kind; /* 0: digits hold the row, 1: it is zero (no product to run), 2: it holds NaN or infinity */
} dsq_row;

/* One batch row of the state into its digits (scratch: dsq_row_floats(k) floats, 64-byte aligned). */
static void dsq_quantize_row(const float *restrict h, int64_t k, float *scratch, int avx2) {
    const int64_t k4 = dsq_groups(k);
    uint8_t *restrict u = (uint8_t *)scratch;
    uint16_t *restrict lo = (uint16_t *)scratch, *restrict hi = lo + 4 * k4;
    dsq_row *hd = (dsq_row *)(scratch + dsq_digit_floats(k4));
    uint32_t mb = 0; /* the largest |h| as bits: NaN and infinity compare above every finite value */
    for (int64_t j = 0; j < k; j++) {
        uint32_t b;
        memcpy(&b, h + j, 4);
        b &= 0x7fffffffu;
        mb = b > mb ? b : mb;
    }
    hd->kind = mb == 0 ? 1 : mb >= 0x7f800000u ? 2 : 0;
    if (hd->kind) return;
    float m;
    memcpy(&m, &mb, 4);
    int e;
    frexpf(m, &e); /* m = f 2^e, f in [0.5, 1): |h_k| 2^(22-e) <= 2^22 */
    const double f = ldexp(1.0, 22 - e), round = 6755399441055744.0; /* 1.5 * 2^52: adding it rounds to even */
    int64_t sh = 0;
    if (avx2) { /* U = lo + 2^12 hi, each below 2^12 */
        for (int64_t j = 0; j < k; j++) {
            const int32_t hq = (int32_t)(((double)h[j] * f + round) - round);
            const uint32_t uq = (uint32_t)(hq + (1 << 23));
            sh += hq;
            lo[j] = (uint16_t)(uq & 4095u);
            hi[j] = (uint16_t)(uq >> 12);
        }
        for (int64_t j = k; j < 4 * k4; j++) lo[j] = hi[j] = 0;
    } else {
        for (int64_t j = 0; j < k; j++) {
            const int32_t hq = (int32_t)(((double)h[j] * f + round) - round);
            const uint32_t uq = (uint32_t)(hq + (1 << 23));
            sh += hq;
            u[j] = (uint8_t)uq;
            u[4 * k4 + j] = (uint8_t)(uq >> 8);
            u[8 * k4 + j] = (uint8_t)(uq >> 16);
        }
        for (int64_t j = k; j < 4 * k4; j++) u[j] = u[4 * k4 + j] = u[8 * k4 + j] = 0;
    }
    hd->sh = sh;
    hd->e = e;
}

/* Columns c0 .. c0 + ncols of one row from its digit sums (acc: 3 x 32 int32 per panel, digit-major). */
static inline void dsq_finish(const int32_t *restrict acc, const double *restrict c1, const double *restrict zq,
                              const double *restrict sc, const dsq_row *hd, float *restrict out, int64_t ncols,
                              int avx2) {
    const double sh = (double)hd->sh, unit = ldexp(1.0, hd->e - 22);
    float t[32];
    for (int64_t j = 0; j < 32; j++) {
        /* the same integer either way (every term below 2^53): identical results */
        const double digits = avx2 ? (double)acc[32 + j] * 4096.0 + (double)acc[j]
                                   : (double)acc[64 + j] * 65536.0 + (double)acc[32 + j] * 256.0 + (double)acc[j];
        const double v = digits - c1[j] + zq[j] * sh;
        t[j] = (float)(v * (sc[j] * unit));
    }
    for (int64_t j = 0; j < ncols; j++) out[j] = t[j];
}

#if DSQ_NATIVE == 2
/* acc += VPMADDWD(w, x) in asm (gcc 12 copies accumulators around the intrinsics: csrc/ds_gemm_int8.c's note). */
#define DSQ_MADD(acc, w, x)                                                                                       \
    do {                                                                                                            \
        __m256i t_;                                                                                                 \
        __asm__("vpmaddwd %3, %2, %1\n\tvpaddd %1, %0, %0" : "+x"(acc), "=&x"(t_) : "x"(w), "x"(x));              \
    } while (0)

/* One panel of one row on AVX2, exact: the weights widened to int16, the two 12-bit digit planes (4 k a group,
   broadcast as 8 bytes) against them by VPMADDWD (pair sums in int32: no saturation); half a panel at a time, 8
   accumulators. acc: 2 x 32 int32, digit-major, as dsq_finish reads them. */
static void dsq_panel_avx2(const uint16_t *restrict lo, const uint16_t *restrict hi, int64_t k4,
                           const int8_t *restrict p, int32_t *restrict acc) {
    for (int h = 0; h < 2; h++) {
        __m256i a[4], b[4];
        for (int c = 0; c < 4; c++) a[c] = b[c] = _mm256_setzero_si256();
        for (int64_t g = 0; g < k4; g++) {
            int64_t l8, h8;
            memcpy(&l8, lo + 4 * g, 8);
            memcpy(&h8, hi + 4 * g, 8);
            const __m256i xl = _mm256_set1_epi64x(l8), xh = _mm256_set1_epi64x(h8);
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
                const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + g * 128 + 64 * h
                                                                                           + 16 * c)));
                DSQ_MADD(a[c], w, xl);
                DSQ_MADD(b[c], w, xh);
            }
        }
        /* columns from pair sums: hadd, then the 64-bit quarters in order (csrc/ds_gemm_int8.c's join) */
        for (int c = 0; c < 4; c += 2) {
            _mm256_storeu_si256((__m256i *)(acc + 16 * h + 4 * c),
                                _mm256_permute4x64_epi64(_mm256_hadd_epi32(a[c], a[c + 1]), 0xD8));
            _mm256_storeu_si256((__m256i *)(acc + 32 + 16 * h + 4 * c),
                                _mm256_permute4x64_epi64(_mm256_hadd_epi32(b[c], b[c + 1]), 0xD8));
        }
    }
}
#endif

#if DSQ_NATIVE == 1
/* Panels q0 .. q0 + two of one row: per group of 4 k, the three digit words broadcast once against each panel's
   two 64-byte weight vectors; 12 accumulators. `two` is a constant in each caller (a branch in the loop made
   gcc shuffle the accumulators between registers every group: 1.4x slower). */
static inline __attribute__((always_inline)) void dsq_kernel(const uint8_t *restrict u, int64_t k4,
                                                             const int8_t *restrict p0, int32_t *restrict acc,
                                                             const int two) {
    const int8_t *p1 = p0 + k4 * 128;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m512i a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    for (int64_t g = 0; g < k4; g++) {
        int32_t d0, d1, d2;
        memcpy(&d0, u + 4 * g, 4);
        memcpy(&d1, u + 4 * k4 + 4 * g, 4);
        memcpy(&d2, u + 8 * k4 + 4 * g, 4);
        const __m512i b0 = _mm512_set1_epi32(d0), b1 = _mm512_set1_epi32(d1), b2 = _mm512_set1_epi32(d2);
        const __m512i w0 = _mm512_load_si512(p0 + g * 128), w1 = _mm512_load_si512(p0 + g * 128 + 64);
        a0 = _mm512_dpbusd_epi32(a0, b0, w0);
        a1 = _mm512_dpbusd_epi32(a1, b0, w1);
        a2 = _mm512_dpbusd_epi32(a2, b1, w0);
        a3 = _mm512_dpbusd_epi32(a3, b1, w1);
        a4 = _mm512_dpbusd_epi32(a4, b2, w0);
        a5 = _mm512_dpbusd_epi32(a5, b2, w1);
        if (two) {
            const __m512i v0 = _mm512_load_si512(p1 + g * 128), v1 = _mm512_load_si512(p1 + g * 128 + 64);
            a6 = _mm512_dpbusd_epi32(a6, b0, v0);
            a7 = _mm512_dpbusd_epi32(a7, b0, v1);
            a8 = _mm512_dpbusd_epi32(a8, b1, v0);
            a9 = _mm512_dpbusd_epi32(a9, b1, v1);
            a10 = _mm512_dpbusd_epi32(a10, b2, v0);
            a11 = _mm512_dpbusd_epi32(a11, b2, v1);
        }
    }
    const __m512i all[12] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};
    for (int i = 0; i < (two ? 12 : 6); i++) _mm512_storeu_si512(acc + 16 * i, all[i]);
}

static void dsq_panels_native(const uint8_t *restrict u, int64_t k4, const int8_t *restrict w, int64_t q0,
                              int64_t q1, int32_t *restrict acc) {
    if (q1 - q0 > 1) dsq_kernel(u, k4, w + q0 * k4 * 128, acc, 1);
    else dsq_kernel(u, k4, w + q0 * k4 * 128, acc, 0);
}
#endif

/* The same sums in plain C, one panel. */
static void dsq_panel_portable(const uint8_t *restrict u, int64_t k4, const int8_t *restrict w, int64_t q,
                               int32_t *restrict acc) {
    const int8_t *p = w + q * k4 * 128;
    for (int64_t i = 0; i < 96; i++) acc[i] = 0;
    for (int64_t g = 0; g < k4; g++)
        for (int64_t d = 0; d < 3; d++) {
            const uint8_t *x = u + 4 * k4 * d + 4 * g;
            for (int64_t j = 0; j < 32; j++) {
                const int8_t *r = p + g * 128 + 4 * j;
                acc[32 * d + j] += x[0] * r[0] + x[1] * r[1] + x[2] * r[2] + x[3] * r[3];
            }
        }
}

/* Columns of a row holding NaN or infinity: s_j * sum_k h_k (q'[j][k] + z'_j) in float, term by term. */
static void dsq_nonfinite(const float *h, const int8_t *w, const double *zq, const double *sc, float *out,
                          int64_t n, int64_t k, int64_t q0, int64_t q1) {
    const int64_t k4 = dsq_groups(k);
    for (int64_t j = q0 * 32; j < n && j < q1 * 32; j++) {
        const int8_t *col = w + (j / 32) * k4 * 128 + (j % 32) * 4;
        float acc = 0.0f;
        for (int64_t i = 0; i < k; i++) acc += h[i] * (float)(col[(i / 4) * 128 + i % 4] + zq[j]);
        out[j] = acc * (float)sc[j];
    }
}

/* Panels q0 .. q1 (at most 2) of one batch row (h, its digits in scratch) into its n-column row of out. */
static void dsq_row_panels(const float *h, const float *scratch, const uint8_t *rq, float *out, int64_t n, int64_t k,
                           int64_t q0, int64_t q1, int portable) {
    const int64_t k4 = dsq_groups(k), np = dsq_panels(n);
    const dsq_row *hd = (const dsq_row *)(scratch + dsq_digit_floats(k4));
    const int8_t *w = (const int8_t *)rq;
    const double *c1 = (const double *)(rq + np * k4 * 128), *zq = c1 + np * 32, *sc = zq + np * 32;
    if (hd->kind == 1) {
        for (int64_t j = q0 * 32; j < n && j < q1 * 32; j++) out[j] = 0.0f;
        return;
    }
    if (hd->kind == 2) {
        dsq_nonfinite(h, w, zq, sc, out, n, k, q0, q1);
        return;
    }
    const uint8_t *u = (const uint8_t *)scratch;
    const int avx2 = dsq_avx2(k, portable);
    int32_t acc[192];
#if DSQ_NATIVE == 1
    if (!portable) {
        dsq_panels_native(u, k4, w, q0, q1, acc);
    } else
#elif DSQ_NATIVE == 2
    if (avx2) {
        const uint16_t *lo = (const uint16_t *)scratch;
        for (int64_t q = q0; q < q1; q++) dsq_panel_avx2(lo, lo + 4 * k4, k4, w + q * k4 * 128, acc + 96 * (q - q0));
    } else
#endif
    {
        for (int64_t q = q0; q < q1; q++) dsq_panel_portable(u, k4, w, q, acc + 96 * (q - q0));
    }
    for (int64_t q = q0; q < q1; q++) {
        const int64_t rest = n - q * 32;
        dsq_finish(acc + 96 * (q - q0), c1 + q * 32, zq + q * 32, sc + q * 32, hd, out + q * 32,
                   rest < 32 ? rest : 32, avx2);
    }
}

/* out rows 0..batch (stride ldo) = H (stride k) @ R^T of one direction: the rows' digits first (one pass over
   H), then panel pairs, split over the team when par. */
static inline void dsq_product(const float *h, const uint8_t *rq, float *out, int64_t ldo, int64_t batch, int64_t n,
                        int64_t k, float *scratch, int par, int portable) {
    const int64_t rf = dsq_row_floats(k), pairs = (dsq_panels(n) + 1) / 2, np = dsq_panels(n);
    for (int64_t b = 0; b < batch; b++) dsq_quantize_row(h + b * k, k, scratch + b * rf, dsq_avx2(k, portable));
    if (par) {
        #pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < pairs; i++)
            for (int64_t b = 0; b < batch; b++)
                dsq_row_panels(h + b * k, scratch + b * rf, rq, out + b * ldo, n, k, 2 * i,
                               2 * i + 2 < np ? 2 * i + 2 : np, portable);
    } else {
        for (int64_t i = 0; i < pairs; i++)
            for (int64_t b = 0; b < batch; b++)
                dsq_row_panels(h + b * k, scratch + b * rf, rq, out + b * ldo, n, k, 2 * i,
                               2 * i + 2 < np ? 2 * i + 2 : np, portable);
    }
}

/* 1: VPDPBUSD (AVX512-VNNI), 2: VPMADDWD (AVX2, R up to DSQ_AVX2_MAX_K deep), 0: the portable sums only. */
int ds_rnn_q8_native(void) { return DSQ_NATIVE; }
#endif
