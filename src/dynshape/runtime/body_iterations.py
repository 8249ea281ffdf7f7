"""The iterations of a compiled Loop / Scan body (loop_bodies.py): checked until the shapes settle, then lean.

Why: called through the executable's general path, a small body's iteration cost ~11 us against ~4 us of
kernels: the binder's checks, copying every input into the arena (the outer values and, for a Loop reading the
whole sequence, all of it, every iteration), re-pointing inputs read in place, copying every output out, then
the loop's own feed dicts, slices and a final np.stack. Yet once an iteration's carried outputs have the shapes
and dtypes of its carried inputs, the next iteration's key, checks and plan are the same, and so are every later
one's (the plan fixes the outputs' shapes). From there on an iteration writes only what changes into the plan's
input slots (the iteration number, the scan slices, the carried values copied from the last iteration's output
slots: they never leave the arena), runs the bound calls, and copies the scan outputs straight into their rows of
one preallocated output. The outer values stay in their slots for the whole loop: the body is built with
`inputs_kept`, so no value of the body reuses an input's slot.

The first iteration, and every one whose carried shapes change (a value growing per iteration), goes through
the checked path: binder, plan for its key, `plan.run`. A plan whose carried output may overlap another carried
input's slot (a body that swaps two values through views) stays on the checked path, as does a call served
without a plan.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynshape.runtime.plan import BoundPlan

__all__ = ["Roles", "Stacks", "iterate", "scalar"]

GROW_FROM = 16  # rows of a scan output whose trip count is unknown (or over MAX_ROWS): doubled when full
MAX_ROWS = 4096  # a known trip count up to this preallocates every row (a Loop stopped early copies its rows)


@dataclass(frozen=True)
class Roles:
    """What each body input and output is to the loop, by position (inputs) and name (outputs)."""

    names: tuple[str, ...]  # the body's inputs (the compiled graph's), in order
    counter: int | None  # the iteration number (Loop)
    carried_in: tuple[int, ...]
    carried_out: tuple[str, ...]
    slices_in: tuple[int, ...]  # the scan slices (Scan)
    cond_out: str | None  # the condition (Loop)
    ys_out: tuple[str, ...]  # the scan outputs
    kept: frozenset  # inputs that keep their value for the whole loop (the outer values, a Loop's condition)


class Stacks:
    """The scan outputs, each written row by row into one preallocated array (rows in reverse for a Scan's
    reverse outputs); the rows grow by doubling when the trip count is not known."""

    def __init__(self, names: tuple[str, ...], rows: int | None, reverse: list[bool], exact: bool = False):
        """`rows`: the trip count (None: unknown); `exact`: every row will be written (a Scan)."""
        self.names, self.rows = names, rows
        self.cap = rows if rows is not None and (exact or rows <= MAX_ROWS) else GROW_FROM
        self.last = [None if not r else rows - 1 for r in reverse]  # (reverse only with a known count)
        self.bufs: list[np.ndarray | None] = [None] * len(names)

    def put(self, i: int, items: list) -> None:
        """Row i of every output (the checked path: the first row fixes each output's row shape and dtype)."""
        for j, y in enumerate(items):
            y = np.asarray(y)
            b = self.bufs[j]
            if b is None:
                b = self.bufs[j] = np.empty((self.cap, *y.shape), y.dtype)
            elif b.shape[1:] != y.shape:
                raise ValueError(f"scan output {self.names[j]!r} has shape {y.shape} at iteration {i} but "
                                 f"{b.shape[1:]} before: every iteration's must agree")
            if i >= b.shape[0]:
                self.grow()
                b = self.bufs[j]
            last = self.last[j]
            b[i if last is None else last - i] = y

    def grow(self) -> None:
        self.cap *= 2
        for j, b in enumerate(self.bufs):
            if b is not None:
                g = np.empty((self.cap, *b.shape[1:]), b.dtype)
                g[:b.shape[0]] = b
                self.bufs[j] = g

    def result(self, j: int, n: int) -> np.ndarray | None:
        """Output j after n iterations (None: no row was written); its own array, exactly n rows."""
        b = self.bufs[j]
        if b is None or not n:
            return None
        return b if b.shape[0] == n else b[:n].copy()


def iterate(bind: Callable, run: Callable, roles: Roles, feed: dict, carried: list, slices: list,
            limit: int | None, ys: Stacks) -> tuple[list, int]:
    """Run the iterations: `bind` is `Executable.held()`'s, `run` the executable's general call. `feed` holds the
    values every iteration shares (the outer values; a Loop's condition); `limit` the trip count (None: until the
    condition says stop). Returns the final carried values and the number of iterations run."""
    names = roles.names
    carried_names = [names[k] for k in roles.carried_in]
    slice_names = [names[k] for k in roles.slices_in]
    counter = None if roles.counter is None else names[roles.counter]
    stop = sys.maxsize if limit is None else limit
    i, go = 0, True
    while go and i < stop:
        feed.update(zip(carried_names, carried))
        if counter is not None:
            feed[counter] = np.array(i, np.int64)
        feed.update((x, np.asarray(a[i])) for x, a in zip(slice_names, slices))  # a 1-D input: 0-d slices
        arrays, plan = bind(feed)
        res = plan.run(arrays) if plan is not None else run(feed)
        if roles.cond_out is not None:
            go = bool(scalar(res[roles.cond_out], "condition"))
        carried = [res[x] for x in roles.carried_out]
        ys.put(i, [res[x] for x in roles.ys_out])
        i += 1
        if plan is not None and go and i < stop:
            copies = _settled(plan, roles, arrays, carried)
            if copies is not None:
                return _lean(plan, roles, copies, i, stop, carried, slices, ys)
    return carried, i


def _settled(plan: BoundPlan, roles: Roles, arrays: list, carried: list) -> list | None:
    """The (input slot, output view) copies that carry the values from one iteration to the next in this plan,
    or None when the next iteration needs the checked path: a carried value whose shape or dtype differs from the
    input it feeds (another key), or an output view that overlaps another carried input's slot (the copies
    would clobber it). A pass-through (the output is the input's slot) needs no copy."""
    views, outs = plan.inputs, dict(plan.outputs)
    for k, c in zip(roles.carried_in, carried):
        a = arrays[k]
        if np.shape(a) != c.shape or getattr(a, "dtype", None) != c.dtype:
            return None
    dst = [views[k] for k in roles.carried_in]
    copies = []
    for d, x in zip(dst, roles.carried_out):
        s = outs[x]
        if d is None or _same(d, s):
            continue  # the body does not read it / passes it through
        if any(o is not None and np.may_share_memory(s, o) for o in dst):
            return None
        copies.append((d, s))
    return copies


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.shape == b.shape
            and a.strides == b.strides and a.dtype == b.dtype)


def _lean(plan: BoundPlan, roles: Roles, copies: list, i: int, stop: int, carried: list, slices: list,
          ys: Stacks) -> tuple[list, int]:
    """The iterations from i on, each on the same plan: write what changes into its slots, execute, read."""
    views, outs = plan.inputs, dict(plan.outputs)
    plan.to_slots(roles.kept)
    for k, c in zip(roles.carried_in, carried):  # the checked iteration's results (copies out of the arena)
        if views[k] is not None:
            views[k][...] = c
    counter = None if roles.counter is None else views[roles.counter]
    sl = [(views[k], a) for k, a in zip(roles.slices_in, slices) if views[k] is not None]
    cond = None if roles.cond_out is None else outs[roles.cond_out]
    src = [outs[x] for x in roles.carried_out]
    ysrc = [outs[x] for x in roles.ys_out]
    grows = ys.rows is None or ys.rows > ys.cap
    rows = [(y, b, last) for y, b, last in zip(ysrc, ys.bufs, ys.last)]
    execute = plan.execute
    while True:
        if counter is not None:
            counter[()] = i
        for v, a in sl:
            v[...] = a[i]
        execute()
        for y, b, last in rows:
            b[i if last is None else last - i] = y
        i += 1
        if (cond is not None and not cond.item()) or i >= stop:
            break
        if grows and i >= ys.cap:
            ys.grow()
            rows = [(y, b, last) for y, b, last in zip(ysrc, ys.bufs, ys.last)]
        for d, s in copies:
            d[...] = s
    return [np.array(s, copy=True) for s in src], i  # the arena is the executable's: the caller's own arrays


def scalar(x: Any, what: str) -> Any:
    a = np.asarray(x)
    if a.size != 1:
        raise ValueError(f"the {what} must be a scalar (one element), got shape {a.shape}")
    return a.reshape(-1)[0]
