"""Memory policy: budgets, preallocation, the cap on cached plans, and the allocator's settings.

With `memory_budget` or `preallocate`, every arena is sized for the worst case over the declared ranges at
compile time (or the compile is refused, naming the symbols that drive it and the largest range of each that
fits); a variant is admitted only if its worst case fits the arenas; a call whose plan needs more than the
budget is refused before anything is allocated. Unbounded executables lay out each key as it comes.

Machine: whatever the declaration, no call allocates more than this machine has (its RAM plus swap, or its
cgroup's limit when lower). A call whose memory plan (or an input copy) needs more is refused before anything
is allocated, naming the input, the symbol, the bytes and how to bound them (`machine_refusal`); an allocation
the operating system still refuses is reported the same way, never as a bare MemoryError.

Allocator: keep freed tensor memory for reuse instead of returning it to the OS after every call. glibc
serves allocations above its mmap threshold (128 KiB at start) with fresh mmaps, so every large intermediate of
every call pays one page fault per 4 KiB when first written: measured on bert_small at (8, 128), 127 ms per call
with the defaults against 85 ms with the settings below. Raising the mmap threshold to its maximum and disabling
heap trimming keeps those pages mapped and reused, bounded by the peak of one call. Option `tune_malloc=False`
(or DYNSHAPE_TUNE_MALLOC=0) leaves the allocator alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from dynshape.errors import ConstraintViolation, DynshapeError
from dynshape.options import Options
from dynshape.runtime.budget import Worst, fmt_bytes, over_budget_text, parse_bytes, worst_case
from dynshape.runtime.plan import Planner
from dynshape.runtime.plan_cache import PLAN_BYTES
from dynshape.sym import Symbol

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's ceiling on 64-bit
_done = False


def tune_allocator(enabled: bool = True) -> bool:
    """Apply the settings once per process; False when not glibc or disabled."""
    global _done
    if _done:
        return True
    if not enabled:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1 and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    _done = ok
    return ok


@functools.cache
def machine_bytes() -> int | None:
    """Memory this process can ever get: RAM + swap, capped by a cgroup limit; None when unknown."""
    total = None
    try:
        info = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.split(":")[0] in ("MemTotal", "SwapTotal")}
        total = info.get("MemTotal", 0) + info.get("SwapTotal", 0) or None
    except (OSError, ValueError, IndexError):
        try:
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            total = None
    try:  # a per-process address-space limit (ulimit -v) is this process's machine
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
            total = soft if total is None else min(total, soft)
    except (ImportError, OSError, ValueError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:
            total = int(text) if total is None else min(total, int(text))
    return total


def machine_refusal(need: int, what: str, culprits: str, names: list[str]) -> DynshapeError:
    """The error for a call needing `need` bytes that the machine cannot give: what needs it (`what`), the
    inputs and symbols that drive it (`culprits`, `names`), and how to bound them."""
    have = machine_bytes()
    here = f"this machine has {fmt_bytes(have)}" if have is not None else "the operating system refused it"
    decl = ", ".join(f"{n!r}: (1, N)" for n in names) or "'<dim>': (1, N)"
    return DynshapeError(f"{what} needs {fmt_bytes(need)} ({need} bytes); {here}. It comes from {culprits}: bound "
                         f"the symbol(s) at load (dims={{{decl}}}, or --dim NAME=1:N) or compile with "
                         "memory_budget='...' to refuse such calls up front (over_budget='refuse_calls' refuses "
                         "them per call)")


def check_machine(need: int, what: str, culprits: str, names: list[str]) -> None:
    """Refuse, before allocating, what exceeds the memory this machine can ever give."""
    have = machine_bytes()
    if have is not None and need > have:
        raise machine_refusal(need, what, culprits, names)


@dataclass
class MemoryPolicy:
    """What an executable may allocate: the arenas' size when bounded, and the cap on cached plans' values."""

    options: Options
    symbols: list[Symbol]
    notes: list[str] = field(default_factory=list)  # shared with the executable's explain
    budget: int | None = None
    arena_bytes: int = 0
    generic: Planner | None = None
    worst: Worst | None = None  # bounded: the generic build's worst case, used by every call
    _over_text: str | None = None
    _report: Worst | None = None

    def __post_init__(self) -> None:
        self.budget = None if self.options.memory_budget is None else parse_bytes(self.options.memory_budget)

    @property
    def bounded(self) -> bool:
        return self.budget is not None or self.options.preallocate

    def init(self, generic: Planner | None, why_unplanned: str) -> None:
        """Size the arenas for the worst case, or refuse now, naming what drives it."""
        self.generic = generic
        if not self.bounded:
            return
        what = "memory_budget" if self.budget is not None else "preallocate"
        if generic is None:
            raise DynshapeError(f"{what} needs a memory-planned executable: {why_unplanned}")
        w = self.worst = worst_case(generic, self.symbols)
        if w.unbounded:
            dims = ", ".join(f"{n!r}: (1, N)" for n in w.unbounded)
            raise DynshapeError(f"{what} needs an upper bound on every symbol the memory depends on: "
                                f"{', '.join(w.unbounded)} {'is' if len(w.unbounded) == 1 else 'are'} unbounded; "
                                f"declare a max, e.g. dims={{{dims}}}")
        self.arena_bytes = w.reserve
        if self.budget is not None and w.reserve > self.budget:
            at = ", ".join(f"{k}={v}" for k, v in w.at.items())
            if self.options.over_budget == "error":
                raise DynshapeError(f"memory_budget {fmt_bytes(self.budget)}: the worst-case arena is "
                                    f"{fmt_bytes(w.reserve)} (at {at}); {self.fits_text()}. Declare narrower dims "
                                    "or raise the budget; over_budget='refuse_calls' serves the shapes that fit and "
                                    "refuses the others per call")
            self.arena_bytes = self.budget
            self.notes.append(f"worst-case arena {fmt_bytes(w.reserve)} exceeds memory_budget "
                              f"{fmt_bytes(self.budget)}: calls that need more are refused ({self.fits_text()})")

    def fits_text(self) -> str:
        if self._over_text is None:
            w = self.worst or worst_case(self.generic, self.symbols)
            self._over_text = over_budget_text(self.generic, self.symbols, w, self.budget or 0)
        return self._over_text

    def admit(self, planner: Planner | None, his: dict[str, int] | None, what: str, at_compile: bool) -> Worst | None:
        """Bounded memory: a variant's worst case must fit the arenas (at compile time they grow to hold it).
        Returns its worst case; raises (at compile time) or returns None (later: not installed) when it does
        not fit."""
        w = worst_case(planner, self.symbols, his) if planner is not None else None
        need = None if w is None else w.reserve
        if need is not None and need <= self.arena_bytes:
            return w
        if need is None:
            why = "it has no memory plan"
        elif at_compile and (self.budget is None or need <= self.budget):
            self.arena_bytes = need
            return w
        else:
            why = f"it needs a {fmt_bytes(need)} arena, the arenas hold {fmt_bytes(self.arena_bytes)}"
        if at_compile:
            raise DynshapeError(f"{what}: {why}" + (f" (memory_budget {fmt_bytes(self.budget)})"
                                                   if self.budget is not None else ""))
        self.notes.append(f"variant {what} not installed: {why}")
        return None

    def refuse(self, total: int, key_text: str) -> None:
        """A call whose plan needs more than the budget: refused before allocating."""
        if self.budget is not None and total > self.budget:
            raise ConstraintViolation(f"memory_budget {fmt_bytes(self.budget)}: {key_text} needs a "
                                      f"{fmt_bytes(total)} arena; refused before allocating ({self.fits_text()})")

    def plan_bytes(self) -> int:
        """What an arena's cached plans may hold in per-key values: PLAN_BYTES, and with a memory_budget no more
        than the budget leaves beside the arena."""
        if self.budget is None:
            return PLAN_BYTES
        return max(0, min(PLAN_BYTES, self.budget - self.arena_bytes))

    def report(self) -> Worst | None:
        """The generic build's worst-case arena over the declared ranges (None without a memory plan)."""
        if self.generic is None:
            return None
        if self.worst is not None:
            return self.worst
        if self._report is None:
            self._report = worst_case(self.generic, self.symbols)
        return self._report


_T = TypeVar("_T")
_SETTLED_AT = [0]  # the heap's allocated blocks at the last settle


def settled(exe: _T) -> _T:
    """`exe`, after one full garbage collection where the heap grew by more than a quarter since the last one run
    here. Why: a compile leaves tens of thousands of new long-lived objects (GPT-2's step: ~45k), and CPython runs
    a full pass once the objects that reached its oldest generation since the last pass exceed a quarter of those
    it holds: left alone, the pass after an import and a first compile (15 ms for GPT-2's step) fell inside the
    first calls, ~230 us on each token of a first 64-token generation. Run here it is part of a compile that takes
    seconds. A process that compiles many models (a test suite) pays it only as its heap grows by quarters (each
    full pass costs time in proportion to every object the process holds)."""
    blocks = sys.getallocatedblocks()
    if blocks - _SETTLED_AT[0] > _SETTLED_AT[0] // 4:
        gc.collect()
        _SETTLED_AT[0] = sys.getallocatedblocks()
    return exe
