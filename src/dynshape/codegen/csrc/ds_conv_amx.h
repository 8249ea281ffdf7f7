/* Direct convolutions on AMX tiles in bf16 (csrc/ds_conv_amx.c), for generated kernels: a stride-1, undilated,
   ungrouped convolution whose input channels are (or are padded to) a multiple of 16 (window rows of KW * C >= 32
   values, at most DS_CONV_AMX_MAX_KH of them where KW * C is an odd multiple of 16), its input converted once per
   call into a zero-padded bf16 copy, each tap's A tile read from that copy where it lies (no patches gathered). */
#ifndef DS_CONV_AMX_H
#define DS_CONV_AMX_H
#include <stdint.h>

/* The uint16 values of the padded copy of N images (geometry geo: ds_conv.h's DS_CONV_* order). */
int64_t ds_conv_amx_padded(const int64_t *geo, int64_t n);
/* Padded rows r0..r1 (flat over images, OH + KH - 1 rows an image) of x (channels last) into xp, rounded to bf16;
   the zeros after the last image too when r1 is the last row. */
void ds_conv_amx_pad(const int64_t *geo, int64_t n, const float *restrict x, uint16_t *restrict xp, int64_t r0,
                     int64_t r1);
/* The same copy of an input of cx channels a pixel into pixels of geo's C (cx < C: channels cx..C zero; a conv's
   channels padded to a multiple of 16, its weights packed "conv_bf16_cpad" with zero rows for them). */
void ds_conv_amx_pad_from(const int64_t *geo, int64_t n, const float *restrict x, uint16_t *restrict xp, int64_t r0,
                          int64_t r1, int64_t cx);
/* The virtual rows of N images: v = (n * (OH + KH - 1) + oh) * (OW + KW - 1) + ow, the last image's last row's
   end; rows whose ow >= OW or oh >= OH are computed and not stored. */
int64_t ds_conv_amx_rows(const int64_t *geo, int64_t n);
/* Virtual rows v0..v1 times panels q and q + 1 of the packed weights bp (pack_conv_bf16's panels), stored with
   bias, residual and activation as ds_conv_tile2's: only on AMX (ds_bf16_use_amx(-1)); aborts elsewhere. */
void ds_conv_amx_tile2(const int64_t *geo, const uint16_t *restrict xp, const void *bp, float *restrict y,
                       int64_t v0, int64_t v1, int64_t q, const float *restrict bias, const float *restrict res);
/* Narrow windows (any stride, undilated, ungrouped, C <= 8 with KW * Cp <= 32, Cp = ds_conv_amx_narrow_cp(C)): the
   padded copy's uint16 values for N images, its rows (flat over images, (OH - 1) * SH + KH an image) r0..r1 filled
   from x, the virtual rows (N * OH * OW rounded up to 16 a row), and virtual rows v0..v1 (multiples of 16) times
   panels q and q + 1 of the "conv_narrow_bf16" weights bn, finished as ds_conv_amx_tile2's: only on AMX. */
int64_t ds_conv_amx_narrow_cp(int64_t c);
int64_t ds_conv_amx_narrow_padded(const int64_t *geo, int64_t n);
void ds_conv_amx_narrow_pad(const int64_t *geo, int64_t n, const float *restrict x, uint16_t *restrict xp,
                            int64_t r0, int64_t r1);
int64_t ds_conv_amx_narrow_rows(const int64_t *geo, int64_t n);
void ds_conv_amx_narrow_tile2(const int64_t *geo, const uint16_t *restrict xp, const void *bn, float *restrict y,
                              int64_t v0, int64_t v1, int64_t q, const float *restrict bias,
                              const float *restrict res);
#endif
