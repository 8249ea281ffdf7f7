"""Memory planning and pre-bound calls: the request path of a compiled executable.

For each distinct tuple of symbol values (the key) a `BoundPlan` is made once:
- every tensor's shape is evaluated, buffers get offsets in one arena by first-fit over their lifetimes
  (views such as Reshape share their producer's buffer and extend its lifetime);
- steps that read only constants and the key (position ids, masks built from shapes) run once, here;
- every kernel step and native lowering gets its arguments with final addresses; other ops run their numpy
  lowering into their planned buffer; consecutive native calls become one C program (one foreign call).
Afterwards a call copies the inputs into the arena, runs the pre-bound calls and copies the outputs out:
no allocation on the request path but the outputs the caller keeps.
"""

from __future__ import annotations

import ctypes
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from dynshape.codegen import program
from dynshape.codegen.keep import Keep, TableRef
from dynshape.codegen.lowering import BindRequest, NativeCall
from dynshape.errors import ConstraintViolation, DynshapeError
from dynshape.ir.types import TensorType
from dynshape.options import Options
from dynshape.passes.values import is_view
from dynshape.runtime.arenas import aligned_bytes
from dynshape.runtime.build import Build, KernelStep, NodeStep
from dynshape.runtime.concat_joins import concat_joins
from dynshape.runtime.per_key import PerKeySteps, contiguous, shape_py, slot_image
from dynshape.runtime.pointers import address
from dynshape.runtime.programs import Call, find_places, pack_programs, patch
from dynshape.sym import Expr, Symbol
from dynshape.sym.pysource import compile_key_function, key_names, to_py

ALIGN = 64
LAYOUT_LIMIT = 1 << 62  # a memory plan's bytes in all from which it is refused (its offsets are int64 in the C)
_SCRATCH: dict[int, dict[str, np.ndarray]] = {}  # id(arena buffer) -> tag -> the scratch its plans share


def scratch_for(arena: np.ndarray, keep: list) -> Callable[[int, str], np.ndarray]:
    """Scratch shared by the plans of one arena buffer (BindRequest.scratch). Why shared: a plan per key each with
    its own (an LSTM's projection of every step, 1-2 MB) made text_rec's resident memory grow by 180 MB over
    1,000 calls at random widths, 256 cached plans holding one each. A key needing more gets a larger buffer;
    plans bound to the smaller one keep it alive until they are dropped."""
    if id(arena) not in _SCRATCH:
        _SCRATCH[id(arena)] = {}
        weakref.finalize(arena, _SCRATCH.pop, id(arena), None)
    shared = _SCRATCH[id(arena)]

    def scratch(nbytes: int, tag: str) -> np.ndarray:
        buf = shared.get(tag)
        if buf is None or buf.nbytes < nbytes:
            buf = shared[tag] = aligned_bytes(nbytes + nbytes // 4)
        keep.append(buf)
        return buf

    return scratch


@dataclass(slots=True)  # no per-plan __dict__: up to 256 are cached per arena
class BoundPlan:
    inputs: list  # arena views the call's input arrays are copied into
    calls: list[Call]  # zero-argument callables, in order
    outputs: list  # (name, array view or fixed array)
    arena: np.ndarray
    keep: list  # per-key arrays the calls' raw addresses point into (kept alive here)
    labels: list[str]  # per call: the node(s) it runs, for error messages
    nbytes: int = 0  # memory of the values computed once for this key (outside the arena)
    input_names: tuple = ()  # the graph's input names, in `inputs` order (for error messages)
    # inputs read where they lie: (input index, dtype, arena address, bytes, [(program words, positions)]) each
    in_place: tuple = ()
    current: list | None = None  # per in_place entry: the address its programs hold now
    # outputs written straight into an out= array: (name, arena address, bytes, places) each, and their addresses
    out_place: tuple = ()
    out_current: list | None = None
    # the large writable outputs, (name, shape, dtype), of at least IN_PLACE_BYTES: without out=, the call writes
    # them into new arrays and returns those (no copy out of the arena; smaller ones are copied, which costs less
    # than patching the programs). Why: a decoder step at past 2048 copied 4 MiB of KV out per call (0.2 ms).
    fresh: tuple = ()
    want: dict | None = None  # output name -> (shape, dtype): what an out= array must be (made by __post_init__)
    copy_in: tuple = ()  # (input index, arena view) of every input the calls read from the arena
    # `calls` as run: a NativeCall as a partial of its C function (no Python frame per call: ~0.1 us each)
    runs: tuple = ()
    bucket: Any = None  # a plan moved between the keys of its layout in place: its BucketState (rekey.py)
    # (table words, index, fail) of each status word a native call sets when it refuses its input (Keep.check)
    checks: tuple = ()

    def __post_init__(self) -> None:
        self.views_changed()
        self.runs = tuple(partial(c.fn, *c.args) if type(c) is NativeCall else c for c in self.calls)

    def views_changed(self) -> None:
        """What follows from `inputs` and `outputs`: the out= shapes wanted, the inputs copied in (a bucket plan
        moved to another key makes new views, rekey.py)."""
        self.want = {name: (tuple(v.shape), v.dtype) for name, v in self.outputs}
        self.copy_in = tuple((k, v) for k, v in enumerate(self.inputs) if v is not None)

    def run(self, arrays: list, out: dict | None = None) -> dict:
        """Copy the inputs in (any strides), run the bound calls, copy the outputs out: into the caller's arrays
        for the names in `out` (checked before anything runs), into new arrays for the others. A failure names the
        node that failed (or the input / output being copied): a ConstraintViolation, never a bare numpy error.

        The fixed cost per call is kept to plain comparisons (a decode loop's step is ~30 us of kernels): the
        out= check is inline when every array fits (`check_out` words the refusal otherwise), addresses come
        from `pointers.address`, programs are patched only when an address changed since the plan's last call."""
        if out:
            if not self._fits(out):
                check_out(out, self.want)  # refuses by name; an array it admits (a subclass) goes on
        elif self.fresh:
            try:
                out = {name: np.empty(shape, dtype) for name, shape, dtype in self.fresh}
            except MemoryError as e:  # (fuzzer case 22947, seed 777: it escaped raw)
                raise _refused_outputs(sum(math.prod(shape) * np.dtype(dtype).itemsize
                                           for _, shape, dtype in self.fresh)) from e
        skip, written = self._place(arrays, out) if self.in_place or self.out_place else ((), ())
        try:
            for k, view in self.copy_in:
                if k not in skip:
                    view[...] = arrays[k]
        except Exception as e:  # the binder checked shapes and dtypes: report, do not crash
            raise self._input_error(arrays, e) from e
        self.execute()
        try:
            if out:
                return {name: out[name] if name in written else _into(out[name], v) if name in out
                        else v.copy() for name, v in self.outputs}
            return {name: v.copy() for name, v in self.outputs}
        except MemoryError as e:
            raise _refused_outputs(sum(int(np.asarray(v).nbytes) for _, v in self.outputs)) from e

    def execute(self) -> None:
        """Run the bound calls on what the arena (and the patched addresses) hold now. A failure names the node
        that failed: a ConstraintViolation, never a bare numpy error."""
        i = 0
        try:
            for call in self.runs:
                call()
                i += 1
        except DynshapeError as e:
            if self.labels[i] in str(e):
                raise
            raise ConstraintViolation(f"{self.labels[i]}: {e}") from e
        except Exception as e:  # data-dependent failures (an index out of range): name the node
            raise ConstraintViolation(f"{self.labels[i]} failed at run time: {type(e).__name__}: {e}") from e
        for words, k, fail in self.checks:  # a native call that refused its input (it wrote nothing it may not)
            if words[k]:
                status, words[k] = words[k], 0
                fail(words, status)

    def load(self, arrays: list, kept: frozenset) -> None:
        """Make the plan read the inputs indexed in `kept` from `arrays` (where they lie, or copied into their
        slots, as `run` does), and every other input and every output from / into its own arena slot, without
        running anything: for a caller that then writes the other inputs into the `inputs` views itself, calls
        `execute` and reads the `outputs` views, many times (a Loop body's iterations, body_iterations.py:
        the `kept` arrays must stay alive and unchanged meanwhile). The next `run` patches whatever it needs
        again (it compares the addresses the programs hold)."""
        skip, _ = self._place(arrays, None, kept) if self.in_place or self.out_place else ((), ())
        try:
            for k, view in self.copy_in:
                if k in kept and k not in skip:
                    view[...] = arrays[k]
        except Exception as e:  # the binder checked shapes and dtypes: report, do not crash
            raise self._input_error(arrays, e) from e

    def _fits(self, out: Any) -> bool:
        """Whether `out` passes `check_out` for this plan, in plain comparisons (False: let check_out decide)."""
        if type(out) is not dict:
            return False
        want = self.want
        for name, a in out.items():
            w = want.get(name)
            if w is None or type(a) is not np.ndarray or a.shape != w[0] or (a.dtype is not w[1] and a.dtype != w[1]):
                return False
            f = a.flags
            if not (f.c_contiguous and f.writeable):
                return False
        return True

    def _place(self, arrays: list, out: dict | None, kept: frozenset | None = None) -> tuple[set, set]:
        """Point the programs at the caller's arrays: the out= arrays (checked: this call's shape and dtype,
        C-contiguous) of the outputs that can be written where they lie, and the inputs that can be read where
        they lie (C-contiguous, aligned, the input's dtype: no copy into the arena); at the arena slot for the
        others. An input whose bytes overlap an out= array written in place is copied as usual (a decode loop
        passing the past and the present KV in one buffer): read in place, the kernels would overwrite it
        while reading it. The arena is held by one call at a time, so patching its plan's programs is this
        call's alone. `kept` (when given): only the inputs it indexes may be read in place. (input indices read
        in place, output names written in place)"""
        written = set()
        spans = []  # (start, end) of the out= arrays written in place
        current = self.out_current
        j = 0
        for name, slot, size, places in self.out_place:
            a = out.get(name) if out else None
            if a is not None and a.flags.aligned:
                at = address(a)
                written.add(name)
                spans.append((at, at + size))
            else:
                at = slot
            if current[j] != at:
                patch(places, at)
                current[j] = at
            j += 1
        skip = set()
        current = self.current
        j = 0
        for k, dtype, slot, size, places in self.in_place:
            a = arrays[k]
            at = slot
            if type(a) is np.ndarray and (a.dtype is dtype or a.dtype == dtype) and (kept is None or k in kept):
                f = a.flags
                if f.c_contiguous and f.aligned:
                    at = address(a)
                    for lo, hi in spans:
                        if at < hi and lo < at + size:
                            at = slot
                            break
                    else:
                        skip.add(k)
            if current[j] != at:
                patch(places, at)
                current[j] = at
            j += 1
        return skip, written

    def _input_error(self, arrays: list, e: Exception) -> ConstraintViolation:
        """Which input could not be copied into the arena, and why (off the request path)."""
        for k, (view, a) in enumerate(zip(self.inputs, arrays)):
            if view is not None and np.shape(a) != view.shape:
                name = self.input_names[k] if k < len(self.input_names) else f"#{k}"
                return ConstraintViolation(f"input {name!r} of shape {np.shape(a)} cannot be copied into its "
                                           f"{view.shape} slot of the arena: {type(e).__name__}: {e}")
        return ConstraintViolation(f"the inputs cannot be copied into the call's arena: {type(e).__name__}: {e}")


IN_PLACE_BYTES = 1 << 16  # inputs below this at every key are copied (a copy costs less than a patch)


def _refused_outputs(need: int) -> DynshapeError:
    return DynshapeError(f"the call's outputs need {need} bytes, which the operating system refused; bound the "
                         "model's symbols (dims=...) or give it a memory_budget")


def _small(t: TensorType) -> bool:
    """Whether the input is small at every key: all dims bounded and its largest size under IN_PLACE_BYTES."""
    from dynshape.sym import bounds

    n = np.dtype(t.dtype).itemsize
    for d in t.shape:
        hi = d if isinstance(d, int) else bounds(d)[1]
        if hi is None:
            return False
        n *= int(hi)
    return n < IN_PLACE_BYTES


def status_words(keeps: list) -> tuple:
    """The sealed keeps' status words (Keep.check) as (table words, index, fail), for BoundPlan.checks. A bucket
    plan's move rewrites a table in place, at the same address, so these stay valid across its keys (rekey.py)."""
    return tuple(((ctypes.c_int64 * (ref.nbytes // 8)).from_address(ref.addr), k, fail)
                 for keep in keeps for ref, k, fail in keep.checks)


def fresh_outputs(outputs: list, out_place: tuple) -> tuple:
    """BoundPlan.fresh: the outputs written in place that are large enough to get new arrays per call."""
    writable = {p[0] for p in out_place}
    return tuple((name, v.shape, v.dtype) for name, v in outputs if name in writable and v.nbytes >= IN_PLACE_BYTES)


def check_out(out: Any, want: dict[str, tuple]) -> None:
    """Refuse, before anything runs, an `out=` the call cannot write into: not a dict, an unknown output name, or
    an array of another shape or dtype, read-only, or not C-contiguous (the copy into it must be one memcpy, and
    a decode loop relies on the very buffer it passed being filled)."""
    if not isinstance(out, dict):
        raise ConstraintViolation(f"out= must be a dict output name -> numpy array, got {type(out).__name__}")
    for name, a in out.items():
        if name not in want:
            raise ConstraintViolation(f"out= names {name!r}, which is not an output (outputs: {sorted(want)})")
        shape, dtype = want[name]
        what = f"out={{{name!r}: ...}}"
        if not isinstance(a, np.ndarray):
            raise ConstraintViolation(f"{what}: a {type(a).__name__}, not a numpy array")
        if tuple(a.shape) != tuple(shape) or a.dtype != np.dtype(dtype):
            raise ConstraintViolation(f"{what}: {a.dtype}{list(a.shape)}, but this call's output {name!r} is "
                                      f"{np.dtype(dtype)}{list(shape)}")
        if not a.flags.c_contiguous or not a.flags.writeable:
            raise ConstraintViolation(f"{what}: the array must be C-contiguous and writeable")


def _into(dst: np.ndarray, src: Any) -> np.ndarray:
    np.copyto(dst, src)
    return dst


def plannable(b: Build, symbols: list[Symbol]) -> bool:
    """Every value a step touches is a numeric tensor whose shape the call's symbols determine, and no step
    needs the interpreter's scope (If/Loop bodies)."""
    g = b.graph
    names = {s.name for s in symbols}
    for step in b.steps:
        if isinstance(step, NodeStep) and step.scoped:
            return False
        for x in (*step.inputs, *step.outputs):
            if not x or not isinstance(x, str) or x in b.fixed:
                continue
            t = g.types.get(x)
            if not isinstance(t, TensorType) or t.dtype == object or np.dtype(t.dtype).kind not in "biuf":
                return False
            if any(isinstance(d, Expr) and not d.free_symbols <= names for d in t.shape):
                return False
    return all(isinstance(g.types.get(v.name), TensorType) for v in (*g.inputs, *g.outputs))


class Planner:
    """What does not depend on the key: value order, lifetimes, aliasing, shape functions."""

    def __init__(self, build: Build, symbols: list[Symbol], options: Options, in_arena: bool = False):
        self.build, self.graph, self.options, self.symbols = build, build.graph, options, symbols
        g = self.graph
        self.fixed = {k: contiguous(v) for k, v in build.fixed.items()}
        self.fixed_addr = {id(v): v.ctypes.data for v in self.fixed.values()}
        self.fixed_at = {k: v.ctypes.data for k, v in self.fixed.items()}  # by value name (or PackedWeight)
        self._entries: dict[int, tuple] = {}  # id(ctypes function) -> (it, its address): see _entry
        inputs = [v.name for v in g.inputs]
        produced = [o for s in build.steps for o in s.outputs if o]
        # the symbolic values a step or an output reads: a plan keeps only those (text recognition's exported
        # shape arithmetic leaves ~27 small arrays per key, 6.5 KB of each cached plan's 15 KB, read by nothing)
        self.reads = {v.name for v in g.outputs} | {x for s in build.steps for x in s.inputs if isinstance(x, str)}
        free = {x for s in build.steps if isinstance(s, NodeStep) for x in s.node.free_names()}
        self.reads |= free
        # steps that read only constants and the key's symbolic values (position ids, masks built from shapes,
        # token-type embeddings): computed once per key when the plan is bound, never on the request path (an
        # `in_arena` planner, a bucket plan's, runs the cheap ones in its arena instead: per_key.py)
        self.keyed = PerKeySteps(build, self.fixed, [s.name for s in symbols], self.reads, in_arena)
        self.per_key, per_key_values = self.keyed.steps, self.keyed.made
        self.slots = sorted(self.keyed.slots)  # symbolic values held in the arena (per_key.slot_image)
        self.values = [x for x in dict.fromkeys(inputs + self.slots + produced)
                       if x not in self.fixed and x not in per_key_values]
        # aliasing: outputs of view-like ops share their input's buffer; a Concat's branches are written into it
        self.base: dict[str, str] = {x: x for x in self.values}
        self.joins, self.alias_step = concat_joins(build, set(self.per_key), {v.name for v in g.outputs})
        for x, jn in self.joins.items():
            self.base[x] = jn.into
        views = set()
        for i, s in enumerate(build.steps):
            if isinstance(s, NodeStep) and is_view(s.node) and s.inputs and s.inputs[0] in self.base \
                    and s.outputs[0] in self.base and len([o for o in s.outputs if o]) == 1:
                self.base[s.outputs[0]] = self.base[s.inputs[0]]
                self.alias_step.add(i)
                views.add(i)
        # what a view of an arena value reads besides it (a Reshape's target shape) no call reads: the view's shape
        # is the planner's, from the key (a decode step's per-key reshape targets were made at every token)
        read = {x for i, s in enumerate(build.steps) if i not in views for x in s.inputs if isinstance(x, str)}
        self.keyed.unread({x for i in views for x in build.steps[i].inputs[1:] if x and x not in read}
                          - {v.name for v in g.outputs} - free)
        end = len(build.steps)
        first: dict[str, int] = {x: -1 for x in (*inputs, *self.slots)}
        last: dict[str, int] = {}
        for i, s in enumerate(build.steps):
            for o in s.outputs:
                if o in self.base:
                    b = self.base[o]
                    first.setdefault(b, i)
                    last[b] = max(last.get(b, i), i)
            for x in s.inputs:
                if isinstance(x, str) and x in self.base:
                    b = self.base[x]
                    last[b] = max(last.get(b, i), i)
        for v in g.outputs:
            if v.name in self.base:
                last[self.base[v.name]] = end
        self.in_place = self._readable_in_place(inputs)
        self.out_place = self._writable_in_place()
        for x in (*self.in_place, *self.slots):  # its slot is its own to the end: no buffer shares its address
            last[x] = end
        if options.inputs_kept:  # every input's, too (a Loop body: see BoundPlan.load)
            for x in inputs:
                if self.base.get(x) == x:
                    last[x] = end
        for x in self.out_place:  # and an output's from the start
            first[x] = -1
        self.buffers = [x for x in self.values if self.base[x] == x]
        span = {b: (first.get(b, -1), last.get(b, -1)) for b in self.buffers}
        self.overlaps = {b: [o for o in self.buffers if o != b and not (span[o][1] < span[b][0]
                                                                        or span[b][1] < span[o][0])]
                         for b in self.buffers}  # lifetimes do not depend on the key: computed once
        index = {b: i for i, b in enumerate(self.buffers)}
        adjacency = [[index[o] for o in self.overlaps[b]] for b in self.buffers]
        self._adj_start = np.cumsum([0] + [len(a) for a in adjacency], dtype=np.int64)  # CSR, for ds_first_fit
        self._adj = np.array([i for a in adjacency for i in a] or [0], np.int64)
        self.dtypes = {x: np.dtype(g.types[x].dtype) for x in self.values}
        self.symbol_names = [s.name for s in symbols]
        names = key_names(self.symbol_names)
        body = ", ".join(shape_py(g.types[x].shape, names) for x in self.values)
        self.shapes = compile_key_function("shapes", list(names), f"return [{body}]")
        # the buffers whose bytes depend on the key, and those bytes as one function of it (BucketState.fits)
        self.grows = [b for b in self.buffers if any(isinstance(d, Expr) for d in g.types[b].shape)]
        body = ", ".join(self.bytes_py(b, names) for b in self.grows)
        self.grow_bytes = compile_key_function("grow_bytes", list(names), f"return [{body}]")

    def bytes_py(self, b: str, names: dict) -> str:
        """Python source for buffer b's bytes (unaligned) as a function of the key's symbols (renamed by `names`):
        `grow_bytes`' items, and a bucket plan's at its changed symbols (rekey.py's `_shapes_part`)."""
        return "*".join(f"({to_py(d, names)})" for d in self.graph.types[b].shape) + f"*{self.dtypes[b].itemsize}"

    def _readable_in_place(self, inputs: list[str]) -> list[str]:
        """The inputs a call can read where the caller's array lies instead of copying them into the arena: large
        ones (IN_PLACE_BYTES at the largest key, or unbounded), read only by generated kernels or native steps
        (their arguments are plain addresses, in programs and int64 tables, patched per call:
        `BoundPlan._read_in_place`; a native step whose binder makes a Python call copies the input for that
        plan), directly or through views, never written by a step, and not a graph output. Why: a decoder step
        copied every `past` KV input into its arena (4 MiB at past 512, 0.22 ms a call)."""
        if not self.options.inputs_in_place:
            return []
        build, g = self.build, self.graph
        outputs = {self.base.get(v.name) for v in g.outputs}
        readers: dict[str, set] = {}
        writers: dict[str, int] = {}
        for i, st in enumerate(build.steps):
            for x in st.inputs:
                if isinstance(x, str) and x in self.base:
                    readers.setdefault(self.base[x], set()).add(i)
            if i not in self.alias_step:
                for o in st.outputs:
                    if o in self.base:
                        writers[self.base[o]] = writers.get(self.base[o], 0) + 1
        out = []
        for x in inputs:
            t = g.types.get(x)
            if x not in self.base or self.base[x] != x or x in outputs or writers.get(x) or not readers.get(x):
                continue
            if not all(self._address_only(i) for i in readers[x]):
                continue  # a numpy or reference step reads the arena's array itself
            if isinstance(t, TensorType) and _small(t):
                continue
            out.append(x)
        return out

    def _address_only(self, i: int) -> bool:
        """Step i takes its buffers as plain addresses (a generated kernel, a native step), or is a view."""
        st = self.build.steps[i]
        return i in self.alias_step or type(st) is KernelStep or (type(st) is NodeStep and st.native is not None)

    def _writable_in_place(self) -> list[str]:
        """The outputs a call can write straight into an out= array: their buffer is their own (not a view of
        another value, not a Concat written by its branches, not an input), and every step that writes or reads
        it takes addresses (patched per call, as for inputs read in place). Why: a decoder's `present` KV outputs
        were copied out of the arena into the caller's array after every step."""
        if not self.options.inputs_in_place:
            return []
        g, build = self.graph, self.build
        joined = {jn.into for jn in self.joins.values()}
        inputs = {v.name for v in g.inputs}
        out = []
        for v in dict.fromkeys(v.name for v in g.outputs):
            if v not in self.base or self.base[v] != v or v in joined or v in inputs:
                continue
            touch = [i for i, st in enumerate(build.steps)
                     if any(isinstance(x, str) and self.base.get(x) == v for x in (*st.inputs, *st.outputs))]
            if touch and all(self._address_only(i) for i in touch) and not any(i in self.per_key for i in touch):
                out.append(v)
        return out

    def entry(self, fn: Any) -> int:
        """The entry address of a ctypes function, remembered (ctypes.cast costs ~1 us a call, and a plan packs
        every native step). The function is kept with its address, so its id cannot be reused meanwhile."""
        got = self._entries.get(id(fn))
        if got is None:
            if len(self._entries) >= 4096:  # binders reuse their library's functions: a bound, not a working set
                self._entries.clear()
            got = self._entries[id(fn)] = (fn, program.address(fn))
        return got[1]

    def sizes(self, shapes: dict) -> dict[str, int]:
        """Bytes per buffer (aligned) at these shapes."""
        return {b: -(-max(1, math.prod(shapes[b]) * self.dtypes[b].itemsize) // ALIGN) * ALIGN for b in self.buffers}

    def layout(self, key: tuple) -> tuple[dict, dict, int]:
        """(shape per value, byte offset per buffer, arena size) for one key: first-fit by lifetime. A layout
        whose bytes no int64 holds (a Tile by huge repeats) is refused by name, before the C sees a size."""
        shapes = dict(zip(self.values, self.shapes(key)))
        sizes = self.sizes(shapes)
        if sum(sizes.values()) >= LAYOUT_LIMIT:
            big = max(sizes, key=sizes.get)
            raise ConstraintViolation(f"value {big!r} would have shape {tuple(shapes[big])} at "
                                      f"{dict(zip(self.symbol_names, key))}: {sizes[big]} bytes, and the call's "
                                      f"buffers {sum(sizes.values())} in all, more than any memory plan can hold")
        lib = program.LIBRARY.try_load()
        if lib is None:
            return (shapes, *self.first_fit(sizes))
        n = len(self.buffers)
        size = np.fromiter((sizes[b] for b in self.buffers), np.int64, n)
        order = np.argsort(-size, kind="stable")  # largest first, ties in buffer order (as `first_fit`)
        out = np.empty(3 * n, np.int64)  # offsets, then the C's scratch: per call (the call releases the GIL)
        total = lib.ds_first_fit(n, size.ctypes.data, order.ctypes.data, self._adj_start.ctypes.data,
                                 self._adj.ctypes.data, out.ctypes.data, out[n:].ctypes.data)
        return shapes, dict(zip(self.buffers, out[:n].tolist())), int(total)

    def first_fit(self, sizes: dict) -> tuple[dict, int]:
        """First-fit in Python: (offset per buffer, arena size), largest buffer first, each at the lowest offset
        clear of every placed buffer whose lifetime it overlaps. ds_first_fit is the same loop in C."""
        offsets: dict[str, int] = {}
        total = 0
        for b in sorted(self.buffers, key=lambda b: -sizes[b]):
            clashes = sorted((offsets[o], offsets[o] + sizes[o]) for o in self.overlaps[b] if o in offsets)
            at = 0
            for start, stop in clashes:
                if at + sizes[b] <= start:
                    break
                at = max(at, stop)
            offsets[b] = at
            total = max(total, at + sizes[b])
        return offsets, total

    def addresses(self, key: tuple, base: int, shapes: dict, offsets: dict) -> dict:
        """Every value's address in an arena at `base` (constants' too), refusing a dim the symbols make negative."""
        dtypes, joins = self.dtypes, self.joins
        at: dict = dict(self.fixed_at)  # value name (or PackedWeight) -> address
        for x in self.values:
            shp = shapes[x]
            if shp and min(shp) < 0:  # a dim the symbols make negative: the rules should have refused
                raise ConstraintViolation(f"value {x!r} would have shape {tuple(shapes[x])} at "
                                          f"{dict(zip(self.symbol_names, key))}: a negative dim; the model's "
                                          "shape arithmetic does not hold for these inputs")
            jn = joins.get(x)
            at[x] = base + offsets[self.base[x]] + (0 if jn is None else jn.col * dtypes[x].itemsize)
        return at

    def view(self, x: str, arena: np.ndarray, base: int, at: dict, shapes: dict, offsets: dict,
             key: tuple) -> np.ndarray:
        """Value x's array in the arena at address `base` (a Concat's columns: its strides, x's shape)."""
        dtype, jn, off = self.dtypes[x], self.joins.get(x), at[x] - base
        try:
            if jn is None:
                return np.ndarray(shapes[x], dtype, buffer=arena, offset=off)
            whole = np.ndarray(shapes[jn.into], dtype, buffer=arena, offset=offsets[self.base[x]])
            return np.ndarray(shapes[x], dtype, buffer=arena, offset=off, strides=whole.strides)
        except ValueError as e:  # a shape numpy cannot hold (its dims' product overflows)
            raise ConstraintViolation(f"value {x!r} would have shape {tuple(shapes[x])} at "
                                      f"{dict(zip(self.symbol_names, key))}, which no array can hold ({e})") from None

    def bind(self, key: tuple, arena: np.ndarray, shapes: dict, offsets: dict, symvals: dict,
             bucket: Any = None) -> BoundPlan:
        """This key's plan in `arena`: every value's address, the per-key steps run, every step bound.

        Views of the arena are made only for what needs an array (a native binder's or numpy step's buffers,
        the graph's inputs and outputs, a row-stride kernel's output): a generated kernel takes addresses only,
        and most steps are kernels (text detection: 88 of 96), so their values get an address and no view.

        `bucket` (a `BucketState` to fill, runtime/rekey.py): the plan will be moved to other keys of its layout
        in place, so each step's calls, tables and words are recorded, each native step keeps its own tables,
        the kernels share one key table written in place, and every native call goes into a program."""
        build, g = self.build, self.graph
        base = arena.ctypes.data
        at = self.addresses(key, base, shapes, offsets)
        views: dict[str, np.ndarray] = {}
        addrs = dict(self.fixed_addr)  # id(array) -> address, so binding never asks numpy for pointers

        def view(x: str) -> np.ndarray:
            v = views[x] = self.view(x, arena, base, at, shapes, offsets, key)
            addrs[id(v)] = at[x]
            return v

        keep = Keep(track_ints=bool(self.in_place or self.out_place))
        copied: set[str] = set()  # in-place inputs a Python call reads in this plan: copied, not patched
        fixed, per_key_bytes = self.keyed.values(key, symvals, at, addrs, keep)

        def addr(a: np.ndarray) -> int:
            return addrs.get(id(a)) or a.ctypes.data

        def get(x):
            return None if not x else views[x] if x in views else fixed[x] if x in fixed else view(x)

        calls: list[Call] = []
        labels: list[str] = []
        if self.slots:  # (a bucket planner's: the key's symbolic values into their arena slots, first, every call)
            image, spans, slot_views = slot_image(self.slots, symvals, at)
            keep += [image, spans]
            calls.append(NativeCall(program.LIBRARY.load().ds_scatter_bytes, (spans.ctypes.data, len(self.slots),
                                                                              image.ctypes.data)))
            labels.append("the shape's values into their arena slots")
            if bucket is not None:
                bucket.slot_image, bucket.slot_views = image, slot_views
        scratch = scratch_for(arena, keep)
        key_arrays: dict[tuple, TableRef] = {}  # one int64 table per distinct kernel key in this plan
        skip = self.alias_step | set(self.per_key)
        spans: dict[int, tuple] = {}  # (bucket) step index -> (first call, its Keep)
        for i, s in enumerate(build.steps):
            if i in skip:
                continue
            first = len(calls)
            try:
                if type(s) is KernelStep:  # the common step, inline: the key (and row stride), then addresses
                    values = s.key_values(key, get(s.outputs[0])) if s.row_stride else key
                    d = key_arrays.get(values) if bucket is None or not s.row_stride else None
                    if d is None:
                        d = keep.table(values)
                        if bucket is None or not s.row_stride:
                            key_arrays[values] = d
                        if bucket is not None:
                            bucket.tables.append((d, len(values), s if s.row_stride else None))
                    calls.append(NativeCall(s.entry, (d, *[at[o] for o in s.outputs], *[at[x] for x in s.inputs])))
                    labels.append(s.label)
                    if bucket is not None:
                        spans[i] = (first, None)
                    continue
                ins, outs = [get(x) for x in s.inputs], [get(o) for o in s.outputs]
                own = keep if bucket is None else Keep(track_ints=keep.track_ints)
                made = self.bind_step(s, ins, outs, own, addr, fixed, scratch)
                if (self.in_place or self.out_place) and any(type(c) is not NativeCall for c in made):
                    copied.update(self.base.get(x) for x in (*s.inputs, *s.outputs) if isinstance(x, str))
                if bucket is not None:
                    spans[i] = (first, own)
            except DynshapeError:
                raise
            except Exception as e:  # binding evaluates shapes and indices: name the node, as run time does
                raise ConstraintViolation(f"{s.label} failed for this shape: {type(e).__name__}: {e}") from e
            calls.extend(made)
            labels.extend([s.label] * len(made))
        inputs = [get(v.name) if v.name in self.base else None for v in g.inputs]  # None: not read
        outputs = [(v.name, get(v.name)) for v in g.outputs]
        keep.seal()  # the binders' tables, in one buffer: their calls get the addresses
        int_tables = list(keep.int_tables)
        for _, own in spans.values():
            if own is not None:
                own.seal()
                int_tables += own.int_tables
                keep.append(own)
        programs: list[np.ndarray] = []
        patched = bool(self.in_place or self.out_place)
        where: list | None = [] if bucket is not None else None
        made_calls = calls
        calls, labels = pack_programs(calls, labels, keep, self.entry, programs,
                                      min_run=1 if patched or bucket is not None else 2, where=where)
        names = [v.name for v in g.inputs]
        slot_bytes = bucket.sizes if bucket is not None else None  # which words lie in a slot: the same at every key
        in_place, out_place = self.places(at, shapes, calls, programs + int_tables, copied, slot_bytes)
        plan = BoundPlan(inputs, calls, outputs, arena, keep, labels, per_key_bytes, tuple(names), in_place,
                         [p[2] for p in in_place], out_place, [p[1] for p in out_place],
                         fresh_outputs(outputs, out_place))
        plan.checks = status_words([keep, *(own for _, own in spans.values() if own is not None)])
        if bucket is not None:
            bucket.record(self, key, base, shapes, at, fixed, spans, made_calls, where, programs, keep.int_tables,
                          copied, [keep, *(own for _, own in spans.values() if own is not None)])
            plan.bucket = bucket
        return plan

    def places(self, at: dict, shapes: dict, calls: list, words: list, copied: set,
               slot_bytes: dict | None = None) -> tuple[tuple, tuple]:
        """(in_place, out_place) of a plan: where the words hold each in-place input's and output's slot (not
        those a Python call reads: `copied`), inputs by index, outputs by name, in one pass over the words."""
        names = [v.name for v in self.graph.inputs]
        nbytes = {x: math.prod(shapes[x]) * self.dtypes[x].itemsize for x in (*self.in_place, *self.out_place)}
        found = find_places([(names.index(x), x) for x in self.in_place if x not in copied]
                            + [(x, x) for x in self.out_place if x not in copied], at, nbytes, self.dtypes, calls,
                            words, slot_bytes)
        return (tuple(p for p in found if type(p[0]) is int),
                tuple((x, slot, size, places) for x, _, slot, size, places in found if type(x) is str))

    def bind_step(self, s: NodeStep, ins: list, outs: list, keep: list, addr, fixed: dict,
                   scratch: Callable[[int, str], np.ndarray]) -> list[Call]:
        """Zero-argument callables running a node step from `ins` into the planned buffers `outs` (kernel steps
        are bound inline in `bind`: a key table and addresses; they keep no views, so a cached plan of text_det
        no longer holds ~30 views: 1.9 MB of 6.8 over 300 new shapes)."""
        if s.native is not None:
            made = s.native.bind(BindRequest(s.node, s.attrs, ins, outs, fixed, keep, addr, self.options, scratch))
            if made is not None:
                return made
        fn = s.fn

        def call() -> None:
            res = fn(ins)
            for view, r in zip(outs, res):
                if view is not None:
                    view[...] = r

        return [call]


