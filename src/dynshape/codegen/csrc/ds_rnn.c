/* Fused recurrent layers for dynshape: ONNX LSTM, GRU and RNN in float32, every direction, any sequence length
   and batch (runtime values), with initial states, sequence_lens, LSTM peepholes / input_forget, GRU
   linear_before_reset and the cell clip.  Default activations only (LSTM sigmoid/tanh/tanh, GRU sigmoid/tanh,
   RNN tanh, relu or sigmoid): the Python binding (codegen/rnn_kernel.py) declines the others.

   Why this shape: a recurrent layer is one big product and many small ones.  The input projection of every time
   step and both directions is one product X [seq*batch, input] @ W^T [input, dirs*gates*hidden] done first, on
   the packed micro-kernels; then each step is the recurrent product H [batch, hidden] @ R^T (R packed once) into
   a [batch, gates*hidden] row block (all gates of a row contiguous, in the ONNX gate order), followed by one
   pass per row that adds the projection and bias, applies the activations and updates the state while the row
   is in L1.  No transposes (layout 1 is a stride), no per-step allocation, no reversed copies (a reverse pass
   reads its time steps backwards, each batch entry from its own last valid step).  With OpenMP, the two
   directions of a bidirectional layer run on two threads, except where a step is big enough (batch * gates *
   hidden^2 >= 2^20) to split its product panels and rows over the team: then the directions run in turn.

   Entry points take one pointer to int64 arguments, so they can join a compiled program of native calls
   (codegen/program.py); floats travel as their IEEE bits.  The argument block is the same for the three ops:
     a[0]  x            const float*  [seq, batch, input] (layout 0) or [batch, seq, input] (layout 1)
     a[1]  wp           const float*  W of all directions, W.reshape(dirs*gates*hidden, input), packed as
                                       packed_gemm.pack_b(that, trans=True): n = dirs*gates*hidden, k = input
     a[2]  rp           const float*  per direction, one after the other: pack_b(R[d], trans=True)
                                       (GRU: pack_b(R[d][:2h], trans=True) then pack_b(R[d][2h:], trans=True))
     a[3]  b            const float*  ONNX B [dirs, 2*gates*hidden] or 0
     a[4]  seq_lens     const int32*  [batch] or 0 (values are clamped to 0..seq; check them before the call)
     a[5]  h0           const float*  initial_h, [dirs, batch, hidden] (layout 1: [batch, dirs, hidden]) or 0
     a[6]  c0           const float*  initial_c (LSTM) or 0
     a[7]  p            const float*  peepholes P [dirs, 3*hidden] (LSTM) or 0
     a[8]  y            float*        Y [seq, dirs, batch, hidden] (layout 1: [batch, seq, dirs, hidden]) or 0
     a[9]  y_h          float*        Y_h, shaped like h0, or 0
     a[10] y_c          float*        Y_c (LSTM), shaped like h0, or 0
     a[11] ws           float*        workspace of ds_rnn_workspace(op, seq, batch, hidden, dirs) floats
                                       (any alignment: the kernel aligns its buffers to 64 bytes; W and R
                                       packed on 64-byte boundaries run ~1.4x faster than misaligned)
     a[12] seq  a[13] batch  a[14] input  a[15] hidden
     a[16] flags        bits 0-1 direction (0 forward, 1 reverse, 2 bidirectional), bit 2 LSTM input_forget,
                        bit 3 layout 1, bit 4 GRU linear_before_reset, bits 8-9 (10-11) the RNN activation of
                        direction 0 (1): 0 tanh, 1 relu, 2 sigmoid
     a[17] clip         bits of a float: the cell clip threshold (+inf when the node has none)
     a[18] rq           const uint8*  LSTM only, or 0: R of every direction as 8-bit integers (csrc/ds_rnn_q8.h's
                                       layout, direction after direction, 64-byte aligned), used instead of rp;
                                       the workspace then grows by dirs * batch * dsq_row_floats(hidden) floats,
                                       and flags bit 5 runs its portable product (tests)
     a[19] wq           const uint8*  or 0: W of all directions as 8-bit integers, the same layout with
                                       W.reshape(dirs*gates*hidden, input) as one direction, used instead of
                                       wp; the workspace grows by seq * batch * dsq_row_floats(input) floats more
   flags bit 6: wp holds W as bf16 pairs (bf16.pack_b_bf16 of the same matrix) and the input projection runs on
   them (csrc/ds_gemm_bf16.c's tiles: AMX or VDPBF16PS, X's rows rounded as they are read), for precision="bf16".
   flags bit 7: rp holds R the same way (per direction, bf16.pack_b_bf16 of each matrix a[2] lists, one after the
   other) and each step's recurrent product runs on them, the state's rows rounded as they are read (a product
   by constant weights, bandwidth-bound on R at batch 1: half the bytes a step); the gates, the cell and the
   state stay float32.
   Outputs past an entry's sequence length are zero; Y_h / Y_c hold its last valid step (zero for length 0). */

#include <math.h>
#include <stdint.h>

/* The packed micro-kernel library (csrc/ds_gemm.c), loaded with its symbols global before this library, so its
   entry points resolve at load time. */
#include "ds_gemm.h"
#include "ds_gemm_bf16.h" /* the bf16 tiles (loaded global before this library): flags bit 6's input projection */
#include "ds_rnn_q8.h"
#include "ds_simd.h"

#define DSR_BF16_ROWS 64 /* rows of X a bf16 tile rounds once and takes through every panel of W */

enum { DSR_LSTM = 0, DSR_GRU = 1, DSR_RNN = 2 };
#define DSR_PAR_MIN (1 << 20)          /* multiply-adds per step below which a step stays on one thread */
/* packed weights a product of few rows streams, above which it splits over the threads whatever its multiply-adds:
   each thread's share then stays in its own L2 from call to call (a decoder's one-token LSTM step at hidden 256,
   input 384: 1 MB of R and 1.5 MB of W, ~66 us from L3 on one thread of an Intel Xeon at 2 threads) */
#define DSR_PAR_BYTES (512 * 1024)
#define DSR_W_BLOCK_BYTES (512 * 1024) /* packed W per column block of the input projection */

/* ---- activations: branch-free, so the per-row loops vectorise ---------------------------------------------- */
static inline float dsr_from_bits(int32_t i) {
    float f;
    __builtin_memcpy(&f, &i, 4);
    return f;
}

/* x = n*ln2 + r with |r| <= ln2/2: returns e^r - 1 (Taylor to r^7: relative error < 2e-8) and 2^n in *scale.
   x is clamped to [-87, 88] first, so 2^n stays a normal float. */
static inline float dsr_expm1_reduced(float x, float *scale) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x; /* ternaries, not fminf/fmaxf: those do not vectorise */
    const float shift = 12582912.0f; /* 1.5 * 2^23: adding it rounds to the nearest integer */
    const float n = (x * 1.44269504f + shift) - shift;
    float r = x - n * 0.693145751953125f; /* ln2 split in two: n * hi is exact */
    r = r - n * 1.42860677e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    *scale = dsr_from_bits(((int32_t)n + 127) << 23);
    return r + r * r * p;
}

/* 1 / (1 + e^-x): relative error a few ulp over the whole range (e^-x never cancels against the 1). */
static inline float dsr_sigmoid(float x) {
    float s, em = dsr_expm1_reduced(-x, &s);
    const float y = 1.0f / (1.0f + (s + s * em));
    return x != x ? x : y;
}

/* tanh(x) = -u / (2 + u) with u = e^(-2|x|) - 1: no cancellation near 0 (u ~ -2|x| keeps its relative
   accuracy), so small arguments keep theirs too; |x| >= 10 gives +-1 exactly as float rounding would. */
static inline float dsr_tanh(float x) {
    const float a = fabsf(x), t = a > 10.0f ? 10.0f : a;
    float s, em = dsr_expm1_reduced(-2.0f * t, &s);
    const float u = s * em + (s - 1.0f);
    const float y = copysignf(-u / (2.0f + u), x);
    return x != x ? x : y;
}

static inline float dsr_clip(float x, float c) { return x < -c ? -c : x > c ? c : x; }

/* e^x for the fused gates below (x clamped to [-87, 88], so at most 6e37: a product of two such terms' (1 + e)
   factors with a (2 + u) <= 2 stays finite). */
static inline float dsr_exp(float x) {
    float s, em = dsr_expm1_reduced(x, &s);
    return s + s * em;
}

/* tanh(x) as num / den (den in [1, 2]), so a product with a sigmoid shares one division. */
static inline float dsr_tanh_frac(float x, float *den) {
    const float a = fabsf(x), t = a > 10.0f ? 10.0f : a;
    float s, em = dsr_expm1_reduced(-2.0f * t, &s);
    const float u = s * em + (s - 1.0f);
    *den = 2.0f + u;
    return copysignf(-u, x);
}

/* ---- one row of one step per op (s: the recurrent product, g: the input projection, both gate-contiguous) ---- */
/* LSTM: sigmoid(a) * tanh(b) = num_b / ((1 + e^-a) den_b), so the five activations cost three divisions, not
   five (a vector division is the costliest instruction here). NaN inputs propagate through the arithmetic. */
static inline __attribute__((always_inline)) void dsr_lstm_row(
    const float *restrict s, const float *restrict g, const float *restrict bias, const float *restrict peep,
    float *restrict h, float *restrict c, int64_t hid, float clip, int coupled) {
    const float *pi = peep, *po = peep + hid, *pf = peep + 2 * hid;
    for (int64_t j = 0; j < hid; j++) {
        const float cp = c[j];
        const float xi = dsr_clip(g[j] + bias[j] + s[j] + pi[j] * cp, clip);
        const float xo = g[hid + j] + bias[hid + j] + s[hid + j];
        const float xf = g[2 * hid + j] + bias[2 * hid + j] + s[2 * hid + j] + pf[j] * cp;
        const float xc = dsr_clip(g[3 * hid + j] + bias[3 * hid + j] + s[3 * hid + j], clip);
        float dc, cn;
        const float nc = dsr_tanh_frac(xc, &dc);
        if (coupled) { /* f = 1 - i */
            const float i = dsr_sigmoid(xi);
            cn = (1.0f - i) * cp + i * (nc / dc);
        } else {
            const float ei = 1.0f + dsr_exp(-xi), ef = 1.0f + dsr_exp(-dsr_clip(xf, clip));
            cn = cp / ef + nc / (ei * dc);
        }
        const float eo = 1.0f + dsr_exp(-dsr_clip(xo + po[j] * cn, clip));
        float dh;
        const float nh = dsr_tanh_frac(cn, &dh);
        c[j] = cn;
        h[j] = nh / (eo * dh);
    }
}

/* GRU, first half: keeps 1 + e^-z_in (z = its reciprocal), and r (linear_before_reset) or r * H (default). */
static inline void dsr_gru_zr(const float *restrict s, const float *restrict g, const float *restrict bias,
                              const float *restrict h, float *restrict ez, float *restrict rr, int64_t hid, float clip,
                              int lbr) {
    for (int64_t j = 0; j < hid; j++) {
        ez[j] = 1.0f + dsr_exp(-dsr_clip(g[j] + bias[j] + s[j], clip));
        const float r = dsr_sigmoid(dsr_clip(g[hid + j] + bias[hid + j] + s[hid + j], clip));
        rr[j] = lbr ? r : r * h[j];
    }
}

/* GRU, second half: sh = H Rh^T (linear_before_reset) or (r * H) Rh^T; the state is updated in place, as
   (1 - z) tanh + z H = ((ez - 1) num + H den) / (ez den): one division. */
static inline void dsr_gru_h(const float *restrict sh, const float *restrict g, const float *restrict bias,
                             const float *restrict rbh, const float *restrict ez, const float *restrict rr,
                             float *restrict h, int64_t hid, float clip, int lbr) {
    for (int64_t j = 0; j < hid; j++) {
        const float lin = sh[j] + rbh[j];
        const float pre = g[2 * hid + j] + bias[2 * hid + j] + (lbr ? rr[j] * lin : lin);
        float den;
        const float num = dsr_tanh_frac(dsr_clip(pre, clip), &den);
        h[j] = ((ez[j] - 1.0f) * num + h[j] * den) / (ez[j] * den);
    }
}

static inline void dsr_rnn_row(const float *restrict s, const float *restrict g, const float *restrict bias,
                               float *restrict h, int64_t hid, float clip, int act) {
    if (act == 1) {
        for (int64_t j = 0; j < hid; j++) {
            const float v = dsr_clip(g[j] + bias[j] + s[j], clip);
            h[j] = v < 0.0f ? 0.0f : v;
        }
    } else if (act == 2) {
        for (int64_t j = 0; j < hid; j++) h[j] = dsr_sigmoid(dsr_clip(g[j] + bias[j] + s[j], clip));
    } else {
        for (int64_t j = 0; j < hid; j++) h[j] = dsr_tanh(dsr_clip(g[j] + bias[j] + s[j], clip));
    }
}

/* ---- products ---------------------------------------------------------------------------------------------- */
typedef float dsr_v16 __attribute__((vector_size(64)));
typedef float dsr_v16u __attribute__((vector_size(64), aligned(4), may_alias));
static inline dsr_v16 dsr_ld(const float *p) { return *(const dsr_v16u *)p; }

static inline int64_t dsr_panels(int64_t n) { return (n + 31) / 32; }

static inline void dsr_store32(float *c, dsr_v16 lo, dsr_v16 hi, int64_t ncols) {
    float t[32];
    *(dsr_v16u *)t = lo;
    *(dsr_v16u *)(t + 16) = hi;
    for (int64_t j = 0; j < ncols; j++) c[j] = t[j];
}

#ifdef __AVX512F__
/* One row a (k floats) times packed panels q0..q1 of B (n columns), into c. Batch 1 is the VAD case, and there
   the micro-kernel's one-row tile leaves the FMA units waiting: two panels at a time with k unrolled twice keep
   eight independent accumulators (15% faster per step at hidden 128, bandwidth-bound on R in L2). */
static void dsr_gemv(const float *restrict a, const float *restrict bp, float *restrict c, int64_t n, int64_t k,
                     int64_t q0, int64_t q1) {
    int64_t q = q0;
    for (; q + 1 < q1; q += 2) {
        const float *p0 = bp + q * k * 32, *p1 = p0 + k * 32;
        dsr_v16 a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0}, e0 = {0}, e1 = {0}, f0 = {0}, f1 = {0};
        int64_t p = 0;
        for (; p + 1 < k; p += 2) {
            const float x = a[p], y = a[p + 1];
            const float *r0 = p0 + p * 32, *r1 = p1 + p * 32;
            a0 += x * dsr_ld(r0); a1 += x * dsr_ld(r0 + 16); b0 += x * dsr_ld(r1); b1 += x * dsr_ld(r1 + 16);
            e0 += y * dsr_ld(r0 + 32); e1 += y * dsr_ld(r0 + 48); f0 += y * dsr_ld(r1 + 32); f1 += y * dsr_ld(r1 + 48);
        }
        for (; p < k; p++) {
            const float x = a[p];
            a0 += x * dsr_ld(p0 + p * 32); a1 += x * dsr_ld(p0 + p * 32 + 16);
            b0 += x * dsr_ld(p1 + p * 32); b1 += x * dsr_ld(p1 + p * 32 + 16);
        }
        const int64_t rest = n - (q + 1) * 32;
        dsr_store32(c + q * 32, a0 + e0, a1 + e1, 32);
        dsr_store32(c + (q + 1) * 32, b0 + f0, b1 + f1, rest < 32 ? rest : 32);
    }
    if (q < q1) {
        const float *p0 = bp + q * k * 32;
        dsr_v16 a0 = {0}, a1 = {0}, e0 = {0}, e1 = {0};
        int64_t p = 0;
        for (; p + 1 < k; p += 2) {
            const float x = a[p], y = a[p + 1], *r0 = p0 + p * 32;
            a0 += x * dsr_ld(r0); a1 += x * dsr_ld(r0 + 16); e0 += y * dsr_ld(r0 + 32); e1 += y * dsr_ld(r0 + 48);
        }
        if (p < k) { a0 += a[p] * dsr_ld(p0 + p * 32); a1 += a[p] * dsr_ld(p0 + p * 32 + 16); }
        const int64_t rest = n - q * 32;
        dsr_store32(c + q * 32, a0 + e0, a1 + e1, rest < 32 ? rest : 32);
    }
}
#else
/* Without AVX-512, on the machine's 8-float vectors (a 64-byte dsr_v16 has no register mode there and gcc keeps it
   in memory, every multiply-add a round trip through the stack; ds_simd.h's ds_v8): one panel at a time, its 32 columns in four
   vectors, even and odd k apart (eight accumulators), then added: each lane sums in the AVX-512 loop's order. */
static void dsr_gemv(const float *restrict a, const float *restrict bp, float *restrict c, int64_t n, int64_t k,
                     int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; q++) {
        const float *p0 = bp + q * k * 32;
        ds_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, e0 = {0}, e1 = {0}, e2 = {0}, e3 = {0};
        int64_t p = 0;
        for (; p + 1 < k; p += 2) {
            const float x = a[p], y = a[p + 1], *r0 = p0 + p * 32;
            a0 += x * ds_ld8(r0); a1 += x * ds_ld8(r0 + 8); a2 += x * ds_ld8(r0 + 16); a3 += x * ds_ld8(r0 + 24);
            e0 += y * ds_ld8(r0 + 32); e1 += y * ds_ld8(r0 + 40); e2 += y * ds_ld8(r0 + 48); e3 += y * ds_ld8(r0 + 56);
        }
        if (p < k) {
            const float x = a[p], *r0 = p0 + p * 32;
            a0 += x * ds_ld8(r0); a1 += x * ds_ld8(r0 + 8); a2 += x * ds_ld8(r0 + 16); a3 += x * ds_ld8(r0 + 24);
        }
        const int64_t ncols = n - q * 32; /* (ds_st8n stores at most 8, none at <= 0) */
        float *cq = c + q * 32;
        ds_st8n(cq, a0 + e0, ncols);
        ds_st8n(cq + 8, a1 + e1, ncols - 8);
        ds_st8n(cq + 16, a2 + e2, ncols - 16);
        ds_st8n(cq + 24, a3 + e3, ncols - 24);
    }
}
#endif

/* rows 0..batch of c (row stride ldc) = a (row stride lda) @ one packed matrix (n columns, k deep); panels split
   over threads only when the step is big enough to pay for the fork (a parallel region costs ~0.4 us even when
   its `if` is false, so the serial path has none). */
static void dsr_product(const float *a, int64_t lda, const float *bp, float *c, int64_t ldc, int64_t batch,
                        int64_t n, int64_t k, int par) {
    const int64_t panels = dsr_panels(n);
    if (par) {
        #pragma omp parallel for schedule(static)
        for (int64_t q = 0; q < panels; q++) {
            if (batch == 1) dsr_gemv(a, bp, c, n, k, q, q + 1);
            else ds_gemm_tile(a, lda, bp, c, ldc, 0, batch, q, n, k);
        }
    } else if (batch == 1) {
        dsr_gemv(a, bp, c, n, k, 0, panels);
    } else {
        for (int64_t q = 0; q < panels; q++) ds_gemm_tile(a, lda, bp, c, ldc, 0, batch, q, n, k);
    }
}

/* dsr_product on R packed as bf16 pairs (flags bit 7): a's rows rounded once per product and thread (a fresh
   epoch: the state changed since the last step), then every panel on VDPBF16PS (AMX tiles from 4 rows). */
static void dsr_product_bf16(const float *a, int64_t lda, const uint16_t *bp, float *c, int64_t ldc, int64_t batch,
                             int64_t n, int64_t k, int par) {
    const int64_t panels = dsr_panels(n), ep = ds_bf16_epoch();
    if (par) {
        #pragma omp parallel for schedule(static)
        for (int64_t q = 0; q < panels; q++) ds_gemm_block_bf16(a, lda, bp, c, ldc, 0, batch, q, n, k, ep);
    } else {
        for (int64_t q = 0; q < panels; q++) ds_gemm_block_bf16(a, lda, bp, c, ldc, 0, batch, q, n, k, ep);
    }
}

/* ---- the layer ------------------------------------------------------------------------------------------------ */
typedef struct {
    int op, dir, layout, coupled, lbr, act[2];
    int64_t seq, batch, in, hid, nd, gates, n; /* n = nd * gates * hid: the projection's row length */
    float clip;
    const float *x, *wp, *rp, *b, *h0, *c0, *p;
    const int32_t *lens;
    const uint8_t *rq, *wq; /* 8-bit R and W (ds_rnn_q8.h) or 0 */
    int portable;
    int wbf16; /* wp holds bf16 pairs (flags bit 6) */
    int rbf16; /* rp holds bf16 pairs (flags bit 7) */
    float *y, *yh, *yc, *gx, *bias, *rbh, *zeros, *dirws, *q8ws;
} dsr_layer;

/* One direction's step state, for the per-row passes. */
typedef struct {
    const dsr_layer *L;
    int64_t d, s;
    int reverse;
    float *S, *H, *C, *T1, *T2;
    const float *bias, *rbh, *peep;
} dsr_step;

static inline int64_t dsr_gates(int64_t op) { return op == DSR_LSTM ? 4 : op == DSR_GRU ? 3 : 1; }
static inline int64_t dsr_r16(int64_t n) { return (n + 15) / 16 * 16; } /* 64-byte multiples keep buffers aligned */
static inline int64_t dsr_dir_floats(int64_t op, int64_t batch, int64_t hid) {
    return dsr_r16(batch * dsr_gates(op) * hid) + 4 * dsr_r16(batch * hid); /* step product, H, C, 2 GRU rows */
}

/* Floats of workspace one call needs: 16 to align its start, the projection of every step, per-direction state,
   the summed biases, a row of zeros. */
int64_t ds_rnn_workspace(int64_t op, int64_t seq, int64_t batch, int64_t hid, int64_t nd) {
    const int64_t g = dsr_gates(op);
    return 16 + dsr_r16(seq * batch * nd * g * hid) + nd * dsr_dir_floats(op, batch, hid) + dsr_r16(nd * g * hid)
           + dsr_r16(nd * hid) + dsr_r16(3 * hid);
}

static inline int64_t dsr_len(const dsr_layer *L, int64_t b) {
    if (!L->lens) return L->seq;
    const int64_t v = L->lens[b];
    return v < 0 ? 0 : v > L->seq ? L->seq : v;
}

/* Row indices of (time t, entry b) in X and its projection, of (t, direction d, b) in Y, of (d, b) in a state. */
static inline int64_t dsr_xrow(const dsr_layer *L, int64_t t, int64_t b) {
    return L->layout ? b * L->seq + t : t * L->batch + b;
}
static inline int64_t dsr_yrow(const dsr_layer *L, int64_t t, int64_t d, int64_t b) {
    return L->layout ? (b * L->seq + t) * L->nd + d : (t * L->nd + d) * L->batch + b;
}
static inline int64_t dsr_srow(const dsr_layer *L, int64_t d, int64_t b) {
    return L->layout ? b * L->nd + d : d * L->batch + b;
}

/* Batch entry b of step st: phase 0 is the whole update (GRU: z and r), phase 1 GRU's h gate. */
static void dsr_row(const dsr_step *st, int64_t b, int phase) {
    const dsr_layer *L = st->L;
    const int64_t hid = L->hid, gh = L->gates * hid, len = dsr_len(L, b);
    if (st->s >= len) return;
    const int64_t t = st->reverse ? len - 1 - st->s : st->s;
    const float *g = L->gx + dsr_xrow(L, t, b) * L->n + st->d * gh, *sb = st->S + b * gh;
    float *h = st->H + b * hid;
    if (phase == 1) {
        dsr_gru_h(sb + 2 * hid, g, st->bias, st->rbh, st->T1 + b * hid, st->T2 + b * hid, h, hid, L->clip, L->lbr);
    } else if (L->op == DSR_LSTM) {
        if (L->coupled) dsr_lstm_row(sb, g, st->bias, st->peep, h, st->C + b * hid, hid, L->clip, 1);
        else dsr_lstm_row(sb, g, st->bias, st->peep, h, st->C + b * hid, hid, L->clip, 0);
    } else if (L->op == DSR_RNN) {
        dsr_rnn_row(sb, g, st->bias, h, hid, L->clip, L->act[st->d]);
    } else {
        dsr_gru_zr(sb, g, st->bias, h, st->T1 + b * hid, st->T2 + b * hid, hid, L->clip, L->lbr);
    }
}

static void dsr_rows(const dsr_step *st, int phase, int par) {
    const int64_t batch = st->L->batch;
    if (par) {
        #pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < batch; b++) dsr_row(st, b, phase);
    } else {
        for (int64_t b = 0; b < batch; b++) dsr_row(st, b, phase);
    }
}

/* The projection rows the next step reads: at long sequences the projection is far larger than the caches, and
   a step's rows would otherwise arrive from memory one demand miss at a time, after the recurrent product. */
static void dsr_prefetch_step(const dsr_layer *L, int64_t d, int64_t s, int reverse) {
    const int64_t gh = L->gates * L->hid;
    for (int64_t b = 0; b < L->batch; b++) {
        const int64_t len = dsr_len(L, b);
        if (s >= len) continue;
        const char *g = (const char *)(L->gx + dsr_xrow(L, reverse ? len - 1 - s : s, b) * L->n + d * gh);
        for (int64_t off = 0; off < gh * 4; off += 64) __builtin_prefetch(g + off, 0, 3);
    }
}

/* rows 0..batch of c (row stride gates * hidden) = a (row stride hidden) @ one packed R matrix of n columns */
static inline void dsr_recurrent(const dsr_layer *L, const float *a, const char *rp, float *c, int64_t n, int par) {
    const int64_t hid = L->hid, gh = L->gates * hid;
    if (L->rbf16) dsr_product_bf16(a, hid, (const uint16_t *)rp, c, gh, L->batch, n, hid, par);
    else dsr_product(a, hid, (const float *)rp, c, gh, L->batch, n, hid, par);
}

static void dsr_direction(const dsr_layer *L, int64_t d) {
    const int64_t hid = L->hid, batch = L->batch, gh = L->gates * hid, seq = L->seq;
    dsr_step st = {.L = L, .d = d, .reverse = L->dir == 1 || (L->dir == 2 && d == 1)};
    st.S = L->dirws + d * dsr_dir_floats(L->op, batch, hid);
    st.H = st.S + dsr_r16(batch * gh);
    st.C = st.H + dsr_r16(batch * hid);
    st.T1 = st.C + dsr_r16(batch * hid);
    st.T2 = st.T1 + dsr_r16(batch * hid);
    st.bias = L->bias + d * gh;
    st.rbh = L->rbh + d * hid;
    st.peep = L->p ? L->p + d * 3 * hid : L->zeros;
    /* bytes of one panel of R: hid rows of 32 floats, or (hid + 1) / 2 rows of 64 bf16 */
    const int64_t panel = L->rbf16 ? (hid + 1) / 2 * 128 : hid * 128;
    const int64_t rsize = (L->op == DSR_GRU ? dsr_panels(2 * hid) + dsr_panels(hid) : dsr_panels(gh)) * panel;
    const char *rp = L->rp ? (const char *)L->rp + d * rsize : 0, *rp_h = rp ? rp + dsr_panels(2 * hid) * panel : 0;
    float *S = st.S, *H = st.H, *C = st.C;
    int64_t maxlen = 0;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = dsr_len(L, b);
        maxlen = len > maxlen ? len : maxlen;
        const float *h0 = L->h0 ? L->h0 + dsr_srow(L, d, b) * hid : L->zeros;
        const float *c0 = L->c0 ? L->c0 + dsr_srow(L, d, b) * hid : L->zeros;
        for (int64_t j = 0; j < hid; j++) {
            H[b * hid + j] = h0[j];
            C[b * hid + j] = c0[j];
        }
    }
    const int rows_par = batch * gh * hid >= DSR_PAR_MIN;
    int par = rows_par; /* the recurrent product's: also where R is large (not inside the directions' own team) */
#ifdef _OPENMP
    par = par || ((int64_t)sizeof(float) * gh * hid >= DSR_PAR_BYTES && omp_get_max_threads() > 1
                  && !omp_in_parallel());
#endif
    for (int64_t s = 0; s < maxlen; s++) {
        st.s = s;
        if (s + 1 < maxlen) dsr_prefetch_step(L, d, s + 1, st.reverse);
        if (L->rq) {
            dsq_product(H, L->rq + d * dsq_dir_bytes(gh, hid), S, gh, batch, gh, hid,
                        L->q8ws + d * batch * dsq_row_floats(hid), par, L->portable);
        } else if (L->op == DSR_GRU) {
            dsr_recurrent(L, H, rp, S, 2 * hid, par);
            if (L->lbr) dsr_recurrent(L, H, rp_h, S + 2 * hid, hid, par);
        } else {
            dsr_recurrent(L, H, rp, S, gh, par);
        }
        dsr_rows(&st, 0, rows_par);
        if (L->op == DSR_GRU) {
            /* default GRU: the h gate's recurrent product is (r * H) Rh^T, so it waits for r */
            if (!L->lbr) dsr_recurrent(L, st.T2, rp_h, S + 2 * hid, hid, par);
            dsr_rows(&st, 1, rows_par);
        }
        if (L->y) {
            for (int64_t b = 0; b < batch; b++) {
                const int64_t len = dsr_len(L, b);
                if (s >= len) continue;
                float *y = L->y + dsr_yrow(L, st.reverse ? len - 1 - s : s, d, b) * hid;
                for (int64_t j = 0; j < hid; j++) y[j] = H[b * hid + j];
            }
        }
    }
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = dsr_len(L, b);
        if (L->y)
            for (int64_t t = len; t < seq; t++) {
                float *y = L->y + dsr_yrow(L, t, d, b) * hid;
                for (int64_t j = 0; j < hid; j++) y[j] = 0.0f;
            }
        float *yh = L->yh ? L->yh + dsr_srow(L, d, b) * hid : 0;
        float *yc = L->yc ? L->yc + dsr_srow(L, d, b) * hid : 0;
        for (int64_t j = 0; j < hid; j++) {
            if (yh) yh[j] = len ? H[b * hid + j] : 0.0f;
            if (yc) yc[j] = len ? C[b * hid + j] : 0.0f;
        }
    }
}

/* the input projection's column block of `step` panels from panel q: rows of X @ those columns of packed W */
static void dsr_w_block(const dsr_layer *L, int64_t rows, int64_t q, int64_t step, int64_t panels) {
    const int64_t ncols = q + step < panels ? step * 32 : L->n - q * 32;
    ds_gemm_packed(L->x, L->in, L->wp + q * L->in * 32, L->gx + q * 32, L->n, rows, ncols, L->in);
}

static void dsr_layer_run(int op, const int64_t *a) {
    dsr_layer L;
    L.op = op;
    L.x = (const float *)a[0];
    L.wp = (const float *)a[1];
    L.rp = (const float *)a[2];
    L.b = (const float *)a[3];
    L.lens = (const int32_t *)a[4];
    L.h0 = (const float *)a[5];
    L.c0 = op == DSR_LSTM ? (const float *)a[6] : 0;
    L.p = op == DSR_LSTM ? (const float *)a[7] : 0;
    L.y = (float *)a[8];
    L.yh = (float *)a[9];
    L.yc = op == DSR_LSTM ? (float *)a[10] : 0;
    float *ws = (float *)(((uintptr_t)a[11] + 63) & ~(uintptr_t)63);
    L.seq = a[12];
    L.batch = a[13];
    L.in = a[14];
    L.hid = a[15];
    const int64_t flags = a[16];
    L.dir = (int)(flags & 3);
    L.coupled = op == DSR_LSTM && (flags >> 2 & 1);
    L.layout = (int)(flags >> 3 & 1);
    L.lbr = op == DSR_GRU && (flags >> 4 & 1);
    L.act[0] = op == DSR_RNN ? (int)(flags >> 8 & 3) : 0;
    L.act[1] = op == DSR_RNN ? (int)(flags >> 10 & 3) : 0;
    L.clip = dsr_from_bits((int32_t)a[17]);
    L.rq = op == DSR_LSTM ? (const uint8_t *)a[18] : 0;
    L.wq = (const uint8_t *)a[19];
    L.portable = (int)(flags >> 5 & 1);
    L.wbf16 = (int)(flags >> 6 & 1);
    L.rbf16 = (int)(flags >> 7 & 1) && !L.rq;
    L.nd = L.dir == 2 ? 2 : 1;
    L.gates = dsr_gates(op);
    const int64_t hid = L.hid, gh = L.gates * hid, rows = L.seq * L.batch;
    L.n = L.nd * gh;
    L.gx = ws;
    L.dirws = L.gx + dsr_r16(rows * L.n);
    L.bias = L.dirws + L.nd * dsr_dir_floats(op, L.batch, hid);
    L.rbh = L.bias + dsr_r16(L.nd * gh);
    L.zeros = L.rbh + dsr_r16(L.nd * hid);
    L.q8ws = L.zeros + dsr_r16(3 * hid);
    for (int64_t j = 0; j < 3 * hid; j++) L.zeros[j] = 0.0f;
    /* Wb + Rb once per call; GRU keeps Rb_h apart (linear_before_reset puts it inside r * (...)) */
    for (int64_t d = 0; d < L.nd; d++) {
        const float *wb = L.b ? L.b + d * 2 * gh : L.zeros, *rb = L.b ? wb + gh : L.zeros;
        for (int64_t k = 0; k < gh; k++) {
            const int split = op == DSR_GRU && k >= 2 * hid;
            L.bias[d * gh + k] = L.b ? wb[k] + (split ? 0.0f : rb[k]) : 0.0f;
        }
        for (int64_t j = 0; j < hid; j++) L.rbh[d * hid + j] = L.b && op == DSR_GRU ? rb[2 * hid + j] : 0.0f;
    }
    /* The input projection of every time step and direction: one product, over column blocks of packed W that
       stay in L2 (~512 KB) while every row streams past; a bidirectional W at hidden 256 is 4 MB, which the
       rows would otherwise pull from L3 once per 60-row block. */
    const int64_t panels = dsr_panels(L.n), block = (DSR_W_BLOCK_BYTES / 128) / (L.in > 0 ? L.in : 1);
    int64_t step = block < 1 ? 1 : block;
    /* few rows and a large W (a decoder's one-token step): too few multiply-adds for ds_gemm_packed to split, but
       streamed from L3 on one thread; the column blocks split evenly over the threads, each one's in its own L2 */
    int w_par = 0;
#ifdef _OPENMP
    const int64_t nth = omp_get_max_threads();
    w_par = nth > 1 && !(L.wq || L.wbf16) && rows * L.n * L.in < DSR_PAR_MIN
            && (int64_t)sizeof(float) * L.n * L.in >= DSR_PAR_BYTES;
    if (w_par) {
        const int64_t nb = ((panels + step - 1) / step + nth - 1) / nth * nth;
        step = (panels + nb - 1) / nb;
    }
#endif
    if (L.wq) { /* its panel pairs (16 KB each at input 512) stay in L1 while every row passes */
        float *scratch = L.q8ws + (L.rq ? L.nd * L.batch * dsq_row_floats(hid) : 0);
        dsq_product(L.x, L.wq, L.gx, L.n, rows, L.n, L.in, scratch, rows * L.n * L.in >= DSR_PAR_MIN, L.portable);
    }
    if (L.wbf16 && !L.wq) { /* a block of X's rows rounded once per thread, then every panel of W */
        const int64_t ep = ds_bf16_epoch(), nb = (rows + DSR_BF16_ROWS - 1) / DSR_BF16_ROWS;
        #pragma omp parallel for schedule(static) if (rows * L.n * L.in >= DSR_PAR_MIN && nb > 1)
        for (int64_t rb = 0; rb < nb; rb++) {
            const int64_t i0 = rb * DSR_BF16_ROWS, i1 = i0 + DSR_BF16_ROWS < rows ? i0 + DSR_BF16_ROWS : rows;
            for (int64_t q = 0; q < panels; q++)
                ds_gemm_block_bf16(L.x, L.in, L.wp, L.gx, L.n, i0, i1, q, L.n, L.in, ep);
        }
    }
    const int64_t wblocks = L.wq || L.wbf16 ? 0 : (panels + step - 1) / step;
    if (w_par) {
        #pragma omp parallel for schedule(static)
        for (int64_t qb = 0; qb < wblocks; qb++) dsr_w_block(&L, rows, qb * step, step, panels);
    } else {
        for (int64_t qb = 0; qb < wblocks; qb++) dsr_w_block(&L, rows, qb * step, step, panels);
    }
    /* the directions on two threads, each step on one; unless a step is big enough to split over the team
       (dsr_direction's `par`): then the directions run one after the other, each step's product split, so that
       each thread streams its share of R from its own L2 (a bidirectional LSTM of hidden 512, batch 1, 40 steps:
       R is 4 MB a direction, 2 MB a thread; 2 threads: 6.83 ms by directions, 4.29 by steps; onnxruntime 4.19) */
    int both = 0;
#ifdef _OPENMP
    both = L.nd == 2 && omp_get_max_threads() > 1 && L.seq * L.batch * gh * hid >= (DSR_PAR_MIN >> 4)
           && L.batch * gh * hid < DSR_PAR_MIN;
#endif
    if (both) {
        #pragma omp parallel for num_threads(2) schedule(static, 1)
        for (int64_t d = 0; d < 2; d++) dsr_direction(&L, d);
    } else {
        for (int64_t d = 0; d < L.nd; d++) dsr_direction(&L, d);
    }
}

void ds_lstm_f32(const int64_t *args) { dsr_layer_run(DSR_LSTM, args); }
void ds_gru_f32(const int64_t *args) { dsr_layer_run(DSR_GRU, args); }
void ds_rnn_f32(const int64_t *args) { dsr_layer_run(DSR_RNN, args); }

/* The activations alone, for tests of their accuracy: kind 0 sigmoid, 1 tanh. */
void ds_rnn_activation_f32(const float *x, float *y, int64_t n, int64_t kind) {
    if (kind == 0)
        for (int64_t i = 0; i < n; i++) y[i] = dsr_sigmoid(x[i]);
    else
        for (int64_t i = 0; i < n; i++) y[i] = dsr_tanh(x[i]);
}
