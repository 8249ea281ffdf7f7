"""Programs: runs of pre-bound native calls packed into int64 words that one C call executes, and where the words
of a plan hold an in-place value's address (so a call can point them at the caller's array).

Why apart from plan.py: a plan bound per key (plan.py) and a bucket plan moved between keys in place (rekey.py)
build and patch the same words.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import numpy as np

from dynshape.codegen import program
from dynshape.codegen.keep import Keep, TableRef, resolved
from dynshape.codegen.lowering import NativeCall

Call = Callable[[], None]


def patch(places: list, at: int) -> None:
    for words, positions in places:
        words[positions] = at


def find_places(values: list[tuple], at: dict, nbytes: dict, dtypes: dict, calls: list,
                programs: list[np.ndarray], spans: dict | None = None) -> tuple:
    """Where each in-place value's arena address stands in this plan's programs and int64 tables: (key, dtype, slot,
    bytes, places) per (key, value name) given. Its slot is its own for the whole call (the planner extends its
    lifetime), so a word equal to it is that value or a view of it. A value is left to be copied as usual (no
    entry) when a call outside the programs takes an address in its slot, or when any word points inside the slot
    but not at its start: a native binder's derived address (a Split's second half, a Slice's offset, a strided
    copy's rows) that a patch of the start would leave pointing into the arena. `spans` (bytes per value, at least
    its size): the slots as a bucket plan lays them out for its largest key, so that which words lie inside a slot
    does not change with the key (rekey.py)."""
    if not values or not programs:
        return ()
    # one pass over the words, each placed among the values' slots by bisection (whole-array comparisons per value
    # and program cost ~35 us a value: 141 of the 385 us a new past length spent binding its plan)
    size = nbytes if spans is None else spans
    ranges = sorted((at[x], at[x] + max(1, size[x]), k) for k, (_, x) in enumerate(values))
    firsts = [r[0] for r in ranges]
    lo_all, hi_all = ranges[0][0], max(r[1] for r in ranges)

    def owner(w: int) -> int:
        """The index in `ranges` of the slot holding address w, or -1."""
        i = bisect.bisect_right(firsts, w) - 1
        return i if i >= 0 and w < ranges[i][1] else -1

    dropped = set()  # values an outside call addresses, or with a word inside the slot but not at its start
    for c in calls:
        if type(c) is NativeCall:
            for a in c.args:
                if type(a) is int and lo_all <= a < hi_all and (i := owner(a)) >= 0:
                    dropped.add(i)
    found: dict[int, list] = {}  # range index -> [(program index, positions)]
    # word by word in plain Python for a few words (a decoder step's 58: numpy's fixed costs are more), else the
    # words inside any slot picked out by numpy in one pass over them all (GPT-2's step: ~2,000 words)
    if sum(len(w) for w in programs) <= 256:
        scan = ((j, pos, w) for j, words in enumerate(programs) for pos, w in enumerate(words.tolist())
                if lo_all <= w < hi_all)
    else:
        flat = np.concatenate(programs)
        hits = np.flatnonzero((flat >= lo_all) & (flat < hi_all))
        starts = np.cumsum([0] + [len(w) for w in programs])
        owners = np.searchsorted(starts, hits, side="right") - 1
        scan = zip(owners.tolist(), (hits - starts[owners]).tolist(), flat[hits].tolist())
    for j, pos, w in scan:
        i = owner(w)
        if i < 0:
            continue
        if w != ranges[i][0]:
            dropped.add(i)
            continue
        hits_i = found.setdefault(i, [])
        if hits_i and hits_i[-1][0] == j:
            hits_i[-1][1].append(pos)
        else:
            hits_i.append((j, [pos]))
    slot_of = {k: i for i, (_, _, k) in enumerate(ranges)}
    out = []
    for k, (key, x) in enumerate(values):
        i = slot_of[k]
        if i in dropped or i not in found:
            continue
        # (a single word as its index: numpy sets one item several times faster than it sets an index array's)
        places = [(programs[j], pos[0] if len(pos) == 1 else np.array(pos, np.intp)) for j, pos in found[i]]
        out.append((key, dtypes[x], at[x], nbytes[x], places))
    return tuple(out)


def native_words(call: Call, entry: Callable[[Any], int]) -> list[int] | None:
    """[entry address, nargs, *args] of a call a program can run (a NativeCall of at most MAX_ARGS ints, its
    tables sealed), else None."""
    if type(call) is not NativeCall or len(call.args) > program.MAX_ARGS:
        return None
    args = [a.addr if type(a) is TableRef else a for a in call.args]
    if not all(type(a) is int for a in args):
        return None
    return [entry(call.fn), len(args), *args]


_RUN_LABELS: dict[tuple, str] = {}  # one string per (first, last, count) of a program run, shared by every plan


def pack_programs(calls: list[Call], labels: list[str], keep: Keep, entry: Callable[[Any], int] = program.address,
              programs: list | None = None, min_run: int = 2,
              where: list | None = None) -> tuple[list[Call], list[str]]:
    """Runs of `min_run` (two) or more native calls become one ds_run_program call over an int64 program (tables
    resolved to their sealed addresses, in the same pass); every other call with its tables resolved. The
    programs made are appended to `programs` (inputs read in place patch their words). `where` (with `programs`):
    per call given, (index in `programs`, offset of its words) where it went into a program, else its index in the
    calls returned (a bucket plan rewrites a step's words or replaces its call when it moves to another key,
    rekey.py)."""
    lib = program.LIBRARY.try_load()
    if lib is None:
        return [resolved(c) for c in calls], labels
    out: list = []
    out_labels: list = []
    run: list = []  # (call, label, program words, index) of the native calls since the last Python one

    def flush() -> None:
        if run and len(run) >= min_run:
            if where is not None and programs is not None:
                at = 0
                for _, _, words, k in run:
                    where[k] = (len(programs), at)
                    at += len(words)
            prog = np.array([x for _, _, words, _ in run for x in words], dtype=np.int64)
            keep.append(prog)
            if programs is not None:
                programs.append(prog)
            ends = (run[0][1], run[-1][1], len(run))
            label = _RUN_LABELS.get(ends)
            if label is None:
                if len(_RUN_LABELS) >= 4096:  # labels of executables since freed: a bound, not a working set
                    _RUN_LABELS.clear()
                label = _RUN_LABELS[ends] = "{} .. {} ({} native steps)".format(*ends)
            out.append(NativeCall(lib.ds_run_program, (prog.ctypes.data, len(run))))
            out_labels.append(label)
        else:
            for call, label, _, k in run:
                if where is not None:
                    where[k] = len(out)
                out.append(resolved(call))
                out_labels.append(label)
        run.clear()

    for k, (call, label) in enumerate(zip(calls, labels)):
        if where is not None:
            where.append(None)
        words = native_words(call, entry)
        if words is None:
            flush()
            if where is not None:
                where[k] = len(out)
            out.append(resolved(call))
            out_labels.append(label)
        else:
            run.append((call, label, words, k))
    flush()
    return out, out_labels
