"""Conditions on dimensions and the three-valued prover.

Every condition is normalised to one of: e >= 0, e == 0, e != 0, k | e. `prove` answers True (holds at every
admissible assignment), False (fails at every one) or None; it never turns "don't know" into False.
"""

from __future__ import annotations

import functools
import math

from dynshape.errors import ShapeError
from dynshape.sym.bounds import atom_divisor, interval, without_fdiv
from dynshape.sym.expr import DimLike, Expr, OpAtom, as_dim
from dynshape.sym.rewrite import mod, simplify, substitute_atom

_MAX_DEPTH = 4


class Cond:
    """A condition over dimensions. `bool()` proves it or raises ShapeError; never a silent False."""

    __slots__ = ("kind", "expr", "k", "text")

    def __init__(self, kind: str, expr: DimLike, text: str, k: int = 0):
        self.kind, self.expr, self.text, self.k = kind, expr, text, k

    def __bool__(self) -> bool:
        r = prove(self)
        if r is None:
            raise ShapeError(f"cannot decide whether {self.text} for every admissible value of "
                             f"{_describe_syms(self.expr)}")
        return r

    def negate(self) -> Cond:
        neg = {"ge": None, "eq": "ne", "ne": "eq"}
        if self.kind == "ge":  # not (e >= 0)  <=>  -e - 1 >= 0
            return Cond("ge", -self.expr - 1, f"not ({self.text})")
        if self.kind == "div":
            raise ShapeError(f"cannot negate divisibility condition {self.text}")
        return Cond(neg[self.kind], self.expr, f"not ({self.text})")

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cond) and (self.kind, self.expr, self.k) == (other.kind, other.expr, other.k)

    def __hash__(self) -> int:
        return hash((self.kind, self.expr, self.k))

    def evaluate(self, env: dict[str, int]) -> bool:
        v = self.expr.evaluate(env) if isinstance(self.expr, Expr) else self.expr
        return {"ge": v >= 0, "eq": v == 0, "ne": v != 0, "div": self.k != 0 and v % self.k == 0}[self.kind]

    @property
    def free_symbols(self) -> frozenset:
        return self.expr.free_symbols if isinstance(self.expr, Expr) else frozenset()


def _describe_syms(e: DimLike) -> str:
    if isinstance(e, int):
        return "its symbols"
    return ", ".join(s.describe() for s in sorted(e.syms, key=lambda s: s.name))


def lt(a: DimLike, b: DimLike) -> Cond:
    a, b = as_dim(a), as_dim(b)
    return Cond("ge", b - a - 1, f"{a} < {b}")


def le(a: DimLike, b: DimLike) -> Cond:
    a, b = as_dim(a), as_dim(b)
    return Cond("ge", b - a, f"{a} <= {b}")


def eq(a: DimLike, b: DimLike) -> Cond:
    """The condition a == b (Python's == on expressions is canonical-form equality, not this)."""
    a, b = as_dim(a), as_dim(b)
    return Cond("eq", a - b, f"{a} == {b}")


def ne(a: DimLike, b: DimLike) -> Cond:
    a, b = as_dim(a), as_dim(b)
    return Cond("ne", a - b, f"{a} != {b}")


def divides(k: int, e: DimLike) -> Cond:
    """The condition that the positive integer k divides e."""
    k = as_dim(k)
    if not isinstance(k, int) or k < 1:
        raise ShapeError(f"divides(k, e) needs a positive integer k, got {k}")
    e = as_dim(e)
    return Cond("div", e, f"{k} divides {e}", k=k)


def prove(c: Cond) -> bool | None:
    """True if c holds for every admissible assignment, False if it fails for every one, else None."""
    if not isinstance(c, Cond):
        if isinstance(c, bool):
            return c
        raise ShapeError(f"prove() takes a condition, got {type(c).__name__} {c!r}")
    return _prove(c)


@functools.lru_cache(maxsize=200_000)  # conditions are immutable and hashable; shape inference re-asks a lot
def _prove(c: Cond) -> bool | None:
    e = simplify(c.expr)
    if c.kind == "ge":
        return _nonneg(e, 0)
    if c.kind == "div":
        r = mod(e, c.k)
        if isinstance(r, int):
            return r == 0
        return False if interval(r)[0] >= 1 else None
    is_zero = _zero(e)
    if c.kind == "eq":
        return is_zero
    return None if is_zero is None else not is_zero


def _zero(e: DimLike) -> bool | None:
    if isinstance(e, int):
        return e == 0
    lo, hi = interval(e)
    if lo > 0 or hi < 0:
        return False
    g = 0
    for m, coef in e.terms:
        d = abs(coef)
        for a in m:
            d *= atom_divisor(a)
        g = math.gcd(g, d)
    if g > 1 and e.const % g:
        return False
    up, down = _nonneg(e, 0), _nonneg(-e, 0)
    if up and down:
        return True
    if up is False or down is False:
        return False
    return None


def _nonneg(e: DimLike, depth: int) -> bool | None:
    if isinstance(e, int):
        return e >= 0
    lo, hi = interval(e)
    if lo >= 0:
        return True
    if hi < 0:
        return False
    if depth >= _MAX_DEPTH:
        return None
    for attempt in (_split_minmax, _eliminate_fdiv):
        r = attempt(e, depth)
        if r is not None:
            return r
    return None


def _atoms(e: Expr):
    for m, _ in e.terms:
        yield from m


def _nested_in(e: DimLike, a: OpAtom) -> bool:
    """Whether atom a occurs inside another atom of e (so e is not simply R + c*a with R free of a)."""
    if isinstance(e, int):
        return False
    for x in _atoms(e):
        if isinstance(x, OpAtom) and x != a:
            for arg in x.args:
                if isinstance(arg, Expr) and (any(y == a for y in _atoms(arg)) or _nested_in(arg, a)):
                    return True
    return False


def _nonneg_after(e: Expr, a: OpAtom, arg: DimLike, depth: int) -> bool | None:
    """e >= 0 with atom a replaced by arg; None when the substitution is not even well-defined."""
    try:
        return _nonneg(simplify(substitute_atom(e, a, arg)), depth + 1)
    except ShapeError:  # e.g. a divisor that is positive only thanks to the min/max
        return None


def _split_minmax(e: Expr, depth: int) -> bool | None:
    """Case analysis on one min/max atom: at every point it equals one of its arguments."""
    a = next((x for x in _atoms(e) if isinstance(x, OpAtom) and x.op in ("min", "max")), None)
    if a is None:
        return None
    linear = [(m, c) for m, c in e.terms if a in m]
    if len(linear) == 1 and linear[0][0] == (a,) and not _nested_in(e, a):
        # e = R + c*atom: min <= arg_i and max >= arg_i give one-sided bounds from a single argument
        c = linear[0][1]
        lower_bound_from_one = (a.op == "min") == (c < 0)
        results = [_nonneg_after(e, a, arg, depth) for arg in a.args]
        if lower_bound_from_one and any(r is True for r in results):
            return True
        if not lower_bound_from_one and any(r is False for r in results):
            return False
    else:
        results = [_nonneg_after(e, a, arg, depth) for arg in a.args]
    if all(r is True for r in results):
        return True
    if all(r is False for r in results):
        return False
    return None


def _eliminate_fdiv(e: Expr, depth: int) -> bool | None:
    """Decide on scale*e with every linear X//d written as (X - X%d)/d (see bounds.without_fdiv)."""
    rewritten = without_fdiv(e)
    if rewritten is None:
        return None
    out, scale = rewritten
    if isinstance(out, int):
        return out >= 0
    lo, hi = interval(out)
    if lo > -scale:  # e is an integer in [ceil(lo/scale), floor(hi/scale)]
        return True
    if hi < 0:
        return False
    return _split_minmax(out, depth + 1) if depth + 1 < _MAX_DEPTH else None

