/* ScatterND and ScatterElements (ONNX) into a contiguous output: the data copied in, then the updates written
   (or added / multiplied) at the indices, in the indices' order, as the reference's numpy does (`out[where] =
   updates`, `np.add.at`, `np.multiply.at`): a later duplicate index wins, a reduction applies one update after
   the other. Every index is checked before anything is written; the count of those outside [-n, n) is returned
   (the caller raises, naming the node) and the output is left untouched. A negative index counts from the end.

   Why: BART's decoder inputs (`shift_tokens_right`: the ids shifted one right by a ScatterND or a
   ScatterElements, per call, on token ids) ran on numpy every call.

   The tables' fields are named in ds_shared.h (codegen/cshared.py: DS_SCATTER_ND_*, DS_SCATTER_EL_*, and the
   reduction and element type codes). */
#include <stdint.h>
#include <string.h>

#include "ds_shared.h"

static inline int64_t ds_scatter_index(const void *idx, int64_t i32, int64_t p) {
    return i32 ? (int64_t)((const int32_t *)idx)[p] : ((const int64_t *)idx)[p];
}

/* dst[j] (op)= src[j] for `count` elements of `size` bytes. Integers wrap as numpy's do (unsigned arithmetic on
   the same bits); floats in their own precision, one operation each, as numpy's ufunc.at. */
#define DS_SCATTER_COMBINE(T, OP)                                   \
    do {                                                            \
        T *d_ = (T *)dst;                                           \
        const T *s_ = (const T *)src;                               \
        for (int64_t j = 0; j < count; j++) d_[j] = d_[j] OP s_[j]; \
    } while (0)
#define DS_SCATTER_TYPED(OP)                                                      \
    switch (type) {                                                               \
    case DS_SCATTER_F32: DS_SCATTER_COMBINE(float, OP); break;                    \
    case DS_SCATTER_F64: DS_SCATTER_COMBINE(double, OP); break;                   \
    case DS_SCATTER_I32: DS_SCATTER_COMBINE(uint32_t, OP); break;                 \
    case DS_SCATTER_I64: DS_SCATTER_COMBINE(uint64_t, OP); break;                 \
    default: break;                                                               \
    }
static void ds_scatter_combine(char *dst, const char *src, int64_t count, int64_t size, int64_t reduction,
                               int64_t type) {
    if (reduction == DS_SCATTER_NONE) {
        memcpy(dst, src, (size_t)(count * size));
    } else if (reduction == DS_SCATTER_ADD) {
        DS_SCATTER_TYPED(+)
    } else {
        DS_SCATTER_TYPED(*)
    }
}

/* The fields both tables begin with (DS_SCATTER_AT_*): element size, index width, reduction, element type, the
   output's bytes and the buffers. */
typedef struct {
    int64_t size, i32, reduction, type, nbytes;
    char *out;
    const char *x, *upd;
    const void *idx;
} ds_scatter_call;

static ds_scatter_call ds_scatter_read(const int64_t *a) {
    const ds_scatter_call c = {a[DS_SCATTER_AT_ITEMSIZE], a[DS_SCATTER_AT_I32], a[DS_SCATTER_AT_REDUCTION],
                               a[DS_SCATTER_AT_TYPE], a[DS_SCATTER_AT_NBYTES], (char *)a[DS_SCATTER_AT_OUT],
                               (const char *)a[DS_SCATTER_AT_X], (const char *)a[DS_SCATTER_AT_UPD],
                               (const void *)a[DS_SCATTER_AT_IDX]};
    return c;
}

/* a: see DS_SCATTER_ND_* (k index components per update, m updates of `slice` elements each; shape[k] the data's
   first k dims, ostride[k] the output's strides over them in bytes). */
int64_t ds_scatter_nd(const int64_t *a) {
    const int64_t k = a[DS_SCATTER_ND_K], m = a[DS_SCATTER_ND_M], slice = a[DS_SCATTER_ND_SLICE];
    const ds_scatter_call c = ds_scatter_read(a);
    const int64_t *shape = a + DS_SCATTER_ND_GEO, *ostride = shape + k;
    int64_t bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < k; j++) {
            int64_t v = ds_scatter_index(c.idx, c.i32, i * k + j);
            v += v < 0 ? shape[j] : 0;
            bad += v < 0 || v >= shape[j];
        }
    if (bad) return bad;
    if (c.x != c.out) memcpy(c.out, c.x, (size_t)c.nbytes);
    for (int64_t i = 0; i < m; i++) {
        int64_t off = 0;
        for (int64_t j = 0; j < k; j++) {
            int64_t v = ds_scatter_index(c.idx, c.i32, i * k + j);
            off += (v + (v < 0 ? shape[j] : 0)) * ostride[j];
        }
        ds_scatter_combine(c.out + off, c.upd + i * slice * c.size, slice, c.size, c.reduction, c.type);
    }
    return 0;
}

/* a: see DS_SCATTER_EL_* (rank, axis, n = the data's extent on the axis; shape[rank] the indices' (and the
   updates'), ostride[rank] the output's strides in bytes). */
int64_t ds_scatter_elements(const int64_t *a) {
    const int64_t rank = a[DS_SCATTER_EL_RANK], axis = a[DS_SCATTER_EL_AXIS], n = a[DS_SCATTER_EL_N];
    const ds_scatter_call c = ds_scatter_read(a);
    const int64_t *shape = a + DS_SCATTER_EL_GEO, *ostride = shape + rank;
    int64_t total = 1, bad = 0, ctr[DS_SCATTER_MAX_RANK] = {0};
    for (int64_t d = 0; d < rank; d++) total *= shape[d];
    for (int64_t p = 0; p < total; p++) {
        const int64_t v = ds_scatter_index(c.idx, c.i32, p);
        bad += v < -n || v >= n;
    }
    if (bad) return bad;
    if (c.x != c.out) memcpy(c.out, c.x, (size_t)c.nbytes);
    for (int64_t p = 0; p < total; p++) {
        int64_t v = ds_scatter_index(c.idx, c.i32, p), off = 0;
        v += v < 0 ? n : 0;
        for (int64_t d = 0; d < rank; d++) off += (d == axis ? v : ctr[d]) * ostride[d];
        ds_scatter_combine(c.out + off, c.upd + p * c.size, 1, c.size, c.reduction, c.type);
        for (int64_t d = rank - 1; d >= 0; d--) {
            if (++ctr[d] < shape[d]) break;
            ctr[d] = 0;
        }
    }
    return 0;
}
