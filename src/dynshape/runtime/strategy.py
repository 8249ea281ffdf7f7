"""Hybrid specialisation: what a variant is valid for (its guard), how a call finds it, which variants to build.

A variant is a build plus the guard it was compiled under.  Every guard is a box over the symbols: per symbol
a range and a divisor (`Dom`), intersected with the declared symbol.  Three kinds follow from the box:
- exact: every symbol pinned (`batch == 1 and seq == 16`); found by one dict lookup on the key;
- bucket: ranges (`65 <= seq <= 128`); the build's symbols carry the narrower ranges, pinned ones become literals;
- predicate: a divisor the build may rely on (`seq % 8 == 0`, e.g. for tail-free loops).
Buckets are never padded: a call runs at its exact shape in the build of the first bucket that admits it.

A clause the binder already guarantees (implied by the declared range or divisor) or implied by another clause
of the same guard is dropped and recorded, so dispatch tests only what can fail.  Dispatch is exact keys first
(dict), then buckets, most specific first, compiled into one Python function, then the generic build.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynshape.errors import DynshapeError
from dynshape.options import Options

HANDFUL = 8  # `auto`: at most this many distinct shapes (declared or profiled) get one static variant each
MAX_BUCKETS = 8


@dataclass(frozen=True)
class Dom:
    """Admissible values of one symbol: multiples of `mult` in [lo, hi] (hi None: unbounded)."""

    lo: int
    hi: int | None
    mult: int = 1

    @property
    def size(self) -> int | None:
        return None if self.hi is None else (self.hi - self.lo) // self.mult + 1

    def contains(self, v: int) -> bool:
        return self.lo <= v and (self.hi is None or v <= self.hi) and v % self.mult == 0

    def __str__(self) -> str:
        mult = f", multiple of {self.mult}" if self.mult > 1 else ""
        return f"[{self.lo}, {'inf' if self.hi is None else self.hi}]{mult}"


def declared(symbols: list) -> tuple[Dom, ...]:
    return tuple(Dom(s.lo, s.hi, s.mult) for s in symbols)


def _intersect(a: Dom, b: Dom) -> Dom | None:
    mult = math.lcm(a.mult, b.mult)
    lo = -(-max(a.lo, b.lo) // mult) * mult
    his = [h for h in (a.hi, b.hi) if h is not None]
    hi = min(his) // mult * mult if his else None
    return None if hi is not None and lo > hi else Dom(lo, hi, mult)


def _requested(x: Any, name: str) -> Dom:
    """A spec entry: int (pinned), (lo, hi), or {"min", "max", "multiple_of"}."""
    if isinstance(x, bool):
        raise DynshapeError(f"{name}: expected an int, a (min, max) pair or a dict, got {x!r}")
    if isinstance(x, int):
        return Dom(x, x, 1)
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return Dom(int(x[0]), None if x[1] is None else int(x[1]), 1)
    if isinstance(x, Mapping) and set(x) <= {"min", "max", "multiple_of"}:
        hi = x.get("max")
        return Dom(int(x.get("min", 0)), None if hi is None else int(hi), int(x.get("multiple_of", 1)))
    raise DynshapeError(f"{name}: expected an int, a (min, max) pair or a dict of min/max/multiple_of, got {x!r}")


@dataclass
class Guard:
    """What a build was compiled under, why it exists, and the clauses dispatch actually tests."""

    doms: tuple[Dom, ...]
    clauses: tuple[str, ...]
    source: str  # the clauses as one Python condition over s0, s1, ... (the key's symbols)
    dropped: tuple[str, ...]
    why: str
    where: str
    pinned: bool = True  # declared (or chosen at compile time): never evicted
    divisor: bool = False  # some clause is a divisibility predicate the build may rely on

    @property
    def key(self) -> tuple | None:
        """The symbol values, when the guard pins every symbol (an exact key)."""
        return tuple(d.lo for d in self.doms) if all(d.lo == d.hi for d in self.doms) else None

    @property
    def kind(self) -> str:
        """exact (every symbol pinned), predicate (relies on a divisor), bucket (ranges) or all (no clause)."""
        if self.key is not None:
            return "exact"
        if not self.clauses:
            return "all"
        return "predicate" if self.divisor else "bucket"

    def text(self) -> str:
        return " and ".join(self.clauses) or "every admissible shape"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "guard": self.text(), "why": self.why, "where": self.where,
                "dropped": list(self.dropped), "evictable": not self.pinned}


def make_guard(symbols: list, spec: Mapping[str, Any], why: str, where: str, pinned: bool = True) -> Guard:
    """The guard of a spec (symbol name -> int | (lo, hi) | {min, max, multiple_of}) over the declared symbols."""
    names = [s.name for s in symbols]
    unknown = sorted(set(spec) - set(names))
    if unknown:
        raise DynshapeError(f"{why}: the model has no symbol {unknown} (its symbols: {', '.join(names) or 'none'})")
    doms, clauses, source, dropped = [], [], [], []
    for i, (s, decl) in enumerate(zip(symbols, declared(symbols))):
        n, v = s.name, f"s{i}"
        want = _requested(spec[n], n) if n in spec else decl
        dom = _intersect(decl, want)
        if dom is None:
            raise DynshapeError(f"{why}: {n} {want} admits no value of the declared {s.describe()}")
        doms.append(dom)
        if dom.lo == dom.hi:
            clauses.append(f"{n} == {dom.lo}")
            source.append(f"{v} == {dom.lo}")
            if want.lo != want.hi:
                dropped.append(f"{n} in {want}: implied by {n} == {dom.lo}")
            continue
        # the declared range rounded to the new divisor: what the binder and the divisor clause already imply
        base = _intersect(decl, Dom(0, None, dom.mult)) or decl
        for op, mine, theirs, implied, asked in ((">=", dom.lo, decl.lo, base.lo, want.lo or None),
                                                 ("<=", dom.hi, decl.hi, base.hi, want.hi)):
            if mine != implied:
                clauses.append(f"{n} {op} {mine}")
                source.append(f"{v} {op} {mine}")
            elif mine != theirs:
                dropped.append(f"{n} {op} {mine}: implied by {n} % {dom.mult} == 0 and the declaration "
                               f"{s.describe()}")
            elif n in spec and asked is not None:
                dropped.append(f"{n} {op} {asked}: implied by the declaration {s.describe()}")
        if dom.mult != decl.mult:
            clauses.append(f"{n} % {dom.mult} == 0")
            source.append(f"{v} % {dom.mult} == 0")
        elif want.mult > 1:
            dropped.append(f"{n} % {want.mult} == 0: implied by the declaration {s.describe()}")
    return Guard(tuple(doms), tuple(clauses), " and ".join(source) or "True", tuple(dropped), why, where, pinned,
                 any(d.mult != m.mult for d, m in zip(doms, declared(symbols))))


def exact_guard(symbols: list, key: tuple, why: str, where: str, pinned: bool = True) -> Guard:
    return make_guard(symbols, dict(zip((s.name for s in symbols), key)), why, where, pinned)


def order_buckets(guards: list[Guard]) -> tuple[list[int], list[str]]:
    """Indices in dispatch order (most specific first) and notes on buckets dropped as duplicates."""
    def volume(g: Guard) -> float:
        return math.prod(math.inf if d.size is None else d.size for d in g.doms)

    order, notes = [], []
    for i in sorted(range(len(guards)), key=lambda i: volume(guards[i])):
        same = [j for j in order if guards[j].doms == guards[i].doms]
        if same:
            notes.append(f"bucket {guards[i].text()}: dropped, it admits exactly the shapes of an earlier bucket")
            continue
        order.append(i)
    return order, notes


def compile_pick(nsym: int, buckets: list[tuple[Guard, Any]], fallback: Any) -> Callable[[tuple], Any]:
    """`pick(key) -> variant`: the buckets' conditions in order as one generated function, else `fallback`."""
    unpack = "".join(f"s{i}, " for i in range(nsym))
    lines = ["def pick(key):"]
    if nsym and buckets:
        lines.append(f"    ({unpack}) = key")
    for i, (g, _) in enumerate(buckets):
        lines.append(f"    if {g.source}: return _b{i}")
    lines.append("    return _fallback")
    scope: dict = {"_fallback": fallback, **{f"_b{i}": v for i, (_, v) in enumerate(buckets)}}
    exec(compile("\n".join(lines), "<dynshape dispatch>", "exec"), scope)  # noqa: S102 - our own generated source
    pick = scope["pick"]
    pick.source = "\n".join(lines)
    return pick


def derive_buckets(symbols: list) -> list[dict]:
    """Power-of-two ranges of the symbol with the most admissible values, at most MAX_BUCKETS of them."""
    def width(s) -> float:
        return math.inf if s.hi is None else (s.hi - s.lo) // s.mult + 1

    wide = [s for s in symbols if width(s) > 1]
    if not wide:
        return []
    s = max(wide, key=width)
    uppers, p = [], 1
    while (s.hi is None and len(uppers) < MAX_BUCKETS - 1) or (s.hi is not None and p < s.hi):
        if p > s.lo:
            uppers.append(p)
        p *= 2
    if s.hi is not None:
        uppers.append(s.hi)
    ranges, lo = [], s.lo
    for u in uppers:
        ranges.append((lo, u))
        lo = u + 1
    if s.hi is None:
        ranges.append((lo, None))
    if len(ranges) > MAX_BUCKETS:
        cut = len(ranges) - MAX_BUCKETS + 1
        ranges = [(ranges[0][0], ranges[cut - 1][1])] + ranges[cut:]
    return [{s.name: r} for r in ranges]


def admissible_count(symbols: list) -> int | None:
    """How many keys the declared ranges admit (facts aside); None when a symbol is unbounded."""
    sizes = [d.size for d in declared(symbols)]
    return None if any(n is None for n in sizes) else math.prod(sizes)


@dataclass
class Choice:
    """The strategy that runs and why: what to build at compile time, what to build as calls arrive."""

    requested: str
    name: str
    reasons: list[str]
    auto_specialize: bool
    every_shape: bool = False  # each new key is hot on first sight (a handful of admissible shapes)
    prebuild: list = field(default_factory=list)  # keys to build now, from the profile
    prebuild_pinned: bool = False  # chosen as "one variant per shape" (kept) rather than as hot (evictable)
    buckets: list = field(default_factory=list)  # bucket specs to build now


def choose(opts: Options, symbols: list, profile: dict[tuple, int] | None, hot_in_profile: list) -> Choice:
    """Apply `opts.strategy` to the declared ranges and the profile (documented rule by rule in `compile`)."""
    req = opts.strategy
    names = ", ".join(s.name for s in symbols)
    count = admissible_count(symbols)
    admits = "unboundedly many" if count is None else str(count)
    thresholds = (f">= {opts.hot_calls} calls and >= {opts.hot_share:.0%} of the last {opts.hot_window}, "
                  f"at most {opts.max_variants or 'unlimited'}")
    seen = sorted(profile, key=lambda k: -profile[k]) if profile else []

    def pick(name: str, reasons: list[str], **kw: Any) -> Choice:
        auto = opts.auto_specialize if opts.auto_specialize is not None else name == "multi_version"
        if auto and name == "multi_version" and not kw.get("every_shape"):
            reasons.append(f"hot shapes get a static variant built in the background ({thresholds})")
        if opts.buckets and name != "bucketed":  # declared buckets serve under every strategy but static
            kw["buckets"] = [] if name == "static" else list(opts.buckets)
            reasons.append("buckets= ignored: static builds every shape" if name == "static" else
                           f"{len(opts.buckets)} declared bucket(s) between the exact keys and the generic build")
        return Choice(req, name, reasons, bool(auto and symbols), **kw)

    if req == "generic":
        return pick("generic", ["requested: one generic build serves every shape; variants only where declared"])
    if req == "static":
        return pick("static", ["requested: each new shape is compiled on first sight, synchronously, before the "
                               "call runs (the recompile-per-shape baseline)"])
    if req == "bucketed":
        specs = list(opts.buckets) if opts.buckets else derive_buckets(symbols)
        where = "declared (buckets=)" if opts.buckets else "derived: power-of-two ranges of the widest symbol"
        return pick("bucketed", [f"requested: {len(specs)} range buckets, {where}; no padding, each call runs at its "
                                 "exact shape in its bucket's build; generic for shapes outside every bucket"],
                    buckets=specs)
    if req == "multi_version":
        return pick("multi_version", ["requested: generic build plus static variants for hot shapes"]
                    + ([f"profile: {len(hot_in_profile)} hot shape(s) prebuilt"] if profile else []),
                    prebuild=hot_in_profile)
    # auto
    if not symbols:
        return pick("generic", ["auto: no symbolic dims, the generic build is already static"])
    if count is not None and count <= HANDFUL:
        return pick("multi_version", [f"auto: the declared ranges of {names} admit only {count} shapes (<= "
                                      f"{HANDFUL}): each gets its own static variant, built in the background on "
                                      "first sight"], every_shape=True)
    if profile and len(profile) <= HANDFUL:
        return pick("multi_version", [f"auto: the profile saw only {len(profile)} distinct shapes (<= {HANDFUL}): "
                                      "one static variant each, prebuilt now; the generic build serves the rest"],
                    prebuild=seen, prebuild_pinned=True)
    why = f"auto: the declared ranges of {names} admit {admits} shapes"
    if profile:
        why += f" and the profile saw {len(profile)} distinct ones (> {HANDFUL}); its {len(hot_in_profile)} hot " \
               "shape(s) are prebuilt"
    return pick("multi_version", [why + ": generic build plus static variants for hot shapes"],
                prebuild=hot_in_profile)
