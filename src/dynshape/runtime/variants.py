"""The variant table and dispatch: which build serves a call.

Dispatch is exact keys first (one dict lookup on the tuple of symbol values), then range buckets, most specific
first (one compiled function), then the generic build. The exact-key table is copy-on-write: readers never
lock, installs (from the background builder) swap in a new dict. Over the cap on hot variants, the least
recently hot evictable one goes.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from dynshape.runtime.budget import Worst
from dynshape.runtime.build import Build
from dynshape.runtime.per_key import arena_steps
from dynshape.runtime.plan import Planner
from dynshape.runtime.profile import KeyProfile
from dynshape.runtime.strategy import Guard, compile_pick

_uids = itertools.count()
_BUCKET_PLANNER_LOCK = threading.Lock()  # Variant.bucket_planner is made once, whichever thread asks first


@dataclass(eq=False)
class Variant:
    """One build and its guard: generic (key None), a bucket (key None, narrowed graph) or static for one key."""

    build: Build
    guard: Guard
    planner: Planner | None  # when every value's shape follows from the key
    uid: int = field(default_factory=lambda: next(_uids))  # names its plans in the arenas' caches
    hits: int = 0
    last_call: int = 0  # stats.calls at its latest hit (eviction: least recently hot)
    worst: Worst | None = None  # bounded memory: the arena its keys need, offsets valid over its guard
    _bucket_planner: Planner | None = None

    @property
    def bucket_planner(self) -> Planner | None:
        """The planner its bucket plans take: its cheap per-key steps run in the arena (runtime/per_key.py), so a
        plan moved to a new key computes nothing in Python; the planner itself where no per-key step moves. Made on
        the first bucket plan (most variants never make one)."""
        pl = self.planner
        if self._bucket_planner is None and pl is not None:
            with _BUCKET_PLANNER_LOCK:  # (one per variant: arenas on other threads move the same plans' kind)
                if self._bucket_planner is None:
                    moves = pl.options.per_key_in_arena and pl.keyed.steps and arena_steps(pl.build, pl.keyed.steps)
                    self._bucket_planner = Planner(pl.build, pl.symbols, pl.options, in_arena=True) if moves else pl
        return self._bucket_planner

    @property
    def key(self) -> tuple | None:
        return self.build.key

    @property
    def steps(self) -> tuple:
        return self.build.steps

    @property
    def fixed(self) -> dict:
        return dict(self.build.fixed)


class VariantTable:
    """Exact-key variants, buckets and the generic build; `lookup(key)` is the whole dispatch."""

    def __init__(self, generic: Variant, names: list[str], max_variants: int | None, profile: KeyProfile):
        self.generic = generic
        self.names = names
        self.max_variants = max_variants
        self.profile = profile
        self.exact: dict[tuple, Variant] = {}
        self.buckets: list[Variant] = []
        self.default: Variant | None = generic  # no buckets: nothing to test after the exact-key lookup
        self.pick: Callable[[tuple], Variant] = lambda key: generic
        self.evicted: list[dict] = []
        self._lock = threading.Lock()

    def lookup(self, key: tuple) -> Variant:
        return self.exact.get(key) or self.default or self.pick(key)

    def set_buckets(self, buckets: list[Variant], pick: Callable[[tuple], Variant] | None = None) -> None:
        """Install the buckets (in dispatch order) and compile the function that follows the exact lookup;
        `pick` replaces it (strategy static: build on first sight)."""
        self.buckets = list(buckets)
        if pick is not None:
            self.pick, self.default = pick, None
        else:
            self.pick = compile_pick(len(self.names), [(v.guard, v) for v in self.buckets], self.generic)
            self.default = None if self.buckets else self.generic

    def install(self, variant: Variant, calls: int) -> None:
        """Publish a static variant (copy-on-write); evict the least recently hot evictable one over the cap."""
        cap = self.max_variants
        with self._lock:
            variants = {**self.exact, variant.key: variant}
            evictable = [k for k, v in variants.items() if not v.guard.pinned and k != variant.key]
            while cap is not None and not variant.guard.pinned and len(evictable) + 1 > cap:
                recent = self.profile.recent
                victim = min(evictable, key=lambda k: (recent(k), variants[k].last_call))
                evictable.remove(victim)
                old = variants.pop(victim)
                self.evicted.append({"values": dict(zip(self.names, victim)), "hits": old.hits,
                                     "why": f"cap of {cap} variants: least recently hot when "
                                            f"{self.fmt_key(variant.key)} was installed"})
            self.exact = variants

    def fmt_key(self, key: tuple) -> str:
        return ", ".join(f"{n}={v}" for n, v in zip(self.names, key)) or "()"
