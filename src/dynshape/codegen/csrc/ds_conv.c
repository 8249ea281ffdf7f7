/* Channels-last convolution tiles: implicit GEMM on packed weights (see ds_conv.h for the contract).

   A micro-tile is MR consecutive output pixels of one output row times 32 output channels, accumulated in
   2*MR vector registers over every tap (kh, kw) and input channel of the group: per tap, each row's input
   pixel is found (or the zero row, where the tap falls in the padding), then the inner loop is the same
   broadcast-FMA loop as the product micro-kernels (ds_gemm.c) over the tap's CG packed rows. A tap row that
   falls outside the input entirely (ih out of range) is skipped for the whole tile. */
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

#define DS_CROW_INIT(r) ds_v16 c##r##0 = {0}, c##r##1 = {0}; const float *a##r;
#define DS_CROW_PTR(r)                                                                                      \
    { const int64_t iw = iw0 + (r) * SW; a##r = (uint64_t)iw < (uint64_t)W ? xr + iw * C : zeros; }
#define DS_CROW_FMA(r) { const float v = a##r[p]; c##r##0 += v * b0; c##r##1 += v * b1; }
#define DS_CROW_STORE(r) ds_store_row(yo + (r) * LDY, c##r##0, c##r##1, ncols);

#define DS_CONV_MICRO(MR)                                                                                   \
    static void ds_conv_micro_##MR(const int64_t *geo, const float *restrict xg, const float *restrict bp,  \
                                   float *restrict yo, const float *restrict zeros, int64_t ho, int64_t wo,  \
                                   int64_t ncols) {                                                          \
        GEO_LOCALS;                                                                                         \
        DS_ROWS##MR(DS_CROW_INIT)                                                                            \
        for (int64_t kh = 0; kh < KH; kh++) {                                                               \
            const int64_t ih = ho * SH - PT + kh * DH;                                                      \
            if ((uint64_t)ih >= (uint64_t)H) continue;                                                      \
            const float *xr = xg + ih * W * C;                                                              \
            for (int64_t kw = 0; kw < KW; kw++) {                                                           \
                const int64_t iw0 = wo * SW - PL + kw * DW;                                                 \
                DS_ROWS##MR(DS_CROW_PTR)                                                                     \
                const float *b = bp + (kh * KW + kw) * CG * 32;                                             \
                for (int64_t p = 0; p < CG; p++) {                                                          \
                    const ds_v16 b0 = ds_ld16(b + p * 32), b1 = ds_ld16(b + p * 32 + 16);                   \
                    DS_ROWS##MR(DS_CROW_FMA)                                                                 \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
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
                  const float *restrict zeros, int64_t n, int64_t ho, int64_t wo0, int64_t wo1, int64_t g,
                  int64_t q) {
    const int64_t H = geo[DS_CONV_H], W = geo[DS_CONV_W], C = geo[DS_CONV_C], OH = geo[DS_CONV_OH];
    const int64_t OW = geo[DS_CONV_OW], CG = geo[DS_CONV_CG], LDY = geo[DS_CONV_LDY], OCG = geo[DS_CONV_OCG];
    const int64_t K = geo[DS_CONV_KH] * geo[DS_CONV_KW] * CG, panels = (OCG + 31) / 32;
    const int64_t ncols = OCG - q * 32 < 32 ? OCG - q * 32 : 32;
    const float *xg = x + n * H * W * C + g * CG;
    const float *panel = bp + (g * panels + q) * K * 32;
    for (int64_t wo = wo0; wo < wo1; wo += DS_MR) {
        const int64_t mr = wo1 - wo < DS_MR ? wo1 - wo : DS_MR;
        float *yo = y + ((n * OH + ho) * OW + wo) * LDY + g * OCG + q * 32;
        switch (mr) {
        case 1: ds_conv_micro_1(geo, xg, panel, yo, zeros, ho, wo, ncols); break;
        case 2: ds_conv_micro_2(geo, xg, panel, yo, zeros, ho, wo, ncols); break;
        case 3: ds_conv_micro_3(geo, xg, panel, yo, zeros, ho, wo, ncols); break;
#if DS_MR > 4
        case 4: ds_conv_micro_4(geo, xg, panel, yo, zeros, ho, wo, ncols); break;
        case 5: ds_conv_micro_5(geo, xg, panel, yo, zeros, ho, wo, ncols); break;
        case 6: ds_conv_micro_6(geo, xg, panel, yo, zeros, ho, wo, ncols); break;
        case 7: ds_conv_micro_7(geo, xg, panel, yo, zeros, ho, wo, ncols); break;
        case 8: ds_conv_micro_8(geo, xg, panel, yo, zeros, ho, wo, ncols); break;
        case 9: ds_conv_micro_9(geo, xg, panel, yo, zeros, ho, wo, ncols); break;
        case 10: ds_conv_micro_10(geo, xg, panel, yo, zeros, ho, wo, ncols); break;
        case 11: ds_conv_micro_11(geo, xg, panel, yo, zeros, ho, wo, ncols); break;
        default: ds_conv_micro_12(geo, xg, panel, yo, zeros, ho, wo, ncols); break;
#else
        default: ds_conv_micro_4(geo, xg, panel, yo, zeros, ho, wo, ncols); break;
#endif
        }
    }
}
