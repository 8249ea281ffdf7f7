"""Run a bound plan's native steps in one foreign call instead of one ctypes call each.

A planned call is a list of pre-bound steps whose arguments are fixed integers (addresses, extents). Each
ctypes call costs about a microsecond; a transformer layer has ~20 steps, so at batch 1 the calls cost as much
as a few of the kernels. Consecutive native steps are packed into one int64 program
    [fn, nargs, arg0, ..., fn, nargs, ...]
that `ds_run_program` walks in C. Data-movement steps (Transpose, Expand: a strided view copied into a
contiguous buffer) get a C copy too, so they join the program instead of splitting it.

Every entry is called through a function type of `nargs` int64 parameters: the steps take pointers and
int64 extents only, which travel in the same registers on the 64-bit ABIs we build for (x86-64, aarch64).
"""

from __future__ import annotations

import ctypes

from dynshape.codegen.cgen import prelude

MAX_ARGS = 16


def _dispatch() -> str:
    cases = []
    for n in range(MAX_ARGS + 1):
        params = ", ".join(["int64_t"] * n) or "void"
        args = ", ".join(f"a[{i}]" for i in range(n))
        cases.append(f"        case {n}: ((void (*)({params}))fn)({args}); break;")
    return "\n".join(cases)


_SRC = r"""
/* dst (contiguous) = the strided view described by a: [ndim, itemsize, dst, src, shape[ndim], strides[ndim]]
   (strides in bytes, 0 where the source broadcasts). The innermost dim is a memcpy when it is contiguous. */
void ds_copy_strided(const int64_t *a) {
    const int64_t nd = a[0], size = a[1];
    char *dst = (char *)a[2];
    const char *src = (const char *)a[3];
    const int64_t *shape = a + 4, *stride = a + 4 + nd;
    int64_t idx[16] = {0};
    if (nd == 0) { memcpy(dst, src, size); return; }
    for (int64_t d = 0; d < nd; d++) if (shape[d] == 0) return;
    const int64_t inner = shape[nd - 1], ist = stride[nd - 1];
    if (size == 4 && nd >= 2 && stride[nd - 2] == 4 && ist != 4) {
        /* the last two dims swapped (a matrix transpose per outer index): 16 x 16 tiles, so every cache line
           read or written is used whole instead of one float of it */
        const int64_t rows = shape[nd - 2];
        for (;;) {
            const char *s = src;
            for (int64_t d = 0; d < nd - 2; d++) s += idx[d] * stride[d];
            float *o = (float *)dst;
            for (int64_t r0 = 0; r0 < rows; r0 += 16)
                for (int64_t c0 = 0; c0 < inner; c0 += 16) {
                    const int64_t r1 = r0 + 16 < rows ? r0 + 16 : rows, c1 = c0 + 16 < inner ? c0 + 16 : inner;
                    for (int64_t c = c0; c < c1; c++)
                        for (int64_t r = r0; r < r1; r++) memcpy(o + r * inner + c, s + r * 4 + c * ist, 4);
                }
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

void ds_run_program(const int64_t *p, int64_t n) {
    for (int64_t s = 0; s < n; s++) {
        const void *fn = (const void *)p[0];
        const int64_t nargs = p[1], *a = p + 2;
        switch (nargs) {
@CASES@
        }
        p += 2 + nargs;
    }
}
"""

_lib: ctypes.CDLL | None | bool = None


def spec() -> dict:
    """How this helper library is built (shared with artefacts, which ship it)."""
    from dynshape.codegen.cc import DEFAULT_FLAGS

    return {"source": prelude() + _SRC.replace("@CASES@", _dispatch()), "name": "program",
            "flags": DEFAULT_FLAGS, "symbols": ["ds_run_program", "ds_copy_strided"]}


def library() -> ctypes.CDLL | None:
    """The runner library, or None without a C compiler (plans then call their steps one by one)."""
    global _lib
    if _lib is None:
        try:
            from dynshape.codegen.cc import compile_c

            lib = compile_c(**spec())
            lib.ds_run_program.argtypes, lib.ds_run_program.restype = [ctypes.c_void_p, ctypes.c_int64], None
            lib.ds_copy_strided.argtypes, lib.ds_copy_strided.restype = [ctypes.c_void_p], None
            _lib = lib
        except Exception:  # noqa: BLE001 - no compiler: step by step
            _lib = False
    return _lib or None


def address(cfunc) -> int:
    """Entry address of a ctypes function."""
    return ctypes.cast(cfunc, ctypes.c_void_p).value
