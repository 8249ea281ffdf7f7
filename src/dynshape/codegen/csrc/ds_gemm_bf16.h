/* The bf16 products' entry points, for generated kernels (csrc/ds_gemm_bf16.c; loaded before them, symbols
   global). `ep` is the kernel call's `ds_bf16_epoch()`, taken once per call before its parallel loop. */
#ifndef DS_GEMM_BF16_H
#define DS_GEMM_BF16_H
#include <stdint.h>

int ds_bf16_native(void);
int ds_bf16_use_amx(int want);
int64_t ds_bf16_epoch(void);
void ds_round_bf16(const float *restrict x, int64_t n, uint16_t *restrict out);
void ds_gemm_block_bf16(const float *restrict a, int64_t lda, const void *bp, float *restrict c, int64_t ldc,
                        int64_t i0, int64_t i1, int64_t q, int64_t n, int64_t k, int64_t ep);
void ds_gemm_panel_bf16(const float *restrict a, int64_t lda, const void *panel, float *restrict c, int64_t ldc,
                        int64_t i0, int64_t i1, int64_t ncols, int64_t k, int64_t ep);
void ds_gemm_block_bf16e(const float *restrict a, int64_t lda, const void *bp, float *restrict c, int64_t ldc,
                         int64_t i0, int64_t i1, int64_t q, int64_t n, int64_t k, int64_t ep);
void ds_gemm_panel_bf16e(const float *restrict a, int64_t lda, const void *panel, float *restrict c, int64_t ldc,
                         int64_t i0, int64_t i1, int64_t ncols, int64_t k, int64_t ep);
void ds_pack_panels_bf16(const float *restrict b, int64_t ldb, int64_t k, int64_t n, void *out);
void ds_pack_panels_t_bf16(const float *restrict a, int64_t lda, int64_t k, int64_t n, void *out);
void ds_pack_panels_bf16_ref(const float *restrict b, int64_t ldb, int64_t k, int64_t n, void *out);
void ds_pack_panels_t_bf16_ref(const float *restrict a, int64_t lda, int64_t k, int64_t n, void *out);
void ds_pack_panels_bf16e(const float *restrict b, int64_t ldb, int64_t k, int64_t n, void *out);
void ds_pack_panels_t_bf16e(const float *restrict a, int64_t lda, int64_t k, int64_t n, void *out);
void ds_conv_tile2_bf16(const int64_t *geo, const float *restrict x, const void *bp, float *restrict y,
                        const float *restrict zeros, int64_t p0, int64_t p1, int64_t g, int64_t q,
                        const float *restrict bias, const float *restrict res, int64_t ep);
void ds_conv_tile2_bf16e(const int64_t *geo, const float *restrict x, const void *bp, float *restrict y,
                         const float *restrict zeros, int64_t p0, int64_t p1, int64_t g, int64_t q,
                         const float *restrict bias, const float *restrict res, int64_t ep);
/* The same tiles with a prologue: each input value v becomes max(v * scale[c] + shift[c], 0) (scale, shift NULL
   where absent: 1, 0; relu 0: no max) before it is rounded, c its input channel; 1x1, ungrouped convs of at
   least 32 input channels (rules.match_conv_prologue); aborts on another. */
void ds_conv_tile2_bf16_pre(const int64_t *geo, const float *restrict x, const void *bp, float *restrict y,
                            const float *restrict zeros, int64_t p0, int64_t p1, int64_t g, int64_t q,
                            const float *restrict bias, const float *restrict res, int64_t ep,
                            const float *restrict scale, const float *restrict shift, int64_t relu);
void ds_conv_tile2_bf16e_pre(const int64_t *geo, const float *restrict x, const void *bp, float *restrict y,
                             const float *restrict zeros, int64_t p0, int64_t p1, int64_t g, int64_t q,
                             const float *restrict bias, const float *restrict res, int64_t ep,
                             const float *restrict scale, const float *restrict shift, int64_t relu);
int64_t ds_conv_tile2_bf16_addr(void);
int64_t ds_conv_tile2_bf16e_addr(void);
#endif
