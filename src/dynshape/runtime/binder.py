"""Per-call shape work compiled once into one flat Python function.

`make_binder(inputs, facts)` writes Python source that reads every input's shape, binds each symbol from
the first axis that carries it (plain or linear), checks ranks, dtypes, ranges, divisors, cross-input
agreement and the graph's residual facts, and returns the tuple of symbol values: the dispatch key.
The fast path is straight-line comparisons (a few microseconds); only when a check fails does the slow
path run the general solver to word a precise `ConstraintViolation`.

Every check reads only the arrays' shapes and dtypes: nothing is copied or allocated before they pass (a
strided view of 10**9 rows is refused by its range, not copied first). The binder hands back the caller's
arrays as they are, strides included; the planned path copies them into its arena anyway, and the unplanned
path makes them contiguous once the call's memory is known to fit. Nested Python lists (and scalars) are
converted with the model's dtype when their values fit it exactly; anything else is refused by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from dynshape.errors import ConstraintViolation
from dynshape.ir.graph import Graph
from dynshape.sym import Cond, Expr, Symbol, solve
from dynshape.sym.pysource import to_py
from dynshape.sym.solve import check_symbol


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype
    shape: tuple


def symbols_of(inputs: list[InputSpec], facts: list) -> list[Symbol]:
    """Every symbol the call depends on, in first-seen order over the inputs."""
    seen: dict[str, Symbol] = {}
    for spec in inputs:
        for d in spec.shape:
            if isinstance(d, Expr):
                for s in sorted(d.syms, key=lambda s: s.name):
                    seen.setdefault(s.name, s)
    for cond, _ in facts:
        for e in ((cond.expr,) if isinstance(cond, Cond) else (cond.a, cond.b)):
            if isinstance(e, Expr):
                for s in e.syms:
                    seen.setdefault(s.name, s)
    return list(seen.values())


def make_binder(inputs: list[InputSpec], facts: list | None = None, check_dtype: bool = True,
                notes: list[tuple[str, str]] | None = None, fallback: Callable | None = None):
    """Compile `bind(feed: dict) -> (arrays, key)`; key holds the symbol values in `symbols_of` order.
    `fallback`: what binds a call the fast path refuses (instead of the slow path's precise refusal).

    `notes`: (text, origin) of the facts that shaped the signature (refined ranges, equalities, requirements):
    a violation naming a symbol says which of them made its range what it is ("because: H - 2 >= 1 ...
    (node 'conv' (Conv))")."""
    facts = list(facts or [])
    syms = symbols_of(inputs, facts)
    names = {s.name: f"s{i}" for i, s in enumerate(syms)}
    bound: set[str] = set()
    lines = ["def bind(feed):", "    try:"]
    body: list[str] = [f"if len(feed) != {len(inputs)}: return _slow(feed)"]
    checks: list[str] = []
    for k, spec in enumerate(inputs):
        a = f"a{k}"
        body.append(f"{a} = feed[{spec.name!r}]")
        body.append(f"if type({a}) is not _nd: {a} = _conv({a}, {k})")
        if check_dtype:
            body.append(f"if {a}.dtype is not _dt{k} and {a}.dtype != _dt{k}: return _slow(feed)")
        body.append(f"sh{k} = {a}.shape")
        body.append(f"if len(sh{k}) != {len(spec.shape)}: return _slow(feed)")
        for ax, d in enumerate(spec.shape):
            v = f"sh{k}[{ax}]"
            if isinstance(d, int):
                checks.append(f"{v} != {d}")
                continue
            lin = linear_symbol(d)
            if lin is not None and lin[0].name not in bound:
                s, c, k0 = lin
                n = names[s.name]
                if c == 1 and k0 == 0:
                    body.append(f"{n} = {v}")
                else:
                    body.append(f"{n}, _r = divmod({v} - ({k0}), {c})")
                    body.append("if _r: return _slow(feed)")
                bound.add(s.name)
                _range_checks(s, n, checks)
            else:
                checks.append(f"{v} != {to_py(d, names)}")
    unbound = [s.name for s in syms if s.name not in bound]
    if unbound:  # symbols no input axis carries linearly: bind them with the general solver
        body.append("_env = _solve_all(feed)")
        for s in syms:
            if s.name in unbound:
                body.append(f"{names[s.name]} = _env[{s.name!r}]")
                _range_checks(s, names[s.name], checks)
    for cond, _ in facts:
        checks.append(_fact_violated_py(cond, names))
    if checks:
        body.append("if " + " or ".join(checks) + ": return _slow(feed)")
    key = "(" + "".join(f"{names[s.name]}, " for s in syms) + ")"
    body.append(f"return ({', '.join(f'a{k}' for k in range(len(inputs)))}{',' if len(inputs) == 1 else ''}), {key}")
    lines += ["        " + ln for ln in body]
    # KeyError: a missing name; TypeError: a feed that is not a mapping (None, a list)
    lines += ["    except (KeyError, TypeError):", "        return _slow(feed)"]
    src = "\n".join(lines)

    def _conv(a, k):
        return as_input_array(a, inputs[k])

    def _solve_all(feed):
        obs = []
        for spec in inputs:
            shp = np.shape(feed[spec.name])
            for ax, d in enumerate(spec.shape):
                obs.append((d, int(shp[ax]), f"input {spec.name!r} axis {ax}"))
        return solve(obs)

    def _slow(feed):
        try:
            explain_violation(inputs, facts, feed, check_dtype)  # raises: the precise reason
        except ConstraintViolation as e:
            because = _because(str(e), notes or [], {s.name for s in syms})
            if because:
                raise ConstraintViolation(f"{e}; because: {because}") from None
            raise
        raise AssertionError("binder fast path rejected an input the slow path accepts:\n" + src)

    scope = {"_nd": np.ndarray, "_conv": _conv, "_slow": _slow if fallback is None else fallback,
             "_solve_all": _solve_all}
    for k, spec in enumerate(inputs):
        scope[f"_dt{k}"] = np.dtype(spec.dtype)
    exec(compile(src, "<dynshape binder>", "exec"), scope)  # noqa: S102 - our own generated source
    bind = scope["bind"]
    bind.source = src
    bind.symbols = syms
    return bind


def linear_symbol(d: Expr) -> tuple[Symbol, int, int] | None:
    """(s, c, k) when d is c*s + k with c > 0: the axis binds s by one division."""
    if len(d.terms) != 1:
        return None
    (m, c), = d.terms
    if len(m) != 1 or not isinstance(m[0], Symbol) or c <= 0:
        return None
    return m[0], c, d.const


def _range_checks(s: Symbol, n: str, checks: list[str]) -> None:
    checks.append(f"{n} < {s.lo}")
    if s.hi is not None:
        checks.append(f"{n} > {s.hi}")
    if s.mult > 1:
        checks.append(f"{n} % {s.mult}")


def _fact_violated_py(cond, names: dict[str, str]) -> str:
    if not isinstance(cond, Cond):  # a broadcast pair: equal, or one side is 1
        a, b = to_py(cond.a, names), to_py(cond.b, names)
        return f"not ({a} == {b} or {a} == 1 or {b} == 1)"
    e = to_py(cond.expr, names)
    return {"ge": f"{e} < 0", "eq": f"{e} != 0", "ne": f"{e} == 0", "div": f"{e} % {cond.k}"}[cond.kind]


def as_input_array(a, spec: InputSpec) -> np.ndarray:
    """`a` as an ndarray for input `spec`, without copying an ndarray (a subclass becomes a plain view).

    Lists, tuples and scalars are converted with the model's dtype, and only when every value survives the
    conversion exactly (no int64 wrapped into int32, no 0.5 truncated to an integer, no float overflowing to
    inf): a feed the model cannot take is refused here, by name, never silently altered."""
    if isinstance(a, np.ndarray):
        return a.view(np.ndarray)
    want = np.dtype(spec.dtype)
    what = f"input {spec.name!r}"
    if a is None:
        raise ConstraintViolation(f"{what} is None; the model takes an array of {want} {_fmt_shape(spec.shape)}")
    if not isinstance(a, (list, tuple, int, float, bool, complex, str, bytes, np.generic)):
        raise ConstraintViolation(f"{what} is a {type(a).__name__}; the model takes a numpy array of {want} "
                                  f"{_fmt_shape(spec.shape)}")
    try:
        arr = np.asarray(a)
    except Exception as exc:  # noqa: BLE001 - a ragged nested list, an object numpy cannot read
        raise ConstraintViolation(f"{what}: cannot convert this {type(a).__name__} to an array ({exc}); pass a "
                                  f"numpy array of {want} {_fmt_shape(spec.shape)}") from None
    return _cast_exact(arr, want, what, type(a).__name__)


def _cast_exact(arr: np.ndarray, want: np.dtype, what: str, given: str) -> np.ndarray:
    """arr in dtype `want` when the conversion keeps every value (floats may round, never overflow)."""
    if arr.dtype == want:
        return arr
    if want.kind == "O" and arr.dtype.kind in "USO":
        return arr.astype(object)
    if arr.dtype.kind in "biuf" and want.kind in "biufc" and not (arr.dtype.kind == "f" and want.kind in "biu"):
        with np.errstate(all="ignore"):
            out = arr.astype(want)
        if want.kind in "fc":
            exact = bool(np.all(np.isfinite(out) | ~np.isfinite(arr)))
        else:
            exact = np.array_equal(out.astype(arr.dtype), arr)
        if exact:
            return out
        raise ConstraintViolation(f"{what}: the {given}'s values do not fit {want} (the conversion would change "
                                  f"them); pass a numpy array of {want}")
    raise ConstraintViolation(f"{what}: a {given} of {arr.dtype} values, but the model takes {want}; pass a numpy "
                              f"array of {want}")


def explain_violation(inputs: list[InputSpec], facts: list, feed: dict, check_dtype: bool = True) -> None:
    """Raise the precise ConstraintViolation for a feed the fast path rejected."""
    if not isinstance(feed, Mapping):
        raise ConstraintViolation(f"inputs must be a dict of name -> array, got {type(feed).__name__}")
    expected = [s.name for s in inputs]
    missing = [n for n in expected if n not in feed]
    extra = [n for n in feed if n not in expected]
    if missing or extra:
        raise ConstraintViolation(f"inputs: missing {missing}, unexpected {extra}; the model takes {expected}")
    feed = {spec.name: as_input_array(feed[spec.name], spec) for spec in inputs}
    obs = []
    for spec in inputs:
        a = feed[spec.name]
        shp = np.shape(a)
        dt = getattr(a, "dtype", None)
        if check_dtype and dt is not None and np.dtype(dt) != np.dtype(spec.dtype):
            raise ConstraintViolation(f"input {spec.name!r}: dtype {np.dtype(dt)} but the model takes "
                                      f"{np.dtype(spec.dtype)}; convert it with .astype({np.dtype(spec.dtype).name!r})")
        if len(shp) != len(spec.shape):
            raise ConstraintViolation(f"input {spec.name!r}: rank {len(shp)} (shape {tuple(shp)}) but the model "
                                      f"takes rank {len(spec.shape)} {_fmt_shape(spec.shape)}")
        for ax, d in enumerate(spec.shape):
            obs.append((d, int(shp[ax]), f"input {spec.name!r} axis {ax} ({d})"))
    env = solve(obs)
    where: dict[str, str] = {}
    for d, _, label in obs:
        for n in getattr(d, "free_symbols", ()):
            where.setdefault(n, label.split(" (")[0])
    for s in symbols_of(inputs, []):
        if s.name in env:
            check_symbol(s, env[s.name], f"{s.name} (from {where.get(s.name, 'a derived dim')})")
    for cond, origin in facts:
        if not (cond.evaluate(env) if isinstance(cond, Cond) else cond(env)):
            vals = ", ".join(f"{n} = {env[n]} (from {where.get(n, 'a derived dim')})"
                             for n in sorted(cond.free_symbols))
            raise ConstraintViolation(f"the model requires {cond.text} (from {origin}); this call has {vals}")


def _because(msg: str, notes: list[tuple[str, str]], symbols: set[str]) -> str:
    """The facts (at most 4) that mention a symbol the message names: why its range or relation is what it is."""
    words = re.compile(r"[A-Za-z_?][\w.?]*")
    named = set(words.findall(msg)) & symbols
    related = [f"{text} ({origin})" for text, origin in notes
               if text not in msg and named & set(words.findall(text))]
    return "; ".join(dict.fromkeys(related[:4]))


def _fmt_shape(shape: tuple) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def graph_binder(graph: Graph, fallback: Callable | None = None):
    """The binder of a graph whose inputs are all tensors: its input shapes, dtypes and residual facts."""
    specs = [InputSpec(v.name, np.dtype(v.dtype), tuple(graph.types[v.name].shape)) for v in graph.inputs]
    facts = [(f.check, f.origin) for f in graph.signature.facts if f.kind != "assume"
             and (isinstance(f.check, Cond) or (hasattr(f.check, "a") and hasattr(f.check, "b")))]
    notes = [(f.text, f.origin) for f in graph.signature.facts if f.kind in ("range", "eq", "require")]
    return make_binder(specs, facts, notes=notes, fallback=fallback)


def nonempty_first(narrowed: Graph, full: Callable, names: list[str]) -> Callable:
    """A binder that checks a call against the graph re-inferred with the symbols that may be 0 at >= 1
    (`narrowed`, what the main builds are made from), and hands a call it refuses (a 0, or a bad input) to the
    graph as loaded's binder (`full`: the key with a 0, or the precise refusal), with no exception in between (a
    decoder's first step, past length 0, binds in a microsecond). Why: the loaded graph's facts are written for
    dims that may be 0 (each broadcast as `max(a, b) * min(a, b, 1)`, nested once per layer), and bert_small's
    took ~30 us a call to evaluate, 5% of a (1, 16) call; at >= 1 they fold to a few comparisons."""
    fast = graph_binder(narrowed, fallback=full)
    if [s.name for s in fast.symbols] != names:  # another key order: the loaded graph's binder alone
        return full
    fast.symbols = full.symbols  # (the admitted ranges: 0 included)
    return fast
