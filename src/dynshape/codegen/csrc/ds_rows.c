/* Row-wise kernels for the reductions transformers spend time in: softmax and layer norm on the last axis.

   numpy needs five to eight passes with temporaries for these; one row at a time in C keeps the row in
   cache. The row length is a runtime argument, so one build serves every shape. */
#include "ds_prelude.h"
#include "ds_shared.h" /* DS_REDUCE_*: the reductions ds_reduce_f32 computes */
#include "ds_layernorm_row.h"
#include "ds_softmax_row.h"


/* The largest of n floats (-inf for n = 0); a NaN is skipped here, and the passes after it propagate it. */
static inline float ds_row_max(const float *restrict x, int64_t n) {
    float m = -INFINITY;
    #pragma omp simd reduction(max:m)
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

void ds_softmax_f32(const float *restrict x, float *restrict y, int64_t rows, int64_t n) {
    #pragma omp parallel for schedule(static) if(rows * n >= 32768)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        const float m = ds_row_max(xr, n);
        const float inv = 1.0f / ds_softmax_exp_to(xr, yr, n, m);
        #pragma omp simd
        for (int64_t i = 0; i < n; i++) yr[i] *= inv;
    }
}

/* Softmax / log-softmax over the middle axis of x viewed as (outer, n, inner), inner > 1: yolov8's DFL head takes
   the softmax over 16 bins of a (N, 4, 16, A) tensor. The row kernel's semantics lane by lane (the maximum skips
   NaN, exp(x - max) through ds_expf_nonpos, so a NaN or an infinity makes its lane NaN as numpy's does), vectorised
   over DS_LANES consecutive inner positions at a time: each of the n strided rows is read contiguously. log = 1:
   (x - max) - log(sum), the reference's log-softmax. */
#define DS_LANES 64
void ds_softmax_mid_f32(const float *restrict x, float *restrict y, int64_t outer, int64_t n, int64_t inner,
                        int64_t log) {
    const int64_t blocks = (inner + DS_LANES - 1) / DS_LANES;
    #pragma omp parallel for schedule(static) if(outer * n * inner >= 32768)
    for (int64_t t = 0; t < outer * blocks; t++) {
        const int64_t o = t / blocks, j0 = (t % blocks) * DS_LANES;
        const int64_t w = inner - j0 < DS_LANES ? inner - j0 : DS_LANES;
        const float *xo = x + o * n * inner + j0;
        float *yo = y + o * n * inner + j0;
        float m[DS_LANES], s[DS_LANES];
        for (int64_t j = 0; j < w; j++) { m[j] = -INFINITY; s[j] = 0.0f; }
        for (int64_t k = 0; k < n; k++) {
            const float *xr = xo + k * inner;
            #pragma omp simd
            for (int64_t j = 0; j < w; j++) m[j] = xr[j] > m[j] ? xr[j] : m[j];
        }
        for (int64_t k = 0; k < n; k++) {
            const float *xr = xo + k * inner;
            float *yr = yo + k * inner;
            #pragma omp simd
            for (int64_t j = 0; j < w; j++) {
                const float d = xr[j] - m[j], e = ds_expf_nonpos(d);
                yr[j] = log ? d : e;
                s[j] += e;
            }
        }
        for (int64_t j = 0; j < w; j++) s[j] = log ? logf(s[j]) : 1.0f / s[j];
        for (int64_t k = 0; k < n; k++) {
            float *yr = yo + k * inner;
            if (log) {
                #pragma omp simd
                for (int64_t j = 0; j < w; j++) yr[j] -= s[j];
            } else {
                #pragma omp simd
                for (int64_t j = 0; j < w; j++) yr[j] *= s[j];
            }
        }
    }
}

/* Log-softmax over contiguous rows (the last axis): (x - max) - log(sum of exp(x - max)), as the reference. */
void ds_logsoftmax_f32(const float *restrict x, float *restrict y, int64_t rows, int64_t n) {
    #pragma omp parallel for schedule(static) if(rows * n >= 32768)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        const float m = ds_row_max(xr, n);
        float s = 0.0f;
        #pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < n; i++) { const float d = xr[i] - m; yr[i] = d; s += ds_expf_nonpos(d); }
        const float l = logf(s);
        #pragma omp simd
        for (int64_t i = 0; i < n; i++) yr[i] -= l;
    }
}

/* CumSum over the middle axis of (outer, n, inner), in the input's type: kind 0 float32, 1 int32, 2 int64 (the
   integers through the unsigned type, so an overflow wraps as numpy's does; signed overflow is undefined in C).
   Row by row, y[i] = y[i - 1] + x[i] over the inner positions at once (they vectorise, and every lane adds in
   numpy's accumulate order, so float32 sums are bit for bit the reference's). exclusive: y[i] = y[i - 1] +
   x[i - 1], y[0] = 0 (y[1] = x[0] as is: the reference's shifted inclusive sum, -0.0 kept); reverse: from the end. */
#define DS_CUMSUM(T, A)                                                                                          \
    for (int64_t o = 0; o < outer; o++) {                                                                        \
        const T *xs = (const T *)x + o * n * inner;                                                              \
        T *ys = (T *)y + o * n * inner;                                                                          \
        for (int64_t i = 0; i < n; i++) {                                                                        \
            const int64_t r = reverse ? n - 1 - i : i, p = i == 0 ? r : reverse ? r + 1 : r - 1;    \
            T *yr = ys + r * inner;                                                                              \
            const T *yp = ys + p * inner, *xr = xs + (exclusive ? p : r) * inner;                                \
            if (i == 0 && exclusive) { for (int64_t j = 0; j < inner; j++) yr[j] = 0; }                          \
            else if (i == 0 || (i == 1 && exclusive)) { for (int64_t j = 0; j < inner; j++) yr[j] = xr[j]; }     \
            else {                                                                                               \
                for (int64_t j = 0; j < inner; j++) yr[j] = (T)((A)yp[j] + (A)xr[j]);                            \
            }                                                                                                    \
        }                                                                                                        \
    }

void ds_cumsum(const void *x, void *y, int64_t outer, int64_t n, int64_t inner, int64_t kind, int64_t exclusive,
               int64_t reverse) {
    if (kind == 0) { DS_CUMSUM(float, float) }
    else if (kind == 1) { DS_CUMSUM(int32_t, uint32_t) }
    else { DS_CUMSUM(int64_t, uint64_t) }
}

void ds_cumsum_args(const int64_t *a) {
    ds_cumsum((const void *)a[0], (void *)a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
}

void ds_layernorm_f32(const float *restrict x, const float *restrict scale, const float *restrict bias,
                      float *restrict y, int64_t rows, int64_t n, float eps) {
    #pragma omp parallel for schedule(static) if(rows * n >= 32768)
    for (int64_t r = 0; r < rows; r++) ds_layernorm_row_inline(x + r * n, y + r * n, scale, bias, n, eps);
}

/* ReduceSum / Mean / Max / Min / L2 / SumSquare / L1 (op DS_REDUCE_*) of x seen as (outer, n, inner), over its
   middle axis: y[o][i] = op over k of x[o][k][i]. The reduced axes of a C-contiguous array, when they are
   consecutive, are that middle axis whatever the rank. inner = 1 (the last axes): rows of n contiguous elements,
   T5's RMSNorm (mean(x^2) over the hidden axis), the channels-first LayerNorms written as x.mean(1) that the layout
   pass turns into last-axis reductions, a softmax written out (x - max(x)); inner > 1: blocks of DS_LANES
   consecutive inner positions, each of the n strided rows read contiguously (a LayerNorm of jax2tf's written as
   sums over axis 1 of (batch, 512, 256): magika's). Sums in float32 (as onnxruntime accumulates); an empty slice
   sums to 0, averages to NaN (0 / 0, as numpy), and has -inf / +inf as its max / min (the reference's initial
   value); a NaN in a slice makes its max / min NaN (np.max propagates it). */
/* max / min that keep a NaN once either side has one (numpy's maximum / minimum) */
static inline float ds_nan_max(float acc, float v) { return (v > acc || v != v) ? v : acc; }
static inline float ds_nan_min(float acc, float v) { return (v < acc || v != v) ? v : acc; }

static void ds_reduce_row(const float *restrict xr, float *restrict y, int64_t n, int64_t op) {
    if (op == DS_REDUCE_MAX || op == DS_REDUCE_MIN) {
        float m = op == DS_REDUCE_MAX ? -INFINITY : INFINITY;
        int nan = 0;
        if (op == DS_REDUCE_MAX) {
            #pragma omp simd reduction(max:m) reduction(|:nan)
            for (int64_t i = 0; i < n; i++) { m = xr[i] > m ? xr[i] : m; nan |= xr[i] != xr[i]; }
        } else {
            #pragma omp simd reduction(min:m) reduction(|:nan)
            for (int64_t i = 0; i < n; i++) { m = xr[i] < m ? xr[i] : m; nan |= xr[i] != xr[i]; }
        }
        *y = nan ? NAN : m;
        return;
    }
    float s = 0.0f;
    if (op == DS_REDUCE_L2 || op == DS_REDUCE_SUM_SQUARE) {
        #pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < n; i++) s += xr[i] * xr[i];
    } else if (op == DS_REDUCE_L1) {
        #pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < n; i++) s += fabsf(xr[i]);
    } else {
        #pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < n; i++) s += xr[i];
    }
    *y = op == DS_REDUCE_MEAN ? s / (float)n : op == DS_REDUCE_L2 ? sqrtf(s) : s;
}

void ds_reduce_f32(const float *restrict x, float *restrict y, int64_t outer, int64_t n, int64_t inner, int64_t op) {
    if (inner == 1) {
        #pragma omp parallel for schedule(static) if(outer * n >= 32768)
        for (int64_t r = 0; r < outer; r++) ds_reduce_row(x + r * n, y + r, n, op);
        return;
    }
    const int64_t blocks = (inner + DS_LANES - 1) / DS_LANES;
    const float init = op == DS_REDUCE_MAX ? -INFINITY : op == DS_REDUCE_MIN ? INFINITY : 0.0f;
    #pragma omp parallel for schedule(static) if(outer * n * inner >= 32768)
    for (int64_t t = 0; t < outer * blocks; t++) {
        const int64_t o = t / blocks, j0 = (t % blocks) * DS_LANES;
        const int64_t w = inner - j0 < DS_LANES ? inner - j0 : DS_LANES;
        const float *xo = x + o * n * inner + j0;
        float acc[DS_LANES];
        for (int64_t j = 0; j < w; j++) acc[j] = init;
        for (int64_t k = 0; k < n; k++) {
            const float *xr = xo + k * inner;
            if (op == DS_REDUCE_SUM || op == DS_REDUCE_MEAN) {
                #pragma omp simd
                for (int64_t j = 0; j < w; j++) acc[j] += xr[j];
            } else if (op == DS_REDUCE_L2 || op == DS_REDUCE_SUM_SQUARE) {
                #pragma omp simd
                for (int64_t j = 0; j < w; j++) acc[j] += xr[j] * xr[j];
            } else if (op == DS_REDUCE_L1) {
                #pragma omp simd
                for (int64_t j = 0; j < w; j++) acc[j] += fabsf(xr[j]);
            } else if (op == DS_REDUCE_MAX) {
                #pragma omp simd
                for (int64_t j = 0; j < w; j++) acc[j] = ds_nan_max(acc[j], xr[j]);
            } else {
                #pragma omp simd
                for (int64_t j = 0; j < w; j++) acc[j] = ds_nan_min(acc[j], xr[j]);
            }
        }
        float *yo = y + o * inner + j0;
        for (int64_t j = 0; j < w; j++)
            yo[j] = op == DS_REDUCE_MEAN ? acc[j] / (float)n : op == DS_REDUCE_L2 ? sqrtf(acc[j]) : acc[j];
    }
}

/* ds_reduce_f32 with its arguments in one int64 array (x, y, outer, n, inner, op): a plan's program can call it. */
void ds_reduce_args(const int64_t *a) {
    ds_reduce_f32((const float *)a[0], (float *)a[1], a[2], a[3], a[4], a[5]);
}

/* The same with every argument in one int64 array (eps as the bits of a float): a plan's program can call it. */
void ds_layernorm_args(const int64_t *a) {
    float eps;
    memcpy(&eps, &a[6], sizeof eps);
    ds_layernorm_f32((const float *)a[0], (const float *)a[1], (const float *)a[2], (float *)a[3], a[4], a[5], eps);
}

/* LRN over the last axis (channels last): y = x / (bias + alpha / size * sum of squares over the window
   [c - (size - 1) / 2, c + size / 2] clipped to the row)^beta. Per row: the squares into a scratch row padded
   with lo zeros before and hi after (so every window is `size` plain loads and the loop over channels
   vectorises: the clipped scalar loop made Inception v1's two LRNs 4.8 ms of a 34 ms call at 320x320), the
   window sums, then one vectorised pass; beta = 0.75 (AlexNet, GoogLeNet, ZFNet) as sqrt(v) * sqrt(sqrt(v))
   (correctly rounded square roots, within 2 ulp of powf, and vectorised), any other beta with powf. The sums
   add the window's squares in channel order, as before. */
void ds_lrn_f32(const float *restrict x, float *restrict y, int64_t rows, int64_t n, int64_t size, float alpha,
                float beta, float bias) {
    const int64_t lo = (size - 1) / 2;
    const float k = alpha / (float)size;
    #pragma omp parallel if(rows * n >= 32768)
    {
        float *d = (float *)malloc((size_t)n * sizeof(float));
        float *sq = (float *)calloc((size_t)(n + size), sizeof(float)); /* its padding stays zero */
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * n;
            float *yr = y + r * n;
            #pragma omp simd
            for (int64_t c = 0; c < n; c++) sq[lo + c] = xr[c] * xr[c];
            for (int64_t c = 0; c < n; c++) d[c] = 0.0f;
            for (int64_t j = 0; j < size; j++) { /* tap-major: the channel loop vectorises whatever the size */
                #pragma omp simd
                for (int64_t c = 0; c < n; c++) d[c] += sq[c + j];
            }
            #pragma omp simd
            for (int64_t c = 0; c < n; c++) d[c] = bias + k * d[c];
            if (beta == 0.75f) {
                #pragma omp simd
                for (int64_t c = 0; c < n; c++) { const float q = sqrtf(d[c]); yr[c] = xr[c] / (q * sqrtf(q)); }
            } else {
                for (int64_t c = 0; c < n; c++) yr[c] = xr[c] / powf(d[c], beta);
            }
        }
        free(sq);
        free(d);
    }
}

/* Instance and group normalisation, channels first: each row of n = cpr * hw contiguous elements (cpr channels
   of hw elements: InstanceNormalization cpr = 1, GroupNormalization C / G) is normalised over itself, then
   scaled and shifted per channel ((x - mean) * rstd * scale + bias); element i of row r belongs to channel (r * cpr + i / hw) % channels. Mean and variance in two passes,
   accumulated in double: a row is a whole feature map (tens of thousands of elements), where a float sum drifts. */
void ds_chan_norm_f32(const float *restrict x, const float *restrict scale, const float *restrict bias,
                      float *restrict y, int64_t rows, int64_t n, int64_t hw, int64_t cpr, int64_t channels,
                      float eps) {
    #pragma omp parallel for schedule(static) if(rows * n >= 32768)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        double s = 0.0;
        #pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < n; i++) s += xr[i];
        const double mean = s / (double)n;
        double v = 0.0;
        #pragma omp simd reduction(+:v)
        for (int64_t i = 0; i < n; i++) { double d = xr[i] - mean; v += d * d; }
        const float rstd = (float)(1.0 / sqrt(v / (double)n + (double)eps));
        const float m = (float)mean;
        for (int64_t k = 0; k < cpr; k++) {
            const int64_t c = (r * cpr + k) % channels;
            const float a = rstd * scale[c], b = bias[c];
            const float *xc = xr + k * hw;
            float *yc = yr + k * hw;
            #pragma omp simd
            for (int64_t i = 0; i < hw; i++) yc[i] = (xc[i] - m) * a + b;
        }
    }
}

void ds_chan_norm_args(const int64_t *a) {
    float eps;
    memcpy(&eps, &a[9], sizeof eps);
    ds_chan_norm_f32((const float *)a[0], (const float *)a[1], (const float *)a[2], (float *)a[3], a[4], a[5], a[6],
                     a[7], a[8], eps);
}

/* InstanceNormalization channels last: x is (batch, hw, c); each channel of each image is normalised over its
   hw positions. Per image: the channel sums and sums of squared deviations in two passes over the rows (the
   loop over channels vectorises, double accumulators), then one pass y = (x - mean[c]) * rstd[c] * scale[c] + bias[c]. */
void ds_instnorm_nhwc_f32(const float *restrict x, const float *restrict scale, const float *restrict bias,
                          float *restrict y, int64_t batch, int64_t hw, int64_t c, float eps) {
    #pragma omp parallel if(batch * hw * c >= 32768 && batch > 1)
    {
        double *acc = (double *)malloc((size_t)(c > 0 ? c : 1) * sizeof(double));
        float *a = (float *)malloc((size_t)(c > 0 ? c : 1) * sizeof(float));
        float *b = (float *)malloc((size_t)(c > 0 ? c : 1) * sizeof(float));
        float *mean = (float *)malloc((size_t)(c > 0 ? c : 1) * sizeof(float));
        #pragma omp for schedule(static)
        for (int64_t n = 0; n < batch; n++) {
            const float *xn = x + n * hw * c;
            float *yn = y + n * hw * c;
            for (int64_t j = 0; j < c; j++) acc[j] = 0.0;
            for (int64_t p = 0; p < hw; p++) {
                #pragma omp simd
                for (int64_t j = 0; j < c; j++) acc[j] += xn[p * c + j];
            }
            for (int64_t j = 0; j < c; j++) mean[j] = (float)(acc[j] / (double)hw);
            for (int64_t j = 0; j < c; j++) acc[j] = 0.0;
            for (int64_t p = 0; p < hw; p++) {
                #pragma omp simd
                for (int64_t j = 0; j < c; j++) { double d = (double)xn[p * c + j] - mean[j]; acc[j] += d * d; }
            }
            for (int64_t j = 0; j < c; j++) {
                const float rstd = (float)(1.0 / sqrt(acc[j] / (double)hw + (double)eps));
                a[j] = rstd * scale[j];
                b[j] = bias[j];
            }
            for (int64_t p = 0; p < hw; p++) {
                #pragma omp simd
                for (int64_t j = 0; j < c; j++) yn[p * c + j] = (xn[p * c + j] - mean[j]) * a[j] + b[j];
            }
        }
        free(acc); free(a); free(b); free(mean);
    }
}

/* TopK over the middle axis of (outer, n, inner), kind 0 float32 / 1 int32 / 2 int64: each slice's k first in the
   reference's order (largest: descending, else ascending; equal values by ascending index; a NaN ranks above every
   number, where numpy's sort puts it), their values and int64 indices. Per slice, its indices merge-sorted (stable,
   n log n, so ties keep their index order) on the values, in `scratch`: 2n indices (the plan's scratch). */
#define DS_TOPK_BETTER(a, b)                                                                                     \
    (largest ? ((a) > (b) || ((a) != (a) && (b) == (b))) : ((a) < (b) || ((a) == (a) && (b) != (b))))
#define DS_TOPK(T)                                                                                               \
    for (int64_t o = 0; o < outer; o++)                                                                          \
        for (int64_t j = 0; j < inner; j++) {                                                                    \
            const T *xs = (const T *)x + o * n * inner + j;                                                      \
            int64_t *src = idx, *dst = tmp;                                                                      \
            for (int64_t i = 0; i < n; i++) src[i] = i;                                                          \
            for (int64_t w = 1; w < n; w *= 2) {                                                                 \
                for (int64_t lo = 0; lo < n; lo += 2 * w) {                                                      \
                    const int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;          \
                    int64_t a = lo, b = mid, t = lo;                                                             \
                    while (a < mid && b < hi) {                                                                  \
                        const T va = xs[src[a] * inner], vb = xs[src[b] * inner];                                \
                        dst[t++] = DS_TOPK_BETTER(vb, va) ? src[b++] : src[a++];                                 \
                    }                                                                                            \
                    while (a < mid) dst[t++] = src[a++];                                                         \
                    while (b < hi) dst[t++] = src[b++];                                                          \
                }                                                                                                \
                int64_t *s = src; src = dst; dst = s;                                                            \
            }                                                                                                    \
            T *yv = (T *)values + o * k * inner + j;                                                             \
            int64_t *yi = indices + o * k * inner + j;                                                           \
            for (int64_t i = 0; i < k; i++) { yv[i * inner] = xs[src[i] * inner]; yi[i * inner] = src[i]; }      \
        }

void ds_topk(const void *x, void *values, int64_t *indices, int64_t outer, int64_t n, int64_t inner, int64_t k,
             int64_t largest, int64_t kind, int64_t *scratch) {
    int64_t *idx = scratch, *tmp = scratch + n;
    if (kind == 0) { DS_TOPK(float) }
    else if (kind == 1) { DS_TOPK(int32_t) }
    else { DS_TOPK(int64_t) }
}

void ds_topk_args(const int64_t *a) {
    ds_topk((const void *)a[0], (void *)a[1], (int64_t *)a[2], a[3], a[4], a[5], a[6], a[7], a[8], (int64_t *)a[9]);
}
