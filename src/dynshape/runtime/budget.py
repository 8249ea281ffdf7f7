"""Worst-case memory from the symbol ranges, budgets, and the arenas planned calls run in.

Two numbers bound the arena of a memory plan over every admissible shape:
- the sound bound: the sum of every planned buffer's size (+ alignment), as an expression of the symbols,
  evaluated with `bounds`.  First-fit places each buffer at or below the end of those placed before it, so an
  arena never exceeds the sum of its buffers: this holds whatever the layout does.
- the layout at the upper bounds: `Planner.layout` at the key with every symbol at its maximum.  Alone it is
  no bound (first-fit is not monotone in the sizes), but when every buffer's largest size over the ranges is
  the one at that key (checked per buffer with `bounds`), placing buffers at *those* offsets for every key is
  valid: intervals that do not overlap at their largest never overlap when smaller.  Then the layout at the
  upper bounds is the arena every key fits in, and that is what `preallocate` reserves and budgets compare.
  Otherwise the sound bound is used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynshape.errors import DynshapeError
from dynshape.runtime.plan import ALIGN, Planner
from dynshape.sym import Expr, bounds, simplify, substitute, sym

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(x: int | str) -> int:
    """`2GiB`, `512 MiB`, `1.5GB`, `4096` -> bytes."""
    if isinstance(x, int) and not isinstance(x, bool) and x >= 0:
        return x
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([A-Za-z]*)\s*", str(x))
    if not m or m.group(2).lower() not in _UNITS:
        raise DynshapeError(f"memory_budget={x!r}: expected bytes as an int or a size like '2GiB', '512MB'")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "unbounded"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} B"


@dataclass
class Worst:
    """The worst-case arena of one build over a box of symbol values (see the module docstring)."""

    at: dict[str, int]  # the key the layout is taken at: every symbol at its upper bound
    expr: Any  # sound bound in bytes, as an expression of the symbols
    sound: int | None
    layout: int | None
    offsets: dict | None  # the layout's offsets at `at`: valid for every key of the box when `monotone`
    monotone: bool
    unbounded: list[str]

    @property
    def reserve(self) -> int | None:
        """Bytes an arena needs so that every key of the box fits without growing it."""
        return self.layout if self.monotone else self.sound

    def as_dict(self) -> dict:
        return {"at": self.at, "sound_bytes": self.sound, "sound_expr": str(self.expr), "layout_at_max": self.layout,
                "monotone": self.monotone, "reserve": self.reserve, "unbounded": self.unbounded,
                "text": self.text()}

    def text(self) -> str:
        if self.unbounded:
            return f"unbounded: no upper bound on {', '.join(self.unbounded)}"
        at = ", ".join(f"{k}={v}" for k, v in self.at.items())
        how = ("every buffer is largest there (proved per buffer), so that layout holds every shape"
               if self.monotone else "some buffer is not largest there, so the sound bound is the reserve")
        return (f"arena {fmt_bytes(self.reserve)}: layout at the upper bounds ({at}) {fmt_bytes(self.layout)}, "
                f"{how}; sound bound (sum of all buffers) {fmt_bytes(self.sound)} = {self.expr}")


def worst_case(planner: Planner, symbols: list, his: dict[str, int] | None = None) -> Worst:
    """Worst case of `planner`'s build with each symbol up to its declared max, or up to `his[name]`."""
    his = his or {}
    g = planner.graph
    narrow = {s.name: sym(s.name, s.lo, his[s.name], s.mult) for s in symbols if s.name in his}
    sizes: dict[str, Any] = {}
    for b in planner.buffers:
        t = g.types[b]
        e: Any = np.dtype(t.dtype).itemsize
        for d in t.shape:
            e = e * d
        sizes[b] = substitute(e, narrow) if narrow and isinstance(e, Expr) else e
    expr = simplify(sum(sizes.values()) + ALIGN * len(sizes))
    free = expr.free_symbols if isinstance(expr, Expr) else frozenset()
    top = {s.name: his.get(s.name, s.hi) for s in symbols}
    unbounded = [s.name for s in symbols if s.name in free and top[s.name] is None]
    at = {n: v if v is not None else s.lo for (n, v), s in zip(top.items(), symbols)}
    if unbounded:
        return Worst(at, expr, None, None, None, False, unbounded)
    ub = {b: bounds(e)[1] if isinstance(e, Expr) else e for b, e in sizes.items()}
    at_size = {b: e.evaluate(at) if isinstance(e, Expr) else e for b, e in sizes.items()}
    _, offsets, total = planner.layout(tuple(at.values()))
    sound = sum(ub.values()) + ALIGN * len(ub)
    return Worst(at, expr, sound, total, offsets, all(ub[b] == at_size[b] for b in sizes), [])


def drivers(planner: Planner, symbols: list, worst: Worst) -> list[tuple[str, float]]:
    """Symbols the worst case grows with, largest factor first: (name, reserve at max / reserve at min)."""
    out = []
    free = worst.expr.free_symbols if isinstance(worst.expr, Expr) else frozenset()
    for s in symbols:
        if s.name in free and s.hi is not None and s.hi > s.lo:
            low = worst_case(planner, symbols, {s.name: s.lo}).reserve or 1
            out.append((s.name, worst.reserve / low))
    return sorted(out, key=lambda x: -x[1])


def largest_fit(planner: Planner, symbols: list, name: str, budget: int) -> int | None:
    """Largest max of one symbol (the others at their max) whose worst case fits `budget`; None if none does."""
    s = next(s for s in symbols if s.name == name)

    def fits(m: int) -> bool:
        return (worst_case(planner, symbols, {name: m}).reserve or 0) <= budget

    lo, hi = 0, (s.hi - s.lo) // s.mult  # search over the multiples s.lo + i * s.mult
    if not fits(s.lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(s.lo + mid * s.mult) else (lo, mid - 1)
    return s.lo + lo * s.mult


def over_budget_text(planner: Planner, symbols: list, worst: Worst, budget: int) -> str:
    """Which symbols drive the worst case and the largest range of each that fits the budget."""
    grow = drivers(planner, symbols, worst)
    parts = []
    for name, _ in grow:
        m = largest_fit(planner, symbols, name, budget)
        others = ", ".join(f"{o} <= {worst.at[o]}" for o, _ in grow if o != name)
        at = f" at {others}" if others else ""
        parts.append(f"no range of {name} fits{at}" if m is None else f"{name} <= {m} fits {fmt_bytes(budget)}{at}")
    grows = ", ".join(f"{n} (x{f:.3g} over its range)" if f < 1000 else f"{n} (x{f:,.0f} over its range)"
                      for n, f in grow) or "nothing symbolic"
    return f"it grows with {grows}; " + "; ".join(parts)
