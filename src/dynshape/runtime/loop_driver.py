"""The lean iterations of a compiled Loop / Scan body (body_iterations.py) run by one C call, ds_run_loop.

Why: once a body's carried shapes settle, each iteration is the same few things on the same plan: write the
iteration number and the scan slices into their input slots, run the body's bound native steps, copy the scan
outputs into their rows, copy the carried outputs into the carried inputs' slots. Driven from Python that is
~1 us an iteration around a body of ~1 us of kernels (an RNN cell of a 32x32 MatMul and a Tanh at batch 4):
a third to a half of the loop. Here every one of those is a step of an int64 program (ds_program.c): the body's
steps as its plan packed them, and strided copies whose source (a scan slice) or destination (an output row)
address the driver advances by a fixed stride per iteration; ds_run_loop runs them N times, reading the
condition between iterations, and returns the iterations it ran.

A plan is driven only when every step of its body is native (a NativeCall, or a Python step that offers a C
form: a Gather of an index read at run time); every other plan keeps the Python lean loop. A C step that finds
an index out of range sets a status word and the driver stops after that iteration: the caller re-runs it on
the plan's own (Python) steps, which raise by name.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import numpy as np

from dynshape.codegen import program
from dynshape.codegen.lowering import NativeCall
from dynshape.errors import ConstraintViolation
from dynshape.runtime.pointers import address

if TYPE_CHECKING:
    from dynshape.runtime.body_iterations import Lean

__all__ = ["Driver"]

_HEADER = 8  # [body, nbody, carry, ncarry, cond, nstat, stat, nadv] then (word, base, delta) per advancing word


def _copy_desc(dst: np.ndarray, src: np.ndarray) -> np.ndarray | None:
    """ds_copy_strided's descriptor: dst (C-contiguous) = src (any strides), or None when it cannot be one."""
    if dst.shape != src.shape or dst.dtype != src.dtype or not dst.flags.c_contiguous or dst.ndim > 16:
        return None
    return np.array([dst.ndim, dst.itemsize, address(dst), address(src), *dst.shape, *src.strides], np.int64)


class Driver:
    """One plan's iterations in C, made once per plan (`make`) and pointed at each call's scan inputs and output
    rows (`run`). `keep` holds every array whose address a program word holds."""

    def __init__(self, lib: ctypes.CDLL, steps: list[int], nsteps: int, stat: list[int], lean: Lean) -> None:
        copy, general = program.address(lib.ds_copy_strided), program.address(lib.ds_copy_general)
        self.lib, self.plan = lib, lean.plan
        self.keep: list = []

        def desc_step(desc: np.ndarray, fn: int = copy) -> list[int]:
            self.keep.append(desc)
            return [fn, 1, address(desc)]

        carry: list[int] = []
        for d, s in lean.copies:
            carry += desc_step(_copy_desc(d, s))
        # scan slices: the descriptor's source (word 3) advances by the input's stride (its strides: per call)
        self.slices = [(v, np.array([v.ndim, v.itemsize, address(v), 0, *v.shape, *v.strides], np.int64))
                       if v is not None else None for v in lean.slices]
        self.seen: list = [None] * (len(self.slices) + len(lean.ys))  # (address, strides) last pointed at
        # scan outputs: the descriptor's destination (word 2), a row of the call's buffer (any strides: a row of
        # the Scan's own output, whose scan axis may be inner), advances by a row
        self.row_descs = [np.array([y.ndim, y.itemsize, 0, address(y), *y.shape, *y.strides, *y.strides], np.int64)
                          for y in lean.ys]
        pre = [w for sl in self.slices if sl is not None for w in desc_step(sl[1])]
        post = [w for desc in self.row_descs for w in desc_step(desc, general)]
        body = np.array(pre + steps + post, np.int64)
        carry_words = np.array(carry or [0], np.int64)
        self.stat = np.array(stat or [0], np.int64)
        self.status = [ctypes.c_int64.from_address(a) for a in stat]
        self.keep += [body, carry_words]
        adv = []
        if lean.counter is not None:
            adv.append((address(lean.counter), 0, 1))
        self.at_slices = _HEADER + 3 * len(adv)
        adv += [(address(desc) + 24, 0, 0) for sl in self.slices if sl is not None for desc in (sl[1],)]
        self.at_rows = _HEADER + 3 * len(adv)
        adv += [(address(desc) + 16, 0, 0) for desc in self.row_descs]
        cond = 0 if lean.cond is None else address(lean.cond)
        self.head: np.ndarray = np.array([address(body), len(pre) // 3 + nsteps + len(post) // 3, address(carry_words),
                              len(carry) // 3, cond, len(stat), address(self.stat), len(adv)]
                             + [w for a in adv for w in a], np.int64)
        self.head_at = address(self.head)

    @staticmethod
    def make(lean: Lean) -> Driver | None:
        """The driver of this Lean's plan, or None when one of its steps has no C form (or no C compiler)."""
        lib = program.LIBRARY.try_load()
        if lib is None or lean.copies is None:
            return None
        steps: list[int] = []
        stat: list[int] = []
        n = 0
        for c in lean.plan.calls:
            n += 1
            if type(c) is NativeCall:
                if len(c.args) > program.MAX_ARGS or not all(type(a) is int for a in c.args):
                    return None
                steps += [program.address(c.fn), len(c.args), *c.args]
            elif getattr(c, "native", None) is not None:
                fn, table = c.native
                steps += [program.address(fn), 1, table.addr]
                stat.append(table.addr + 7 * 8)
            else:
                return None
        # the status words of the plan's native calls that check their inputs (a Gather's indices read at run time)
        stat += [ctypes.addressof(words) + 8 * k for words, k, _ in lean.plan.checks]
        counter = lean.counter
        if counter is not None and (counter.dtype != np.int64 or counter.shape != ()):
            return None
        if lean.cond is not None and lean.cond.dtype != np.bool_:
            return None
        for d, s in lean.copies:
            if _copy_desc(d, s) is None:
                return None
        if any(v is not None and (not v.flags.c_contiguous or v.ndim > 16) for v in lean.slices):
            return None
        if any(y.ndim > 16 for y in lean.ys):
            return None
        return Driver(lib, steps, n, stat, lean)

    def point(self, slices: list, stop: int) -> bool:
        """Point the slice copies at this call's scan inputs (each's rows along axis 0, any strides); False when
        one cannot be read so (its row shape or dtype differs from its slot's, or it has fewer than `stop` rows:
        the Python path raises)."""
        head, j, seen = self.head, self.at_slices, self.seen
        for k, (sl, a) in enumerate(zip(self.slices, slices)):
            if sl is None:
                continue
            v, desc = sl
            if a.shape[1:] != v.shape or a.dtype != v.dtype or a.shape[0] < stop:
                return False
            at = (address(a), a.strides)
            if seen[k] != at:  # (a planned caller passes the same buffer every call)
                desc[4 + v.ndim:] = a.strides[1:]
                head[j + 1], head[j + 2] = at[0], a.strides[0]
                seen[k] = at
            j += 3
        return True

    def point_rows(self, bufs: list, last: list) -> None:
        """Point the row copies at these output buffers (row i, or row last - i for a reversed output)."""
        head, j, seen, k = self.head, self.at_rows, self.seen, len(self.slices)
        for b, end, desc in zip(bufs, last, self.row_descs):
            at = (address(b), b.strides, end)
            if seen[k] != at:
                nd = b.ndim - 1
                desc[4 + nd:4 + 2 * nd] = b.strides[1:]
                base, step = at[0], b.strides[0]
                if end is not None:
                    base, step = base + end * step, -step
                head[j + 1], head[j + 2] = base, step
                seen[k] = at
            j += 3
            k += 1

    def run(self, i: int, stop: int, carry_first: bool) -> int:
        """Iterations i .. stop - 1 (fewer when the condition turns false); the next iteration's number. An
        iteration a C step refused is run again on the plan's own steps, which raise naming the node."""
        n = self.lib.ds_run_loop(self.head_at, i, stop, int(carry_first))
        for s in self.status:
            if s.value:
                for t in self.status:
                    t.value = 0
                self.plan.execute()  # the same iteration: its inputs are still in their slots
                raise ConstraintViolation(f"iteration {n - 1}: a native step of the loop body refused its input, which "
                                   "the plan's own steps then accepted")
        return n
