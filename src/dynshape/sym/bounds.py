"""Sound value ranges and divisors of expressions.

`interval(e)` returns (lo, hi) with -inf/inf for unbounded ends. Sums and products of symbols with
non-negative coefficients get the exact range (every dim is >= 0, so such polynomials are monotone).
With negative coefficients plain interval arithmetic is loose (s*s - s), so we also evaluate the
polynomial re-centred at every atom's lower and upper bound (s = lo + t, t >= 0), which decides the
typical shape facts without a general solver.
"""

from __future__ import annotations

import functools
import math
from functools import reduce

from dynshape.sym.expr import Atom, DimLike, Expr, OpAtom, Symbol

INF = math.inf


def _mul(a: float, b: float) -> float:
    if a == 0 or b == 0:
        return 0
    return a * b


def _imul(x: tuple, y: tuple) -> tuple:
    c = (_mul(x[0], y[0]), _mul(x[0], y[1]), _mul(x[1], y[0]), _mul(x[1], y[1]))
    return min(c), max(c)


def _ipow(x: tuple, n: int) -> tuple:
    lo, hi = x
    if n % 2 == 1 or lo >= 0:
        return (_pow(lo, n), _pow(hi, n))
    if hi <= 0:
        return (_pow(hi, n), _pow(lo, n))
    return (0, max(_pow(lo, n), _pow(hi, n)))


def _pow(v: float, n: int) -> float:
    if v in (INF, -INF):
        return v if n % 2 else INF
    return v**n


def _floordiv(x: float, d: float) -> float:
    if d == INF:
        return 0 if x >= 0 else -1
    if x in (INF, -INF):
        return x
    return x // d


def atom_interval(a: Atom) -> tuple:
    if isinstance(a, Symbol):
        return (a.lo, INF if a.hi is None else a.hi)
    if a.op in ("min", "max"):
        ivs = [interval(x) for x in a.args]
        pick = min if a.op == "min" else max
        return (pick(i[0] for i in ivs), pick(i[1] for i in ivs))
    xl, xh = interval(a.args[0])
    dl, dh = interval(a.args[1])
    if a.op == "fdiv":
        vals = [_floordiv(x, d) for x in (xl, xh) for d in (dl, dh) if not (x in (INF, -INF) and d == INF)]
        return (min(vals), max(vals))
    # mod by a positive divisor
    if dl == dh and dl != INF:
        c = dl
        if xl != -INF and xh != INF and xl // c == xh // c:
            k = xl // c
            return (xl - k * c, xh - k * c)
    hi = dh - 1
    if xl >= 0:
        hi = min(hi, xh)
    return (0, hi)


def _mono_interval(m: tuple) -> tuple:
    out = (1, 1)
    i = 0
    while i < len(m):
        j = i
        while j < len(m) and m[j] == m[i]:
            j += 1
        out = _imul(out, _ipow(atom_interval(m[i]), j - i))
        i = j
    return out


def _naive(e: Expr) -> tuple:
    lo = hi = e.const
    for m, c in e.terms:
        ml, mh = _mono_interval(m)
        if c > 0:
            lo, hi = lo + _mul(c, ml), hi + _mul(c, mh)
        else:
            lo, hi = lo + _mul(c, mh), hi + _mul(c, ml)
    return lo, hi


def _shifted(e: Expr, at_low: bool) -> tuple:
    """Bounds of e with every atom written as lo + t (at_low) or hi - t, t in [0, width]."""
    atoms: dict = {}
    for m, _ in e.terms:
        for a in m:
            if a not in atoms:
                lo, hi = atom_interval(a)
                base = lo if at_low else hi
                if base in (INF, -INF):
                    return (-INF, INF)
                atoms[a] = (base, hi - lo, len(atoms))
    poly: dict = {(): e.const}
    for m, c in e.terms:
        term: dict = {(): c}
        for a in m:
            base, _, idx = atoms[a]
            step = 1 if at_low else -1
            nxt: dict = {}
            for k, v in term.items():
                if base:
                    nxt[k] = nxt.get(k, 0) + v * base
                k2 = tuple(sorted(k + (idx,)))
                nxt[k2] = nxt.get(k2, 0) + v * step
            term = nxt
        for k, v in term.items():
            poly[k] = poly.get(k, 0) + v
    widths = {idx: w for (_, w, idx) in atoms.values()}
    lo = hi = poly.pop((), 0)
    for k, v in poly.items():
        if v == 0:
            continue
        w = reduce(_mul, (widths[i] for i in k), 1)
        if v > 0:
            hi += _mul(v, w)
        else:
            lo += _mul(v, w)
    return lo, hi


def interval(e: DimLike) -> tuple:
    """A sound (lo, hi) for e over every admissible assignment; -inf/inf mark unbounded ends."""
    return (e, e) if isinstance(e, int) else _interval(e)


@functools.lru_cache(maxsize=200_000)  # expressions are immutable and hashable
def _interval(e: Expr) -> tuple:
    lo, hi = _naive(e)
    needs_tightening = any(c < 0 for _, c in e.terms) or any(
        atom_interval(a)[0] < 0 for m, _ in e.terms for a in m if isinstance(a, OpAtom)
    )
    if needs_tightening:
        for at_low in (True, False):
            l2, h2 = _shifted(e, at_low)
            lo, hi = max(lo, l2), min(hi, h2)
        rewritten = without_fdiv(e)
        if rewritten is not None:  # scale*e == out, e an integer
            out, scale = rewritten
            l2, h2 = interval(out)
            lo = max(lo, -((-l2) // scale) if l2 != -INF else -INF)
            hi = min(hi, h2 // scale if h2 != INF else INF)
    d = divisor(e)
    if d > 1:
        if lo != -INF:
            lo = -((-lo) // d) * d
        if hi != INF:
            hi = (hi // d) * d
    return lo, hi


def without_fdiv(e: Expr) -> tuple | None:
    """(out, scale) with scale*e == out, each linear c*(X//d) rewritten as c*scale/d*(X - X%d).

    X % d then enters as an atom bounded by [0, d-1] on its own: a sound relaxation that keeps the
    correlation between X and X//d that plain interval arithmetic loses ((b+7)//8*8 - b is in [0, 7]).
    """
    fdivs = {a for m, _ in e.terms for a in m if isinstance(a, OpAtom) and a.op == "fdiv"
             and isinstance(a.args[1], int)}
    if not fdivs or any(len(m) > 1 and any(a in fdivs for a in m) for m, _ in e.terms):
        return None
    scale = 1
    for a in fdivs:
        scale = math.lcm(scale, a.args[1])
    out: DimLike = e.const * scale
    for m, c in e.terms:
        a = m[0]
        if len(m) == 1 and a in fdivs:
            x, d = a.args
            out = out + (c * scale // d) * (x - Expr.from_atom(OpAtom("mod", (x, d))))
        else:
            out = out + c * scale * Expr.from_terms({m: 1})
    return out, scale


def bounds(e: DimLike) -> tuple[int | None, int | None]:
    """Public form of `interval`: None marks an unbounded end."""
    lo, hi = interval(e)
    return (None if lo == -INF else int(lo), None if hi == INF else int(hi))


def atom_divisor(a: Atom) -> int:
    if isinstance(a, Symbol):
        return a.mult
    if a.op in ("min", "max"):
        return reduce(math.gcd, (divisor(x) for x in a.args))
    if a.op == "mod" and isinstance(a.args[1], int):
        return math.gcd(divisor(a.args[0]), a.args[1])
    if a.op == "fdiv" and isinstance(a.args[1], int):  # (c*k*m)//c == k*m: exact division keeps k
        d = divisor(a.args[0])
        return d // a.args[1] if d % a.args[1] == 0 else 1
    return 1


def divisor(e: DimLike) -> int:
    """The largest k known to divide e for every assignment (0 means e is the constant 0)."""
    if isinstance(e, int):
        return abs(e)
    g = abs(e.const)
    for m, c in e.terms:
        d = abs(c)
        for a in m:
            d *= atom_divisor(a)
        g = math.gcd(g, d)
        if g == 1:
            return 1
    return g
