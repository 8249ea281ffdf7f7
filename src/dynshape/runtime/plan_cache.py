"""The plans bound to one arena, by (variant uid, key), and the policy that keeps them bounded.

A bound plan holds per-key values (masks, position ids, token-type embeddings) besides its pre-bound calls, so
the cache is capped by count and by those bytes. The oldest plan goes first. Keeping the most-called keys
instead fixed a stream cycling over more keys than fit, but resident memory then crept up 3-4% over 3,000
random shapes after warm-up, against 0.04% with this policy (bench/memory_bench.py). Known cost: a stream
cycling over more keys than the cache holds (the shared request stream: 171 keys, 77 MB) re-plans every call.
"""

from __future__ import annotations

PLANS_PER_ARENA = 256  # the default of Options.plan_cache
PLAN_BYTES = 64 << 20  # per arena: per-key values (masks, ids) the cached plans hold


class PlanCache(dict):
    """Insertion-ordered plans by (variant uid, key): reads are plain dict lookups (the request path). `held`:
    the per-key bytes of the plans in it, kept as plans come and go (summing them per new plan cost ~10 us with
    256 cached: a decode loop binds a plan per token)."""

    def __init__(self, plans: dict | None = None) -> None:
        super().__init__()
        self.held = 0
        for slot, plan in (plans or {}).items():
            self[slot] = plan

    def __setitem__(self, slot: tuple, plan) -> None:
        old = self.get(slot)
        if old is not None:
            self.held -= old.nbytes
        super().__setitem__(slot, plan)
        self.held += plan.nbytes

    def __delitem__(self, slot: tuple) -> None:
        self.held -= self[slot].nbytes
        super().__delitem__(slot)

    def pop(self, slot: tuple, *default):
        if slot not in self:
            return super().pop(slot, *default)
        plan = super().pop(slot)
        self.held -= plan.nbytes
        return plan

    def clear(self) -> None:
        super().clear()
        self.held = 0

    def keep(self, slot: tuple, plan, cap_bytes: int, cap_plans: int = PLANS_PER_ARENA) -> None:
        """Cache a new plan within `cap_plans` plans and `cap_bytes` of per-key values, the oldest going first;
        a plan alone over a cap serves its own call and is not kept."""
        if plan.nbytes > cap_bytes or cap_plans < 1:
            return
        while self and (len(self) >= cap_plans or self.held + plan.nbytes > cap_bytes):
            self.pop(next(iter(self)))
        self[slot] = plan

    def drop_stale(self, current_bytes: int) -> None:
        """After the arena grew: plans bound to older buffers stay valid (each keeps its buffer alive), so a key
        seen before the growth is not re-planned on its next call (re-planning is the latency spike a warmed-up
        stream must not see). Those older buffers are capped at `current_bytes` in all, the plans on the oldest
        (smallest) buffers dropped first."""
        keys_of: dict[int, list] = {}  # id(old buffer) -> slots of the plans bound to it
        size_of: dict[int, int] = {}
        for slot, plan in self.items():
            keys_of.setdefault(id(plan.arena), []).append(slot)
            size_of[id(plan.arena)] = plan.arena.nbytes
        stale = sum(size_of.values())
        for buf in sorted(size_of, key=size_of.__getitem__):  # the smallest buffers are the oldest
            if stale <= current_bytes:
                break
            for slot in keys_of[buf]:
                del self[slot]
            stale -= size_of[buf]
