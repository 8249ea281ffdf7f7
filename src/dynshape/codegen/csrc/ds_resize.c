/* Channels-last 2-D resize by per-axis tap tables (nearest: one tap; linear: two taps with weights), computed
   once per shape from the op's own reference (codegen/lower/resize.py), so every coordinate mode and rounding
   rule is the spec's. The channels of a pixel are contiguous: a nearest output pixel is one vector copy, a
   linear one four vectorised reads. OpenMP over output rows. */
#include <stdint.h>

/* a: x, y, N, H, W, C, OH, OW, ih0, ih1, wh, iw0, iw1, ww, linear, LDY (tables: int64 rows / columns, float
   weights of the second tap; nearest reads only ih0 / iw0; LDY: floats between output pixels, C or the width
   of the Concat whose slice y is). */
void ds_resize2d_nhwc(const int64_t *a) {
    const float *x = (const float *)a[0];
    float *y = (float *)a[1];
    const int64_t N = a[2], H = a[3], W = a[4], C = a[5], OH = a[6], OW = a[7];
    const int64_t *ih0 = (const int64_t *)a[8], *ih1 = (const int64_t *)a[9];
    const float *wh = (const float *)a[10];
    const int64_t *iw0 = (const int64_t *)a[11], *iw1 = (const int64_t *)a[12];
    const float *ww = (const float *)a[13];
    const int linear = (int)a[14];
    const int64_t LDY = a[15];
    #pragma omp parallel for schedule(static) if(N * OH * OW * C >= 65536)
    for (int64_t row = 0; row < N * OH; row++) {
        const int64_t n = row / OH, oh = row % OH;
        const float *x0 = x + (n * H + ih0[oh]) * W * C;
        float *yr = y + row * OW * LDY;
        if (!linear) { /* a vector copy per pixel: a memcpy call per 32-channel pixel cost more than the copy */
            for (int64_t ow = 0; ow < OW; ow++) {
                const float *restrict src = x0 + iw0[ow] * C;
                float *restrict dst = yr + ow * LDY;
                #pragma omp simd
                for (int64_t c = 0; c < C; c++) dst[c] = src[c];
            }
            continue;
        }
        const float *x1 = x + (n * H + ih1[oh]) * W * C;
        const float b = wh[oh], a0 = 1.0f - b;
        for (int64_t ow = 0; ow < OW; ow++) {
            const float *p00 = x0 + iw0[ow] * C, *p01 = x0 + iw1[ow] * C;
            const float *p10 = x1 + iw0[ow] * C, *p11 = x1 + iw1[ow] * C;
            const float d = ww[ow], c0 = 1.0f - d;
            float *o = yr + ow * LDY;
            #pragma omp simd
            for (int64_t c = 0; c < C; c++)
                o[c] = a0 * (c0 * p00[c] + d * p01[c]) + b * (c0 * p10[c] + d * p11[c]);
        }
    }
}
