"""The arenas planned calls run in: one contiguous buffer each, with the plans bound to its addresses, in a pool
so that concurrent calls never share one."""

from __future__ import annotations

import mmap
import threading

import numpy as np

from dynshape.runtime.plan_cache import PlanCache


class Arena:
    """One contiguous buffer and the plans bound to its addresses. `fit`: (planner, offsets, sizes) of the layout
    the buffer was last grown for, whose slots a later key may reuse (see Executable._plan)."""

    __slots__ = ("buf", "fit", "plans", "buckets", "seen")

    def __init__(self, nbytes: int):
        self.buf = aligned_bytes(nbytes)
        self.plans = PlanCache()
        self.fit: tuple | None = None
        self.buckets: dict = {}  # (variant uid, bucket) -> its bucket plan (runtime/rekey.py)
        self.seen: dict = {}  # (variant uid, key) served by a bucket plan once: with its state dropped, binds its own


ARENA_ALIGN = 64


def aligned_bytes(nbytes: int) -> np.ndarray:
    """`nbytes` uninitialised bytes starting on a cache line, every page of them resident.

    Aligned: the plan aligns every buffer's offset to 64, but numpy's large allocations start 16 bytes past a
    page: every 64-byte vector load and store of an activation then split two cache lines (ResNet-50 at 224x224,
    1 thread: see the commit that added this). Touched: an arena (or scratch) is reserved memory, sized with
    headroom for the key that grew it; left to the kernel's lazy paging, a later, smaller key whose first-fit
    layout reached pages no earlier key had touched grew resident memory in the middle of a warmed-up stream
    (SVTR: +2 MB at the 1,400th random shape). Touched once here, resident memory is what `explain` reports
    from the first call on (a page fault per 4 KB, ~2-5 ms for a 20 MB arena, once per growth)."""
    raw = np.empty(nbytes + ARENA_ALIGN, np.uint8)
    raw[::4096] = 0
    off = -raw.ctypes.data % ARENA_ALIGN
    return raw[off:off + nbytes]


OWN_PAGES_MIN = 64 << 10  # per-key values from this size live in their own mapping (own_pages)


def own_pages(a: np.ndarray) -> np.ndarray:
    """`a` copied into an anonymous mapping of its own when it is large (>= OWN_PAGES_MIN bytes), else as is.

    Why: a plan's per-key values (bert's token-type embeddings of (batch, seq, hidden): up to MBs per key) live as
    long as the plan stays in its arena's cache, and a stream with more keys than the cache holds replaces them
    oldest first, each a different size. From the heap (the allocator keeps everything below its 32 MiB mmap
    threshold there, `memory.tune_allocator`) that churn left holes no later size fitted: under a served
    overload of bert_small the heap's free bytes grew 6 -> 32 MB in 30 s, resident memory +2.5-3.5% after
    warm-up. A mapping of its own is returned to the OS whole when the last plan holding it goes; the cost is
    one copy and its page faults when a plan is made (about 0.1 ms a MB), never on a cached plan's call."""
    if a.nbytes < OWN_PAGES_MIN or a.dtype.hasobject or not a.flags.c_contiguous:
        return a
    buf = mmap.mmap(-1, a.nbytes)
    out = np.frombuffer(buf, dtype=a.dtype, count=a.size).reshape(a.shape)
    out[...] = a
    return out


class ArenaPool:
    """Arenas for concurrent planned calls: a call takes one and gives it back, so no two calls share one.

    Up to `limit` arenas are made, on demand or up front (`fill`).  The request path pops from and appends to
    `free` itself (atomic under the GIL, no lock, no call); only when `free` is empty does it call `take`,
    which makes another arena, returns None (the caller runs the allocating path) or, with `wait`, blocks
    until one is given back: a budgeted executable waits rather than allocate outside its budget.  Whoever
    gives an arena back while `waiting` calls `wake`.
    """

    def __init__(self, limit: int, nbytes: int = 0, wait: bool = False):
        self.limit, self.nbytes, self.wait = limit, nbytes, wait
        self.arenas: list[Arena] = []
        self.free: list[Arena] = []
        self.waiting = 0
        self._cond = threading.Condition()

    def fill(self) -> None:
        with self._cond:
            while len(self.arenas) < self.limit:
                self.free.append(self._new())

    def _new(self) -> Arena:
        arena = Arena(self.nbytes)
        self.arenas.append(arena)
        return arena

    def take(self) -> Arena | None:
        with self._cond:
            if len(self.arenas) < self.limit:
                return self._new()
            if not self.wait:
                return None
            self.waiting += 1
            try:
                while True:
                    try:
                        return self.free.pop()
                    except IndexError:
                        self._cond.wait()
            finally:
                self.waiting -= 1

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    @property
    def nbytes_total(self) -> int:
        return sum(int(a.buf.size) for a in self.arenas)


def grow(arena: Arena, total: int) -> None:
    """Grow an arena to hold `total` bytes (25% headroom); plans bound to older buffers stay (see PlanCache)."""
    arena.buf = aligned_bytes(total + total // 4)
    arena.plans.drop_stale(arena.buf.nbytes)
