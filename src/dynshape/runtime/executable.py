"""`ds.compile`: a symbolic graph turned once into an executable that serves every admissible shape.

What compiling does today:
- the per-call shape work (binding, every check, the dispatch key) becomes one generated Python function
  (`binder.py`), so a bad input is rejected before any kernel runs;
- shape arithmetic disappears: every value inference knows symbolically (Shape -> Gather -> Concat chains)
  becomes a per-call expression of the bound symbols, and its producing nodes are dead code;
- dead code is dropped, constants are folded into the plan;
- ops run through their lowering to a direct numpy/BLAS call when one is registered, else their reference;
- `specialize=[{...}]` adds fully static variants (all symbolic values precomputed) found by an O(1) dict
  lookup on the tuple of symbol values;
- variants carry guards (`strategy.py`): exact keys, then range buckets, then the generic build; hot keys get
  variants built in the background (`profile.py`); planned calls run in a pool of arenas, sized for the
  worst case when memory is budgeted or preallocated (`budget.py`).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import itertools
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynshape.codegen import packed_gemm
from dynshape.codegen.cc import DEFAULT_FLAGS, build_shared, cache_dir, compile_c, pinned_cache_dir
from dynshape.codegen.cgen import prelude
from dynshape.codegen.fused_c import emit_attention, emit_gemm, emit_group, emit_softmax, make_step
from dynshape.codegen.lowering import get_lowering
from dynshape.errors import ConstraintViolation, DynshapeError
from dynshape.ir import opdef
from dynshape.ir.execute import bind_inputs
from dynshape.ir.graph import Graph
from dynshape.ir.types import TensorType
from dynshape.passes.cse import eliminate_common
from dynshape.passes.fusion import AttentionGroup, GemmGroup, Group, SoftmaxGroup, fuse
from dynshape.passes.hoist import hoist_scalar_ops, with_types
from dynshape.runtime import profile as profile_io
from dynshape.runtime.binder import InputSpec, make_binder, to_py
from dynshape.runtime.budget import Arena, ArenaPool, Worst, fmt_bytes, grow, over_budget_text, parse_bytes, worst_case
from dynshape.runtime.memory import tune_allocator
from dynshape.runtime.plan import Planner, plannable
from dynshape.runtime.profile import KeyProfile
from dynshape.runtime.strategy import (
    Guard,
    Options,
    choose,
    compile_pick,
    declared,
    exact_guard,
    make_guard,
    order_buckets,
)
from dynshape.sym import Cond, Expr, substitute, sym


@dataclass
class _Step:
    fn: Any
    inputs: tuple
    outputs: tuple
    label: str
    needs_key: bool = False
    needs_scope: bool = False  # If/Loop/Scan: the reference runs the body with the call's values and symbols
    op_type: str = ""
    attrs: dict = field(default_factory=dict)
    kernel: Any = None  # (GroupKernel, C entry, dims(key)) of a fused kernel, for planned execution


@dataclass
class Variant:
    """One build and its guard: generic (key None), a bucket (key None, narrowed graph) or static for one key."""

    key: tuple | None
    steps: list
    fixed: dict  # values known before the call: constants, and for static variants all symbolic values
    symbolic: Any  # key -> {name: array} of symbolic values (None for static variants)
    hits: int = 0
    graph: Any = None  # the graph this build compiled: the symbolic one, or with the key's dims substituted
    planner: Any = None  # plan.Planner when every value's shape follows from the key
    guard: Guard | None = None  # what the build is valid for, why and where it was added
    uid: int = field(default_factory=lambda: next(_uids))  # names its plans in the arenas' caches
    last_call: int = 0  # stats.calls at its latest hit (eviction: least recently hot)
    worst: Worst | None = None  # bounded memory: the arena its keys need, offsets valid over its guard


_uids = itertools.count()


@dataclass
class Stats:
    calls: int = 0
    bind_s: float = 0.0
    run_s: float = 0.0
    hits: dict = field(default_factory=dict)
    builds: int = 0


def _symbolic_values(graph: Graph, needed: set, symbols: list) -> Any:
    """Values inference knows as expressions of the symbols: compile one function computing them all."""
    names = {s.name: f"s{i}" for i, s in enumerate(symbols)}
    exprs = []
    for name in sorted(needed):
        t = graph.types.get(name)
        if not isinstance(t, TensorType) or t.value is None or t.value.dtype != object:
            continue
        if any(isinstance(d, Expr) for d in t.value.shape):
            continue
        flat = list(t.value.reshape(-1))
        if not all(isinstance(v, (int, np.integer, Expr)) for v in flat):
            continue
        if any(isinstance(v, Expr) and not v.free_symbols <= set(names) for v in flat):
            continue
        items = ", ".join(to_py(v, names) if isinstance(v, Expr) else str(int(v)) for v in flat)
        exprs.append(f"    out[{name!r}] = _np.array([{items}], dtype=_np.{np.dtype(t.dtype).name})"
                     f".reshape({tuple(t.value.shape)!r})")
    unpack = "".join(f"{n}, " for n in names.values())
    src = "def symvals(key):\n    out = {}\n"
    if symbols:
        src += f"    ({unpack}) = key\n"
    src += "\n".join(exprs) + "\n    return out\n"
    scope: dict = {"_np": np}
    exec(builtins.compile(src, "<dynshape symbolic values>", "exec"), scope)  # noqa: S102 - our own generated source
    return scope["symvals"]


def _lower(node, opset: int):
    op = opdef.lookup(node.op_type, node.domain)
    attrs = dict(node.attrs)
    attrs["_opset"] = opset
    attrs["_num_outputs"] = len(node.outputs)
    fast = get_lowering(node.op_type, "numpy", node.domain)
    if fast is not None:
        fn = fast.rule(attrs)
        if fn is not None:
            return fn
    ref = op.reference
    if node.subgraphs():
        return lambda args, scope, env: ref(args, {**attrs, "_scope": scope, "_env": env})
    return lambda args: ref(args, attrs)


PLANS_PER_ARENA = 256
PLAN_BYTES = 64 << 20  # per arena: per-key values (masks, ids) the cached plans hold
_helpers_started = threading.Event()


def _warm_helpers(where) -> None:
    """Build the helper libraries (BLAS bridge, row kernels) on another core while the graph's kernels compile:
    from a cold cache the two compilations overlap instead of queueing."""
    if _helpers_started.is_set():
        return
    _helpers_started.set()
    from dynshape.codegen import gemm, program, row_kernels

    def warm():
        with pinned_cache_dir(where):
            program.LIBRARY.try_load(), gemm._kernel(), row_kernels.library()

    threading.Thread(target=warm, daemon=True, name="dynshape-helpers").start()


def _dedupe(kernels: dict) -> dict:
    """Kernels whose C is the same but for the name (one per layer of a transformer) share one function:
    the compiler sees each body once.  Their loop extents stay their own (computed per kernel from the key)."""
    first: dict[str, Any] = {}
    out = {}
    for i, k in kernels.items():
        body = k.source.replace(k.name + "(", "@(", 1)
        same = first.setdefault(body, k)
        out[i] = k if same is k else dataclasses.replace(k, name=same.name, source="")
    return out


class Executable:
    """The result of `ds.compile`: call it with arrays; every shape the signature admits runs.

    Constructed directly (as `ds.load` does) it serves with the `generic` strategy: a loaded artefact must never
    invoke the C compiler, and only `ds.compile` turns on building variants as calls arrive.
    """

    def __init__(self, graph: Graph, specialize: list | None = None, fuse: bool = True, planned: bool = True,
                 options: Options | None = None):
        tune_allocator()
        self._cache = cache_dir()
        _warm_helpers(self._cache)
        self.graph = graph
        self.fuse = fuse
        self.planned = planned
        self.options = opts = options or Options()
        tensors_only = all(isinstance(graph.types.get(v.name), TensorType) for v in graph.inputs)
        if tensors_only:
            specs = [InputSpec(v.name, np.dtype(v.dtype), tuple(graph.types[v.name].shape)) for v in graph.inputs]
            facts = [(f.check, f.origin) for f in graph.signature.facts
                     if isinstance(f.check, Cond) or (hasattr(f.check, "a") and hasattr(f.check, "b"))]
            self._bind = make_binder(specs, facts)
            self.symbols = list(self._bind.symbols)
        else:  # sequence / optional inputs: the reference executor's general binder
            self.symbols = [e.atom() for e in graph.signature.symbols.values()]
            self._bind = self._general_bind
        self._names = [s.name for s in self.symbols]
        self._lock = threading.Lock()  # installs (the dispatch table is copy-on-write: readers never lock)
        self._build_lock = threading.Lock()  # `static`: one synchronous build at a time
        self.stats_ = Stats()
        self.profile_ = KeyProfile(opts.hot_calls, opts.hot_share, opts.hot_window)
        self._variants: dict[tuple, Variant] = {}
        self._buckets: list[Variant] = []
        self._cond = threading.Condition()  # background builds: queue, pending keys, worker liveness
        self._queue: deque = deque()
        self._pending: set = set()
        self._worker: threading.Thread | None = None
        self._refused: set = set()  # keys over the memory budget or whose variant does not fit: never built
        self.notes: list[str] = []  # what was skipped or dropped, and why (shown by explain)
        self.evicted: list[dict] = []
        self.build_errors: list[str] = []
        self._budget = None if opts.memory_budget is None else parse_bytes(opts.memory_budget)
        self._bounded = self._budget is not None or opts.preallocate
        self._arena_bytes = 0
        self._over_text: str | None = None
        self._worst: Worst | None = None  # unbounded executables: for reports only (calls lay out per key)
        self._pool = ArenaPool(opts.arenas, wait=self._bounded)

        counts = profile_io.load(opts.profile, self._names) if opts.profile is not None else None
        self._generic = self._build(None)
        self._generic.guard = make_guard(self.symbols, {}, "generic: serves every admissible shape", "compile")
        hot = self.profile_.hot_in_total(counts) if counts else []
        self.choice = choose(opts, self.symbols, counts, hot)
        self._auto = self.choice.auto_specialize
        if self.choice.every_shape:
            self.profile_.min_calls, self.profile_.min_share = 1, 0.0
        if self._bounded:
            self._init_memory()
        self._add_buckets(self.choice.buckets)  # and compiles the dispatch that follows the exact-key lookup
        for spec in specialize or []:
            self.add_variant(spec)
        for key in self.choice.prebuild:
            self._prebuild(key, counts)
        self._pool.nbytes = self._arena_bytes
        if opts.preallocate:
            self._pool.fill()

    # ---- building -------------------------------------------------------------------------------
    def _live_nodes(self, known: set) -> list:
        needed = {v.name for v in self.graph.outputs}
        live = []
        for node in reversed(self.graph.nodes):
            outs = [o for o in node.outputs if o]
            if any(o in needed and o not in known for o in outs):
                live.append(node)
                needed.update(x for x in node.inputs if x)
        return list(reversed(live)), needed

    def _specialized(self, mapping: dict) -> Graph:
        """The graph with symbols replaced by values (static variants) or narrower symbols (buckets)."""
        types = {}
        for name, t in self.graph.types.items():
            if isinstance(t, TensorType) and any(isinstance(d, Expr) for d in t.shape):
                t = TensorType(t.dtype, tuple(substitute(d, mapping) if isinstance(d, Expr) else d for d in t.shape),
                               t.value)
            types[name] = t
        return dataclasses.replace(self.graph, types=types)

    def _build(self, key: tuple | None, narrow: dict | None = None) -> Variant:
        """The generic build (key None), a bucket's (narrow: name -> int or narrower symbol) or a static one."""
        g = self.graph
        consts = g.constants()
        sym_names = {n for n, t in g.types.items() if isinstance(t, TensorType) and t.value is not None
                     and t.value.dtype == object}
        symvals = _symbolic_values(g, sym_names, self.symbols)
        # a symbolic value is "known" when the compiled function can produce it
        probe_names = self._probe_symbolic(symvals)
        known = set(consts) | probe_names
        live, needed = self._live_nodes(known)
        live = eliminate_common(live, {v.name for v in g.outputs})
        if self.fuse and os.environ.get("DYNSHAPE_HOIST", "1") != "0":
            live, hoisted = hoist_scalar_ops(live, g.types, consts, {v.name for v in g.outputs})
        else:
            hoisted = {}
        mapping = dict(zip(self._names, key)) if key is not None else narrow
        spec = with_types(self._specialized(mapping) if mapping else g, hoisted)
        steps = self._steps(live, known, spec) if self.fuse else [self._node_step(n) for n in live]
        fixed = {k: v for k, v in consts.items() if k in needed}
        fixed.update(self._pack_weights(steps, consts))
        if key is not None:
            fixed.update({k: v for k, v in symvals(key).items() if k in needed})
            variant = Variant(key, steps, fixed, None, graph=spec)
        else:
            variant = Variant(None, steps, fixed, symvals, graph=spec)
        if self.planned and plannable(self, variant):
            variant.planner = Planner(self, variant)
        return variant

    def _node_step(self, n) -> _Step:
        attrs = {**n.attrs, "_opset": self.graph.opset, "_num_outputs": len(n.outputs)}
        return _Step(_lower(n, self.graph.opset), tuple(n.inputs), tuple(n.outputs), n.name,
                     needs_scope=bool(n.subgraphs()), op_type=n.op_type, attrs=attrs)

    def _steps(self, live: list, known: set, g: Graph) -> list:
        """Fuse elementwise chains into C kernels (one library per build); the rest via lowerings."""
        items = fuse(live, g, known)
        key_names = {s.name for s in self.symbols}
        kernels = {}
        emitters = {Group: emit_group, SoftmaxGroup: emit_softmax, GemmGroup: emit_gemm, AttentionGroup: emit_attention}
        for i, item in enumerate(items):
            emit = emitters.get(type(item))
            if emit is not None:
                k = emit(item, g, f"ds_fused_{i}", key_names)
                if k is not None:
                    kernels[i] = k
        kernels = _dedupe(kernels)
        lib_of = self._compile_kernels(kernels, items, g.name or "graph")
        steps = []
        for i, item in enumerate(items):
            if i in kernels:
                k = kernels[i]
                fn = make_step(k, lib_of[k.name], self.symbols)
                steps.append(_Step(fn, tuple(k.inputs), tuple(k.outputs), "+".join(n.name for n in item.nodes),
                                   needs_key=True, op_type="fused", kernel=fn.raw))
            else:
                for n in (item.nodes if type(item) in emitters else [item]):
                    steps.append(self._node_step(n))
        return steps

    @staticmethod
    def _compile_kernels(kernels: dict, items: list, graph_name: str) -> dict:
        """Kernel name -> loaded library. Products (which call the micro-kernel library) and the other groups
        are two libraries compiled at the same time as that library: on a cold cache the compiler is most of
        the build."""
        parts: dict[bool, list] = {True: [], False: []}
        for i, k in kernels.items():
            if k.source:
                parts[isinstance(items[i], (GemmGroup, AttentionGroup))].append(k)
        jobs = {}
        for gemms, ks in parts.items():
            if ks:
                src = prelude() + ('#include "ds_gemm.h"\n' if gemms else "") + \
                    "".join(k.source for k in ks)
                jobs[gemms] = (src, f"{graph_name}_{'products' if gemms else 'fused'}", [k.name for k in ks])
        flags = {"flags": DEFAULT_FLAGS, "openmp": True}
        tasks = [lambda src=src, name=name: build_shared(src, name, **flags) for src, name, _ in jobs.values()]
        if True in jobs:
            tasks.append(packed_gemm.library)
        # in parallel for a compile someone waits for; one at a time in the background builder, whose compiler
        # processes would otherwise take both cores from the request it must not slow down
        if len(tasks) > 1 and threading.current_thread().name != "dynshape-builder":
            from concurrent.futures import ThreadPoolExecutor

            where = cache_dir()  # the workers build where this thread would (an artefact's libs/ while saving)

            def run(task):
                with pinned_cache_dir(where):
                    return task()

            with ThreadPoolExecutor(2) as pool:
                list(pool.map(run, tasks))
        else:
            for f in tasks:
                f()
        libs = {key: compile_c(src, name, symbols=symbols, **flags) for key, (src, name, symbols) in jobs.items()}
        return {name: libs[key] for key, (_, _, names) in jobs.items() for name in names}

    @staticmethod
    def _pack_weights(steps: list, consts: dict) -> dict:
        """The packed form of every constant matrix a GemmGroup kernel reads: packed once per weight array, so
        the variants and executables of one graph share it (memory, and the caches it competes for)."""
        out = {}
        for s in steps:
            for x in s.inputs:
                if "::packed" in x and x not in out:
                    w, how = x.rsplit("::packed", 1)
                    out[x] = packed_gemm.packed(consts[w], trans=how == "T")
        return out

    def _probe_symbolic(self, symvals) -> set:
        """Names the symbolic-value function computes (evaluated at the symbols' lower bounds)."""
        key = tuple(max(s.lo, 1) for s in self.symbols)
        try:
            return set(symvals(key))
        except Exception:  # noqa: BLE001 - a probe failure just means "compute at run time instead"
            return set()

    def add_variant(self, values: dict) -> Variant:
        """Build the fully static variant for one assignment of the symbols (by name); it is never evicted."""
        key = self._key_of(values, "specialize")
        variant = self._build(key)
        variant.guard = exact_guard(self.symbols, key, "declared (specialize= / add_variant)", "compile")
        if not self._install(variant, at_compile=True):
            raise DynshapeError(f"specialize {values}: {self.notes[-1]}")
        return variant

    def _key_of(self, values: dict, what: str) -> tuple:
        missing = [n for n in self._names if n not in values]
        if missing:
            raise DynshapeError(f"{what}: no value for {missing} (symbols: {self._names})")
        key = tuple(int(values[n]) for n in self._names)
        for s, v in zip(self.symbols, key):
            if v < s.lo or (s.hi is not None and v > s.hi) or v % s.mult:
                raise ConstraintViolation(f"{what}: {s.name} = {v} violates {s.describe()}")
        return key

    def _prebuild(self, key: tuple, counts: dict | None) -> None:
        """A static variant for a profiled shape, now; a shape the declaration no longer admits is skipped."""
        if key in self._variants:
            return
        if not all(d.contains(v) for d, v in zip(declared(self.symbols), key)):
            self.notes.append(f"profile shape {self._fmt_key(key)} skipped: outside the declared dims")
            return
        n = counts.get(key, 0) if counts else 0
        why = f"profile {self.options.profile}: {n} of {sum(counts.values()) if counts else 0} calls"
        variant = self._build(key)
        variant.guard = exact_guard(self.symbols, key, why, "compile", pinned=self.choice.prebuild_pinned)
        self._install(variant, at_compile=True)

    def _add_buckets(self, specs: list) -> None:
        """Build one variant per bucket (guard first: implied clauses dropped) and compile their dispatch."""
        guards = [make_guard(self.symbols, spec, "bucket (no padding: the call runs at its exact shape)",
                             "compile: " + ("buckets=" if self.options.buckets else "strategy " + self.choice.name))
                  for spec in specs]
        order, notes = order_buckets(guards)
        self.notes += notes
        for i in order:
            g = guards[i]
            if g.key is not None:  # a bucket of one shape is an exact key
                variant = self._build(g.key)
                variant.guard = g
                self._install(variant, at_compile=True)
                continue
            narrow = {}
            for s, d, decl in zip(self.symbols, g.doms, declared(self.symbols)):
                if d != decl:
                    narrow[s.name] = d.lo if d.lo == d.hi else sym(s.name, d.lo, d.hi, d.mult)
            variant = self._build(None, narrow)
            variant.guard = g
            if self._bounded:
                self._admit(variant, at_compile=True)
            self._buckets.append(variant)
            self.stats_.builds += 1
        if self.choice.name == "static":
            self._pick, self._default = self._build_on_sight, None
        else:  # no buckets: no call after the exact-key lookup
            self._pick = compile_pick(len(self.symbols), [(v.guard, v) for v in self._buckets], self._generic)
            self._default = None if self._buckets else self._generic

    def _install(self, variant: Variant, at_compile: bool = False) -> bool:
        """Publish a static variant (copy-on-write); evict the least recently hot evictable one over the cap."""
        if self._bounded and not self._admit(variant, at_compile):
            return False
        cap = self.options.max_variants
        with self._lock:
            variants = {**self._variants, variant.key: variant}
            evictable = [k for k, v in variants.items() if not v.guard.pinned and k != variant.key]
            while cap is not None and not variant.guard.pinned and len(evictable) + 1 > cap:
                recent = self.profile_.recent
                victim = min(evictable, key=lambda k: (recent(k), variants[k].last_call))
                evictable.remove(victim)
                old = variants.pop(victim)
                self.evicted.append({"values": dict(zip(self._names, victim)), "hits": old.hits,
                                     "why": f"cap of {cap} variants: least recently hot when "
                                            f"{self._fmt_key(variant.key)} was installed"})
            self._variants = variants
            self.stats_.builds += 1
        return True

    def _admit(self, variant: Variant, at_compile: bool) -> bool:
        """Bounded memory: the variant's worst case must fit the arenas (at compile time they grow to hold it)."""
        his = None if variant.guard is None else {s.name: d.hi for s, d in zip(self.symbols, variant.guard.doms)}
        w = variant.worst = worst_case(variant.planner, self.symbols, his) if variant.planner else None
        need = None if w is None else w.reserve
        if need is not None and need <= self._arena_bytes:
            return True
        what = "bucket " + variant.guard.text() if variant.key is None else self._fmt_key(variant.key)
        if need is None:
            why = "it has no memory plan"
        elif at_compile and (self._budget is None or need <= self._budget):
            self._arena_bytes = need
            return True
        else:
            why = f"it needs a {fmt_bytes(need)} arena, the arenas hold {fmt_bytes(self._arena_bytes)}"
        if at_compile:
            raise DynshapeError(f"{what}: {why}" + (f" (memory_budget {fmt_bytes(self._budget)})"
                                                   if self._budget is not None else ""))
        self.notes.append(f"variant {what} not installed: {why}")
        self._refused.add(variant.key)
        return False

    def _build_on_sight(self, key: tuple) -> Variant:
        """`static`: build the key's variant now, on the request path (the recompile-per-shape baseline)."""
        if key in self._refused:
            return self._generic
        with self._build_lock:
            variant = self._variants.get(key)
            if variant is None:
                variant = self._build(key)
                variant.guard = exact_guard(self.symbols, key, "strategy static: compiled on first sight",
                                            f"call {self.stats_.calls + 1}")  # kept: no cap, no eviction
                if not self._install(variant):
                    return self._generic
            return variant

    # ---- background builds of hot keys ---------------------------------------------------------
    def _hot(self, key: tuple) -> None:
        """Queue a build for a key that just became hot; returns at once (the call goes on with what exists)."""
        if key in self._pending or key in self._refused or not self.profile_.is_hot(key):
            return
        with self._cond:
            if key in self._pending or key in self._variants:
                return
            self._pending.add(key)
            p = self.profile_
            self._queue.append((key, f"hot: {p.count(key)} calls, {p.share(key):.0%} of the last "
                                     f"{min(p.calls, p.window)}", f"built in the background from call {p.calls}"))
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="dynshape-builder", daemon=True)
                self._worker.start()

    def _work(self) -> None:
        """The builder thread: drains the queue, then exits (the next hot key starts a new one)."""
        _background()
        while True:
            with self._cond:
                if not self._queue:
                    self._worker = None
                    return
                key, why, where = self._queue.popleft()
            try:
                with pinned_cache_dir(self._cache):  # where the executable was compiled, whatever others do since
                    variant = self._build(key)
                variant.guard = exact_guard(self.symbols, key, why, where, pinned=False)
                self._install(variant)
            except Exception as e:  # noqa: BLE001 - a failed build leaves the generic build serving the key
                self._refused.add(key)
                self.build_errors.append(f"{self._fmt_key(key)}: {type(e).__name__}: {e}")
            finally:
                with self._cond:
                    self._pending.discard(key)
                    self._cond.notify_all()

    def wait_for_builds(self, timeout: float | None = None) -> bool:
        """Block until no background build is queued or running; False if `timeout` seconds passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout)

    @property
    def pending(self) -> list[dict]:
        """Keys whose background build is queued or running."""
        return [dict(zip(self._names, k)) for k in list(self._pending)]

    def _general_bind(self, feed: dict) -> tuple:
        env = bind_inputs(self.graph, feed)
        return [feed[v.name] for v in self.graph.inputs], tuple(env[s.name] for s in self.symbols)

    # ---- running --------------------------------------------------------------------------------
    def run(self, feed: dict) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        arrays, key = self._bind(feed)
        if self.profile_.observe(key) and self._auto and key not in self._variants:
            self._hot(key)
        variant = self._variants.get(key) or self._default or self._pick(key)
        t1 = time.perf_counter()
        if variant.planner is not None:
            pool = self._pool
            try:
                arena = pool.free.pop()
            except IndexError:
                arena = pool.take()
            if arena is not None:  # else every arena is in use: allocate this call's tensors instead
                try:
                    plan = arena.plans.get((variant.uid, key)) or self._plan(variant, key, arena)
                    out = plan.run(arrays)
                finally:
                    pool.free.append(arena)
                    if pool.waiting:
                        pool.wake()
                self._account(variant, t0, t1)
                return out
        values = dict(variant.fixed)
        if variant.symbolic is not None:
            values.update(variant.symbolic(key))
        for spec, a in zip(self.graph.inputs, arrays):
            values[spec.name] = a
        for step in variant.steps:
            args = [values[x] if x else None for x in step.inputs]
            if step.needs_key:
                outs = step.fn(args, key)
            elif step.needs_scope:
                outs = step.fn(args, values, dict(zip(self._names, key)))
            else:
                outs = step.fn(args)
            for name, out in zip(step.outputs, outs):
                if name:  # ufuncs turn 0-d results into numpy scalars; sequences (lists) stay as they are
                    values[name] = np.asarray(out) if isinstance(out, np.generic) else out
        self._account(variant, t0, t1)
        return {v.name: values[v.name] for v in self.graph.outputs}

    def _account(self, variant: Variant, t0: float, t1: float) -> None:
        st = self.stats_
        st.calls += 1
        st.bind_s += t1 - t0
        st.run_s += time.perf_counter() - t1
        variant.hits += 1
        variant.last_call = st.calls

    def _plan(self, variant: Variant, key: tuple, arena: Arena):
        """Lay out and bind this key's plan in the arena the caller holds (refused first if over budget)."""
        pl = variant.planner
        w = variant.worst
        if w is not None and w.monotone and w.reserve <= arena.buf.size:  # bounded: the max-key offsets fit all
            shapes, offsets, total = dict(zip(pl.values, pl.shapes(key))), w.offsets, w.layout
        else:
            shapes, offsets, total = pl.layout(key)
        if self._budget is not None and total > self._budget:
            self._refused.add(key)
            raise ConstraintViolation(f"memory_budget {fmt_bytes(self._budget)}: {self._fmt_key(key)} needs a "
                                      f"{fmt_bytes(total)} arena; refused before allocating ({self._fits_text()})")
        if total > arena.buf.size:
            grow(arena, total)
        symvals = variant.symbolic(key) if variant.symbolic is not None else {}
        plan = pl.bind(key, arena.buf, shapes, offsets, symvals)
        self._keep_plan(arena.plans, (variant.uid, key), plan)
        return plan

    def _keep_plan(self, plans: dict, slot: tuple, plan: Any) -> None:
        """Cache a new plan within PLANS_PER_ARENA plans and the per-key bytes `_plan_bytes` allows, the oldest
        going first. A stream cycling over more keys than fit misses every time; keeping the most-called keys
        instead fixed that, but resident memory then crept up 3-4% over 3,000 random shapes after warm-up,
        against 0.04% with this policy (bench/memory_bench.py)."""
        cap = self._plan_bytes()
        if plan.nbytes > cap:
            return  # serves this call only
        held = sum(p.nbytes for p in plans.values()) + plan.nbytes
        while plans and (len(plans) >= PLANS_PER_ARENA or held > cap):
            held -= plans.pop(next(iter(plans))).nbytes
        plans[slot] = plan

    def __call__(self, **inputs: Any) -> list[np.ndarray]:
        out = self.run(inputs)
        return [out[v.name] for v in self.graph.outputs]

    # ---- memory ---------------------------------------------------------------------------------
    def _plan_bytes(self) -> int:
        """What an arena's cached plans may hold in per-key values: PLAN_BYTES, and with a memory_budget no more
        than the budget leaves beside the arena."""
        if self._budget is None:
            return PLAN_BYTES
        return max(0, min(PLAN_BYTES, self._budget - self._arena_bytes))

    def _init_memory(self) -> None:
        """Budget / preallocate: size the arenas for the worst case, or refuse now, naming what drives it."""
        what = "memory_budget" if self._budget is not None else "preallocate"
        if self._generic.planner is None:
            why = "planned=False" if not self.planned else \
                "some value's shape does not follow from the symbols (data-dependent sizes, sequences, control flow)"
            raise DynshapeError(f"{what} needs a memory-planned executable: {why}")
        w = self._generic.worst = worst_case(self._generic.planner, self.symbols)
        if w.unbounded:
            dims = ", ".join(f"{n!r}: (1, N)" for n in w.unbounded)
            raise DynshapeError(f"{what} needs an upper bound on every symbol the memory depends on: "
                                f"{', '.join(w.unbounded)} {'is' if len(w.unbounded) == 1 else 'are'} unbounded; "
                                f"declare a max, e.g. dims={{{dims}}}")
        self._arena_bytes = w.reserve
        if self._budget is not None and w.reserve > self._budget:
            at = ", ".join(f"{k}={v}" for k, v in w.at.items())
            if self.options.over_budget == "error":
                raise DynshapeError(f"memory_budget {fmt_bytes(self._budget)}: the worst-case arena is "
                                    f"{fmt_bytes(w.reserve)} (at {at}); {self._fits_text()}. Declare narrower dims "
                                    "or raise the budget; over_budget='refuse_calls' serves the shapes that fit and "
                                    "refuses the others per call")
            self._arena_bytes = self._budget
            self.notes.append(f"worst-case arena {fmt_bytes(w.reserve)} exceeds memory_budget "
                              f"{fmt_bytes(self._budget)}: calls that need more are refused ({self._fits_text()})")

    def _fits_text(self) -> str:
        if self._over_text is None:
            w = self._generic.worst or worst_case(self._generic.planner, self.symbols)
            self._over_text = over_budget_text(self._generic.planner, self.symbols, w, self._budget or 0)
        return self._over_text

    def worst_case_memory(self) -> Worst | None:
        """The generic build's worst-case arena over the declared ranges (None without a memory plan)."""
        if self._generic.planner is None:
            return None
        if self._generic.worst is not None:  # bounded: computed at compile time, and used by every call
            return self._generic.worst
        if self._worst is None:
            self._worst = worst_case(self._generic.planner, self.symbols)
        return self._worst

    # ---- reporting ------------------------------------------------------------------------------
    def _fmt_key(self, key: tuple) -> str:
        return ", ".join(f"{n}={v}" for n, v in zip(self._names, key)) or "()"

    def save_profile(self, path: str | os.PathLike) -> None:
        """Write the observed key counts (JSON, by symbol name) for `ds.compile(..., profile=path)`."""
        profile_io.save(path, self._names, dict(self.profile_.counts))

    def explain_strategy(self) -> dict:
        """The strategy and why, the hotness rule, every variant with its guard, buckets, evictions, memory."""
        p, c = self.profile_, self.choice
        variants = [{"values": dict(zip(self._names, k)), **v.guard.as_dict(), "hits": v.hits}
                    for k, v in self._variants.items()]
        mem = self.worst_case_memory()
        return {
            "requested": c.requested,
            "strategy": c.name,
            "reasons": list(c.reasons),
            "dispatch": f"exact key (dict, {len(self._variants)} variant(s)) -> {len(self._buckets)} bucket(s) "
                        f"-> {'build on first sight' if c.name == 'static' else 'generic'}",
            "auto_specialize": {"on": self._auto, "hot_calls": p.min_calls, "hot_share": p.min_share,
                                "window": p.window, "max_variants": self.options.max_variants},
            "generic": {**self._generic.guard.as_dict(), "hits": self._generic.hits},
            "variants": variants,
            "buckets": [{**v.guard.as_dict(), "hits": v.hits} for v in self._buckets],
            "evicted": list(self.evicted),
            "pending": self.pending,
            "errors": list(self.build_errors),
            "notes": list(self.notes),
            "profile": {"calls": p.calls, "distinct_keys": len(p.counts)},
            "memory": None if mem is None else {**mem.as_dict(), "budget": self._budget,
                                                "arena_bytes": self._arena_bytes if self._bounded else None,
                                                "arenas": self._pool.limit, "preallocated": self.options.preallocate},
        }

    def stats(self) -> dict:
        st = self.stats_
        return {
            "calls": st.calls,
            "builds": 1 + st.builds,
            "hits": {"generic": self._generic.hits,
                     **{str(dict(zip(self._names, k))): v.hits for k, v in self._variants.items()},
                     **{v.guard.text(): v.hits for v in self._buckets}},
            "bind_seconds": st.bind_s,
            "run_seconds": st.run_s,
            "steps": len(self._generic.steps),
            "arena_bytes": self._pool.nbytes_total,
            "planned": self._generic.planner is not None,
            "nodes": len(self.graph.nodes),
        }


GIL_SLICE_S, GIL_PAUSE_S = 0.0005, 0.01  # the builder: 0.5 ms of Python, then 10 ms off the GIL


def _background() -> None:
    """Make the calling (builder) thread yield to request threads.

    CPU: the lowest priority (Linux: nice is per thread, and the compiler processes it starts inherit it), so
    a build takes idle cycles and does not slow a multi-threaded BLAS call down.  GIL: a profile hook pauses
    the thread for GIL_PAUSE_S after every GIL_SLICE_S of Python work.  Sleeping releases the GIL, so a request
    thread waits at most about one slice for it, the build's tens of milliseconds of Python are spread thin
    over many calls instead of doubling one, and a low-priority thread descheduled while it holds the GIL
    stalls the others only within such a slice.
    """
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    clock, pause = time.perf_counter, time.sleep
    since = clock()

    def hook(frame: Any, event: str, arg: Any) -> None:
        nonlocal since
        if clock() - since > GIL_SLICE_S:
            pause(GIL_PAUSE_S)
            since = clock()

    sys.setprofile(hook)


def compile(graph: Graph, specialize: list | None = None, fuse: bool = True,  # noqa: A001
            planned: bool = True, *, strategy: str = "auto", profile: str | os.PathLike | None = None,
            auto_specialize: bool | None = None, hot_calls: int = 20, hot_share: float = 0.05,
            hot_window: int = 1000, max_variants: int | None = 16, buckets: list | None = None,
            memory_budget: int | str | None = None, over_budget: str = "error", preallocate: bool = False,
            arenas: int = 4) -> Executable:
    """Compile a graph once; the result runs every admissible shape without recompiling.

    `fuse=False` keeps one step per op (no generated C); `planned=False` allocates every tensor per call
    instead of using the memory plan: the baselines those optimisations are measured against.

    Specialisation (`strategy`):
    - "auto" (default): no symbols -> "generic"; declared ranges admitting <= 8 shapes -> each shape gets a
      static variant on first sight; a profile of <= 8 distinct shapes -> one static variant each, prebuilt;
      otherwise "multi_version".
    - "multi_version": the generic build plus static variants of hot shapes, built by a background thread that
      yields (lowest CPU priority, short GIL slices); until a variant is installed the generic build serves its
      shape, so no call waits for a build.  Hot: `hot_calls` (20) calls in the current window of `hot_window`
      (1,000) calls, and `hot_share` (5%) of the last `hot_window`.  At most `max_variants` (16) such variants;
      over the cap the least recently hot is evicted.  Counting costs two dict operations per call, so
      `auto_specialize` defaults to on for this strategy and off for the others.
    - "bucketed": one build per range bucket (`buckets=[{"seq": (65, 128)}, {"batch": 1}]`, or power-of-two
      ranges of the widest symbol), never padded; the generic build for shapes outside every bucket.
    - "generic": one build, variants only from `specialize`.  "static": each new shape is built on first sight,
      synchronously, and kept (the recompile-per-shape baseline).
    `profile=path` (written by `exe.save_profile`) prebuilds the shapes it shows hot.

    Memory: `memory_budget` ("2GiB" or bytes) refuses at compile time when the worst-case arena over the declared
    ranges exceeds it, naming the symbols that drive it and the largest range of each that fits; with
    `over_budget="refuse_calls"` it compiles and refuses, before allocating, each call whose plan needs more.
    `preallocate=True` reserves the worst-case arena of each of the `arenas` (4) arenas at compile time.  Either
    sizes every arena for the worst case, needs an upper bound on every symbol the memory depends on, and makes
    a call that finds all arenas taken wait for one (unbounded executables allocate that call's tensors).
    """
    options = Options(strategy, profile, auto_specialize, hot_calls, hot_share, hot_window, max_variants, buckets,
                      memory_budget, over_budget, preallocate, arenas)
    return Executable(graph, specialize, fuse, planned, options)
