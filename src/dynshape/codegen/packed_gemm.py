"""Our own sgemm for products with a constant right operand (weights), with the epilogue fused in.

Why our own: the weights are known at compile time, so they are packed once into 32-column panels
(`pack_b`), and a register-blocked micro-kernel streams them without the per-call packing a BLAS does. It
matched MKL and beat OpenBLAS here (bench/gemm_bench.py --packed: 130-157 GFLOP/s on one AVX-512 core at
M = 7..4096), so the fast path no longer depends on which BLAS is installed.  And because the product is
ours, the elementwise group that consumes it (bias, ReLU, GELU, residual add) runs on each block of rows
while it is still in cache, instead of another pass over memory.

`SOURCE` is plain C with GCC vector extensions (no intrinsics): 16-float vectors become one zmm register
with AVX-512, two ymm with AVX2, four xmm elsewhere.  It is one shared library (`library()`, loaded with its
symbols global, compiled once per machine); a fused kernel includes `DECLS` and calls
    ds_gemm_tile(a, lda, bp, c, ldc, i0, i1, q, n, k)
for the tile (rows i0..i1, panel q) of C = A @ B, then applies its epilogue to that tile while it is in cache.
"""

from __future__ import annotations

import weakref

import numpy as np

from dynshape.codegen.row_kernels import LAYERNORM_ROW

NR = 32  # columns per packed panel: two 16-float vectors
ROW_BLOCK = 60  # rows per block (a multiple of every micro-tile height): the block stays in cache for the epilogue
ROW_TAIL = 12  # a last block of up to this many rows joins the one before it
MR_WIDE = 12  # rows per micro-tile with 32 vector registers (AVX-512): 24 accumulators; 12 measured 6-10% over 8
MR_NARROW = 4  # with 16 registers
PAR_MIN_FLOPS = 1 << 20  # multiply-adds below which a product runs on one thread


def pack_b(b: np.ndarray, trans: bool = False) -> np.ndarray:
    """B (k, n) (or (n, k) with trans) as panels [ceil(n/32), k, 32] of float32, zero-padded on the right."""
    b = np.asarray(b, dtype=np.float32)
    if trans:
        b = b.T
    k, n = b.shape
    panels = -(-n // NR)
    padded = np.zeros((k, panels * NR), np.float32)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, panels, NR).transpose(1, 0, 2))


_packed: dict[tuple[int, bool], tuple] = {}  # (id(weight), trans) -> (weakref to the weight, its packed form)


def packed(w: np.ndarray, trans: bool = False) -> np.ndarray:
    """pack_b(w, trans), computed once per weight array while that array lives (shared by every executable
    compiled from the same graph)."""
    key = (id(w), trans)
    hit = _packed.get(key)
    if hit is not None and hit[0]() is w:
        return hit[1]
    out = pack_b(w, trans)
    try:
        ref = weakref.ref(w, lambda _, key=key: _packed.pop(key, None))
    except TypeError:  # not weak-referenceable: no sharing
        return out
    _packed[key] = (ref, out)
    return out


def _micro(mr: int) -> str:
    """mr rows x 32 columns of C in 2*mr vector registers; the 32-wide rows of the B panel are ps floats apart
    (32 when packed, the matrix's row stride when read in place)."""
    split = mr == 1  # one row: two independent accumulator pairs hide the FMA latency
    lines = [f"static void ds_micro_{mr}(const float *restrict a, int64_t lda, const float *restrict bp, "
             "int64_t ps, int64_t k, float *restrict c, int64_t ldc, int64_t ncols) {"]
    lines += [f"    ds_v16 c{r}0 = {{0}}, c{r}1 = {{0}};" for r in range(mr)]
    lines += [f"    const float *a{r} = a + {r} * lda;" for r in range(mr)]
    p0 = "0"
    if split:
        lines.append("    ds_v16 e0 = {0}, e1 = {0};")
        lines.append("    int64_t p = 0;")
        lines.append("    for (; p + 1 < k; p += 2) {")
        lines.append("        const float *q = bp + p * ps, *q1 = q + ps;")
        lines.append("        c00 += a0[p] * ds_ld16(q); c01 += a0[p] * ds_ld16(q + 16);")
        lines.append("        e0 += a0[p + 1] * ds_ld16(q1); e1 += a0[p + 1] * ds_ld16(q1 + 16);")
        lines.append("    }")
        lines.append("    c00 += e0; c01 += e1;")
        p0 = "p"
    lines.append(f"    for (int64_t px = {p0}; px < k; px++) {{")
    lines.append("        const ds_v16 b0 = ds_ld16(bp + px * ps), b1 = ds_ld16(bp + px * ps + 16);")
    lines += [f"        {{ const float x = a{r}[px]; c{r}0 += x * b0; c{r}1 += x * b1; }}" for r in range(mr)]
    lines.append("    }")
    lines += [f"    ds_store_row(c + {r} * ldc, c{r}0, c{r}1, ncols);" for r in range(mr)]
    lines.append("}")
    return "\n".join(lines)


_HEAD = r"""
typedef float ds_v16 __attribute__((vector_size(64)));
typedef float ds_v16u __attribute__((vector_size(64), aligned(4), may_alias));
static inline ds_v16 ds_ld16(const float *p) { return *(const ds_v16u *)p; }
static inline void ds_st16(float *p, ds_v16 v) { *(ds_v16u *)p = v; }
static inline void ds_store_row(float *c, ds_v16 x0, ds_v16 x1, int64_t n) {
    if (n == 32) { ds_st16(c, x0); ds_st16(c + 16, x1); return; }
    float t[32];
    ds_st16(t, x0);
    ds_st16(t + 16, x1);
    for (int64_t j = 0; j < n; j++) c[j] = t[j];
}
"""

_DRIVER = r"""
/* B (k x n, row stride ldb) into panels of 32 columns, zero padded: the layout pack_b makes, at run time. */
void ds_pack_panels(const float *restrict b, int64_t ldb, int64_t k, int64_t n, float *restrict bp) {
    for (int64_t q = 0; q * 32 < n; q++) {
        const int64_t nc = n - q * 32 < 32 ? n - q * 32 : 32;
        float *dst = bp + q * k * 32;
        for (int64_t p = 0; p < k; p++) {
            const float *src = b + p * ldb + q * 32;
            int64_t j = 0;
            for (; j < nc; j++) dst[p * 32 + j] = src[j];
            for (; j < 32; j++) dst[p * 32 + j] = 0.0f;
        }
    }
}

/* The same panels for B = transpose(A), A n x k with row stride lda (attention's K as the model stores it):
   each of a panel's rows is read once, contiguously, and written down one column of the panel (in L1). */
void ds_pack_panels_t(const float *restrict a, int64_t lda, int64_t k, int64_t n, float *restrict bp) {
    for (int64_t q = 0; q * 32 < n; q++) {
        const int64_t nc = n - q * 32 < 32 ? n - q * 32 : 32;
        float *dst = bp + q * k * 32;
        int64_t j = 0;
        for (; j < nc; j++) {
            const float *src = a + (q * 32 + j) * lda;
            for (int64_t p = 0; p < k; p++) dst[p * 32 + j] = src[p];
        }
        for (; j < 32; j++)
            for (int64_t p = 0; p < k; p++) dst[p * 32 + j] = 0.0f;
    }
}

/* Rows i0..i1 of C (row stride ldc) = A (row stride lda) @ one panel of B: ncols <= 32 columns whose rows are
   ps floats apart. Tiles are independent, so a parallel loop over them needs no synchronisation. */
/* The tile (rows i0..i1, panel q) of C = A @ B with B packed by pack_b. */
void ds_gemm_tile(const float *restrict a, int64_t lda, const float *restrict bp, float *restrict c,
                                int64_t ldc, int64_t i0, int64_t i1, int64_t q, int64_t n, int64_t k) {
    ds_gemm_panel(a, lda, bp + q * k * 32, 32, c + q * 32, ldc, i0, i1, n - q * 32 < 32 ? n - q * 32 : 32, k);
}

"""

_LAYERNORM = LAYERNORM_ROW.replace("@STORAGE@", "")

_PLAIN = r"""
/* C = A @ B for B packed by pack_b, tiles in parallel: the product alone, without an epilogue. */
void ds_gemm_packed(const float *restrict a, int64_t lda, const float *restrict bp, float *restrict c,
                           int64_t ldc, int64_t m, int64_t n, int64_t k) {
    const int64_t blocks = (m + DS_ROW_BLOCK - 1) / DS_ROW_BLOCK, panels = (n + 31) / 32;
    #pragma omp parallel for collapse(2) schedule(static) if(m * n * k >= DS_PAR_MIN_FLOPS)
    for (int64_t rb = 0; rb < blocks; rb++)
        for (int64_t q = 0; q < panels; q++) {
            const int64_t r0 = rb * DS_ROW_BLOCK, r1 = r0 + DS_ROW_BLOCK < m ? r0 + DS_ROW_BLOCK : m;
            ds_gemm_tile(a, lda, bp, c, ldc, r0, r1, q, n, k);
        }
}
"""

def _panel_driver() -> str:
    """ds_gemm_panel: micro-tiles of DS_MR rows down the block, a shorter one at the bottom."""
    call = "(ai, lda, panel, ps, k, ci, ldc, ncols); break;"

    def cases(mr_max: int) -> str:
        out = [f"        case {m}: ds_micro_{m}{call}" for m in range(1, mr_max)]
        return "\n".join(out + [f"        default: ds_micro_{mr_max}{call}"])
    return f"""
/* Rows i0..i1 of C (row stride ldc) = A (row stride lda) @ one panel of B: ncols <= 32 columns whose rows are
   ps floats apart. Tiles are independent, so a parallel loop over them needs no synchronisation. */
void ds_gemm_panel(const float *restrict a, int64_t lda, const float *restrict panel, int64_t ps,
                   float *restrict c, int64_t ldc, int64_t i0, int64_t i1, int64_t ncols, int64_t k) {{
    for (int64_t i = i0; i < i1; i += DS_MR) {{
        const int64_t mr = i1 - i < DS_MR ? i1 - i : DS_MR;
        const float *ai = a + i * lda;
        float *ci = c + i * ldc;
        switch (mr) {{
#if DS_MR > {MR_NARROW}
{cases(MR_WIDE)}
#else
{cases(MR_NARROW)}
#endif
        }}
    }}
}}
"""


SOURCE = (_HEAD + f"#ifdef __AVX512F__\n#define DS_MR {MR_WIDE}\n#else\n#define DS_MR {MR_NARROW}\n#endif\n"
          + "\n".join(_micro(m) for m in range(1, MR_NARROW + 1)) + f"\n#if DS_MR > {MR_NARROW}\n"
          + "\n".join(_micro(m) for m in range(MR_NARROW + 1, MR_WIDE + 1)) + "\n#endif\n" + _panel_driver()
          + _DRIVER
          + f"#define DS_ROW_BLOCK {ROW_BLOCK}\n#define DS_PAR_MIN_FLOPS {PAR_MIN_FLOPS}\n" + _PLAIN + _LAYERNORM)

# What generated kernels include: the library's entry points, resolved when they load (after `library()`).
DECLS = r"""
void ds_pack_panels(const float *restrict b, int64_t ldb, int64_t k, int64_t n, float *restrict bp);
void ds_pack_panels_t(const float *restrict a, int64_t lda, int64_t k, int64_t n, float *restrict bp);
void ds_gemm_panel(const float *restrict a, int64_t lda, const float *restrict panel, int64_t ps,
                   float *restrict c, int64_t ldc, int64_t i0, int64_t i1, int64_t ncols, int64_t k);
void ds_gemm_tile(const float *restrict a, int64_t lda, const float *restrict bp, float *restrict c,
                  int64_t ldc, int64_t i0, int64_t i1, int64_t q, int64_t n, int64_t k);
void ds_gemm_packed(const float *restrict a, int64_t lda, const float *restrict bp, float *restrict c,
                    int64_t ldc, int64_t m, int64_t n, int64_t k);
void ds_layernorm_row(const float *x, float *y, const float *restrict scale, const float *restrict bias,
                      int64_t n, float eps);
int omp_get_max_threads(void);
"""

_lib: list = []


def spec() -> dict:
    """How this helper library is built (shared with artefacts, which ship it)."""
    from dynshape.codegen.cc import DEFAULT_FLAGS

    return {"source": "#include <stdint.h>\n#include <stdlib.h>\n#include <math.h>\n" + SOURCE, "name": "packed_gemm",
            "flags": DEFAULT_FLAGS, "openmp": True, "share": True,
            "symbols": ["ds_pack_panels", "ds_pack_panels_t", "ds_gemm_panel", "ds_gemm_tile", "ds_gemm_packed",
                        "ds_layernorm_row"]}


def library():
    """Load the micro-kernel library with its symbols global: kernels that call it must load after this."""
    if not _lib:
        from dynshape.codegen.cc import compile_c

        _lib.append(compile_c(**spec()))
    return _lib[0]
