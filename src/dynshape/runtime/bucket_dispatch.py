"""Which bucket plan serves a key an arena has not seen (runtime/rekey.py's plans, runtime/key_states.py's
remembered states): put back, moved there, or made anew, and the state a plan leaves remembered. Why a module of
its own: the policy reads the executable's options, statistics and memory budget but none of its dispatch, and
executable.py, which calls it once per planned call at an unseen key, stays one file with one job."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynshape.codegen import program
from dynshape.errors import DynshapeError
from dynshape.runtime import key_states as ks
from dynshape.runtime.arenas import Arena, grow
from dynshape.runtime.memory import check_machine
from dynshape.runtime.plan import BoundPlan
from dynshape.runtime.rekey import BUCKETS_PER_ARENA, BucketState, bucket_layout, rekey
from dynshape.runtime.variants import Variant

if TYPE_CHECKING:
    from dynshape.runtime.executable import Executable


def bucket_plan(exe: Executable, variant: Variant, key: tuple, arena: Arena) -> BoundPlan | None:
    """A bucket plan of this arena at key: one whose state there is remembered, put back (runtime/key_states.py),
    else the last made whose bucket holds the key moved to it (runtime/rekey.py), else a new one made at the key.
    None: the key's own plan (recalled OWN_PLAN_AFTER times, or seen before with its state dropped, while the
    plan cache has room; a bounded arena too small for a bucket; no program library). A bucket plan that cannot
    move to the key is dropped and a new one made at it."""
    seen, uid, buf = arena.seen, variant.uid, arena.buf
    for slot, plan in reversed(arena.buckets.items()):  # a bucket plan that was at this key: its state put back
        if slot[0] == uid:  # (one bound to an older buffer too: it holds that buffer, valid as its own plans are)
            st = plan.bucket
            if key == st.key:  # (its own plan once called ks.OWN_PLAN_IN_A_ROW times in a row: a single shape)
                calls = exe.stats_.calls
                st.in_a_row, st.last_call = (st.in_a_row + 1 if st.last_call == calls - 1 else 1), calls
                return None if st.in_a_row >= ks.OWN_PLAN_IN_A_ROW and len(arena.plans) < exe.options.plan_cache \
                    and own_plan_kept(exe, arena, plan.nbytes) else plan
            made = st.remembered.get(key)
            if made is None:
                continue
            if made.hits >= ks.OWN_PLAN_AFTER and len(arena.plans) < exe.options.plan_cache \
                    and own_plan_kept(exe, arena, made.nbytes):
                ks.forget(plan, key)  # called often enough to pay for binding its own plan (below)
                return None
            made.hits += 1
            leave(exe, plan, arena, spare=key)
            if ks.recall(plan, key, exe.stats_.calls):
                return plan
            break  # (not reached: the state at key is spared) moved or bound below
    nbytes = seen.get((uid, key))  # its per-key bytes, once a bucket plan served it (0: none could)
    if (nbytes is not None and len(arena.plans) < exe.options.plan_cache and own_plan_kept(exe, arena, nbytes)) \
            or program.LIBRARY.try_load() is None:
        return None  # (a full cache would evict another key's plan for this one: a stream cycling over more
        # keys than it holds, a decode loop longer than it, would bind a plan per call)
    if len(seen) >= 4096:
        seen.clear()
    seen[uid, key] = 0
    w = variant.worst
    whole = w is not None and w.monotone and w.reserve <= buf.size  # bounded: the worst case's offsets hold all
    pl = variant.planner if whole else variant.bucket_planner  # (whose offsets are the variant's planner's)
    stale, last = False, None
    for slot, plan in reversed(arena.buckets.items()):  # the last made first (a decode loop's)
        if slot[0] != uid:
            continue
        last = last or plan.bucket.key
        if plan.arena is not buf:
            stale = True
        elif plan.bucket.planner is pl and plan.bucket.covers(key):
            shapes = plan.bucket.shapes_at(pl, key)  # (None: a buffer outgrows its slot in the plan's layout)
            if shapes is None:
                continue
            leave(exe, plan, arena)
            if rekey(pl, plan, key, shapes):
                seen[uid, key] = plan.nbytes
                return plan
            del arena.buckets[slot]  # half moved: never used again; a new bucket plan starts at this key (a
            break  # product that takes another kernel from this size on: its calls change shape once, here)
    shapes = dict(zip(pl.values, pl.shapes(key)))
    if stale:
        ks.drop_stale_buckets(arena)
    if whole:
        top, offsets, total, sizes = None, w.offsets, w.layout, None
    else:
        made = bucket_layout(pl, key, shapes, tuple(s.hi for s in exe.symbols), last)
        if made is None:
            return None
        top, offsets, total, sizes = made
    if total > buf.size:
        if exe.memory.bounded:  # the arenas hold the worst case (or the budget): they do not grow for a bucket
            return None
        try:
            check_machine(total, "a bucket plan", "", [])
            grow(arena, total)
        except (MemoryError, DynshapeError):
            return None
        arena.fit = (pl, offsets, sizes or pl.sizes(shapes))
    slot = (uid, "worst" if top is None else top)
    symvals = variant.build.symbolic(key) if variant.build.symbolic is not None else {}
    state = BucketState(slot, top, offsets, sizes, total, planner=pl)
    plan = pl.bind(key, arena.buf, shapes, offsets, symvals, bucket=state)
    arena.buckets.pop(slot, None)
    while len(arena.buckets) >= BUCKETS_PER_ARENA:
        arena.buckets.pop(next(iter(arena.buckets)))
    arena.buckets[slot] = plan
    plan.bucket.last_call = exe.stats_.calls
    seen[uid, key] = plan.nbytes
    return plan


def own_plan_kept(exe: Executable, arena: Arena, nbytes: int) -> bool:
    """Whether a key's own plan holding `nbytes` of per-key values would stay in the arena's plan cache
    (`PlanCache.keep` under the cap Executable._plan gives it). One that would not is bound again on every call
    (BEiT at 224x224: relative-position tables of ~70 MB per key, 18 ms a call on its bucket plan, 840 ms binding
    its own each call), so the bucket plan goes on serving the key."""
    return nbytes <= exe.memory.plan_bytes() - ks.remembered_bytes(arena)


def leave(exe: Executable, plan: BoundPlan, arena: Arena, spare: tuple | None = None) -> None:
    """A bucket plan about to move off its key: its state there remembered (runtime/key_states.py), as the
    calls at that key left it (their in-place words pointing at the caller's arrays: a decode loop's next
    generation passes the same buffers, so nothing is patched again)."""
    plan.bucket.in_a_row, plan.bucket.last_call = 1, exe.stats_.calls  # (this call: the first at the next key)
    ks.remember(plan, arena, ks.STATES_PER_PLAN * exe.options.plan_cache,  # (one budget for plans and states)
                exe.memory.plan_bytes() - arena.plans.held, spare, exe.stats_.calls)
