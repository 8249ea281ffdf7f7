"""Constructors for the opaque atoms (floordiv, mod, min, max) and the rewrites that remove them.

Every rewrite here is an identity over the integers *given the symbols' declared ranges and divisors*;
nothing is true only "usually". The ones used:
  (c*q*X + R) // c   = q*X + R // c                 (any integer X)
  (g*X) // c         = (g/h*X) // (c/h),  h = gcd(g, c)
  (X // a) // b      = X // (a*b)                   (a, b > 0)
  X // c             = k     when k*c <= X < (k+1)*c is provable
  (c*q*X + R) % c    = R % c;  X % c = 0 when c divides X;  X % c = X - k*c within one period
  (-Y) % c           = c*((Y + c - 1) // c) - Y      (every term of -Y negative: a padding amount; -(Y % c)
                                                      as -Y)
  min(a, b)          = a     when a <= b is provable
  c*(X // d)         = (c/d)*X   when d | c and d | X          (in `simplify`)
"""

from __future__ import annotations

import functools
import math

from dynshape.errors import ShapeError
from dynshape.sym.bounds import INF, atom_interval, divisor, interval
from dynshape.sym.expr import DimLike, Expr, OpAtom, Symbol, as_dim


def _positive_divisor(b: DimLike, what: str, a: DimLike) -> None:
    lo, hi = interval(b)
    if lo <= 0 <= hi:
        raise ShapeError(
            f"{what} {a} by {b}: the divisor may be zero or change sign (range [{_fmt(lo)}, {_fmt(hi)}]); "
            "declare the symbols it uses with min >= 1"
        )


def _fmt(v: float) -> str:
    return "inf" if v == INF else "-inf" if v == -INF else str(int(v))


def _split(a: Expr, c: int) -> tuple:
    """a = c*q + r with every coefficient of r in (-c, c) not a multiple of c, r's constant in [0, c)."""
    q: dict = {}
    r: dict = {}
    for m, coef in a.terms:
        if coef % c == 0:
            q[m] = coef // c
        else:
            r[m] = coef
    qc, rc = divmod(a.const, c)
    return Expr.from_terms(q, qc), Expr.from_terms(r, rc)


def _gcd_content(e: Expr) -> int:
    g = abs(e.const)
    for _, c in e.terms:
        g = math.gcd(g, c)
    return g


def floordiv(a: DimLike, b: DimLike) -> DimLike:
    a, b = as_dim(a), as_dim(b)
    if isinstance(b, int):
        if b == 0:
            raise ShapeError(f"floor division of {a} by zero")
        if isinstance(a, int):
            return a // b
        if b < 0:
            return -floordiv(a + (-b - 1), -b)
        return _fdiv_const(a, b)
    b_lo, b_hi = interval(b)
    if b_hi < 0:
        return floordiv(-a, -b)
    _positive_divisor(b, "floor division of", a)
    if isinstance(a, int):
        if 0 <= a < b_lo:
            return 0
        return _pinned(OpAtom("fdiv", (a, b)))
    if a == b:
        return 1
    quot, rest = _divide_by_monomial(a, b)
    if quot is None:
        return _fdiv_atom(a, b)
    return quot + (0 if isinstance(rest, int) and rest == 0 else _fdiv_atom(rest, b))


def _divide_by_monomial(a: Expr, b: Expr) -> tuple:
    """If b is c*m (one term), split a into (c*m)*q + r; otherwise (None, a)."""
    if b.const != 0 or len(b.terms) != 1:
        return None, a
    (bm, bc), = b.terms
    q: dict = {}
    r: dict = {}
    for m, coef in a.terms:
        rem = _mono_div(m, bm)
        if rem is not None and coef % bc == 0:
            q[rem] = q.get(rem, 0) + coef // bc
        else:
            r[m] = coef
    if not q:
        return None, a
    qconst = q.pop((), 0)
    return Expr.from_terms(q, qconst), Expr.from_terms(r, a.const)


def exact_quotient(a: DimLike, b: DimLike) -> DimLike | None:
    """q with a == b * q as polynomials (for every value of their atoms, b = 0 included), where b is one term
    (c * atoms) dividing every term of a; None otherwise. Why: Reshape's -1 beside floor-division dims (Swin's
    window reverse: B*(H//7)*(W//7)*49*C elements over (H//7)*(W//7)*49*C) is B wherever that divisor is not 0,
    but `floordiv` refuses a divisor that may be 0, and the -1 became a data-dependent dim."""
    a, b = as_dim(a), as_dim(b)
    if not isinstance(b, Expr):
        return None
    if isinstance(a, int):
        return 0 if a == 0 else None
    quot, rest = _divide_by_monomial(a, b)
    return quot if quot is not None and isinstance(rest, int) and rest == 0 else None


def _mono_div(m: tuple, d: tuple) -> tuple | None:
    rest = list(m)
    for a in d:
        try:
            rest.remove(a)
        except ValueError:
            return None
    return tuple(rest)


def _pinned(atom: OpAtom) -> DimLike:
    """The atom as an expression, or the int it always equals when its bounds pin it to one value."""
    lo, hi = atom_interval(atom)
    if lo == hi and lo not in (INF, -INF):
        return int(lo)
    return Expr.from_atom(atom)


def _fdiv_atom(a: DimLike, b: Expr) -> DimLike:
    if isinstance(a, int) and a == 0:
        return 0
    al, ah = interval(a)
    bl, _ = interval(b)
    if al >= 0 and ah != INF and ah < bl:
        return 0
    return _pinned(OpAtom("fdiv", (a, b)))


def _fdiv_const(a: Expr, c: int) -> DimLike:
    if c == 1:
        return a
    q, r = _split(a, c)
    if isinstance(r, Expr):
        q, r = _exact_multiples(q, r, c)
    if isinstance(r, int):
        return q + r // c
    if r.const and divisor(r - r.const) % c == 0:  # (Y + k)//c == Y//c + k//c when c | Y
        return q + r.const // c + floordiv(r - r.const, c)
    g = math.gcd(_gcd_content(r), c)
    if g > 1:
        r = Expr.from_terms({m: coef // g for m, coef in r.terms}, r.const // g)
        c //= g
        if c == 1:
            return q + r
    # (X // a + k) // c == (X + k*a) // (a*c)   for positive ints a, c
    if len(r.terms) == 1 and r.terms[0][1] == 1 and len(r.terms[0][0]) == 1:
        atom = r.terms[0][0][0]
        if isinstance(atom, OpAtom) and atom.op == "fdiv" and isinstance(atom.args[1], int) and atom.args[1] > 0:
            x, inner = atom.args
            return q + floordiv(x + r.const * inner, inner * c)
    lo, hi = interval(r)
    if lo != -INF and hi != INF and lo // c == hi // c:
        return q + int(lo // c)
    return q + _pinned(OpAtom("fdiv", (r, c)))


def _exact_multiples(q: DimLike, r: Expr, c: int) -> tuple:
    """Move into q the terms k*s of r whose symbol s is declared a multiple of m with c | k*m: for every admissible
    s, (k*s) // c == (k*m // c) * (s // m) exactly, and (X + Y) // c == X / c + Y // c when c | X. So H // 16 and
    2 * (H // 32) are one canonical form when H is a multiple of 32 (what a stride-2 conv and a 2x upsample of
    the next level give)."""
    rest: dict = {}
    for mono, coef in r.terms:
        s = mono[0] if len(mono) == 1 else None
        if isinstance(s, Symbol) and s.mult > 1 and (coef * s.mult) % c == 0:
            q = q + (coef * s.mult // c) * _pinned(OpAtom("fdiv", (Expr.from_atom(s), s.mult)))
        else:
            rest[mono] = coef
    return q, Expr.from_terms(rest, r.const)


def mod(a: DimLike, b: DimLike) -> DimLike:
    a, b = as_dim(a), as_dim(b)
    if isinstance(b, int):
        if b == 0:
            raise ShapeError(f"modulo of {a} by zero")
        if isinstance(a, int):
            return a % b
        if b < 0:
            return a - b * floordiv(a, b)
        return _mod_const(a, b)
    if interval(b)[1] < 0:
        return a - b * floordiv(a, b)
    _positive_divisor(b, "modulo of", a)
    if isinstance(a, Expr):
        if a == b:
            return 0
        quot, rest = _divide_by_monomial(a, b)
        if quot is not None:
            a = rest
    if isinstance(a, int) and a == 0:
        return 0
    al, ah = interval(a)
    if al >= 0 and ah != INF and ah < interval(b)[0]:
        return a
    return _pinned(OpAtom("mod", (a, b)))


def _mod_const(a: Expr, c: int) -> DimLike:
    if c == 1:
        return 0
    _, r = _split(a, c)
    if isinstance(r, int):
        return r % c
    if divisor(r - r.const) % c == 0:  # (Y + k) % c == k % c when c | Y
        return r.const % c
    g = math.gcd(_gcd_content(r), c)
    if g > 1:
        inner = Expr.from_terms({m: coef // g for m, coef in r.terms}, r.const // g)
        return g * mod(inner, c // g)
    lo, hi = interval(r)
    if lo != -INF and hi != INF and lo // c == hi // c:
        return r - int(lo // c) * c
    if all(coef < 0 for _, coef in r.terms):
        # r = -y, or -(y % c) (== -y modulo c): what pads y up to a multiple of c, as exporters write it (HF Swin's
        # `(-(y % c)) % c`, or `(c - y % c) % c`), is c * ceil(y / c) - y for every integer y, so y plus it is
        # c * ceil(y / c): a multiple of c the canonical form shows (a padded map's windows divide its size)
        y = _mod_arg(r, c)
        y = -r if y is None else y
        return c * floordiv(y + (c - 1), c) - y
    return _pinned(OpAtom("mod", (r, c)))


def _mod_arg(r: Expr, c: int) -> DimLike | None:
    """y where r is -(y % c), else None."""
    if r.const != 0 or len(r.terms) != 1:
        return None
    (mono, coef), = r.terms
    atom = mono[0] if len(mono) == 1 else None
    if coef != -1 or not isinstance(atom, OpAtom) or atom.op != "mod" or atom.args[1] != c:
        return None
    return atom.args[0]


def _minmax(op: str, args: tuple) -> DimLike:
    flat: list = []
    for x in args:
        x = as_dim(x)
        if isinstance(x, Expr) and x.is_atom() and isinstance(x.atom(), OpAtom) and x.atom().op == op:
            flat.extend(x.atom().args)
        else:
            flat.append(x)
    ints = [x for x in flat if isinstance(x, int)]
    exprs: list = []
    for x in flat:
        if isinstance(x, Expr) and x not in exprs:
            exprs.append(x)
    pick = min if op == "min" else max
    cands = ([pick(ints)] if ints else []) + exprs
    # drop every candidate that another candidate provably dominates
    keep: list = []
    for i, x in enumerate(cands):
        dominated = False
        for j, y in enumerate(cands):
            if i == j:
                continue
            lo, hi = interval(x - y)
            # min: drop x when y <= x everywhere; when they are provably equal keep the earlier one
            if op == "min" and lo >= 0 and (hi > 0 or j < i):
                dominated = True
            if op == "max" and hi <= 0 and (lo < 0 or j < i):
                dominated = True
            if dominated:
                break
        if not dominated:
            keep.append(x)
    if len(keep) == 1:
        return keep[0]
    keep.sort(key=lambda x: (0, x) if isinstance(x, int) else (1, x.key))
    return Expr.from_atom(OpAtom(op, tuple(keep)))


def min_(*args: DimLike) -> DimLike:
    """Minimum of dimensions (two or more)."""
    if len(args) < 2:
        raise ShapeError("min_ needs at least two arguments")
    return _minmax("min", args)


def max_(*args: DimLike) -> DimLike:
    """Maximum of dimensions (two or more)."""
    if len(args) < 2:
        raise ShapeError("max_ needs at least two arguments")
    return _minmax("max", args)


def ceil_div(a: DimLike, b: DimLike) -> DimLike:
    """ceil(a / b) for a positive divisor b, as (a + b - 1) // b (exact for every integer a)."""
    a, b = as_dim(a), as_dim(b)
    if isinstance(b, int) and b < 0 or isinstance(b, Expr) and interval(b)[1] < 0:
        return -floordiv(-a, b)
    return floordiv(a + b - 1, b)


# ---- substitution and simplification -----------------------------------------------------------
def _rebuild(e: DimLike, atom_fn) -> DimLike:
    if isinstance(e, int):
        return e
    total: DimLike = e.const
    for m, c in e.terms:
        p: DimLike = c
        for a in m:
            p = p * atom_fn(a)
        total = total + p
    return total


def _apply_atom(a: OpAtom, args: list) -> DimLike:
    if a.op == "fdiv":
        return floordiv(*args)
    if a.op == "mod":
        return mod(*args)
    return _minmax(a.op, tuple(args))


def substitute(e: DimLike, mapping: dict) -> DimLike:
    """Replace symbols (keys: names or Symbols) by ints/expressions and re-canonicalise."""
    by_name = {(k.name if isinstance(k, Symbol) else k.atom().name if isinstance(k, Expr) else k): v
               for k, v in mapping.items()}
    memo: dict = {}

    def atom_fn(a):
        if a in memo:
            return memo[a]
        if isinstance(a, Symbol):
            out = as_dim(by_name[a.name]) if a.name in by_name else Expr.from_atom(a)
        else:
            out = _apply_atom(a, [substitute(x, by_name) for x in a.args])
        memo[a] = out
        return out

    return _rebuild(e, atom_fn)


def simplify(e: DimLike) -> DimLike:
    """Canonical form using every symbol's range and divisibility (see the module docstring)."""
    e = as_dim(e)
    return e if isinstance(e, int) else _simplify(e)


@functools.lru_cache(maxsize=200_000)  # expressions are immutable and hashable
def _simplify(e: Expr) -> DimLike:

    def atom_fn(a):
        if isinstance(a, Symbol):
            return Expr.from_atom(a)
        return _apply_atom(a, [simplify(x) for x in a.args])

    out = _exact_divisions(_rebuild(e, atom_fn))
    if isinstance(out, Expr):  # sound bounds that pin one value: the expression is that constant
        lo, hi = interval(out)
        if lo == hi and lo not in (INF, -INF):
            return int(lo)
    return out


def _exact_divisions(e: DimLike) -> DimLike:
    """c*(X // d) -> (c/d)*X when d | c and d | X;  d*k*(X // d) + k*(X % d) -> k*X."""
    if isinstance(e, int):
        return e
    d = dict(e.terms)
    changed = False
    for m, c in list(d.items()):
        if len(m) != 1 or not isinstance(m[0], OpAtom) or m[0].op != "fdiv" or not isinstance(m[0].args[1], int):
            continue
        x, k = m[0].args
        if c % k == 0 and divisor(x) % k == 0:
            del d[m]
            _add_into(d, x, c // k)
            changed = True
            continue
        mod_m = (OpAtom("mod", (x, k)),)
        if c % k == 0 and d.get(mod_m) == c // k:
            del d[m]
            del d[mod_m]
            _add_into(d, x, c // k)
            changed = True
    if not changed:
        return e
    const = d.pop((), 0) + e.const
    return _exact_divisions(Expr.from_terms(d, const))


def _add_into(d: dict, x: DimLike, k: int) -> None:
    if isinstance(x, int):
        d[()] = d.get((), 0) + k * x
        return
    d[()] = d.get((), 0) + k * x.const
    for m, c in x.terms:
        d[m] = d.get(m, 0) + k * c


def substitute_atom(e: DimLike, target: OpAtom, value: DimLike) -> DimLike:
    """Replace every occurrence of one atom (also inside other atoms) by a value."""

    def atom_fn(a):
        if a == target:
            return value
        if isinstance(a, Symbol):
            return Expr.from_atom(a)
        return _apply_atom(a, [substitute_atom(x, target, value) for x in a.args])

    return _rebuild(e, atom_fn)
