"""Printer primitives for generated C: type names, exact literals, symbolic-dim expressions, the prelude.

Why these exist: generated code must reproduce Python semantics exactly.  Dims use floor division and a
modulo with the divisor's sign (C truncates; csrc/ds_prelude.h has the helpers), and float constants must
round-trip bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dynshape.errors import DynshapeError

__all__ = ["PRELUDE", "c_dim", "c_float", "c_int", "c_type", "prelude"]

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


def c_dim(e: Any, names: Mapping[str, str] | Callable[[str], str]) -> str:
    """int64_t C expression for a dimension (int or dynshape.sym.Expr), with Python's // and % semantics.

    `names` maps symbol names to C expressions (a kernel reads them from its key array).  Floor division by a
    positive constant of a provably non-negative numerator uses plain `/` `%` (vectorisable, cheaper);
    everything else calls ds_floordiv/ds_mod from the prelude.
    """
    if isinstance(e, (int, np.integer)) and not isinstance(e, bool):
        return c_int(int(e))
    lookup: Callable[[str], str] = names if callable(names) else names.__getitem__
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


def prelude(fast_math: bool = True) -> str:
    """What a generated C file starts with: csrc/ds_prelude.h (headers, integer dim helpers and
    ds_expf/ds_erff/ds_tanhf: the fast vectorisable ones, or libm's)."""
    return ("" if fast_math else "#define DS_LIBM_MATH\n") + '#include "ds_prelude.h"\n'


PRELUDE = prelude()
