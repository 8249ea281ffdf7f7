"""The iterations of a compiled Loop / Scan body (loop_bodies.py): checked until the shapes settle, then lean.

Why: called through the executable's general path, a small body's iteration cost ~11 us against ~4 us of
kernels: the binder's checks, copying every input into the arena (the outer values and, for a Loop reading the
whole sequence, all of it, every iteration), re-pointing inputs read in place, copying every output out, then
the loop's own feed dicts, slices and a final np.stack. Yet once an iteration's (checked) carried inputs have the
shapes and dtypes of the carried outputs its plan gives, the next iteration's key, checks and plan are the same,
and so are every later one's (the plan fixes the outputs' shapes). From that iteration on, each writes only what
changes into the plan's input slots (the iteration number, the scan slices, the carried values copied from the
last iteration's output slots: they never leave the arena), runs the bound calls, and copies the scan outputs
straight into their rows of one preallocated output; the shared inputs are loaded once (`BoundPlan.load`) and
stay in their slots for the whole loop: the body is built with `inputs_kept`, so no value of the body reuses an
input's slot.

When every step of the plan is native, the lean iterations are one C call (loop_driver.py: ds_run_loop runs the
body's steps N times with the slice and row copies around them, reading the condition between iterations);
otherwise the loop below runs them from Python.

Every iteration before that (a carried value that changes shape: growing, or first narrowed) goes through the
checked path: binder, plan for its key, `plan.run`. A plan whose carried output may overlap another carried
input's slot (a body that swaps two values through views) stays on the checked path, as does a call served
without a plan.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynshape.runtime.loop_driver import Driver
from dynshape.runtime.plan import BoundPlan
from dynshape.runtime.pointers import address

__all__ = ["Roles", "Stacks", "iterate", "own", "scalar"]

GROW_FROM = 16  # rows of a scan output whose trip count is unknown (or over MAX_ROWS): doubled when full
CHUNK = 1 << 16  # lean iterations per C call at most (an interrupt waits for the call)
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

    def __post_init__(self) -> None:  # the names each call's feed takes, once (frozen: set through object)
        object.__setattr__(self, "feed_names", ([self.names[k] for k in self.carried_in],
                                                [self.names[k] for k in self.slices_in],
                                                None if self.counter is None else self.names[self.counter]))


class Stacks:
    """The scan outputs, each written row by row into one preallocated array (rows in reverse for a Scan's
    reverse outputs); the rows grow by doubling when the trip count is not known."""

    def __init__(self, names: tuple[str, ...], rows: int | None, reverse: list[bool], exact: bool = False,
                 into: list | None = None):
        """`rows`: the trip count (None: unknown); `exact`: every row will be written (a Scan); `into`: per output,
        an array of `rows` rows (any strides: a view of the node's planned output) to write them into, or None."""
        self.names, self.rows = names, rows
        self.cap = rows if rows is not None and (exact or rows <= MAX_ROWS) else GROW_FROM
        self.last = [None if not r else rows - 1 for r in reverse]  # (reverse only with a known count)
        self.bufs: list[np.ndarray | None] = [None] * len(names)
        if into is not None and exact:
            self.bufs = list(into)

    def ready(self, items: list, i: int) -> None:
        """Rows for items like these from iteration i on: the first fix each output's row shape and dtype; a
        later iteration's must have that shape."""
        for j, y in enumerate(items):
            b = self.bufs[j]
            if b is None:
                self.bufs[j] = np.empty((self.cap, *y.shape), y.dtype)
            elif b.shape[1:] != y.shape or b.dtype != y.dtype:
                raise ValueError(f"scan output {self.names[j]!r} is {y.dtype}{list(y.shape)} at iteration {i} but "
                                 f"{b.dtype}{list(b.shape[1:])} before: every iteration's must agree")

    def put(self, i: int, items: list) -> None:
        """Row i of every output (the checked path)."""
        items = [np.asarray(y) for y in items]
        self.ready(items, i)
        for j, y in enumerate(items):
            b = self.bufs[j]
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

    def result(self, j: int, n: int, copy: bool = True) -> np.ndarray | None:
        """Output j after n iterations (None: no row was written), exactly n rows: its own array, or with `copy`
        False possibly a view of the rows (for a caller that copies it anyway)."""
        b = self.bufs[j]
        if b is None or not n:
            return None
        return b if b.shape[0] == n else b[:n].copy() if copy else b[:n]


class Lean:
    """A plan's views as the lean iterations use them (made once per plan, kept by the body for its next call):
    the carried values' input slots and output views, the copies that carry them from one iteration to the
    next (None: an output view overlaps another carried input's slot, so they cannot be copied one by one),
    the iteration number's slot, the scan slices' slots, the condition and the scan outputs."""

    __slots__ = ("plan", "dst", "src", "copies", "counter", "slices", "cond", "ys", "driver")

    def __init__(self, plan: BoundPlan, roles: Roles):
        views, outs = plan.inputs, dict(plan.outputs)
        self.plan = plan
        self.dst = [views[k] for k in roles.carried_in]
        self.src = [outs[x] for x in roles.carried_out]
        self.copies: list | None = []
        for d, s in zip(self.dst, self.src):
            if d is None or _same(d, s):
                continue  # the body does not read it / passes it through
            if any(o is not None and np.may_share_memory(s, o) for o in self.dst):
                self.copies = None
                break
            self.copies.append((d, s))
        self.counter = None if roles.counter is None else views[roles.counter]
        self.slices = [views[k] for k in roles.slices_in]
        self.cond = None if roles.cond_out is None else outs[roles.cond_out]
        if self.cond is not None:
            scalar(self.cond, "condition")  # one element (the plan fixes its shape: checked once per plan)
        self.ys = [outs[x] for x in roles.ys_out]
        self.driver: Driver | None | bool = None  # made on first use; False: a step has no C form

    def settled(self, arrays: list, roles: Roles) -> bool:
        """Whether these inputs' next iterations all run on this plan: every carried input has its output's
        shape and dtype (then so does every later one: the plan fixes the outputs)."""
        if self.copies is None:
            return False
        for k, s in zip(roles.carried_in, self.src):
            a = arrays[k]
            if np.shape(a) != s.shape or getattr(a, "dtype", None) != s.dtype:
                return False
        return True


def iterate(bind: Callable, run: Callable, roles: Roles, feed: dict, carried: list, slices: list,
            limit: int | None, ys: Stacks, memo: list) -> tuple[list, int]:
    """Run the iterations: `bind` is `Executable.held()`'s, `run` the executable's general call. `feed` holds the
    values every iteration shares (the outer values; a Loop's condition); `limit` the trip count (None: until the
    condition says stop); `memo` the body's last `Lean` (one item). Returns the final carried values and the
    number of iterations run; the values may be views of the body's arena, valid only while `bind`'s arena is
    held: the caller copies them out (`own`) before it lets go."""
    carried_names, slice_names, counter = roles.feed_names  # type: ignore[attr-defined]
    stop = sys.maxsize if limit is None else limit
    i, go = 0, True
    while go and i < stop:
        feed.update(zip(carried_names, carried))
        if counter is not None:
            feed[counter] = np.array(i, np.int64)
        feed.update((x, np.asarray(a[i])) for x, a in zip(slice_names, slices))  # a 1-D input: 0-d slices
        arrays, plan = bind(feed)  # every check of the inputs
        if plan is not None:
            lean = memo[0]
            if lean is None or lean.plan is not plan:
                lean = memo[0] = Lean(plan, roles)
            if lean.settled(arrays, roles):
                return _lean(lean, roles, arrays, i, stop, slices, ys)
        res = plan.run(arrays) if plan is not None else run(feed)
        if roles.cond_out is not None:
            go = bool(scalar(res[roles.cond_out], "condition"))
        carried = [res[x] for x in roles.carried_out]
        ys.put(i, [res[x] for x in roles.ys_out])
        i += 1
    return carried, i


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return address(a) == address(b) and a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype


def _lean(lean: Lean, roles: Roles, arrays: list, i: int, stop: int, slices: list, ys: Stacks) -> tuple[list, int]:
    """The iterations from i on, on one plan whose inputs `arrays` (checked) settle: write what changes into its
    slots, execute, read; the shared inputs loaded once."""
    plan = lean.plan
    plan.load(arrays, roles.kept)
    for k, d in zip(roles.carried_in, lean.dst):
        if d is not None:
            d[...] = arrays[k]
    ysrc = lean.ys
    ys.ready(ysrc, i)
    grows = ys.rows is None or ys.rows > ys.cap
    while grows and i >= ys.cap:  # the checked iterations filled every row
        ys.grow()
    drv = lean.driver
    if drv is None:
        drv = lean.driver = Driver.make(lean) or False
    if drv and drv.point(slices, stop):
        return _driven(drv, lean, i, stop, ys, grows)
    counter, cond, copies, src = lean.counter, lean.cond, lean.copies, lean.src
    sl = [(v, a) for v, a in zip(lean.slices, slices) if v is not None]
    rows = list(zip(ysrc, ys.bufs, ys.last))
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
            rows = list(zip(ysrc, ys.bufs, ys.last))
        for d, s in copies:
            d[...] = s
    return src, i  # views of the arena: the caller copies them (`own`)


def _driven(drv: Driver, lean: Lean, i: int, stop: int, ys: Stacks, grows: bool) -> tuple[list, int]:
    """`_lean`'s loop in C (loop_driver.py), in runs of at most CHUNK iterations (an interrupt is seen between
    them) and up to the rows of the scan outputs when they grow."""
    cond, first = lean.cond, False
    while True:
        if grows and ys.bufs and i >= ys.cap:
            ys.grow()
        drv.point_rows(ys.bufs, ys.last)
        end = min(stop, i + CHUNK, ys.cap if grows and ys.bufs else stop)
        i = drv.run(i, end, first)
        if i >= stop or (cond is not None and not cond.item()):
            break
        first = True
    return lean.src, i


def own(values: list, into: list | None) -> list:
    """The carried values as the caller's: copied into `into`'s arrays where given (the node's planned outputs),
    else into new arrays (`iterate`'s may be views of the body's arena)."""
    if into is None:
        return [np.array(v, copy=True) for v in values]
    out = []
    for v, o in zip(values, into):
        if o is None:
            out.append(np.array(v, copy=True))
        else:
            o[...] = v
            out.append(o)
    return out


def scalar(x: Any, what: str) -> Any:
    a = np.asarray(x)
    if a.size != 1:
        raise ValueError(f"the {what} must be a scalar (one element), got shape {a.shape}")
    return a.reshape(-1)[0]
