/* Direct convolutions on AMX tiles (TDPBF16PS), bf16 operands, float32 sums: the contract in ds_conv_amx.h.

   Why: the implicit GEMM (ds_gemm_bf16.c's ds_conv_tile2_bf16) gathers each block's patches into scratch, K =
   KH * KW * C values a pixel rounded to bf16 per block and panel pair, and its tiles then read those rows from L2
   (a 128-pixel block of a 3x3 conv on 128 channels: 295 KB of patches). On AMX a tile product takes 16 cycles and
   reads 2 KB, so those reads, not the products, bound the conv (perf: a third of its samples wait on tile loads),
   and the gather itself was 14-16% of ResNet-50's bf16 time. Here the input is rounded once per call into a
   zero-padded copy (Hp = OH + KH - 1 rows of Wp = OW + KW - 1 pixels an image, C bf16 a pixel), and output pixel
   (oh, ow) is virtual row v = oh * Wp + ow, whose tap (kh, kw) reads padded pixel v + kh * Wp + kw: 16 virtual
   rows at 32 values of a window row (KW * C contiguous values from padded pixel v + kh * Wp) are one A tile, a
   plain strided load (a pixel apart), and the rows a pass reads
   over all taps (32 + (KH - 1) * Wp + KW - 1 pixels) stay in L1 across them. The price: the Wp - OW columns past a
   row's end (and, between images, the KH - 1 rows past an image's end) are computed and dropped (2 of 30
   columns on a 28-wide map, 2 of 16 on 14). The weights are the implicit GEMM's packed panels (k = (kh * KW + kw)
   * C + c in pairs): a chunk of 32 k is 32 values of a window row (one tap's 32 channels where C is a multiple of
   32; two taps of 16 channels on a UNet's 16-channel convs, whose 48-value rows end in a half chunk). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds_amx.h"
#include "ds_bf16_round.h"
#include "ds_conv.h"
#include "ds_conv_amx.h"
#include "ds_conv_common.h"
#include "ds_simd.h"

#if DS_AMX && defined(__AMX_BF16__) && DS_BF16_ROUND
#define DS_CONV_AMX 1
#include <immintrin.h>
#else
#define DS_CONV_AMX 0
#endif

/* zero pixels after the last image: a pass's 32 rows past the last virtual row, plus its last tap's offset */
#define DS_PAD_SLACK 48

/* The padded map of one image: OH + KH - 1 rows (*hp) of OW + KW - 1 pixels (*wp), stride 1. */
static inline void ds_padded_map(const int64_t *geo, int64_t *hp, int64_t *wp) {
    *hp = geo[DS_CONV_OH] + geo[DS_CONV_KH] - 1;
    *wp = geo[DS_CONV_OW] + geo[DS_CONV_KW] - 1;
}

int64_t ds_conv_amx_padded(const int64_t *geo, int64_t n) {
    int64_t hp, wp;
    ds_padded_map(geo, &hp, &wp);
    return (n * hp * wp + wp + DS_PAD_SLACK) * geo[DS_CONV_C];
}

int64_t ds_conv_amx_rows(const int64_t *geo, int64_t n) {
    int64_t hp, wp;
    ds_padded_map(geo, &hp, &wp);
    return n > 0 ? ((n - 1) * hp + geo[DS_CONV_OH]) * wp : 0;
}

#if DS_CONV_AMX
/* `pixels` pixels of C floats at src as pixels of Cp bf16 at dst, channels C..Cp zero: one run where C == Cp; for
   Cp past 16 (a direct conv's channels padded to 16s) pixel by pixel; else 16 / Cp pixels a vector, spread by an
   expanding load (lanes l with l % Cp < C), two vectors into 32 bf16. */
static void ds_narrow_round(uint16_t *dst, const float *src, int64_t pixels, int64_t C, int64_t Cp) {
    if (C == Cp) {
        ds_round_run(dst, src, pixels * C);
        return;
    }
    if (Cp > 16) {
        for (int64_t p = 0; p < pixels; p++) {
            ds_round_run(dst + p * Cp, src + p * C, C);
            memset(dst + p * Cp + C, 0, (size_t)(Cp - C) * 2);
        }
        return;
    }
    __mmask16 pat = 0;
    for (int l = 0; l < 16; l++)
        if (l % Cp < C) pat |= (__mmask16)(1u << l);
    const int64_t per = 16 / Cp; /* pixels a vector */
    for (int64_t p = 0; p < pixels; p += 2 * per) {
        const int64_t n = (pixels - p) * Cp; /* values left to write */
        __mmask16 m0, m1;
        ds_bf16_masks(n, &m0, &m1);
        const __m512 lo = _mm512_maskz_expandloadu_ps(pat & m0, src + p * C);
        const __m512 hi = n > 16 ? _mm512_maskz_expandloadu_ps(pat & m1, src + (p + per) * C) : _mm512_setzero_ps();
        ds_put_bf16x32(dst + p * Cp, (__m512i)_mm512_cvtne2ps_pbh(hi, lo), n);
    }
}

/* `pixels` pixels of C bf16 values at src (a bf16-stored input: geo[DS_CONV_XBF]) as pixels of Cp at dst, channels
   C..Cp zero: copied, never rounded again. */
static void ds_narrow_copy(uint16_t *dst, const uint16_t *src, int64_t pixels, int64_t C, int64_t Cp) {
    if (C == Cp) {
        memcpy(dst, src, (size_t)(pixels * C) * 2);
        return;
    }
    for (int64_t p = 0; p < pixels; p++) { /* (inline: a memcpy call a pixel costs more than its few values) */
        ds_copy_bf16(dst + p * Cp, src + p * C, C);
        memset(dst + p * Cp + C, 0, (size_t)(Cp - C) * 2);
    }
}

/* Row r of a padded copy (rows flat over the images, hp an image; wx pixels of cp channels): zeros where the row
   or its columns fall in the pads, else the input's pixels rounded (C channels each, zeros after them to cp), or
   copied where the input is stored as bf16 (geo[DS_CONV_XBF]). */
static void ds_pad_row(const int64_t *geo, int64_t C, const float *restrict x, uint16_t *restrict row, int64_t r,
                       int64_t hp, int64_t wx, int64_t cp) {
    const int64_t H = geo[DS_CONV_H], W = geo[DS_CONV_W], PL = geo[DS_CONV_PL];
    const int64_t img = r / hp, ih = r % hp - geo[DS_CONV_PT];
    if (ih < 0 || ih >= H) {
        memset(row, 0, (size_t)(wx * cp) * 2);
        return;
    }
    const int64_t left = PL < wx ? PL : wx, right = PL + W < wx ? PL + W : wx;
    const int64_t at = ((img * H + ih) * W + left - PL) * C; /* the first pixel's first value, in values */
    memset(row, 0, (size_t)(left * cp) * 2);
    if (right > left && geo[DS_CONV_XBF])
        ds_narrow_copy(row + left * cp, (const uint16_t *)x + at, right - left, C, cp);
    else if (right > left)
        ds_narrow_round(row + left * cp, x + at, right - left, C, cp);
    memset(row + right * cp, 0, (size_t)((wx - right) * cp) * 2);
}
#endif

void ds_conv_amx_pad(const int64_t *geo, int64_t n, const float *restrict x, uint16_t *restrict xp, int64_t r0,
                     int64_t r1) {
    ds_conv_amx_pad_from(geo, n, x, xp, r0, r1, geo[DS_CONV_C]);
}

void ds_conv_amx_pad_from(const int64_t *geo, int64_t n, const float *restrict x, uint16_t *restrict xp, int64_t r0,
                          int64_t r1, int64_t cx) {
#if DS_CONV_AMX
    const int64_t C = geo[DS_CONV_C];
    int64_t hp, wp;
    ds_padded_map(geo, &hp, &wp);
    for (int64_t r = r0; r < r1; r++) ds_pad_row(geo, cx, x, xp + r * wp * C, r, hp, wp, C);
    if (r1 == n * hp) /* the slack after the last image: what the last passes read past it */
        memset(xp + n * hp * wp * C, 0, (size_t)((wp + DS_PAD_SLACK) * C) * 2);
#else
    (void)geo; (void)n; (void)x; (void)xp; (void)r0; (void)r1; (void)cx;
    abort(); /* generated kernels call this only where ds_bf16_use_amx(-1) */
#endif
}

#if DS_CONV_AMX
/* One pass over the window: `rows` (16 or 32) virtual rows from `a` (the padded copy at the first row's first
   tap) times a panel's first `cols` (16 or 32) columns, the sums in tiles 0..3. A window row is `run` contiguous
   values (`whole` chunks of 32, then the half chunk, if any, read as the row's last 32 values times halves[kh]);
   window rows are `ldr` bytes apart in the copy. Always inlined: constant `rows` and `cols`. */
static inline __attribute__((always_inline)) void ds_conv_amx_pass(const uint8_t *a, int64_t sa, int64_t ldr,
                                                                    const uint8_t *panel, int64_t KH, int64_t run,
                                                                    int64_t whole, int64_t half,
                                                                    const uint8_t (*halves)[16 * 128], const int rows,
                                                                    const int cols) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t kh = 0; kh < KH; kh++) {
        const uint8_t *ar = a + kh * ldr, *b = panel + kh * run / 2 * 128;
        for (int64_t c = 0; c < whole; c++, b += 16 * 128)
            ds_amx_chunk(ar + c * 64, sa, b, rows, cols, DS_AMX_BF16);
        if (half) ds_amx_chunk(ar + (run - 32) * 2, sa, halves[kh], rows, cols, DS_AMX_BF16);
    }
}
#endif

/* Of `n` virtual rows from v, how many to compute: n, or where the rows from some point on all lie past their image's
   last output row (an image is `per` virtual rows, its first `out` those of output rows) and never reach the next
   image, the rows before that point. */
static inline int64_t ds_live_rows(int64_t v, int64_t n, int64_t per, int64_t out) {
    const int64_t at = v % per; /* v's place in its image */
    if (at >= out) return at + n <= per ? 0 : n; /* dead from v on, unless the rows reach the next image */
    return at + n <= per && at + n > out ? out - at : n; /* live up to the image's last output row */
}

#if DS_CONV_AMX
/* Rows 0..rows of tmp (32 floats each: virtual rows v.., a panel's columns col0..) to the output pixels they stand
   for, finished: bias, residual, activation. */
static void ds_conv_amx_store(const int64_t *geo, float *y, int64_t v, int64_t rows, int64_t v1, int64_t col0,
                              int64_t ncols, const float *bias, const float *res, const float *tmp) {
    const int64_t OH = geo[DS_CONV_OH], OW = geo[DS_CONV_OW], LDY = geo[DS_CONV_LDY];
    int64_t hp, wp;
    ds_padded_map(geo, &hp, &wp);
    const ds_finish fin = ds_finish_at(geo, bias, res, col0, col0); /* (rows: output pixels, OC apart) */
    const ds_fast_finish fast = ds_fast_finish_of(&fin, ncols);
    int64_t img = v / (hp * wp), oh = v % (hp * wp) / wp, ow = v % wp;
    if (v + rows > v1) rows = v1 - v;
    for (int64_t r = 0; r < rows; r++) {
        if (oh < OH && ow < OW) {
            const int64_t p = (img * OH + oh) * OW + ow;
            ds_finish_row_fast(ds_fin_row(y, p * LDY + col0, 1, &fin), tmp + r * 32, ncols, &fin, &fast, p);
        }
        if (++ow == wp) {
            ow = 0;
            if (++oh == hp) { oh = 0; img++; }
        }
    }
}
#endif

/* ---- Narrow windows: a stem's conv (3 -> 64 7x7 stride 2), any stride, at most 8 input channels ----
   Why: the implicit GEMM gathers each output pixel's KH x KW x C patch (147 values on a 7x7 RGB stem) and rounds it
   per block, which cost 3x OpenVINO's time on ResNet-50's first conv (857 against 294 us, 1 thread). Here the input
   is rounded once into a zero-padded copy whose pixels hold Cp channels (C rounded up to 2, 4 or 8, the rest zero),
   so a window row (KW x Cp <= 32 values) is contiguous: for 16 output pixels of one row the tap row kh is one A
   tile of 16 rows (SW pixels apart) of exactly KW x Cp values, read where it lies. Nothing outside a window enters
   a sum (the tiles are configured to the window row's width, not read as a zero-weighted 32), so an infinity
   reaches only the outputs whose windows hold it. Virtual rows: v = (img * OH + oh) * OWt + ow, OWt = OW rounded up
   to 16 (a 16-row tile never spans two output rows); the padded copy's rows are (OWt - 1) * SW + KW pixels wide,
   so the columns past OW read zeros and are dropped. The weights: pack "conv_narrow_bf16", per panel of 32 outputs
   and tap row, the window row's pairs as 16 rows of 128 bytes (two B tiles side by side). */

int64_t ds_conv_amx_narrow_cp(int64_t c) { return DS_NARROW_CP(c); }

static inline void ds_narrow_map(const int64_t *geo, int64_t *hp, int64_t *wx, int64_t *owt) {
    *owt = (geo[DS_CONV_OW] + 15) / 16 * 16;
    *hp = (geo[DS_CONV_OH] - 1) * geo[DS_CONV_SH] + geo[DS_CONV_KH];
    *wx = (*owt - 1) * geo[DS_CONV_SW] + geo[DS_CONV_KW];
}

int64_t ds_conv_amx_narrow_padded(const int64_t *geo, int64_t n) {
    int64_t hp, wx, owt;
    ds_narrow_map(geo, &hp, &wx, &owt);
    return n * hp * wx * ds_conv_amx_narrow_cp(geo[DS_CONV_C]); /* (no slack: the tiles read inside the rows) */
}

int64_t ds_conv_amx_narrow_rows(const int64_t *geo, int64_t n) {
    int64_t hp, wx, owt;
    ds_narrow_map(geo, &hp, &wx, &owt);
    return geo[DS_CONV_OH] > 0 && geo[DS_CONV_OW] > 0 ? n * geo[DS_CONV_OH] * owt : 0;
}


void ds_conv_amx_narrow_pad(const int64_t *geo, int64_t n, const float *restrict x, uint16_t *restrict xp,
                            int64_t r0, int64_t r1) {
#if DS_CONV_AMX
    const int64_t Cp = ds_conv_amx_narrow_cp(geo[DS_CONV_C]);
    int64_t hp, wx, owt;
    ds_narrow_map(geo, &hp, &wx, &owt);
    (void)n; /* (the rows are flat over the images: no slack after the last, whose tiles read inside its rows) */
    for (int64_t r = r0; r < r1; r++) ds_pad_row(geo, geo[DS_CONV_C], x, xp + r * wx * Cp, r, hp, wx, Cp);
#else
    (void)geo; (void)n; (void)x; (void)xp; (void)r0; (void)r1;
    abort(); /* generated kernels call this only where ds_bf16_use_amx(-1) */
#endif
}

#if DS_CONV_AMX
/* Tiles 0..3 the sums (16 x 64 bytes), 4..5 A (16 rows of a window row's 2 * run bytes), 6..7 B (run / 2 pair
   rows of 64 bytes): loaded where the thread holds another configuration (the next library call that wants the
   common one loads it back: ds_amx_config). */
static void ds_narrow_config(int64_t run) {
    _Alignas(64) ds_tilecfg cfg, want;
    memset(&want, 0, sizeof want);
    want.palette = 1;
    for (int t = 0; t < 8; t++) {
        want.rows[t] = (uint8_t)(t >= 6 ? run / 2 : 16);
        want.colsb[t] = (uint16_t)(t == 4 || t == 5 ? 2 * run : 64);
    }
    ds_sttilecfg(&cfg);
    int same = cfg.palette == 1;
    for (int t = 0; t < 8 && same; t++) same = cfg.rows[t] == want.rows[t] && cfg.colsb[t] == want.colsb[t];
    if (!same) ds_ldtilecfg(&want);
}

/* The window's KH tap rows for 16 (a1 null) or 32 virtual rows (a0's 16, a1's 16) times a panel's first `cols`
   (16 or 32) columns, into tiles 0..3; tap rows `ldr` bytes apart, a tile's rows `sa` apart. */
static inline __attribute__((always_inline)) void ds_narrow_pass(const uint8_t *a0, const uint8_t *a1, int64_t sa,
                                                                  int64_t ldr, const uint8_t *b, int64_t KH,
                                                                  const int two, const int cols) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t kh = 0; kh < KH; kh++, b += 16 * 128) {
        _tile_loadd(4, a0 + kh * ldr, sa);
        _tile_loadd(6, b, 128);
        if (cols == 32) _tile_loadd(7, b + 64, 128);
        _tile_dpbf16ps(0, 4, 6);
        if (cols == 32) _tile_dpbf16ps(1, 4, 7);
        if (two) {
            _tile_loadd(5, a1 + kh * ldr, sa);
            _tile_dpbf16ps(2, 5, 6);
            if (cols == 32) _tile_dpbf16ps(3, 5, 7);
        }
    }
}
#endif

void ds_conv_amx_narrow_tile2(const int64_t *geo, const uint16_t *restrict xp, const void *bn, float *restrict y,
                              int64_t v0, int64_t v1, int64_t q, const float *restrict bias,
                              const float *restrict res) {
#if DS_CONV_AMX
    const int64_t C = geo[DS_CONV_C], OC = geo[DS_CONV_OC], KH = geo[DS_CONV_KH], KW = geo[DS_CONV_KW];
    const int64_t OH = geo[DS_CONV_OH], OW = geo[DS_CONV_OW], SH = geo[DS_CONV_SH], SW = geo[DS_CONV_SW];
    const int64_t LDY = geo[DS_CONV_LDY], Cp = ds_conv_amx_narrow_cp(C), run = KW * Cp;
    const int64_t panels = (OC + 31) / 32;
    if (C > Cp || run > DS_NARROW_ROW || v0 % 16 || v1 % 16) abort(); /* narrow_fits, the tiles' bounds: never */
    if (geo[DS_CONV_XBF] || geo[DS_CONV_YBF] || geo[DS_CONV_RBF]) abort(); /* conv_storage admits no narrow conv */
    int64_t hp, wx, owt;
    ds_narrow_map(geo, &hp, &wx, &owt);
    const int64_t sa = SW * Cp * 2, ldr = wx * Cp * 2; /* bytes between a tile's rows, between tap rows */
    _Alignas(64) float tmp[32 * 32];
    ds_narrow_config(run);
    for (int64_t qq = q; qq < q + 2 && qq < panels; qq++) {
        const uint8_t *panel = (const uint8_t *)bn + qq * KH * 16 * 128;
        const int64_t col0 = qq * 32, ncols = OC - col0 < 32 ? OC - col0 : 32;
        const ds_finish fin = ds_finish_at(geo, bias, res, col0, col0); /* (float32: no flags, checked above) */
        const ds_fast_finish fast = ds_fast_finish_of(&fin, ncols);
        const int narrow = ncols <= 16;
        for (int64_t v = v0; v < v1; v += 32) {
            const int two = v1 - v > 16;
            const uint8_t *a[2];
            int64_t first[2]; /* each 16-row half's first output pixel */
            for (int h = 0; h < 1 + two; h++) {
                const int64_t u = v + 16 * h, ow = u % owt, r = u / owt, img = r / OH, oh = r % OH;
                a[h] = (const uint8_t *)(xp + ((img * hp + oh * SH) * wx + ow * SW) * Cp);
                first[h] = r * OW + ow;
            }
            if (two && narrow) ds_narrow_pass(a[0], a[1], sa, ldr, panel, KH, 1, 16);
            else if (two) ds_narrow_pass(a[0], a[1], sa, ldr, panel, KH, 1, 32);
            else if (narrow) ds_narrow_pass(a[0], 0, sa, ldr, panel, KH, 0, 16);
            else ds_narrow_pass(a[0], 0, sa, ldr, panel, KH, 0, 32);
            ds_amx_store_sums(tmp, two ? 32 : 16, narrow ? 16 : 32);
            for (int h = 0; h < 1 + two; h++) {
                const int64_t ow0 = (v + 16 * h) % owt, m = OW - ow0 < 16 ? OW - ow0 : 16;
                for (int64_t i = 0; i < m; i++) {
                    const int64_t p = first[h] + i;
                    ds_finish_row_fast(y + p * LDY + col0, tmp + (16 * h + i) * 32, ncols, &fin, &fast, p);
                }
            }
        }
    }
#else
    (void)geo; (void)xp; (void)bn; (void)y; (void)v0; (void)v1; (void)q; (void)bias; (void)res;
    abort(); /* generated kernels call this only where ds_bf16_use_amx(-1) */
#endif
}

void ds_conv_amx_tile2(const int64_t *geo, const uint16_t *restrict xp, const void *bp, float *restrict y,
                       int64_t v0, int64_t v1, int64_t q, const float *restrict bias, const float *restrict res) {
#if DS_CONV_AMX
    const int64_t C = geo[DS_CONV_C], OC = geo[DS_CONV_OC], KH = geo[DS_CONV_KH], KW = geo[DS_CONV_KW];
    /* a window row: KW * C contiguous values, `whole` chunks of 32 and (C an odd multiple of 16) a half */
    const int64_t run = KW * C, whole = run / 32, half = run % 32 != 0;
    const int64_t k2 = KH * run / 2, panels = (OC + 31) / 32;
    if (run % 16 || run < 32 || (half && KH > DS_CONV_AMX_MAX_KH)) abort(); /* conv_amx.fits admits none */
    int64_t hp, wp;
    ds_padded_map(geo, &hp, &wp);
    const int64_t sa = C * 2; /* a tile row (a pixel) apart, in bytes */
    _Alignas(64) float tmp[32 * 32];
    /* a window row's half chunk: its last 16 values read as the last 32 of the row (the 16 before them are the
       row's own, so nothing outside the window enters the sums), times B rows zero for those 16 then the half's */
    _Alignas(64) uint8_t halves[half ? KH : 1][16 * 128];
    ds_amx_config();
    for (int64_t qq = q; qq < q + 2 && qq < panels; qq++) {
        const uint8_t *panel = (const uint8_t *)bp + qq * k2 * 128;
        const int64_t col0 = qq * 32, ncols = OC - col0 < 32 ? OC - col0 : 32;
        for (int64_t kh = 0; kh < KH && half; kh++) {
            memset(halves[kh], 0, 8 * 128);
            memcpy(halves[kh] + 8 * 128, panel + (kh * run / 2 + whole * 16) * 128, 8 * 128);
        }
        const uint8_t(*hv)[16 * 128] = (const uint8_t(*)[16 * 128])halves;
        const int narrow = ncols <= 16; /* one B tile of columns (a UNet's 16 outputs: half the products) */
        for (int64_t v = v0; v < v1; v += 32) {
            /* rows past their image's last output row (the KH - 1 padded rows between images: 2 of every 8 rows
               of a 6-row map, a text recogniser's) are never stored: a pass, or its second half, made only of
               them is not computed */
            const int64_t live = ds_live_rows(v, v1 - v < 32 ? v1 - v : 32, hp * wp, geo[DS_CONV_OH] * wp);
            if (live == 0) continue;
            const int two = live > 16;
            const uint8_t *a = (const uint8_t *)(xp + v * C);
            if (two && narrow) ds_conv_amx_pass(a, sa, wp * sa, panel, KH, run, whole, half, hv, 32, 16);
            else if (two) ds_conv_amx_pass(a, sa, wp * sa, panel, KH, run, whole, half, hv, 32, 32);
            else if (narrow) ds_conv_amx_pass(a, sa, wp * sa, panel, KH, run, whole, half, hv, 16, 16);
            else ds_conv_amx_pass(a, sa, wp * sa, panel, KH, run, whole, half, hv, 16, 32);
            ds_amx_store_sums(tmp, two ? 32 : 16, narrow ? 16 : 32);
            ds_conv_amx_store(geo, y, v, two ? 32 : 16, v1, col0, ncols, bias, res, tmp);
        }
    }
    /* (the tiles stay configured for the thread's next call: ds_amx.h's ds_amx_config) */
#else
    (void)geo; (void)xp; (void)bp; (void)y; (void)v0; (void)v1; (void)q; (void)bias; (void)res;
    abort(); /* generated kernels call this only where ds_bf16_use_amx(-1) */
#endif
}
