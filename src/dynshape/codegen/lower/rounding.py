"""Expression rules for rounding and for float <-> integer Casts, so they join elementwise kernels.

Why: a quantized model rounds a bias under a per-call scale (`Cast(Floor(b / s), int32)`), and exporters write
Floor / Ceil and Casts between float and integer around sizes and indices; without rules each ran on numpy once a
call (ddddocr's quantized recogniser: 42 such nodes per call).

A float -> integer Cast computes what the reference (numpy's `astype` on x86-64) gives, with no undefined
behaviour in the C: truncation toward zero for values inside the integer type's range, the type's minimum for
NaN, infinities and values outside it (the x86 "integer indefinite" that numpy returns), spelled as a select so
that the compiler cannot assume the conversion is in range. An integer -> float32 Cast is C's conversion (round to
nearest even), as numpy's. Casts among int32, int64 and bool and from bool are C's conversions too, and a Cast to
bool is `x != 0`: a mask's (GPT-2's attention mask int64 -> bool ran as its own native step, bound again at every
new past length of a first generation).
"""

from __future__ import annotations

import numpy as np

from dynshape.codegen import kir
from dynshape.codegen.lower.elementwise import expr_rule
from dynshape.ir.graph import Graph, Node
from dynshape.passes.values import is_float32

# float32 bounds of the integer types: [lo, hi) holds exactly the values that truncate into range
_RANGE = {"int32": (-2147483648.0, 2147483648.0), "int64": (-9223372036854775808.0, 9223372036854775808.0)}


def _float_unary(fn: str):
    def build(n: Node, a: list[kir.Expr], g: Graph) -> kir.Expr:
        return kir.Call(fn, (a[0],), kir.F32)
    return build


def _float32_in_out(n: Node, g: Graph) -> str | None:
    ok = is_float32(g.types.get(n.inputs[0])) and is_float32(g.types.get(n.outputs[0]))
    return None if ok else "not float32"


def _dtypes(n: Node, g: Graph) -> tuple[str, str]:
    return np.dtype(g.types[n.inputs[0]].dtype).name, np.dtype(g.types[n.outputs[0]].dtype).name


_EXACT = {"int32", "int64", "bool"}  # casts among these and to float32 that C's conversion does as numpy's astype


def _cast_accepts(n: Node, g: Graph) -> str | None:
    a, b = _dtypes(n, g)
    if (a == "float32" and b in _RANGE) or (a in _RANGE and b == "float32"):
        return None
    if b == "bool" and a in (*_EXACT, "float32") or a in _EXACT and b in (*_EXACT, "float32"):
        return None
    return f"Cast {a} -> {b} has no expression rule (float32, int32, int64 and bool only)"


def _cast(n: Node, a: list[kir.Expr], g: Graph) -> kir.Expr:
    src, dst = _dtypes(n, g)
    x = a[0]
    if src == dst:
        return x
    if dst == "bool":  # any nonzero value is true (NaN too, as numpy's astype(bool))
        return kir.Bin("!=", x, kir.Const(0.0 if src == "float32" else 0, src))
    if src != "float32":  # (int64 -> int32 wraps modulo 2^32 in GCC's conversion, as numpy's astype does)
        return kir.Cast(x, dst)
    lo, hi = _RANGE[dst]
    inside = kir.Bin("&&", kir.Bin(">=", x, kir.Const(lo, kir.F32)), kir.Bin("<", x, kir.Const(hi, kir.F32)))
    low = kir.Const(int(lo), dst)
    return kir.Select(inside, kir.Cast(kir.Select(inside, x, kir.Const(0.0, kir.F32)), dst), low)


expr_rule("Floor", _float_unary("floorf"), _float32_in_out)
expr_rule("Ceil", _float_unary("ceilf"), _float32_in_out)
expr_rule("Cast", _cast, _cast_accepts)
