"""Bind symbol values from observed dimensions (the shapes inputs actually have).

Each observation says `expr == value`. Linear forms a*x + c with one unknown are solved directly, repeatedly,
as earlier bindings turn other observations linear; whatever stays unsolved is an error that names it.
"""

from __future__ import annotations

from dynshape.errors import ConstraintViolation, ShapeError
from dynshape.sym.expr import Expr, Symbol, as_dim
from dynshape.sym.rewrite import substitute


def _linear(e: Expr) -> tuple | None:
    """(symbol, a, c) when e == a*symbol + c."""
    if len(e.terms) != 1:
        return None
    (m, a), = e.terms
    if len(m) != 1 or not isinstance(m[0], Symbol):
        return None
    return m[0], a, e.const


def check_symbol(s: Symbol, value: int, label: str) -> None:
    """Raise ConstraintViolation if value breaks s's declared range or divisibility."""
    if value < s.lo or (s.hi is not None and value > s.hi):
        hi = "inf" if s.hi is None else s.hi
        raise ConstraintViolation(f"{label}: {s.name} = {value} is outside its range [{s.lo}, {hi}]")
    if value % s.mult:
        raise ConstraintViolation(f"{label}: {s.name} = {value} is not a multiple of {s.mult}")


def solve(facts: list) -> dict[str, int]:
    """facts: [(expr, observed_int) or (expr, observed_int, label)] -> {symbol name: value}."""
    obs = []
    for i, f in enumerate(facts):
        if not isinstance(f, (tuple, list)) or len(f) not in (2, 3):
            raise ShapeError(f"solve() takes (expr, int[, label]) tuples; item {i} is {f!r}")
        e, v = as_dim(f[0]), f[1]
        label = f[2] if len(f) == 3 else f"observation {i} ({e} == {v})"
        if not isinstance(v, int) or isinstance(v, bool):
            try:
                v = int(as_dim(v))
            except ShapeError as exc:
                raise ConstraintViolation(f"{label}: observed value {v!r} is not an integer") from exc
        obs.append((e, v, label))
    env: dict[str, int] = {}
    source: dict[str, str] = {}
    pending = list(obs)
    progress = True
    while pending and progress:
        progress = False
        rest = []
        for e, v, label in pending:
            r = substitute(e, env) if isinstance(e, Expr) and env else e
            if isinstance(r, int):
                if r != v:
                    _disagree(e, v, r, label, env, source)
                continue
            lin = _linear(r)
            if lin is None:
                rest.append((e, v, label))
                continue
            s, a, c = lin
            if (v - c) % a:
                raise ConstraintViolation(f"{label}: {e} == {v} has no integer solution for {s.name}")
            x = (v - c) // a
            check_symbol(s, x, f"{label} is {v}")
            env[s.name], source[s.name] = x, label
            progress = True
        pending = rest
    if pending:
        missing = sorted({n for e, _, _ in pending for n in e.free_symbols if n not in env})
        raise ConstraintViolation(
            f"cannot determine {', '.join(missing)} from the observed dims ("
            + "; ".join(f"{label}: {e} == {v}" for e, v, label in pending)
            + "); make an input carry each symbol as a plain or linear dim"
        )
    return env


def _disagree(e, v, r, label, env, source) -> None:
    used = sorted(n for n in (e.free_symbols if isinstance(e, Expr) else ()) if n in env)
    why = ", ".join(f"{n} = {env[n]} (from {source[n]})" for n in used)
    value = f"{r}" if str(e) == str(r) else f"{e} = {r}"  # a constant dim: "must equal 1", not "1 = 1"
    raise ConstraintViolation(f"{label} is {v}, but it must equal {value}" + (f" with {why}" if why else ""))
