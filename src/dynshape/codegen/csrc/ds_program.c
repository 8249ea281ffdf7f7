/* The program runner and the strided copy: what lets a bound plan run its native steps in one foreign call.

   A planned call is a list of pre-bound steps whose arguments are fixed integers (addresses, extents); each
   ctypes call costs about a microsecond, so consecutive native steps are packed into one int64 program
       [fn, nargs, arg0, ..., fn, nargs, ...]
   that ds_run_program walks. Every entry is called through a function type of `nargs` int64 parameters: the
   steps take pointers and int64 extents only, which travel in the same registers on the 64-bit ABIs we build
   for (x86-64, aarch64). Data-movement steps (Transpose, Expand: a strided view copied into a contiguous
   buffer) get ds_copy_strided, so they join the program instead of splitting it. */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define DS_PROGRAM_MAX_ARGS 16

/* 3 or 4 planes interleaved into pixels (an RGB image NCHW -> NHWC: (N, H * W, 3) read with the channel stride):
   a few source streams, each read contiguously, and one destination written in order; a fixed width so the
   compiler interleaves vectors (the 16 x 16 tiles copied 3 floats a tile row). */
#define DS_PAR_PLANE_PIXELS (1 << 15)
static void ds_interleave_planes(float *restrict o, const float *restrict s0, int64_t rows, int64_t inner,
                                 int64_t cs) {
    const float *s1 = s0 + cs, *s2 = s1 + cs, *s3 = s2 + cs;
    /* both cores on a large image (a 736 x 736 RGB input: 1.6 M floats each way; one thread ran it at the speed
       of a scalar loop, 0.25 ms of a detector's 24 at 480 x 640) */
    if (inner == 3) {
        #pragma omp parallel for schedule(static) if(rows >= DS_PAR_PLANE_PIXELS)
        for (int64_t r = 0; r < rows; r++) { o[3 * r] = s0[r]; o[3 * r + 1] = s1[r]; o[3 * r + 2] = s2[r]; }
    } else {
        #pragma omp parallel for schedule(static) if(rows >= DS_PAR_PLANE_PIXELS)
        for (int64_t r = 0; r < rows; r++) {
            o[4 * r] = s0[r]; o[4 * r + 1] = s1[r]; o[4 * r + 2] = s2[r]; o[4 * r + 3] = s3[r];
        }
    }
}

/* A matrix transpose in 16 x 16 tiles, so every cache line read or written is used whole instead of one float of
   it: o[r][c] = s[r * 4 + c * ist bytes]. */
static void ds_transpose_scalar(float *restrict o, const char *restrict s, int64_t rows, int64_t inner, int64_t ist) {
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
        for (int64_t c0 = 0; c0 < inner; c0 += 16) {
            const int64_t r1 = r0 + 16 < rows ? r0 + 16 : rows, c1 = c0 + 16 < inner ? c0 + 16 : inner;
            for (int64_t c = c0; c < c1; c++)
                for (int64_t r = r0; r < r1; r++) memcpy(o + r * inner + c, s + r * 4 + c * ist, 4);
        }
}

#ifdef __AVX__
#include <immintrin.h>
/* o[r][c] = s[r + c * lds] for r, c < 8: the 8 source rows (8 floats over r each) transposed in registers. */
static inline void ds_transpose8x8(float *restrict o, int64_t ldo, const float *restrict s, int64_t lds) {
    const __m256 a0 = _mm256_loadu_ps(s), a1 = _mm256_loadu_ps(s + lds), a2 = _mm256_loadu_ps(s + 2 * lds);
    const __m256 a3 = _mm256_loadu_ps(s + 3 * lds), a4 = _mm256_loadu_ps(s + 4 * lds);
    const __m256 a5 = _mm256_loadu_ps(s + 5 * lds), a6 = _mm256_loadu_ps(s + 6 * lds);
    const __m256 a7 = _mm256_loadu_ps(s + 7 * lds);
    const __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
    const __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
    const __m256 t4 = _mm256_unpacklo_ps(a4, a5), t5 = _mm256_unpackhi_ps(a4, a5);
    const __m256 t6 = _mm256_unpacklo_ps(a6, a7), t7 = _mm256_unpackhi_ps(a6, a7);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(o, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(o + ldo, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(o + 2 * ldo, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(o + 3 * ldo, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(o + 4 * ldo, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(o + 5 * ldo, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(o + 6 * ldo, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(o + 7 * ldo, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#endif

/* The same transpose in 8 x 8 register blocks where the source's stride is whole floats: a CNN's NHWC -> NCHW
   output (64 channels of an 80 x 80 map: 409,600 floats) took 208 us element by element, onnxruntime's reorder
   70. The inner loop runs over the shorter side, so the lines it half-writes (or half-reads) are still in L1
   when the next 8 columns (rows) complete them; the rest of both sides as the scalar tiles. */
static void ds_transpose_tiles(float *restrict o, const char *restrict s, int64_t rows, int64_t inner, int64_t ist) {
#ifdef __AVX__
    if (ist % 4 == 0 && rows >= 8 && inner >= 8) {
        const float *sf = (const float *)s;
        const int64_t lds = ist / 4, rv = rows / 8 * 8, cv = inner / 8 * 8;
#define DS_TR_BLOCK ds_transpose8x8(o + r0 * inner + c0, inner, sf + r0 + c0 * lds, lds)
        if (rows <= inner) {
            /* 16 columns per pass: each destination row gets a whole 64-byte line at once (with 8, the line's
               second half came a pass later, after the pass's other rows: 64 of them 25,600 bytes apart share
               four L1 sets) */
            const int64_t c16 = cv / 16 * 16;
            for (int64_t c0 = 0; c0 < c16; c0 += 16)
                for (int64_t r0 = 0; r0 < rv; r0 += 8) {
                    DS_TR_BLOCK;
                    ds_transpose8x8(o + r0 * inner + c0 + 8, inner, sf + r0 + (c0 + 8) * lds, lds);
                }
            for (int64_t c0 = c16; c0 < cv; c0 += 8)
                for (int64_t r0 = 0; r0 < rv; r0 += 8) DS_TR_BLOCK;
        } else {
            for (int64_t r0 = 0; r0 < rv; r0 += 8)
                for (int64_t c0 = 0; c0 < cv; c0 += 8) DS_TR_BLOCK;
        }
#undef DS_TR_BLOCK
        for (int64_t r = 0; r < rv; r++) /* the last inner % 8 columns of the block rows */
            for (int64_t c = cv; c < inner; c++) o[r * inner + c] = sf[r + c * lds];
        if (rv < rows) ds_transpose_scalar(o + rv * inner, s + rv * 4, rows - rv, inner, ist);
        return;
    }
#endif
    ds_transpose_scalar(o, s, rows, inner, ist);
}

/* dst (contiguous) = the strided view (nd dims, 1 <= nd <= 16) of src: the copy on one thread. */
static void ds_copy_view(int64_t nd, int64_t size, char *dst, const char *src, const int64_t *shape,
                         const int64_t *stride) {
    int64_t idx[16] = {0};
    const int64_t inner = shape[nd - 1], ist = stride[nd - 1];
    if (size == 4 && nd >= 2 && stride[nd - 2] == 4 && ist != 4) {
        /* the last two dims swapped (a matrix transpose per outer index) */
        const int64_t rows = shape[nd - 2];
        const int planes = ist % 4 == 0 && (inner == 3 || inner == 4);
        for (;;) {
            const char *s = src;
            for (int64_t d = 0; d < nd - 2; d++) s += idx[d] * stride[d];
            if (planes) ds_interleave_planes((float *)dst, (const float *)s, rows, inner, ist / 4);
            else ds_transpose_tiles((float *)dst, s, rows, inner, ist);
            dst += rows * inner * 4;
            int64_t d = nd - 3;
            for (; d >= 0; d--) {
                if (++idx[d] < shape[d]) break;
                idx[d] = 0;
            }
            if (d < 0) return;
        }
    }
    for (;;) {
        const char *s = src;
        for (int64_t d = 0; d < nd - 1; d++) s += idx[d] * stride[d];
        if (ist == size) {
            memcpy(dst, s, inner * size);
            dst += inner * size;
        } else if (size == 4) {
            float *o = (float *)dst;
            for (int64_t i = 0; i < inner; i++) memcpy(o + i, s + i * ist, 4);
            dst += inner * 4;
        } else {
            for (int64_t i = 0; i < inner; i++, dst += size) memcpy(dst, s + i * ist, size);
        }
        int64_t d = nd - 2;
        for (; d >= 0; d--) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
        if (d < 0) return;
    }
}

/* dst (contiguous) = the strided view described by a: [ndim, itemsize, dst, src, shape[ndim], strides[ndim]]
   (strides in bytes, 0 where the source broadcasts). The innermost dim is a memcpy when it is contiguous. From
   DS_COPY_PAR_BYTES the threads share the outermost dim (text recognition's (N, C, 1, W) -> (W, N, C) before
   its LSTM: 0.28 ms on one thread while the other waited). */
#define DS_COPY_PAR_BYTES (1 << 18)
void ds_copy_strided(const int64_t *a) {
    const int64_t nd = a[0], size = a[1];
    char *dst = (char *)a[2];
    const char *src = (const char *)a[3];
    const int64_t *shape = a + 4, *stride = a + 4 + nd;
    if (nd == 0) { memcpy(dst, src, size); return; }
    int64_t inner = size; /* bytes of dst per index of the outermost dim */
    for (int64_t d = 0; d < nd; d++) {
        if (shape[d] == 0) return;
        if (d > 0) inner *= shape[d];
    }
    if (shape[0] < 2 || shape[0] * inner < DS_COPY_PAR_BYTES) {
        ds_copy_view(nd, size, dst, src, shape, stride);
        return;
    }
    #pragma omp parallel
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t i0 = shape[0] * t / nt, i1 = shape[0] * (t + 1) / nt;
        if (i1 > i0) {
            int64_t part[16];
            memcpy(part, shape, nd * sizeof(int64_t));
            part[0] = i1 - i0;
            ds_copy_view(nd, size, dst + i0 * inner, src + i0 * stride[0], part, stride);
        }
    }
}

#ifdef __AVX512F__
#include <immintrin.h>
#endif
#define DS_PERMUTE_PAR_BYTES (1 << 18) /* from here the threads share the rows (ShuffleNet's 56x56 x 240 shuffle) */
/* A channel shuffle per row, dst[r][c * G + g] = src[r][g * n + c] (rows `stride` bytes apart; 4-byte elements):
   the (G, n) -> (n, G) transpose a channels-last ShuffleNet does per pixel, for ds_permute_rows when its table is
   one (a[6] = G: 2, 4 or 8). 8 values of every group at once, interleaved in registers (unpacks and lane permutes;
   for 8, ds_transpose8x8): the table took 0.5 ns an element on AVX2 (AMD EPYC Zen 3: its gathers are no faster
   than scalar loads), 171 us of ShuffleNet's 56x56 x (4, 28). The same entry point as the table's, so that a bucket
   plan whose keys take one or the other (a K^T of 4 or 8 positions is such a transpose too) rewrites words, not
   calls. */
static void ds_shuffle_rows(float *const out, const char *src, int64_t rows, int64_t stride, int64_t G, int64_t n) {
    #pragma omp parallel for schedule(static) if(rows > 1 && rows * G * n * 4 >= DS_PERMUTE_PAR_BYTES)
    for (int64_t r = 0; r < rows; r++) {
        float *d = out + r * G * n;
        const float *s = (const float *)(src + r * stride);
        int64_t c = 0;
#ifdef __AVX__
        if (G == 2)
            for (; c + 8 <= n; c += 8) {
                const __m256 a0 = _mm256_loadu_ps(s + c), a1 = _mm256_loadu_ps(s + n + c);
                const __m256 lo = _mm256_unpacklo_ps(a0, a1), hi = _mm256_unpackhi_ps(a0, a1);
                _mm256_storeu_ps(d + 2 * c, _mm256_permute2f128_ps(lo, hi, 0x20));
                _mm256_storeu_ps(d + 2 * c + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
            }
        else if (G == 4)
            for (; c + 8 <= n; c += 8) {
                const __m256 a0 = _mm256_loadu_ps(s + c), a1 = _mm256_loadu_ps(s + n + c);
                const __m256 a2 = _mm256_loadu_ps(s + 2 * n + c), a3 = _mm256_loadu_ps(s + 3 * n + c);
                const __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
                const __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
                const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
                const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
                _mm256_storeu_ps(d + 4 * c, _mm256_permute2f128_ps(u0, u1, 0x20));
                _mm256_storeu_ps(d + 4 * c + 8, _mm256_permute2f128_ps(u2, u3, 0x20));
                _mm256_storeu_ps(d + 4 * c + 16, _mm256_permute2f128_ps(u0, u1, 0x31));
                _mm256_storeu_ps(d + 4 * c + 24, _mm256_permute2f128_ps(u2, u3, 0x31));
            }
        else if (G == 8)
            for (; c + 8 <= n; c += 8) ds_transpose8x8(d + 8 * c, 8, s + c, n);
#endif
        for (; c < n; c++)
            for (int64_t g = 0; g < G; g++) d[c * G + g] = s[g * n + c];
    }
}

/* Every row of a small block moved by one table (a transpose of a few inner dims: a channels-last channel
   shuffle's (groups, C / groups) per pixel): a = [dst, src, rows, row stride in bytes, width, table], dst
   contiguous, dst[r * width + k] = src[r * stride + table[k]] (4-byte elements, table in elements), a[6]: the
   groups when the table is a channel shuffle's (ds_shuffle_rows), else 0. The
   strided copy's per-element loop ran ShuffleNet's 56x56 x (4, 28) shuffle at 0.7 ns an element; with AVX-512
   a row is 16-lane gathers from L1. */
void ds_permute_rows(const int64_t *a) {
    float *const out = (float *)a[0];
    const char *src = (const char *)a[1];
    const int64_t rows = a[2], stride = a[3], width = a[4];
    const int32_t *table = (const int32_t *)a[5];
    if (a[6]) { /* a channel shuffle of a[6] groups */
        ds_shuffle_rows(out, src, rows, stride, a[6], width / a[6]);
        return;
    }
    #pragma omp parallel for schedule(static) if(rows > 1 && rows * width * 4 >= DS_PERMUTE_PAR_BYTES)
    for (int64_t r = 0; r < rows; r++) {
        float *dst = out + r * width;
        const float *s = (const float *)(src + r * stride);
        int64_t k = 0;
#ifdef __AVX512F__
        for (; k + 16 <= width; k += 16)
            _mm512_storeu_ps(dst + k, _mm512_i32gather_ps(_mm512_loadu_si512(table + k), s, 4));
#endif
        for (; k < width; k++) dst[k] = s[table[k]];
    }
}

/* Concat into a planned buffer: a = [out, outer, n, bytes_out, (src, bytes) x n]: for each of `outer` rows of
   the output (bytes_out bytes each), the inputs' rows follow each other (the axis and everything inside it are
   contiguous, so a row of input i is `bytes` contiguous bytes). */
/* Rows are shared by the threads when the copy is large: DenseNet's concatenations of every earlier layer's maps
   (read by later layers too, so not written in place) were 2.3 ms of a 34 ms call on one thread, and the only
   steps a second thread did not help. */
#define DS_CONCAT_PAR_BYTES (1 << 20)
/* An input whose address is its own columns of the output's first row was written there by its producer (a
   partial join, runtime/concat_joins.py: a kernel writing rows a stride apart): it is skipped. (A separate
   input cannot start there: the input and output buffers of a step are disjoint unless joined.) */
void ds_concat(const int64_t *a) {
    char *out = (char *)a[0];
    const int64_t outer = a[1], n = a[2], row = a[3];
    #pragma omp parallel for schedule(static) if(outer > 1 && outer * row >= DS_CONCAT_PAR_BYTES)
    for (int64_t o = 0; o < outer; o++) {
        char *dst = out + o * row;
        for (int64_t i = 0; i < n; i++) {
            const int64_t bytes = a[5 + 2 * i];
            const char *src = (const char *)a[4 + 2 * i];
            if (src != dst - o * row) memcpy(dst, src + o * bytes, (size_t)bytes);
            dst += bytes;
        }
    }
}

/* GatherElements into a contiguous output shaped like the indices: out[i] = x[i with axis `axis` replaced by
   idx[i]], a = [rank, axis, itemsize, idx_is_int32, out, x, idx, n, shape[rank] (the indices'), xstride[rank]
   (the data's, in bytes)]; n = x.shape[axis]. A negative index counts from the end (ONNX); one still outside
   [0, n) is never read: its element is zeroed and counted, and the count is returned (the caller raises, naming
   the node). roberta's token-type ids (a buffer expanded to (B, S), gathered at the position ids). */
int64_t ds_gather_elements(const int64_t *a) {
    const int64_t rank = a[0], axis = a[1], size = a[2], i32 = a[3], n = a[7];
    char *out = (char *)a[4];
    const char *x = (const char *)a[5];
    const void *idx = (const void *)a[6];
    const int64_t *shape = a + 8, *xs = a + 8 + rank;
    int64_t total = 1, ctr[16] = {0}, bad = 0;
    for (int64_t d = 0; d < rank; d++) total *= shape[d];
    if (total == 0) return 0;
    const int64_t last = shape[rank - 1], ls = xs[rank - 1], as = xs[axis];
    for (int64_t p = 0; p < total; p += last) {
        const char *base = x;
        for (int64_t d = 0; d < rank - 1; d++)
            if (d != axis) base += ctr[d] * xs[d];
        for (int64_t j = 0; j < last; j++) {
            int64_t v = i32 ? (int64_t)((const int32_t *)idx)[p + j] : ((const int64_t *)idx)[p + j];
            v += v < 0 ? n : 0;
            char *dst = out + (p + j) * size;
            if (v < 0 || v >= n) { memset(dst, 0, (size_t)size); bad++; continue; }
            const char *src = base + v * as + (axis == rank - 1 ? 0 : j * ls);
            switch (size) {
            case 8: memcpy(dst, src, 8); break;
            case 4: memcpy(dst, src, 4); break;
            case 2: memcpy(dst, src, 2); break;
            case 1: *dst = *src; break;
            default: memcpy(dst, src, (size_t)size);
            }
        }
        for (int64_t d = rank - 2; d >= 0; d--) {
            if (++ctr[d] < shape[d]) break;
            ctr[d] = 0;
        }
    }
    return bad;
}

/* A float32 Add / Sub / Mul / Div whose operands broadcast in a way only the call's shape decides (ppocr_det's
   FPN adds an upsampled map of 2 * ceil(H / 32) rows to one of ceil(H / 16): equal, or 1 against 2): the binder
   computes the broadcast strides from the key's buffers. a = [op (0 + 1 - 2 * 3 /), rank, out, x, y,
   shape[rank], xstride[rank], ystride[rank]] (in elements; 0 where an operand is broadcast); out is contiguous.
   IEEE float32 arithmetic, numpy's result bit for bit. */
#define DS_BIN_LOOP(EXPR)                                                                                        \
    if (sx == 1 && sy == 1) { _Pragma("omp simd") for (int64_t j = 0; j < last; j++) { const float u = xp[j], v = yp[j]; o[j] = EXPR; } } \
    else if (sx == 1 && sy == 0) { const float v = yp[0]; _Pragma("omp simd") for (int64_t j = 0; j < last; j++) { const float u = xp[j]; o[j] = EXPR; } } \
    else if (sx == 0 && sy == 1) { const float u = xp[0]; _Pragma("omp simd") for (int64_t j = 0; j < last; j++) { const float v = yp[j]; o[j] = EXPR; } } \
    else { for (int64_t j = 0; j < last; j++) { const float u = xp[j * sx], v = yp[j * sy]; o[j] = EXPR; } }
void ds_binary_f32(const int64_t *a) {
    const int64_t op = a[0], rank = a[1];
    float *out = (float *)a[2];
    const float *x = (const float *)a[3], *y = (const float *)a[4];
    const int64_t *shape = a + 5, *xs = a + 5 + rank, *ys = a + 5 + 2 * rank;
    int64_t total = 1, ctr[16] = {0};
    for (int64_t d = 0; d < rank; d++) total *= shape[d];
    if (total == 0) return;
    const int64_t last = shape[rank - 1], sx = xs[rank - 1], sy = ys[rank - 1];
    for (int64_t p = 0; p < total; p += last) {
        const float *xp = x, *yp = y;
        for (int64_t d = 0; d < rank - 1; d++) { xp += ctr[d] * xs[d]; yp += ctr[d] * ys[d]; }
        float *o = out + p;
        switch (op) {
        case 0: DS_BIN_LOOP(u + v) break;
        case 1: DS_BIN_LOOP(u - v) break;
        case 2: DS_BIN_LOOP(u * v) break;
        default: DS_BIN_LOOP(u / v) break;
        }
        for (int64_t d = rank - 2; d >= 0; d--) {
            if (++ctr[d] < shape[d]) break;
            ctr[d] = 0;
        }
    }
}

/* Each step is called through a type of `nargs` int64 parameters (I below); at most DS_PROGRAM_MAX_ARGS. */
typedef int64_t I;
void ds_run_program(const int64_t *p, int64_t n) {
    for (int64_t s = 0; s < n; s++) {
        const void *fn = (const void *)p[0];
        const int64_t nargs = p[1], *a = p + 2;
        switch (nargs) {
        case 0: ((void (*)(void))fn)(); break;
        case 1: ((void (*)(I))fn)(a[0]); break;
        case 2: ((void (*)(I, I))fn)(a[0], a[1]); break;
        case 3: ((void (*)(I, I, I))fn)(a[0], a[1], a[2]); break;
        case 4: ((void (*)(I, I, I, I))fn)(a[0], a[1], a[2], a[3]); break;
        case 5: ((void (*)(I, I, I, I, I))fn)(a[0], a[1], a[2], a[3], a[4]); break;
        case 6: ((void (*)(I, I, I, I, I, I))fn)(a[0], a[1], a[2], a[3], a[4], a[5]); break;
        case 7: ((void (*)(I, I, I, I, I, I, I))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6]); break;
        case 8: ((void (*)(I, I, I, I, I, I, I, I))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]); break;
        case 9: ((void (*)(I, I, I, I, I, I, I, I, I))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8]); break;
        case 10: ((void (*)(I, I, I, I, I, I, I, I, I, I))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]); break;
        case 11: ((void (*)(I, I, I, I, I, I, I, I, I, I, I))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10]); break;
        case 12: ((void (*)(I, I, I, I, I, I, I, I, I, I, I, I))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11]); break;
        case 13: ((void (*)(I, I, I, I, I, I, I, I, I, I, I, I, I))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12]); break;
        case 14: ((void (*)(I, I, I, I, I, I, I, I, I, I, I, I, I, I))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13]); break;
        case 15: ((void (*)(I, I, I, I, I, I, I, I, I, I, I, I, I, I, I))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14]); break;
        case 16: ((void (*)(I, I, I, I, I, I, I, I, I, I, I, I, I, I, I, I))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]); break;
        }
        p += 2 + nargs;
    }
}

/* Scatter: consecutive chunks of `src` to n places, spans = [dst0, bytes0, dst1, bytes1, ...]; gather: the
   reverse. A bucket plan's words at a key, copied out as it leaves the key and put back when the key comes again,
   each in one foreign call (runtime/key_states.py: 46 buffers of words in GPT-2's step, each a ctypes call of
   ~0.3-0.5 us otherwise). */
void ds_scatter_bytes(const int64_t *spans, int64_t n, const char *src) {
    for (int64_t i = 0; i < n; i++) {
        memcpy((void *)spans[2 * i], src, (size_t)spans[2 * i + 1]);
        src += spans[2 * i + 1];
    }
}

/* A bucket plan's move to a new key (runtime/rekey.py's `_put_words`): vals[i] into the int64 word at address
   dst[i], for every i; unless a word that changes holds, or would hold, an address in [lo, hi) (an in-place
   slot's: the caller puts the words patched with its callers' addresses back first, then calls again with lo = hi):
   then nothing is written and 1 returned. */
int64_t ds_put_words(const int64_t *dst, const int64_t *vals, int64_t n, int64_t lo, int64_t hi) {
    for (int64_t i = 0; lo < hi && i < n; i++) {
        const int64_t old = *(const int64_t *)dst[i], now = vals[i];
        if (old != now && ((old >= lo && old < hi) || (now >= lo && now < hi)))
            return 1;
    }
    for (int64_t i = 0; i < n; i++)
        *(int64_t *)dst[i] = vals[i];
    return 0;
}

void ds_gather_bytes(const int64_t *spans, int64_t n, char *dst) {
    for (int64_t i = 0; i < n; i++) {
        memcpy(dst, (const void *)spans[2 * i], (size_t)spans[2 * i + 1]);
        dst += spans[2 * i + 1];
    }
}

/* dst = src, both strided views of one shape: a = [ndim, itemsize, dst, src, shape[ndim], dst strides[ndim], src
   strides[ndim]] (bytes; ndim <= 16). The loop driver's copy of a scan output into its row of the Scan's output,
   which is strided when the output axis is not the first (a (batch, steps, width) output's row i is [:, i, :]):
   the innermost dim one memcpy where both are contiguous in it. */
void ds_copy_general(const int64_t *a) {
    const int64_t nd = a[0], size = a[1];
    char *const dst = (char *)a[2];
    const char *const src = (const char *)a[3];
    const int64_t *shape = a + 4, *ds = a + 4 + nd, *ss = a + 4 + 2 * nd;
    if (nd == 0) { memcpy(dst, src, (size_t)size); return; }
    for (int64_t d = 0; d < nd; d++)
        if (shape[d] == 0) return;
    int64_t idx[16] = {0};
    const int64_t inner = shape[nd - 1], di = ds[nd - 1], si = ss[nd - 1];
    for (;;) {
        char *o = dst;
        const char *s = src;
        for (int64_t d = 0; d < nd - 1; d++) { o += idx[d] * ds[d]; s += idx[d] * ss[d]; }
        if (di == size && si == size) memcpy(o, s, (size_t)(inner * size));
        else for (int64_t i = 0; i < inner; i++) memcpy(o + i * di, s + i * si, (size_t)size);
        int64_t d = nd - 2;
        for (; d >= 0; d--) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
        if (d < 0) return;
    }
}

/* One index of a Gather read at run time (a Loop body's xs[i]), the data C-contiguous seen as (outer, n, inner
   bytes): a = [out, x, idx, idx_is_int32, outer, n, inner, status]. A negative index counts from the end (ONNX);
   one still outside [0, n) copies nothing and sets a[7] (the loop driver below checks it after each iteration
   and the caller re-runs that iteration's Python path, which raises naming the node). */
void ds_gather_pick(int64_t *a) {
    char *out = (char *)a[0];
    const char *x = (const char *)a[1];
    const int64_t outer = a[4], n = a[5], inner = a[6];
    int64_t i = a[3] ? (int64_t) * (const int32_t *)a[2] : *(const int64_t *)a[2];
    i += i < 0 ? n : 0;
    if (i < 0 || i >= n) { a[7] = 1; return; }
    for (int64_t o = 0; o < outer; o++) memcpy(out + o * inner, x + (o * n + i) * inner, (size_t)inner);
}

/* Gather along an axis with indices read at run time (a token's embedding row, a mask's columns picked at the
   position ids), the data C-contiguous seen as (outer, n, inner bytes) and the output as (outer, count, inner):
   a = [out, x, idx, idx_is_int32, outer, n, inner, count]. A negative index counts from the end (ONNX); one still
   outside [0, n) is never read: its row is zeroed and counted, and the count is returned (the caller raises,
   naming the node). Why not np.take: with the range check before it (its mode="raise" copies through a
   temporary), three numpy calls cost ~12 us of a decoder step's ~160. */
int64_t ds_gather_rows(const int64_t *a) {
    char *out = (char *)a[0];
    const char *x = (const char *)a[1];
    const void *idx = (const void *)a[2];
    const int64_t i32 = a[3], outer = a[4], n = a[5], inner = a[6], count = a[7];
    int64_t bad = 0;
    for (int64_t o = 0; o < outer; o++) {
        const char *src = x + o * n * inner;
        for (int64_t j = 0; j < count; j++) {
            int64_t v = i32 ? (int64_t)((const int32_t *)idx)[j] : ((const int64_t *)idx)[j];
            v += v < 0 ? n : 0;
            char *dst = out + (o * count + j) * inner;
            if (v < 0 || v >= n) { memset(dst, 0, (size_t)inner); bad++; continue; }
            switch (inner) {
            case 8: memcpy(dst, src + v * 8, 8); break;
            case 4: memcpy(dst, src + v * 4, 4); break;
            case 2: memcpy(dst, src + v * 2, 2); break;
            case 1: *dst = src[v]; break;
            default: memcpy(dst, src + v * inner, (size_t)inner);
            }
        }
    }
    return bad;
}

/* ds_gather_rows inside a program: a = its words, then a status word a[8], set to the count of indices out of
   range (their rows zeroed, as there), and a[9], the first such index as given. The plan checks the status after
   its calls (BoundPlan.execute) and raises, naming the node and the index (the indices' buffer may hold other
   values by then); a loop driver checks it after each iteration. Why: with indices read at run time (a token's
   embedding row) the gather was a Python call, ~1.5 us and a split program on every call. */
void ds_gather_rows_st(int64_t *a) {
    const int64_t bad = ds_gather_rows(a);
    if (!bad) return;
    const int64_t n = a[5], count = a[7];
    for (int64_t j = 0; j < count; j++) {
        const int64_t v = a[3] ? (int64_t)((const int32_t *)a[2])[j] : ((const int64_t *)a[2])[j];
        if (v < -n || v >= n) { a[9] = v; break; }
    }
    a[8] = bad;
}

/* The lean iterations of a compiled Loop / Scan body (runtime/loop_driver.py) in one foreign call, instead of a
   Python loop of ~1 us an iteration around a body of ~1 us of kernels. d = [body, nbody, carry, ncarry, cond,
   nstat, stat, nadv, (word, base, delta) x nadv]: for each iteration i in [start, stop): the carried values
   copied from the last iteration's outputs into their input slots (the program `carry`, ncarry steps; skipped
   before the first iteration unless carry_first), every advancing word set to base + i * delta (the iteration
   number's slot, a scan slice's source, a scan output row's destination: in the copy descriptors the program
   `body` runs around the body's own steps), then `body`. It stops after an iteration whose condition (a bool at
   `cond`, 0: none) is false or that set one of the nstat status words at `stat` (an index out of range).
   Returns the number of the next iteration (start + iterations run). */
int64_t ds_run_loop(const int64_t *d, int64_t start, int64_t stop, int64_t carry_first) {
    const int64_t *body = (const int64_t *)d[0], *carry = (const int64_t *)d[2];
    const int64_t nbody = d[1], ncarry = d[3], nstat = d[5], nadv = d[7];
    const uint8_t *cond = (const uint8_t *)d[4];
    const int64_t *const *stat = (const int64_t *const *)d[6];
    const int64_t *adv = d + 8;
    int64_t i = start;
    while (i < stop) {
        if (i > start || carry_first) ds_run_program(carry, ncarry);
        for (int64_t k = 0; k < nadv; k++) *(int64_t *)adv[3 * k] = adv[3 * k + 1] + i * adv[3 * k + 2];
        ds_run_program(body, nbody);
        i++;
        for (int64_t k = 0; k < nstat; k++)
            if (*stat[k]) return i;
        if (cond && !*cond) break;
    }
    return i;
}

/* First-fit placement of a plan's buffers in its arena (runtime/plan.py, Planner.layout): buffers in `order`
   (largest first), each at the lowest offset where it overlaps no placed buffer whose lifetime it shares
   (adjacency in CSR: adj[adj_start[b] .. adj_start[b + 1]]). Returns the arena's size; offset[b] gets each
   buffer's offset. The same placement as the Python loop it replaces, 30x faster (a new shape's plan is made
   on the request path: text detection's 94 buffers took 0.15 ms of a 0.9 ms plan). `work`: 2 * n int64s. */
int64_t ds_first_fit(int64_t n, const int64_t *size, const int64_t *order, const int64_t *adj_start,
                     const int64_t *adj, int64_t *offset, int64_t *work) {
    int64_t *st = work, *en = work + n, total = 0;
    for (int64_t i = 0; i < n; i++) offset[i] = -1;
    for (int64_t k = 0; k < n; k++) {
        const int64_t b = order[k], sz = size[b];
        int64_t cnt = 0;
        for (int64_t j = adj_start[b]; j < adj_start[b + 1]; j++) {
            const int64_t o = adj[j];
            if (offset[o] < 0) continue;
            /* insertion by start: the clashes stay sorted (ties in any order place the buffer alike) */
            int64_t i = cnt++;
            while (i > 0 && st[i - 1] > offset[o]) { st[i] = st[i - 1]; en[i] = en[i - 1]; i--; }
            st[i] = offset[o];
            en[i] = offset[o] + size[o];
        }
        int64_t at = 0;
        for (int64_t i = 0; i < cnt; i++) {
            if (at + sz <= st[i]) break;
            if (en[i] > at) at = en[i];
        }
        offset[b] = at;
        if (at + sz > total) total = at + sz;
    }
    return total;
}

/* Range over integers: out[i] = start + i * delta for i < n, a = [out, n, &start, &delta, is_int32] (start and
   delta read where they lie when the call runs: constants, or a value of the key in the plan's arena; n is the
   output's length, which inference made from the same values). The arithmetic wraps in the output's width as
   numpy's start + arange(n) * delta does: unsigned, so no overflow is undefined. Why in C: in a bucket plan a decode
   step's positions and mask columns are computed on every call (runtime/per_key.py), where numpy's arange through
   the reference cost ~8 us. */
void ds_range_int(const int64_t *a) {
    const int64_t n = a[1];
    if (a[4]) {
        uint32_t *out = (uint32_t *)a[0];
        const uint32_t start = *(const uint32_t *)a[2], delta = *(const uint32_t *)a[3];
        for (int64_t i = 0; i < n; i++) out[i] = start + (uint32_t)i * delta;
    } else {
        uint64_t *out = (uint64_t *)a[0];
        const uint64_t start = *(const uint64_t *)a[2], delta = *(const uint64_t *)a[3];
        for (int64_t i = 0; i < n; i++) out[i] = start + (uint64_t)i * delta;
    }
}
