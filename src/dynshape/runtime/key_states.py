"""A bucket plan's state at each key it was moved to, remembered and put back when the key comes again.

Why: a decode loop meets each past length once per generation. The first generation moves the bucket plan from
key to key (rekey.py: ~330 us a token on GPT-2's step, against ~120 us of call); the second used to bind each
key's own plan on its second sighting (~1.1 ms a token: a user's second generation ran at 0.2x onnxruntime).
What a move changes is small and known: the words it rewrites in place (the programs and the sealed tables,
`BucketState.mutable`), and the Python objects it assigns (the per-key values, the views, the steps it bound
again, the in-place word positions). `remember` copies the words into one bytes buffer and keeps references to
the objects; `recall` copies the words back and puts the references back, so the plan is what the move to that key
made, without running a binder or a per-key step.

Soundness: a move only assigns the plan's `inputs`, `outputs`, `runs`, `in_place`, `out_place`, `fresh`,
`nbytes`, `want`, `copy_in`, `calls` (an item), `current` and `out_current`, the bucket state's `key`, `fixed`,
the entries of `at` for the names in `fixed` (the map is written in place: its other entries are the layout's, the
same at every key of the bucket), and its caches `shapes` and `arrays` (a recall empties them: the next move makes
them again), and the `calls`, `held` and `shapes` of the steps in `movable`, and only writes words
inside `mutable` (rekey.py's `_move` and `_restore`); a call's in-place patching writes the same words and
`current`, remembered together, so a word and the address `current` says it holds agree after a recall. A state is
remembered as the plan leaves its key (after the calls at it: their in-place words already point at the caller's
arrays), and keeps alive every array its words point at (the per-key values in `fixed`, the views, the tables of
the calls it bound). A key recalled often enough gets its own plan (`OWN_PLAN_AFTER`). Memory is bounded
per arena by STATES_PER_PLAN x the plan cache's count, and by the plan cache's bytes, shared with the cached plans
(`remembered_bytes`).

Which states stay when the memory is full: the least recently used one makes room for a new one only once it has
gone unused for STALE_FACTOR x the states held calls; before that the new state is not kept. Why: a decode loop
longer than the states held meets its past lengths in a cycle, and dropping the least recently used state then
drops each one just before its next use (a 2,048-token generation's second run found few of its lengths'
states and ran at 0.75x onnxruntime); kept, the states of the cycle's first keys serve every later generation,
while a stream that moved to other shapes frees the old states once they have gone unused that long.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.codegen import program
from dynshape.runtime.plan import BoundPlan
from dynshape.runtime.pointers import address
from dynshape.runtime.rekey import BucketState

# recalls of a key after which it gets its own plan (the plan cache permitting): binding one costs about as much
# as 60-90 recalls' overhead on a decoder step (~1.1 ms against 12-18 us), so a key called this often pays for it,
# and one called less never does (the rent-or-buy rule: never more than twice the better choice's cost)
OWN_PLAN_AFTER = 64
# calls in a row at the key a bucket plan is at after which the key gets its own plan (laid out for it, not for its
# bucket's largest key: resnet18_nn ran 1-5% slower on the bucket plan's layout; a single-shape stream gets there
# on its 4th call, a decode loop or a stream of mixed shapes practically never)
OWN_PLAN_IN_A_ROW = 4
STATES_PER_PLAN = 8  # states remembered per arena for each plan the plan cache may hold (a state is lighter)
STALE_FACTOR = 4  # calls unused, in states held, after which the least recently used state may make room
_COPY: list = []  # ds_scatter_bytes and ds_gather_bytes, once the program library is loaded


def _copiers() -> list:
    """[scatter, gather] (csrc/ds_program.c), or [] without the program library (no bucket plan then either)."""
    if not _COPY:
        lib = program.LIBRARY.try_load()
        if lib is not None:
            _COPY.extend((lib.ds_scatter_bytes, lib.ds_gather_bytes))
    return _COPY


class _State:
    """One remembered state: the words, and in one flat tuple (few objects: the collector walks every state kept)
    the plan's and the bucket state's fields a move assigns (the order `recall` unpacks), the calls, the in-place
    addresses, and each movable step's calls, held tables and shapes (one flat tuple, `BucketState.movable_snap`,
    shared by the states remembered while no move bound a step again: a decode loop's lean moves bind none)."""

    __slots__ = ("words", "at", "values", "nbytes", "hits", "last")

    def __init__(self, plan: BoundPlan, st: BucketState, now: int) -> None:
        self.words = np.empty(max(1, st.mutable_bytes), np.uint8)
        self.at = address(self.words)  # (kept alive by `words`)
        _COPY[1](*st.copy_args, self.at)
        snap = st.movable_snap  # (one tuple shared by the states remembered while no move bound a step again)
        if snap is None:
            steps = st.steps
            snap = st.movable_snap = tuple(x for k in st.movable for x in (steps[k].calls, steps[k].held,
                                                                           steps[k].shapes))
        self.values = (plan.inputs, plan.outputs, plan.runs, plan.in_place, plan.out_place, plan.fresh, plan.nbytes,
                       plan.want, plan.copy_in, st.key, tuple(st.at[x] for x in st.fixed),
                       st.fixed, tuple(plan.calls),
                       None if plan.current is None else tuple(plan.current),
                       None if plan.out_current is None else tuple(plan.out_current), snap)
        # its memory, estimated: the words, the per-key values and their map (a dict entry and its object ~100
        # bytes), each movable step's calls, tables and shapes (~500 bytes) and each input's and output's view
        # (~300). Not kept: the shapes and the views' map (a move after a recall makes them again: a move's cache,
        # not its state), nor the arena's addresses (one map per bucket plan, `st.at`, written in place; a state
        # keeps its per-key values'). GPT-2's step at past 530: 31.5 KB measured by tracemalloc, 31 KB estimated.
        self.nbytes = len(self.words) + plan.nbytes + 1024 + 100 * len(st.fixed) + 500 * len(st.movable) \
            + 300 * len(st.io)
        self.hits = 0  # recalls so far
        self.last = now  # the call it was remembered or last recalled at


def remember(plan: BoundPlan, arena: Any, cap_states: int, cap_bytes: int, spare: tuple | None = None,
             now: int = 0) -> None:
    """Remember the plan's state at its current key (`now`: this call's number), within `cap_states` states and
    `cap_bytes` over the arena's bucket plans: the least recently used state makes room once it has gone unused
    for STALE_FACTOR x the states held calls (never this plan's state at `spare`, the key about to be recalled),
    else this state is not kept; a state alone over the caps is not kept either."""
    st: BucketState = plan.bucket
    if st.key in st.remembered or st.mutable is None or not _copiers():
        return
    made = _State(plan, st, now)
    if made.nbytes > cap_bytes or cap_states < 1:
        return
    owners = [st, *(p.bucket for p in arena.buckets.values() if p.bucket is not None and p.bucket is not st)]
    count = sum(len(o.remembered) for o in owners)
    held = sum(o.remembered_bytes for o in owners)
    while count >= cap_states or held + made.nbytes > cap_bytes:
        lru = None  # (its state, owner, key)
        for o in owners:
            for k, state in o.remembered.items():  # in order of use: the first is the owner's least recent
                if o is st and k == spare:
                    continue
                if lru is None or state.last < lru[0].last:
                    lru = (state, o, k)
                break
        if lru is None or now - lru[0].last < STALE_FACTOR * count:
            return  # the states held are in use (a cycle of keys longer than they are): this one is not kept
        gone, owner, old = lru
        del owner.remembered[old]
        owner.remembered_bytes -= gone.nbytes
        count, held = count - 1, held - gone.nbytes
    st.remembered[st.key] = made
    st.remembered_bytes += made.nbytes


def recall(plan: BoundPlan, key: tuple, now: int = 0) -> bool:
    """Put back the plan's state at `key` if remembered (True; `now`, this call's number, is its last use), else
    leave it as it is (False)."""
    st: BucketState = plan.bucket
    if key == st.key:
        return True
    made = st.remembered.pop(key, None)
    if made is None:
        return False
    st.remembered[key] = made  # (last in the order of use)
    made.last = now
    _COPY[0](*st.copy_args, made.at)
    (plan.inputs, plan.outputs, plan.runs, plan.in_place, plan.out_place, plan.fresh, plan.nbytes, plan.want,
     plan.copy_in, st.key, at, st.fixed, calls, current, out_current) = made.values[:15]
    st.shapes, st.arrays = None, {}  # (made again by the next move: rekey)
    st.at.update(zip(st.fixed, at))  # (one map per bucket plan: the per-key values' addresses put back in it)
    plan.calls[:] = calls
    plan.current = None if current is None else list(current)
    plan.out_current = None if out_current is None else list(out_current)
    steps, snap, k = st.steps, made.values[15], 0
    for i in st.movable:
        rec = steps[i]
        rec.calls, rec.held, rec.shapes = snap[k:k + 3]
        k += 3
    st.movable_snap = snap
    return True


def forget(plan: BoundPlan, key: tuple) -> None:
    """Drop the plan's remembered state at `key` (the key gets its own plan)."""
    st: BucketState = plan.bucket
    made = st.remembered.pop(key, None)
    if made is not None:
        st.remembered_bytes -= made.nbytes


def drop_stale_buckets(arena: Any) -> None:
    """Bucket plans bound to the arena's older buffers (it grew since) stay, serving the key each is at and the
    keys whose states it remembers (each holds its buffer, valid as the plan cache's own plans on older buffers
    are): a decode loop's first generation grows the arena as the past crosses octaves, and its second would
    otherwise bind a plan per token of the earlier octaves. Their older buffers are capped at the current one's
    bytes, the oldest plans dropped first."""
    current = arena.buf
    old = [(slot, p.arena) for slot, p in arena.buckets.items() if p.arena is not current]
    held = sum({id(b): b.nbytes for _, b in old}.values())
    for slot, buf in old:
        if held <= current.nbytes:
            break
        del arena.buckets[slot]
        if not any(p.arena is buf for p in arena.buckets.values()):
            held -= buf.nbytes


def remembered_bytes(arena: Any) -> int:
    """The bytes of the states the arena's bucket plans remember: the plan cache's byte cap is shared with them, so
    an arena's cached plans and remembered states hold at most that much between them (Options' memory_budget,
    or PLAN_BYTES)."""
    return sum(p.bucket.remembered_bytes for p in arena.buckets.values() if p.bucket is not None)


def rule(plan_cache: int, plan_bytes: int) -> str:
    """How an arena serves keys with plans, for explain."""
    return (f"a key first seen is served by its bucket's plan moved to it; the plan's state at each key is remembered "
            f"as it leaves and put back when the key comes again; a key called {OWN_PLAN_IN_A_ROW} times in a row or "
            f"recalled {OWN_PLAN_AFTER} times binds its own plan; per arena at most {plan_cache} plans, "
            f"{STATES_PER_PLAN * plan_cache} states and {plan_bytes / 2**20:.0f} MiB of per-key values between them; "
            f"a full memory takes a new state only in place of one unused for {STALE_FACTOR}x the states held calls")
