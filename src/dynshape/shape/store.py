"""The constraint store: what a graph's symbols are known to satisfy, and where each fact came from.

- Equalities merge symbols (union-find by substitution: each eliminated symbol maps to an int or an
  expression over the remaining ones); merging intersects ranges and takes the lcm of divisors.
- Simple facts on a bare symbol (x >= c, x <= c, k | x) refine that symbol's declaration.
- Everything else that is not provable stays a residual fact, checked on every call at run time.
A fact that contradicts what is known raises ShapeError listing the clashing facts and their origins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dynshape.errors import ShapeError
from dynshape.sym import Cond, Expr, Symbol, divides, eq, le, prove, simplify, substitute
from dynshape.sym.expr import DimLike, as_dim


@dataclass(frozen=True)
class Fact:
    text: str
    origin: str


class ConstraintStore:
    """Symbols of one graph with merged ranges/divisors, equalities and residual facts, with provenance."""

    def __init__(self) -> None:
        self.symbols: dict[str, Symbol] = {}  # live (not eliminated) symbols, current declaration
        self.bindings: dict[str, DimLike] = {}  # eliminated symbol -> int or expression over live ones
        self.history: dict[str, list[Fact]] = {}  # per symbol: the facts that shaped it
        self.residual: list[tuple[Cond, str]] = []  # facts checked at run time
        self.equalities: list[Fact] = []

    # ---- declarations -------------------------------------------------------------------------
    def declare(self, s: Expr | Symbol, origin: str = "declared") -> Expr:
        """Register a symbol; declaring the same name twice merges the two declarations."""
        atom = s if isinstance(s, Symbol) else s.atom()
        if atom.name in self.bindings:
            return self.resolve(Expr.from_atom(atom))
        old = self.symbols.get(atom.name)
        self.history.setdefault(atom.name, []).append(Fact(atom.describe(), origin))
        if old is None or old == atom:
            self.symbols[atom.name] = atom
            return Expr.from_atom(atom)
        return self._refine(atom.name, max(old.lo, atom.lo), _min_hi(old.hi, atom.hi), math.lcm(old.mult, atom.mult))

    def _refine(self, name: str, lo: int, hi: int | None, mult: int) -> Expr:
        lo = -(-lo // mult) * mult
        hi = None if hi is None else (hi // mult) * mult
        if hi is not None and lo > hi:
            self._clash(name, f"{name} has no admissible value left (needs [{lo}, {hi}], multiple of {mult})")
        new = Symbol(name, lo, hi, mult)
        self.symbols[name] = new
        if self.bindings:  # re-express bindings over the refined symbol
            self.bindings = {k: self._subst(v) for k, v in self.bindings.items()}
        return Expr.from_atom(new)

    def _clash(self, name: str, what: str, extra: list[Fact] = (), fix: str | None = None,
               others: tuple = ()) -> None:
        facts = [f for n in (name, *others) for f in self.history.get(n, [])] + list(extra)
        lines = "\n".join(f"  - {f.text}  (from {f.origin})" for f in facts)
        hint = f"\nfix: {fix}" if fix else ""
        raise ShapeError(f"contradiction on {name}: {what}\nthe clashing facts:\n{lines}{hint}")

    # ---- resolution ---------------------------------------------------------------------------
    def _subst(self, e: DimLike) -> DimLike:
        if isinstance(e, int):
            return e
        mapping = {}
        for s in e.syms:
            if s.name in self.bindings:
                mapping[s.name] = self.bindings[s.name]
            elif s.name in self.symbols and self.symbols[s.name] != s:
                mapping[s.name] = Expr.from_atom(self.symbols[s.name])
        return simplify(substitute(e, mapping)) if mapping else e

    def resolve(self, e: DimLike) -> DimLike:
        """e with eliminated symbols replaced and refined declarations applied, simplified."""
        e = as_dim(e)
        if isinstance(e, Expr):
            for s in e.syms:
                if s.name not in self.symbols and s.name not in self.bindings:
                    self.declare(s, "first seen")
        return self._subst(e)

    # ---- facts --------------------------------------------------------------------------------
    def equate(self, a: DimLike, b: DimLike, origin: str) -> DimLike:
        """Record a == b; returns the merged dim. Raises ShapeError when impossible."""
        a, b = self.resolve(a), self.resolve(b)
        diff = simplify(a - b)
        text = f"{a} == {b}"
        if isinstance(diff, int):
            if diff:
                self._impossible(text, origin, a, b)
            return a
        verdict = prove(eq(diff, 0))
        if verdict is False:
            self._impossible(text, origin, a, b)
        self.equalities.append(Fact(text, origin))
        if verdict is True:
            return a
        target = self._pick_eliminable(diff)
        if target is None:
            self.residual.append((eq(a, b), origin))
            return a
        s, value = target
        self._bind(s, value, text, origin)
        return self.resolve(a)

    def _impossible(self, text: str, origin: str, a: DimLike, b: DimLike) -> None:
        names = sorted((a.free_symbols if isinstance(a, Expr) else set()) | (b.free_symbols if isinstance(b, Expr)
                                                                              else set()))
        if names:
            fix = None
            if isinstance(b, int) and len(names) == 1:
                what = names[0] if str(a) == names[0] else f"{a} (over {names[0]})"
                fix = (f"{what} must equal {b} here: change the declaration of {names[0]} to allow it, "
                       "or feed this model only shapes that make it so")
            self._clash(names[0], f"{text} can never hold", [Fact(text, origin)], fix=fix, others=tuple(names[1:]))
        raise ShapeError(f"{text} is impossible (from {origin})")

    def _pick_eliminable(self, diff: Expr) -> tuple | None:
        """A symbol x with coefficient +-1 appearing only linearly: diff == 0 gives x = -(rest)/coef."""
        cands = []
        for m, c in diff.terms:
            if len(m) == 1 and isinstance(m[0], Symbol) and c in (1, -1):
                x = m[0]
                rest = simplify(diff - c * Expr.from_atom(x))
                if isinstance(rest, Expr) and x.name in rest.free_symbols:
                    continue
                cands.append((x.name.startswith("?"), -x.hi if x.hi is not None else 0, x, simplify(-rest * c)))
        if not cands:
            return None
        # eliminate anonymous symbols first, so named ones survive in printed shapes
        cands.sort(key=lambda t: (not t[0], t[2].name))
        _, _, x, value = cands[0]
        return x, value

    def _bind(self, x: Symbol, value: DimLike, text: str, origin: str) -> None:
        fact = Fact(text, origin)
        self.history.setdefault(x.name, []).append(fact)
        if isinstance(value, int):
            if value < x.lo or (x.hi is not None and value > x.hi) or value % x.mult:
                fix = (f"{x.name} must equal {value} here: declare {x.name} so (e.g. min={value}, max={value}), "
                       f"or check the model")
                self._clash(x.name, f"{x.name} would be {value}, outside {x.describe()}", fix=fix)
            for cond, where in self.residual:  # a residual fact on x may now be decidable
                if x.name in cond.free_symbols:
                    c = Cond(cond.kind, substitute(cond.expr, {x.name: value}), cond.text, cond.k)
                    if prove(c) is False:
                        self._clash(x.name, f"{x.name} = {value} breaks {cond.text}", [Fact(cond.text, where)],
                                    others=tuple(n for n in sorted(cond.free_symbols) if n != x.name)
                                    + tuple(sorted(self._bound_via(cond))))
        elif isinstance(value, Expr) and value.is_atom() and isinstance(value.atom(), Symbol):
            y = value.atom()
            lo, hi, mult = max(x.lo, y.lo), _min_hi(x.hi, y.hi), math.lcm(x.mult, y.mult)
            self.history.setdefault(y.name, []).extend(self.history.get(x.name, []))
            del self.symbols[x.name]
            self.bindings[x.name] = value
            value = self._refine(y.name, lo, hi, mult)
            self.bindings[x.name] = value
            self.bindings = {k: self._subst(v) for k, v in self.bindings.items()}
            return
        del self.symbols[x.name]
        self.bindings[x.name] = value
        self.bindings = {k: self._subst(v) for k, v in self.bindings.items()}
        if isinstance(value, Expr):  # the expression must stay within x's declaration
            for name in value.free_symbols:  # x's history now constrains these symbols: keep it for messages
                self.history.setdefault(name, []).extend(f for f in self.history[x.name]
                                                         if f not in self.history[name])
            self.require(le(x.lo, value), origin, why=f"{x.name} >= {x.lo}")
            if x.hi is not None:
                self.require(le(value, x.hi), origin, why=f"{x.name} <= {x.hi}")
            if x.mult > 1:
                self.require(divides(x.mult, value), origin, why=f"{x.name} multiple of {x.mult}")

    def _bound_via(self, cond: Cond) -> set:
        """Eliminated symbols whose binding mentions the symbols of cond (their history explains it)."""
        names = cond.free_symbols
        return {k for k, v in self.bindings.items() if isinstance(v, Expr) and v.free_symbols & names}

    def require(self, cond: Cond, origin: str, why: str | None = None) -> None:
        """Record a fact that must hold. Bare-symbol bounds and divisors refine the symbol."""
        cond = Cond(cond.kind, self.resolve(cond.expr), cond.text, cond.k)
        verdict = prove(cond)
        if verdict is True:
            return
        if verdict is False:
            names = sorted(cond.free_symbols)
            extra = [Fact(cond.text if why is None else f"{why}: {cond.text}", origin)]
            if names:
                fix = None
                if cond.kind == "div":
                    fix = f"declare {names[0]} with a multiple_of that makes {cond.text}"
                self._clash(names[0], f"{cond.text} can never hold", extra, fix=fix)
            raise ShapeError(f"{cond.text} is false (from {origin})")
        e = cond.expr
        if isinstance(e, Expr) and len(e.terms) == 1 and len(e.terms[0][0]) == 1 and isinstance(e.terms[0][0][0],
                                                                                                   Symbol):
            x, c, k0 = e.terms[0][0][0], e.terms[0][1], e.const
            self.history.setdefault(x.name, []).append(Fact(cond.text, origin))
            if cond.kind == "div" and k0 == 0:
                self._refine(x.name, x.lo, x.hi, math.lcm(x.mult, cond.k // math.gcd(cond.k, abs(c))))
                return
            if cond.kind == "ge" and c > 0:  # c*x + k0 >= 0  <=>  x >= ceil(-k0 / c)
                self._refine(x.name, max(x.lo, -(k0 // c)), x.hi, x.mult)
                return
            if cond.kind == "ge" and c < 0:  # k0 - |c|*x >= 0  <=>  x <= floor(k0 / |c|)
                self._refine(x.name, x.lo, _min_hi(x.hi, k0 // -c), x.mult)
                return
            if cond.kind == "eq":
                self.equate(Expr.from_atom(x) * c, -k0, origin)
                return
        self.residual.append((cond, origin))

    # ---- reporting ----------------------------------------------------------------------------
    def residual_facts(self) -> list[tuple[Cond, str]]:
        """Residual facts re-resolved against everything learnt since; proven ones dropped."""
        out, seen = [], set()
        for cond, origin in self.residual:
            c = Cond(cond.kind, self.resolve(cond.expr), cond.text, cond.k)
            if prove(c) is True or c in seen:
                continue
            seen.add(c)
            out.append((c, origin))
        return out

    def describe(self) -> str:
        lines = [f"  {s.describe()}" for s in sorted(self.symbols.values(), key=lambda s: s.name)]
        lines += [f"  {k} = {v}" for k, v in sorted(self.bindings.items())]
        lines += [f"  requires {c.text}  ({o})" for c, o in self.residual_facts()]
        return "\n".join(lines)


def _min_hi(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)

