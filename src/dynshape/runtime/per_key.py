"""Per-key steps: the steps of a build that read only constants and the key's symbolic values (position ids,
masks built from shapes, token-type embeddings, rotary tables), which a plan computes once per key instead of on
every call, and the values they make for a key (`PerKeySteps.values`).

Why a module of its own: which steps are per key is decided once per planner, and computing their values is
the one part of binding a plan (plan.py) and of moving a bucket plan (rekey.py) that runs steps; plan.py keeps
the layout and the binding.

A bucket plan (rekey.py) moves from key to key: a decode loop meets a new past length at every token, and each
per-key step then ran in Python at every token (GPT-2's step: Range, Expand, a Gather and three mask kernels,
~100 us of a ~350 us first-generation token; Llama's step adds its rotary Cos / Sin). A planner made with
`in_arena=True` (the one a variant's bucket plans take, `bucket_planner`) instead runs in its arena, on every
call, the per-key steps that are cheap there: kernels, native steps, and views of values made in the arena,
whose outputs grow no faster in the symbols than the graph's largest input (a mask row over the past, as large as
the cache; never an encoder's (seq, seq) mask or BEiT's ~70 MB relative-position tables, which cost more per call
than once per key). A move then has nothing to compute: their words follow the key as the other steps' do. A
per-key step that stays (a numpy step, a large value) never reads an arena value: a step that feeds one stays per
key too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from dynshape.errors import ConstraintViolation
from dynshape.ir.execute import Scope
from dynshape.ir.opdef import is_random
from dynshape.ir.types import TensorType
from dynshape.passes.values import is_view
from dynshape.runtime.arenas import own_pages
from dynshape.runtime.build import Build, KernelStep, NodeStep
from dynshape.runtime.pointers import address
from dynshape.sym import Expr
from dynshape.sym.pysource import compile_key_function, key_names, to_py

MEMO_INPUT_BYTES = 1 << 12  # a per-key step's computed inputs up to this size key the shared results
MEMO_BYTES = 16 << 20  # shared per-key results in all, per planner (over it, the memo starts again)


def shape_py(shape: tuple, names: dict) -> str:
    """A shape's tuple as Python source over the key's names (compile_key_function's body)."""
    return "(" + "".join(to_py(d, names) + ", " for d in shape) + ")"


def contiguous(a: np.ndarray) -> np.ndarray:
    """C-contiguous without changing the rank (np.ascontiguousarray turns 0-d arrays into 1-d)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _per_key(build: Build, known: set[str]) -> list[int]:
    """The steps whose inputs are all constants, symbolic values or other such steps' outputs (never a random or
    scoped step), in order."""
    out: list[int] = []
    made: set[str] = set()
    for i, s in enumerate(build.steps):
        ins = [x for x in s.inputs if x]
        random = isinstance(s, NodeStep) and (s.scoped or is_random(s.node))
        if ins and not random and all(x in known or x in made for x in ins):
            out.append(i)
            made.update(o for o in s.outputs if o)
    return out


def _degree(shape: tuple) -> int:
    """The degree of a shape's element count as a polynomial in the symbols (a floor division counts as one)."""
    n: Any = 1
    for d in shape:
        n = n * d
    return max(len(m) for m, _ in n.terms) if isinstance(n, Expr) else 0


def _small(build: Build, s: Any, most: int) -> bool:
    """Whether every output of step s grows no faster in the symbols than the largest graph input (`most`, its
    degree): a decode step's mask row over the past (batch x past, as its cache), never an encoder's (seq, seq)
    mask or BEiT's relative-position tables (degree 4 where its image is 3)."""
    types = build.graph.types
    for o in s.outputs:
        t = types.get(o) if o else None
        if o and (not isinstance(t, TensorType) or t.shape is None or _degree(t.shape) > most):
            return False
    return True


def arena_steps(build: Build, per_key: list[int]) -> frozenset[int]:
    """The per-key steps an `in_arena` planner runs in its arena per call (the module's docstring): kernels, native
    steps and views of arena values with small outputs, none of whose outputs a remaining per-key step reads."""
    steps, types = build.steps, build.graph.types
    most = max((_degree(t.shape) for v in build.graph.inputs
                if isinstance(t := types.get(v.name), TensorType) and t.shape is not None), default=0)
    producer = {o: i for i in per_key for o in steps[i].outputs if o}
    moved = {i for i in per_key if _small(build, steps[i], most) and (
        type(steps[i]) is KernelStep or (isinstance(steps[i], NodeStep) and (
            steps[i].native is not None or is_view(steps[i].node))))}
    changed = True
    while changed:  # (the set only shrinks: a fixed point)
        changed = False
        for i in per_key:
            s = steps[i]
            if i in moved:  # a view aliases its input only where that input lies in the arena
                if isinstance(s, NodeStep) and s.native is None and producer.get(s.inputs[0]) not in moved:
                    moved.discard(i)
                    changed = True
                continue
            for x in s.inputs:  # a step computed per key reads only constants and per-key values
                j = producer.get(x) if x else None
                if j is not None and j in moved:
                    moved.discard(j)
                    changed = True
    return frozenset(moved)


def arena_symbols(build: Build, per_key: list[int]) -> frozenset[str]:
    """The symbolic values an `in_arena` planner keeps in arena slots, copied in by each call (`slot_image`: a
    decode step's past length as a tensor, its position): those of static shape that no remaining per-key step
    reads and no binder reads when it binds (a kernel's operand, a native rule's input outside its `params`; a
    Python step's inputs stay values of the key). Why: a value made anew per key moves to a new address, so every
    step reading it was retabled or had its words rewritten at every token (GPT-2's step: a Range, an Expand and
    two kernels, ~25 us); in a slot its address is the layout's, and the steps read what it holds when they run."""
    if build.symbolic is None:
        return frozenset()
    g, keyed = build.graph, set(per_key)
    names = set(build.symbolic.names) - {v.name for v in g.outputs}
    out = {x for x in names if isinstance(t := g.types.get(x), TensorType) and t.shape is not None
           and not any(isinstance(d, Expr) for d in t.shape) and np.dtype(t.dtype).kind in "biuf"}
    for i, s in enumerate(build.steps):
        if not out.intersection(s.inputs):
            continue
        if i in keyed or (isinstance(s, NodeStep) and (s.scoped or s.native is None)):
            out.difference_update(s.inputs)
        elif isinstance(s, NodeStep):
            params = s.native.params(s.node) if s.native.params is not None else range(1, len(s.inputs))
            out.difference_update(s.inputs[k] for k in params if k < len(s.inputs))
    return frozenset(out)


def slot_image(names: list[str], symvals: dict, at: dict) -> tuple[np.ndarray, np.ndarray, tuple]:
    """The symbolic values held in arena slots (`arena_symbols`) as one buffer, the image: (the image, the spans
    [slot address, bytes, ...] that ds_scatter_bytes copies it into, each value's (name, view of the image)). A
    bucket plan's first call copies the image into the slots on every call: the arena is shared by the plans of its
    keys (another plan's buffers overwrite the slots between two calls of this one), and a move or a state put back
    writes the image, never the arena."""
    arrays = [contiguous(np.asarray(symvals[x])) for x in names]
    image = np.zeros(max(1, sum(a.nbytes for a in arrays)), np.uint8)
    views, off = [], 0
    for x, a in zip(names, arrays):
        v = np.ndarray(a.shape, a.dtype, buffer=image, offset=off)
        v[...] = a
        views.append((x, v))
        off += a.nbytes
    spans = np.array([w for x, a in zip(names, arrays) for w in (at[x], a.nbytes)] or [0], np.int64)
    return image, spans, tuple(views)


class PerKeySteps:
    """Which steps of a build a planner computes per key, and their values at a key (`values`)."""

    def __init__(self, build: Build, fixed: dict, symbol_names: list[str], reads: set[str], in_arena: bool = False):
        self.build, self.graph, self.fixed, self.reads = build, build.graph, fixed, reads
        symbolic = set(build.symbolic.names) if build.symbolic is not None else set()
        every = _per_key(build, set(fixed) | symbolic)
        # the per-key steps this planner runs in its arena instead (a bucket planner's: the module's docstring)
        self.in_arena = arena_steps(build, every) if in_arena else frozenset()
        self.steps: list[int] = [i for i in every if i not in self.in_arena]
        # the symbolic values it keeps in arena slots instead (copied in by the plan's first call: slot_image)
        self.slots = arena_symbols(build, self.steps) if self.in_arena else frozenset()
        self.made: set[str] = {o for i in self.steps for o in build.steps[i].outputs if o}
        # per-key results shared between the plans of keys whose inputs to the step agree (_memo_key)
        self._memo: dict[tuple, tuple] = {}
        self._memo_bytes = 0
        self._memo_lock = threading.Lock()
        self._views, self.view_shapes = self._views_of(symbol_names)
        # per per-key step, its inputs that are not constants (what a move compares with the last key's)
        self._inputs = {i: [x for x in build.steps[i].inputs if x and x not in fixed] for i in self.steps}
        self._outside: frozenset | None = None
        self.unread(set())

    def unread(self, names: set) -> None:
        """Values no call of a plan reads after all (a view's target shape: the Planner knows its views only after
        this is made): not made per key. And the symbols the per-key values outside the arena read (None: some are
        computed by steps, or read symbols not recorded): a move changing none of them leaves every one as it was
        (`unchanged`)."""
        self.reads.difference_update(names)
        symbolic = self.build.symbolic
        deps = symbolic.deps if symbolic is not None else {}
        outside = [k for k in (symbolic.names if symbolic is not None else ()) if k in self.reads
                   and k not in self.slots]
        self._outside = None if self.steps or any(k not in deps for k in outside) \
            else frozenset().union(*(deps[k] for k in outside))

    def unchanged(self, changed: set | frozenset) -> bool:
        """Whether a move whose `changed` symbols are these leaves every per-key value outside the arena as at the
        last key (`values` would carry each one over: none reads a changed symbol, and no per-key step runs). Why:
        a decode loop changes the past length alone, which GPT-2's 17 per-key reshape targets (batch-only) do not
        read, and `values` spent ~20 us a token finding that out."""
        return self._outside is not None and self._outside.isdisjoint(changed)

    def _views_of(self, symbol_names: list[str]) -> tuple[dict, Callable | None]:
        """The per-key steps that only view their input (Unsqueeze, Reshape, Squeeze, Flatten, Identity of a
        per-key value), each -> (its index in `view_shapes(key)`, the function giving their outputs' shapes; its
        dtype). Why: `values` makes such an output as the input's array reshaped to that shape, where the
        reference (its argument checks, a Scope, the memo's key) cost ~12 us a step: six of GPT-2's thirteen
        per-key steps, run at every token of a first generation."""
        g, views, shapes = self.graph, {}, []
        known = set(symbol_names)
        names = key_names(symbol_names)
        for i in self.steps:
            s = self.build.steps[i]
            outs = [o for o in s.outputs if o]
            if type(s) is not NodeStep or not is_view(s.node) or len(outs) != 1 or not s.inputs or not s.inputs[0]:
                continue
            t, src = g.types.get(outs[0]), g.types.get(s.inputs[0])
            if not isinstance(t, TensorType) or not isinstance(src, TensorType) or t.dtype != src.dtype or any(
                    isinstance(d, Expr) and not d.free_symbols <= known for d in t.shape):
                continue
            views[i] = (len(shapes), np.dtype(t.dtype))
            shapes.append(shape_py(t.shape, names))
        if not views:
            return {}, None
        return views, compile_key_function("view_shapes", list(names), f"return [{', '.join(shapes)}]")

    def _memo_key(self, i: int, names: tuple, args: list) -> tuple | None:
        """What step i's per-key result depends on: its constants by name, the rest (symbol values, shapes
        made from them) by content; None (not shared) when such an input is large. Why share: the keys of a
        model at many widths repeat most of these values (text recognition's zero LSTM states depend on the
        batch alone), and each plan of the cache kept its own copy (1 MB over 300 new shapes). Only node steps
        (pure functions of their inputs and attributes: random and scoped ones are never per key); a kernel's
        loop extents come from the key itself, so its result is not shared."""
        if not isinstance(self.build.steps[i], NodeStep):
            return None
        parts: list = [i]
        for x, a in zip(names, args):
            if not x:
                parts.append(None)
            elif x in self.fixed:
                parts.append(x)
            elif isinstance(a, np.ndarray) and a.nbytes <= MEMO_INPUT_BYTES:
                parts.append((a.dtype.str, a.shape, a.tobytes()))
            else:
                return None
        return tuple(parts)

    def _remember(self, memo: tuple, made: tuple) -> None:
        size = sum(v.nbytes for v in made if v is not None)
        with self._memo_lock:
            if self._memo_bytes + size > MEMO_BYTES:
                self._memo.clear()
                self._memo_bytes = 0
            if size <= MEMO_BYTES:
                self._memo[memo] = made
                self._memo_bytes += size

    def values(self, key: tuple, symvals: dict, at: dict, addrs: dict, keep: list,
               previous: dict | None = None, changed: frozenset | set = frozenset()) -> tuple[dict, int]:
        """The constants and this key's values (the symbolic ones read, the per-key steps run), their addresses
        in `at` and `addrs`, each kept in `keep`: (name -> array, bytes computed for the key). With `previous` (a
        bucket plan's values at its last key): a value equal to the previous one is that same array (one that
        reads none of the `changed` symbols is, unread), and a per-key step whose inputs are all the same arrays
        keeps its outputs, so the words reading them stay as they are."""
        g = self.graph
        fixed = dict(self.fixed)
        deps = self.build.symbolic.deps if self.build.symbolic is not None else {}
        for k, v in symvals.items():
            if k not in self.reads or k in self.slots:  # (a slot's value: the plan writes it into the arena)
                continue
            v = contiguous(v)
            p = previous.get(k) if previous is not None else None
            if p is not None and p.shape == v.shape and p.dtype == v.dtype and p.tobytes() == v.tobytes():
                fixed[k] = p  # at[k] holds its address already
                continue
            fixed[k] = v
            addrs[id(v)] = at[k] = address(v)
            keep.append(v)
        if previous is not None:  # a move's `symvals` hold only the values the changed symbols read: the others
            for k, v in previous.items():  # are the last key's
                if k not in fixed and k in deps and deps[k].isdisjoint(changed):
                    fixed[k] = v
        per_key_bytes, vshapes = 0, None
        scope = Scope(fixed, {}, key)  # (the same map the steps below fill: one for all of them)
        for i in self.steps:
            s = self.build.steps[i]
            if previous is not None and all(fixed[x] is previous.get(x) for x in self._inputs[i]):
                for name in s.outputs:  # the same inputs: the same outputs, at the same addresses
                    if name:
                        v = fixed[name] = previous[name]
                        per_key_bytes += v.nbytes
                continue
            view = self._views.get(i)
            if view is not None and fixed[s.inputs[0]].dtype == view[1]:  # the input's array at the output's
                vshapes = vshapes or self.view_shapes(key)  # shape (_views_of; it holds no bytes of its own)
                try:
                    v = fixed[s.inputs[0]].reshape(vshapes[view[0]])
                except ValueError as e:
                    raise ConstraintViolation(f"{s.label} failed for this shape: ValueError: {e}") from e
                name = next(o for o in s.outputs if o)
                fixed[name] = v
                addrs[id(v)] = at[name] = address(v)
                keep.append(v)
                continue
            args = [fixed[x] if x else None for x in s.inputs]
            # (a bucket plan's move does not share: its states keep their values, and a decode loop's are new at
            # every key, so looking them up cost ~8 us a step for nothing)
            memo = self._memo_key(i, s.inputs, args) if previous is None else None
            made = self._memo.get(memo) if memo is not None else None
            if made is None:
                try:
                    outs = s.run(args, scope)
                except Exception as e:  # an index the shapes put out of range: name the node, as run time does
                    raise ConstraintViolation(f"{s.label} failed for this shape: {type(e).__name__}: {e}") from e
                made = tuple(own_pages(contiguous(np.asarray(out, dtype=g.types[name].dtype))) if name else None
                             for name, out in zip(s.outputs, outs))
                if memo is not None:
                    self._remember(memo, made)
            for name, v in zip(s.outputs, made):
                if name:
                    fixed[name] = v
                    addrs[id(v)] = at[name] = address(v)
                    keep.append(v)
                    per_key_bytes += v.nbytes
        return fixed, per_key_bytes
