"""Canonical integer expressions over symbolic dimensions.

An `Expr` is a polynomial with integer coefficients whose variables ("atoms") are symbols or opaque
operations the polynomial ring cannot absorb: floor division, modulo, min and max. The polynomial part is
kept in a canonical sorted form, so equal polynomials compare equal, and an expression with no variables
collapses to a plain `int`. Range- and divisibility-aware rewrites of the opaque atoms live in `rewrite.py`.
"""

from __future__ import annotations

import math
from typing import Union

from dynshape.errors import ShapeError

# A monomial: a sorted tuple of atoms, repeated for powers. () is the constant monomial.
Mono = tuple
DimLike = Union[int, "Expr"]

_INF = math.inf


class Atom:
    """A variable of the polynomial ring: a Symbol or an opaque operation."""

    __slots__ = ("key", "_hash", "syms")

    def evaluate(self, env: dict[str, int]) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def __lt__(self, other: Atom) -> bool:
        return self.key < other.key


class Symbol(Atom):
    """A named dimension with a range [lo, hi] (hi None = unbounded) and a divisor it is a multiple of."""

    __slots__ = ("name", "lo", "hi", "mult")

    def __init__(self, name: str, lo: int, hi: int | None, mult: int):
        self.name, self.lo, self.hi, self.mult = name, lo, hi, mult
        self.key = (0, name, lo, -1 if hi is None else hi, mult)
        self._hash = hash(self.key)
        self.syms = frozenset((self,))

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Symbol) and self.key == other.key)

    def __hash__(self) -> int:
        return self._hash

    def evaluate(self, env: dict[str, int]) -> int:
        try:
            return env[self.name]
        except KeyError:
            raise ShapeError(f"no value for symbol {self.name!r} (have {sorted(env)})") from None

    def describe(self) -> str:
        hi = "inf" if self.hi is None else str(self.hi)
        mult = f", multiple of {self.mult}" if self.mult > 1 else ""
        return f"{self.name} in [{self.lo}, {hi}]{mult}"

    def __repr__(self) -> str:
        return self.name


class OpAtom(Atom):
    """floordiv / mod / min / max of expressions: opaque to the polynomial ring."""

    __slots__ = ("op", "args")

    def __init__(self, op: str, args: tuple):
        self.op, self.args = op, args
        self.key = (1, op, tuple(_key_of(a) for a in args))
        self._hash = hash(self.key)
        syms: frozenset = frozenset()
        for a in args:
            if isinstance(a, Expr):
                syms = _merge_syms(syms, a.syms)
        self.syms = syms

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, OpAtom) and self.key == other.key)

    def __hash__(self) -> int:
        return self._hash

    def evaluate(self, env: dict[str, int]) -> int:
        vals = [a.evaluate(env) if isinstance(a, Expr) else a for a in self.args]
        if self.op == "min":
            return min(vals)
        if self.op == "max":
            return max(vals)
        if vals[1] == 0:
            raise ShapeError(f"division by zero evaluating {self} at {env}")
        return vals[0] // vals[1] if self.op == "fdiv" else vals[0] % vals[1]

    def __repr__(self) -> str:
        if self.op in ("min", "max"):
            return f"{self.op}({', '.join(str(a) for a in self.args)})"
        num, den = self.args
        sign = "//" if self.op == "fdiv" else " % "
        return f"{_paren(num)}{sign}{_paren(den)}"


def _paren(x: DimLike) -> str:
    s = str(x)
    if isinstance(x, int):
        return f"({s})" if x < 0 else s
    if x.is_atom() and (isinstance(x.atom(), Symbol) or x.atom().op in ("min", "max")):
        return s
    return f"({s})"


def _key_of(x: DimLike) -> tuple:
    return (0, x) if isinstance(x, int) else (1, x.key)


def _merge_syms(a: frozenset, b: frozenset) -> frozenset:
    if not a or a is b:
        return b
    if not b:
        return a
    u = a | b
    if len(u) != len(a) and len(u) != len(b):
        names = {s.name for s in u}
        if len(names) != len(u):
            by: dict[str, list[Symbol]] = {}
            for s in u:
                by.setdefault(s.name, []).append(s)
            bad = next(v for v in by.values() if len(v) > 1)
            raise ShapeError(
                "two different symbols share the name "
                f"{bad[0].name!r} ({'; '.join(s.describe() for s in bad)}): they come from unrelated symbol "
                "contexts; declare each symbol once and reuse it"
            )
    return u


class Expr:
    """A canonical polynomial over atoms. Never constant: constants are plain ints."""

    __slots__ = ("terms", "const", "key", "_hash", "syms", "__weakref__")

    def __init__(self, terms: tuple, const: int, syms: frozenset):
        self.terms = terms  # tuple of (Mono, coeff), sorted by mono key, coeff != 0, mono != ()
        self.const = const
        self.key = (tuple((tuple(a.key for a in m), c) for m, c in terms), const)
        self._hash = hash(self.key)
        self.syms = syms

    # ---- construction -------------------------------------------------------------------------
    @staticmethod
    def from_terms(d: dict, const: int = 0) -> DimLike:
        """Canonical constructor from {mono: coeff}; collapses to int when no variable remains."""
        items = [(m, c) for m, c in d.items() if c != 0]
        if not items:
            return const
        items.sort(key=lambda mc: tuple(a.key for a in mc[0]))
        syms: frozenset = frozenset()
        for m, _ in items:
            for a in m:
                syms = _merge_syms(syms, a.syms)
        return Expr(tuple(items), const, syms)

    @staticmethod
    def from_atom(a: Atom) -> Expr:
        return Expr((((a,), 1),), 0, a.syms)

    def is_atom(self) -> bool:
        return self.const == 0 and len(self.terms) == 1 and self.terms[0][1] == 1 and len(self.terms[0][0]) == 1

    def atom(self) -> Atom:
        return self.terms[0][0][0]

    def as_dict(self) -> dict:
        return dict(self.terms)

    # ---- arithmetic ---------------------------------------------------------------------------
    def __add__(self, other: DimLike) -> DimLike:
        other = as_dim(other)
        if isinstance(other, int):
            return self if other == 0 else Expr(self.terms, self.const + other, self.syms)
        d = dict(self.terms)
        for m, c in other.terms:
            d[m] = d.get(m, 0) + c
        return Expr.from_terms(d, self.const + other.const)

    __radd__ = __add__

    def __neg__(self) -> Expr:
        return Expr(tuple((m, -c) for m, c in self.terms), -self.const, self.syms)

    def __sub__(self, other: DimLike) -> DimLike:
        return self + (-as_dim(other))

    def __rsub__(self, other: DimLike) -> DimLike:
        return (-self) + as_dim(other)

    def __mul__(self, other: DimLike) -> DimLike:
        other = as_dim(other)
        if isinstance(other, int):
            if other == 0:
                return 0
            if other == 1:
                return self
            return Expr(tuple((m, c * other) for m, c in self.terms), self.const * other, self.syms)
        d: dict = {}
        a_terms = list(self.terms) + ([((), self.const)] if self.const else [])
        b_terms = list(other.terms) + ([((), other.const)] if other.const else [])
        for ma, ca in a_terms:
            for mb, cb in b_terms:
                m = tuple(sorted(ma + mb)) if ma and mb else (ma or mb)
                d[m] = d.get(m, 0) + ca * cb
        const = d.pop((), 0)
        return Expr.from_terms(d, const)

    __rmul__ = __mul__

    def __floordiv__(self, other: DimLike) -> DimLike:
        from dynshape.sym.rewrite import floordiv

        return floordiv(self, other)

    def __rfloordiv__(self, other: DimLike) -> DimLike:
        from dynshape.sym.rewrite import floordiv

        return floordiv(other, self)

    def __mod__(self, other: DimLike) -> DimLike:
        from dynshape.sym.rewrite import mod

        return mod(self, other)

    def __rmod__(self, other: DimLike) -> DimLike:
        from dynshape.sym.rewrite import mod

        return mod(other, self)

    def __truediv__(self, other: object):
        raise ShapeError(f"true division is not defined on dimensions ({self} / {other}); use // or ceil_div")

    __rtruediv__ = __truediv__

    def __pow__(self, n: int) -> DimLike:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ShapeError(f"only non-negative integer powers of dimensions are defined, got {n!r}")
        out: DimLike = 1
        for _ in range(n):
            out = out * self
        return out

    # ---- comparisons build conditions; == is canonical equality -------------------------------
    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Expr) and self.key == other.key)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return self._hash

    def __lt__(self, other: DimLike):
        from dynshape.sym.cond import lt

        return lt(self, other)

    def __le__(self, other: DimLike):
        from dynshape.sym.cond import le

        return le(self, other)

    def __gt__(self, other: DimLike):
        from dynshape.sym.cond import lt

        return lt(other, self)

    def __ge__(self, other: DimLike):
        from dynshape.sym.cond import le

        return le(other, self)

    def __bool__(self) -> bool:
        raise ShapeError(f"the truth value of the dimension {self} is not defined; compare it explicitly")

    def __index__(self) -> int:
        raise ShapeError(f"{self} is symbolic, not a concrete integer")

    def __int__(self) -> int:
        raise ShapeError(f"{self} is symbolic, not a concrete integer")

    # ---- inspection ---------------------------------------------------------------------------
    @property
    def free_symbols(self) -> frozenset:
        return frozenset(s.name for s in self.syms)

    @property
    def symbols(self) -> frozenset:
        """The Symbol objects (with their ranges) this expression depends on."""
        return self.syms

    def evaluate(self, env: dict[str, int]) -> int:
        total = self.const
        for m, c in self.terms:
            p = c
            for a in m:
                p *= a.evaluate(env)
            total += p
        return total

    def subs(self, mapping: dict) -> DimLike:
        """Replace symbols (by name or Symbol) with ints or expressions, re-canonicalising."""
        from dynshape.sym.rewrite import substitute

        return substitute(self, mapping)

    def __repr__(self) -> str:
        parts: list[str] = []
        for m, c in self.terms:
            factors = []
            i = 0
            while i < len(m):
                j = i
                while j < len(m) and m[j] == m[i]:
                    j += 1
                a, n = m[i], j - i
                s = repr(a)
                if isinstance(a, OpAtom) and a.op in ("fdiv", "mod") and (len(m) > 1 or c != 1 or n > 1):
                    s = f"({s})"
                factors.append(s if n == 1 else f"{s}**{n}")
                i = j
            body = "*".join(factors)
            if c == 1:
                term, neg = body, False
            elif c == -1:
                term, neg = body, True
            else:
                term, neg = f"{abs(c)}*{body}", c < 0
            parts.append(("-" if neg else "+", term))
        if self.const:
            parts.append(("-" if self.const < 0 else "+", str(abs(self.const))))
        out = ("-" if parts[0][0] == "-" else "") + parts[0][1]
        for sign, t in parts[1:]:
            out += f" {sign} {t}"
        return out

    __str__ = __repr__


def as_dim(x: object) -> DimLike:
    """Validate and normalise a dimension-like value: admit ints (incl. numpy ints) and Exprs; reject
    everything else with a clear error."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        raise ShapeError(f"a boolean is not a dimension: {x!r}")
    if isinstance(x, int):
        return x
    try:
        import numpy as np

        if isinstance(x, np.integer):
            return int(x)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(x, float) and x.is_integer():
        raise ShapeError(f"dimensions are integers; got the float {x!r} (use int({x!r}))")
    raise ShapeError(f"dimensions are integers or symbolic expressions; got {type(x).__name__} {x!r}")


def is_expr(x: object) -> bool:
    return isinstance(x, Expr)


def as_int(x: object) -> int | None:
    """The value of a constant dimension, else None."""
    if isinstance(x, Expr):
        return None
    return int(as_dim(x))
