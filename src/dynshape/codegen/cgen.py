"""Printer primitives for generated C: type names, exact literals, symbolic-dim expressions, the prelude.

Why these exist: generated code must reproduce Python semantics exactly.  Dims use floor division and a
modulo with the divisor's sign (C truncates), float constants must round-trip bit for bit, and the
transcendental functions must vectorise (glibc's expf/erff/tanhf only do under -ffast-math, which would also
break NaN/Inf semantics), hence our own branch-free versions, accurate to a few float ulp.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dynshape.errors import DynshapeError

__all__ = ["PRELUDE", "TRAMPOLINE", "c_dim", "c_float", "c_ident", "c_int", "c_type", "prelude"]

_C_TYPES = {
    "float32": "float",
    "float64": "double",
    "float16": "_Float16",  # gcc >= 12 / clang >= 15 on x86-64 and aarch64
    "int8": "int8_t",
    "int16": "int16_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "uint8": "uint8_t",
    "uint16": "uint16_t",
    "uint32": "uint32_t",
    "uint64": "uint64_t",
    "bool": "uint8_t",  # numpy bools are bytes holding 0 or 1; read them as integers, never as _Bool
}


def c_type(dtype: Any) -> str:
    """C element type of a numpy dtype (or anything np.dtype accepts)."""
    name = np.dtype(dtype).name
    try:
        return _C_TYPES[name]
    except KeyError:
        raise DynshapeError(f"no C type for dtype {name}; supported: {', '.join(_C_TYPES)}") from None


def c_int(v: int) -> str:
    """An int64_t literal; INT64_MIN has no literal form, so it is spelled as an expression."""
    v = int(v)
    if not -(2**63) <= v < 2**63:
        raise DynshapeError(f"integer {v} does not fit in int64_t")
    if v == -(2**63):
        return "(-INT64_C(9223372036854775807) - 1)"
    return f"INT64_C({v})" if abs(v) > 2**31 - 1 else (f"({v})" if v < 0 else str(v))


def c_float(x: float, dtype: Any = np.float32) -> str:
    """A C literal that parses back to exactly the same float32/float64 value (inf/nan via math.h macros).

    The shortest decimal that round-trips at the target precision, with an `f` suffix for float so the C
    parser rounds once, directly to float.
    """
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise DynshapeError(f"c_float prints float32/float64 literals, not {dt}")
    v = dt.type(x)
    if math.isnan(v):
        return "NAN" if dt == np.float32 else "((double)NAN)"
    if math.isinf(v):
        s = "INFINITY" if dt == np.float32 else "((double)INFINITY)"
        return s if v > 0 else f"(-{s})"
    text = np.format_float_scientific(v, unique=True, trim="-")  # e.g. 1.1e+00, -0.e+00, 3e-45
    body = text + ("f" if dt == np.float32 else "")
    return f"({body})" if text.startswith("-") else body


def c_ident(name: str) -> str:
    """A valid, collision-free C identifier for an arbitrary name (ONNX dim_params contain '-', ' ', ...)."""
    safe = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if safe != name or not safe or safe[0].isdigit():
        safe = f"{safe}_{hashlib.sha256(name.encode()).hexdigest()[:6]}"
    return "s_" + safe if safe[0].isdigit() else safe


def c_dim(e: Any, names: Mapping[str, str] | Callable[[str], str] | None = None) -> str:
    """int64_t C expression for a dimension (int or dynshape.sym.Expr), with Python's // and % semantics.

    `names` maps symbol names to C variables (default: c_ident of the name).  Floor division by a positive
    constant of a provably non-negative numerator uses plain `/` `%` (vectorisable, cheaper); everything
    else calls ds_floordiv/ds_mod from the prelude.
    """
    if isinstance(e, (int, np.integer)) and not isinstance(e, bool):
        return c_int(int(e))
    lookup: Callable[[str], str]
    if names is None:
        lookup = c_ident
    elif callable(names):
        lookup = names
    else:
        lookup = names.__getitem__
    terms = getattr(e, "terms", None)
    if terms is None:
        raise DynshapeError(f"not a dimension: {e!r} ({type(e).__name__})")
    parts: list[str] = []
    for mono, coeff in terms:
        factors = [_c_atom(a, lookup) for a in mono]
        if coeff != 1:
            factors.insert(0, c_int(coeff))
        parts.append(" * ".join(factors))
    if e.const:
        parts.append(c_int(e.const))
    return "(" + " + ".join(parts) + ")"


def _c_atom(a: Any, lookup: Callable[[str], str]) -> str:
    name = getattr(a, "name", None)
    if name is not None and not hasattr(a, "op"):
        return lookup(name)
    op, args = a.op, [c_dim(x, lookup) for x in a.args]
    if op in ("min", "max"):
        out = args[0]
        for x in args[1:]:
            out = f"ds_{op}({out}, {x})"
        return out
    if op not in ("fdiv", "mod"):
        raise DynshapeError(f"cannot print dimension operation {op!r} as C")
    num, den = a.args
    if isinstance(den, int) and den > 0 and _nonneg(num):
        return f"({args[0]} {'/' if op == 'fdiv' else '%'} {args[1]})"
    return f"ds_{'floordiv' if op == 'fdiv' else 'mod'}({args[0]}, {args[1]})"


def _nonneg(x: Any) -> bool:
    if isinstance(x, int):
        return x >= 0
    try:
        from dynshape.sym import bounds
    except ImportError:  # pragma: no cover - sym is an upstream layer
        return False
    lo = bounds(x)[0]
    return lo is not None and lo >= 0


# Integer helpers: Python semantics for // and % (floor; remainder takes the divisor's sign).  Division by
# zero is undefined here as in C; the runtime's shape checks must rule it out before calling kernels.
_INT_HELPERS = r"""
static inline int64_t ds_floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t ds_mod(int64_t a, int64_t b) {
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t ds_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t ds_max(int64_t a, int64_t b) { return a > b ? a : b; }
"""

# Branch-free float32 transcendental functions.  Coefficients: exp is Cephes' expf polynomial; the erf and
# tanh polynomials were fitted here (iteratively reweighted least squares toward minimax relative error in
# float64): erf(x) = x*P(x^2) on |x| < 1 (rel. err 2e-9), erf = 1 - exp(-Q(|x|)) on [1, 4] (abs. err of
# erfc 1e-9), tanh(x) = x*(1 + x^2*R(x^2)) on |x| < 0.55 (rel. err 3e-9).  Measured in float32 against float64
# references by tests/codegen/test_cgen.py: max relative error < 1e-6 over [-100, 100].
_FAST_MATH = r"""
static inline float ds_bits_to_float(int32_t i) { float f; __builtin_memcpy(&f, &i, 4); return f; }

/* exp(xc) = 2^n * P(r): n = round(xc / ln 2), r = xc - n ln 2 (Cody-Waite, two parts), P Cephes' polynomial. */
static inline float ds_exp_poly(float xc, float *n) {
    *n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest integer */
    float r = xc - *n * 0.693359375f;
    r = r - *n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * (r * r) + r + 1.0f;
}

static inline float ds_expf(float x) {
    float n, p = ds_exp_poly(x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x), &n);
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1; /* two steps: 2^n may be subnormal or 2^128 */
    float y = p * ds_bits_to_float((n1 + 127) << 23) * ds_bits_to_float((n2 + 127) << 23);
    y = x < -103.972084f ? 0.0f : y;
    return x != x ? x : y;
}

/* exp(x) for x in [-87.3, 88]: 2^n is a normal number, so one scale and no range checks. */
static inline float ds_exp_normal(float x) {
    float n, p = ds_exp_poly(x, &n);
    return p * ds_bits_to_float(((int32_t)n + 127) << 23);
}

/* exp of x <= 0 (softmax after subtracting the row maximum): one 2^n scale instead of two, and results that
   would be subnormal (x < -87.3, below 1.2e-38 next to the row maximum's 1) are flushed to zero. */
static inline float ds_expf_nonpos(float x) {
    float y = ds_exp_normal(x < -87.3f ? -87.3f : x);
    y = x < -87.3f ? 0.0f : y;
    return x != x ? x : y;
}

static inline float ds_erff(float x) {
    float t = fabsf(x), z = x * x;
    float p = 7.820643e-05f;
    p = p * z + -7.999558e-04f;
    p = p * z + 5.1870267e-03f;
    p = p * z + -2.6853057e-02f;
    p = p * z + 1.12835646e-01f;
    p = p * z + -3.7612623e-01f;
    p = p * z + 1.1283791e+00f;
    float tc = t < 4.0f ? t : 4.0f;
    float q = -1.8514993e-04f;
    q = q * tc + 2.9355406e-03f;
    q = q * tc + -2.178941e-02f;
    q = q * tc + 1.0300486e-01f;
    q = q * tc + 6.3826233e-01f;
    q = q * tc + 1.1270185e+00f;
    q = q * tc + 3.5893323e-04f;
    float y = t < 1.0f ? x * p : copysignf(1.0f - ds_exp_normal(-q), x);  /* -q in [-16.5, 0) */
    return x != x ? x : y;
}

static inline float ds_tanhf(float x) {
    float t = fabsf(x), z = x * x;
    float p = -5.885589e-03f;
    p = p * z + 2.0787114e-02f;
    p = p * z + -5.3780954e-02f;
    p = p * z + 1.3331886e-01f;
    p = p * z + -3.3333296e-01f;
    float e = ds_exp_normal(2.0f * (t < 9.5f ? t : 9.5f));
    float y = t < 0.55f ? x * (1.0f + z * p) : copysignf(1.0f - 2.0f / (e + 1.0f), x);
    return x != x ? x : y;
}
"""

_LIBM_MATH = r"""
static inline float ds_expf(float x) { return expf(x); }
static inline float ds_expf_nonpos(float x) { return expf(x); }
static inline float ds_erff(float x) { return erff(x); }
static inline float ds_tanhf(float x) { return tanhf(x); }
"""

_HEADERS = "#include <stdint.h>\n#include <stddef.h>\n#include <string.h>\n#include <math.h>\n"


def prelude(fast_math: bool = True) -> str:
    """Headers, integer dim helpers and ds_expf/ds_erff/ds_tanhf (fast vectorisable ones, or libm's)."""
    return _HEADERS + _INT_HELPERS + (_FAST_MATH if fast_math else _LIBM_MATH)


PRELUDE = prelude()


# The cheapest Python -> C path measured (bench/codegen_poc.py: ~0.2 us for 4 arrays, against ~0.5-1 us for a
# bare ctypes call plus ~1.5 us per `arr.ctypes.data`).  Build with cc.compile_extension(TRAMPOLINE,
# "ds_trampoline"); then `invoke(entry_address, *arrays) -> int` calls
#     int entry(void *const *ptrs, const int64_t *shapes)
# with the GIL released, where shapes holds per array [ndim, itemsize, format char, d0, ..., d7] (a fixed
# stride of 11, so generated code indexes it with constants; numpy's format chars: 'f' float32, 'd' float64,
# 'l'/'q' int64, 'i' int32, '?' bool, 'e' float16).  The entry checks ranks, dims and dtypes itself and
# returns 0 or an error code the caller maps to a message.  Buffers must be C-contiguous (numpy raises ValueError);
# read-only ones are accepted, so outputs must be arrays the runtime allocated.
TRAMPOLINE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#define DS_MAX_ARGS 32
#define DS_MAX_DIMS 8
#define DS_SLOT (3 + DS_MAX_DIMS)
typedef int (*ds_entry_fn)(void *const *ptrs, const int64_t *shapes);

/* invoke(entry_address, *arrays): C-contiguous buffers in, entry(ptrs, shapes) called with the GIL released.
   shapes holds, per array, DS_SLOT int64s: ndim, itemsize, format char, then DS_MAX_DIMS dims.
   Returns the entry's int status; 0 = success. */
static PyObject *invoke(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 1 || nargs > DS_MAX_ARGS + 1) {
        PyErr_SetString(PyExc_TypeError, "invoke(entry, *arrays)");
        return NULL;
    }
    ds_entry_fn fn = (ds_entry_fn)PyLong_AsVoidPtr(args[0]);
    if (fn == NULL) return NULL;
    Py_buffer views[DS_MAX_ARGS];
    void *ptrs[DS_MAX_ARGS];
    int64_t shapes[DS_MAX_ARGS * DS_SLOT];
    Py_ssize_t n = nargs - 1, got = 0;
    for (; got < n; got++) {
        Py_buffer *v = &views[got];
        if (PyObject_GetBuffer(args[got + 1], v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fail;
        if (v->ndim > DS_MAX_DIMS) { PyBuffer_Release(v); PyErr_SetString(PyExc_ValueError, "rank > 8"); goto fail; }
        ptrs[got] = v->buf;
        int64_t *s = shapes + got * DS_SLOT;
        const char *f = v->format ? v->format : "B";
        if (*f == '<' || *f == '=' || *f == '@') f++;
        s[0] = v->ndim;
        s[1] = v->itemsize;
        s[2] = *f;
        for (int d = 0; d < v->ndim; d++) s[d + 3] = v->shape[d];
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fn(ptrs, shapes);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) PyBuffer_Release(&views[i]);
    return PyLong_FromLong(rc);
fail:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    return NULL;
}

static PyMethodDef methods[] = {{"invoke", (PyCFunction)(void (*)(void))invoke, METH_FASTCALL, NULL},
                                {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "ds_trampoline", NULL, -1, methods};
PyMODINIT_FUNC PyInit_ds_trampoline(void) { return PyModule_Create(&mod); }
"""
