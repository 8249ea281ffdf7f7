/* Channels-last convolution tiles: implicit GEMM on packed weights (see ds_conv.h for the contract).

   A micro-tile is MR consecutive output pixels of one output row times 32 output channels, accumulated in
   2*MR vector registers over every tap (kh, kw) and input channel of the group: per tap, each row's input
   pixel is found (or the zero row, where the tap falls in the padding), then the inner loop is the same
   broadcast-FMA loop as the product micro-kernels (ds_gemm.c) over the tap's CG packed rows. */
#include <stdint.h>

#include "ds_conv.h"
#include "ds_simd.h"

#define GEO_LOCALS                                                                                          \
    const int64_t H = geo[DS_CONV_H], W = geo[DS_CONV_W], C = geo[DS_CONV_C], OH = geo[DS_CONV_OH];         \
    const int64_t OW = geo[DS_CONV_OW], KH = geo[DS_CONV_KH], KW = geo[DS_CONV_KW];                          \
    const int64_t SH = geo[DS_CONV_SH], SW = geo[DS_CONV_SW], DH = geo[DS_CONV_DH], DW = geo[DS_CONV_DW];    \
    const int64_t PT = geo[DS_CONV_PT], PL = geo[DS_CONV_PL], CG = geo[DS_CONV_CG];                          \
    const int64_t LDY = geo[DS_CONV_LDY];                                                                   \
    (void)OH; (void)OW

#define DS_CROW_INIT(r)                                                                                     \
    ds_v16 c##r##0 = {0}, c##r##1 = {0};                                                                    \
    const float *a##r, *x##r;                                                                               \
    int64_t ih##r, iw##r;                                                                                   \
    { const int64_t pix = p + (r), n = pix / (OH * OW), rem = pix % (OH * OW);                              \
      x##r = xg + n * H * W * C; ih##r = rem / OW * SH - PT; iw##r = rem % OW * SW - PL; }
#define DS_CROW_PTR(r)                                                                                      \
    { const int64_t ih = ih##r + kh * DH, iw = iw##r + kw * DW;                                             \
      a##r = ((uint64_t)ih < (uint64_t)H && (uint64_t)iw < (uint64_t)W) ? x##r + (ih * W + iw) * C : zeros; }
#define DS_CROW_FMA(r) { const float v = a##r[c]; c##r##0 += v * b0; c##r##1 += v * b1; }
#define DS_CROW_STORE(r) ds_store_row(yo + (r) * LDY, c##r##0, c##r##1, ncols);

/* MR consecutive output pixels (flat over image, row, column: a micro-tile may span rows and images, so small
   feature maps still fill it) times one panel of 32 output channels. */
#define DS_CONV_MICRO(MR)                                                                                   \
    static void ds_conv_micro_##MR(const int64_t *geo, const float *restrict xg, const float *restrict bp,  \
                                   float *restrict yo, const float *restrict zeros, int64_t p,               \
                                   int64_t ncols) {                                                          \
        GEO_LOCALS;                                                                                         \
        DS_ROWS##MR(DS_CROW_INIT)                                                                            \
        for (int64_t kh = 0; kh < KH; kh++)                                                                 \
            for (int64_t kw = 0; kw < KW; kw++) {                                                           \
                DS_ROWS##MR(DS_CROW_PTR)                                                                     \
                const float *b = bp + (kh * KW + kw) * CG * 32;                                             \
                for (int64_t c = 0; c < CG; c++) {                                                          \
                    const ds_v16 b0 = ds_ld16(b + c * 32), b1 = ds_ld16(b + c * 32 + 16);                   \
                    DS_ROWS##MR(DS_CROW_FMA)                                                                 \
                }                                                                                           \
            }                                                                                               \
        DS_ROWS##MR(DS_CROW_STORE)                                                                           \
    }

#define DS_ROWS1(M) M(0)
DS_CONV_MICRO(1)
DS_CONV_MICRO(2)
DS_CONV_MICRO(3)
DS_CONV_MICRO(4)
#if DS_MR > 4
DS_CONV_MICRO(5)
DS_CONV_MICRO(6)
DS_CONV_MICRO(7)
DS_CONV_MICRO(8)
DS_CONV_MICRO(9)
DS_CONV_MICRO(10)
DS_CONV_MICRO(11)
DS_CONV_MICRO(12)
#endif

void ds_conv_tile(const int64_t *geo, const float *restrict x, const float *restrict bp, float *restrict y,
                  const float *restrict zeros, int64_t p0, int64_t p1, int64_t g, int64_t q) {
    const int64_t CG = geo[DS_CONV_CG], LDY = geo[DS_CONV_LDY], OCG = geo[DS_CONV_OCG];
    const int64_t K = geo[DS_CONV_KH] * geo[DS_CONV_KW] * CG, panels = (OCG + 31) / 32;
    const int64_t ncols = OCG - q * 32 < 32 ? OCG - q * 32 : 32;
    const float *xg = x + g * CG;
    const float *panel = bp + (g * panels + q) * K * 32;
    for (int64_t p = p0; p < p1; p += DS_MR) {
        const int64_t mr = p1 - p < DS_MR ? p1 - p : DS_MR;
        float *yo = y + p * LDY + g * OCG + q * 32;
        switch (mr) {
        case 1: ds_conv_micro_1(geo, xg, panel, yo, zeros, p, ncols); break;
        case 2: ds_conv_micro_2(geo, xg, panel, yo, zeros, p, ncols); break;
        case 3: ds_conv_micro_3(geo, xg, panel, yo, zeros, p, ncols); break;
#if DS_MR > 4
        case 4: ds_conv_micro_4(geo, xg, panel, yo, zeros, p, ncols); break;
        case 5: ds_conv_micro_5(geo, xg, panel, yo, zeros, p, ncols); break;
        case 6: ds_conv_micro_6(geo, xg, panel, yo, zeros, p, ncols); break;
        case 7: ds_conv_micro_7(geo, xg, panel, yo, zeros, p, ncols); break;
        case 8: ds_conv_micro_8(geo, xg, panel, yo, zeros, p, ncols); break;
        case 9: ds_conv_micro_9(geo, xg, panel, yo, zeros, p, ncols); break;
        case 10: ds_conv_micro_10(geo, xg, panel, yo, zeros, p, ncols); break;
        case 11: ds_conv_micro_11(geo, xg, panel, yo, zeros, p, ncols); break;
        default: ds_conv_micro_12(geo, xg, panel, yo, zeros, p, ncols); break;
#else
        default: ds_conv_micro_4(geo, xg, panel, yo, zeros, p, ncols); break;
#endif
        }
    }
}
