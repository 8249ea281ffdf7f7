"""`ds.compile`: a symbolic graph turned once into an executable that serves every admissible shape.

The pieces, each its own module: the binder (`binder.py`: every check and the dispatch key, one generated
function), the build (`build.py`: graph + options -> steps and kernels), the variant table and dispatch
(`variants.py`), the background builder (`builder.py`), the memory plan and its bound calls (`plan.py`), the
arenas and their plan caches (`arenas.py`, `plan_cache.py`), the memory policy (`memory.py`) and the
specialisation strategy (`strategy.py`, `profile.py`). This module wires them into the public API.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynshape.codegen import clib
from dynshape.codegen.bf16 import check_precision
from dynshape.codegen.cc import cache_dir, pinned_cache_dir
from dynshape.errors import ConstraintViolation, DynshapeError
from dynshape.ir.branches import branch_inputs, shape_branches
from dynshape.ir.execute import Scope, bind_inputs, interpret
from dynshape.ir.graph import Graph
from dynshape.ir.types import TensorType
from dynshape.ir.work import Work, graph_work
from dynshape.options import Options, make
from dynshape.passes.constfold import Folded, fold_constant_nodes
from dynshape.passes.einsum import decompose_einsums
from dynshape.passes.qdq import fuse_qdq
from dynshape.runtime import key_states as ks
from dynshape.runtime import profile as profile_io
from dynshape.runtime.arenas import Arena, ArenaPool, grow
from dynshape.runtime.assumptions import Assumptions
from dynshape.runtime.binder import graph_binder, nonempty_first
from dynshape.runtime.bucket_dispatch import bucket_plan
from dynshape.runtime.build import KernelStep, build, data_dependent_dims
from dynshape.runtime.builder import LAST_REQUEST, BackgroundBuilder, in_builder
from dynshape.runtime.loop_bodies import Bodies
from dynshape.runtime.memory import MemoryPolicy, check_machine, machine_refusal, settled, tune_allocator
from dynshape.runtime.overrides import Overrides
from dynshape.runtime.plan import BoundPlan, Planner, check_out, plannable
from dynshape.runtime.profile import KeyProfile
from dynshape.runtime.rekey import holding_bucket
from dynshape.runtime.strategy import choose, declared, exact_guard, make_guard, order_buckets
from dynshape.runtime.variants import Variant, VariantTable
from dynshape.sym import sym
from dynshape.sym.pysource import compile_key_function, key_names


@dataclass
class Stats:
    calls: int = 0
    bind_s: float = 0.0
    run_s: float = 0.0
    hits: dict = field(default_factory=dict)
    builds: int = 0


_now = time.perf_counter  # the request path's clock, one global lookup

# every build calls these (program runner, row kernels, BLAS bridge): warmed while the graph's kernels compile
EVERY_BUILD_HELPERS = ("program", "row_kernels", "gemm_openblas", "gemm_mkl")


class Executable:
    """The result of `ds.compile`: call it with arrays; every shape the signature admits runs.

    Constructed directly (as `ds.load` does) it serves with the `generic` strategy unless `options` says
    otherwise: a loaded artefact must never invoke the C compiler, and only `ds.compile` turns on building
    variants as calls arrive.
    """

    def __init__(self, graph: Graph, specialize: list | None = None, options: Options | None = None):
        self.notes: list[str] = []  # what was skipped or dropped, and why (shown by explain)
        self.options = opts = options or Options(strategy="generic")
        # Loop / Scan bodies: each compiled once (a generic executable of its own), kept for every build
        body_opts = opts.replace(strategy="generic", profile=None, preallocate=False, inputs_kept=True)
        self._bodies = Bodies(lambda g: Executable(g, None, body_opts))
        tune_allocator(opts.tune_malloc)
        self._cache = cache_dir()
        clib.warm(EVERY_BUILD_HELPERS, self._cache)
        # calls that feed an initializer the model lists as an input: a build from the graph before folding
        self._overrides = Overrides(graph, lambda g: compile(g, options=opts)) if graph.overridable else None
        if opts.fuse and opts.precision == "int8":  # before folding, which would dequantize the int8 weights
            graph = fuse_qdq(graph)
        if opts.fuse:  # Einsums as Transposes, Reshapes and a MatMul (passes/einsum.py): before folding, which
            graph = decompose_einsums(graph)  # then packs a constant operand regrouped for its product
        self.folded = fold_constant_nodes(graph, opts.fold_bytes) if opts.fuse else Folded(graph)
        self.graph = graph = self.folded.graph
        tensors_only = all(isinstance(graph.types.get(v.name), TensorType) for v in graph.inputs)
        if tensors_only:
            self.binder = graph_binder(graph)
            self.symbols = list(self.binder.symbols)
        else:  # sequence / optional inputs: the reference executor's general binder
            self.symbols = [e.atom() for e in graph.signature.symbols.values()]
            self.binder = self._general_bind
        self._names = [s.name for s in self.symbols]
        self._may_be_empty, self._empty_graph, graph = self._nonempty(graph, tensors_only)
        if self._may_be_empty is not None:
            self.binder = nonempty_first(graph, self.binder, self._names)
        self._empty: Executable | None = None
        self.graph = graph
        # what inference assumed of valid inputs (a symbolic Reshape entry that is not 0): keys that break it
        # are valid too, and run a build of the graph re-inferred at their exact shapes (assumptions.py)
        self._assumed = Assumptions(graph, self._names, opts, self.notes,
                                    lambda g: Executable(g, None, opts.replace(strategy="generic", profile=None)))
        self._breaks = self._assumed.breaks if self._assumed.facts else None  # None: one test per call, not a call
        if self._may_be_empty is not None:  # one generated test per call: a 0, else a broken assumption
            zero, breaks = self._may_be_empty, self._breaks
            self._breaks = zero if breaks is None else (lambda key: zero(key) or breaks(key))
        self._where = _symbol_sources(graph, self._names)  # symbol -> "input 'x' axis 0", for memory refusals
        self._build_lock = threading.Lock()  # `static`: one synchronous build at a time
        self.stats_ = Stats()
        self.profile_ = KeyProfile(opts.hot_calls, opts.hot_share, opts.hot_window)
        self._refused: set = set()  # keys over the memory budget or whose variant does not fit: never built
        self.build_errors: list[str] = []
        self.memory = MemoryPolicy(opts, self.symbols, self.notes)
        self._builder = BackgroundBuilder(self._build_hot, self._build_failed)

        counts = profile_io.load(opts.profile, self._names) if opts.profile is not None else None
        generic = self._variant(None, make_guard(self.symbols, {}, "generic: serves every admissible shape",
                                                 "compile"))
        self.table = VariantTable(generic, self._names, opts.max_variants, self.profile_)
        hot = self.profile_.hot_in_total(counts) if counts else []
        self.choice = choose(opts, self.symbols, counts, hot)
        self._auto = self.choice.auto_specialize
        if self.choice.every_shape:
            self.profile_.min_calls, self.profile_.min_share = 1, 0.0
        elif self._auto and generic.build.uncompiled and data_dependent_dims(graph):
            # sizes inference names data-dependent that the key fixes (DPT's reshape to int(seq ** 0.5)): the
            # generic build runs their steps on numpy, a shape's static variant compiles them (build.build
            # re-infers at the key), so a shape earns its variant on its second call, not its 20th
            self.profile_.min_calls = min(self.profile_.min_calls, 2)
            self.notes.append("some sizes depend on values inference could not follow (data-dependent to the "
                              "generic build): a shape is hot from its 2nd call")
        self.memory.init(generic.planner, self._why_unplanned())
        self._pool = ArenaPool(opts.arenas, wait=self.memory.bounded)
        self._add_buckets(self.choice.buckets)
        for spec in specialize or []:
            self.add_variant(spec)
        for key in self.choice.prebuild:
            self._prebuild(key, counts)
        self._pool.nbytes = self.memory.arena_bytes
        if opts.preallocate:
            self._pool.fill()

    # ---- inspection -----------------------------------------------------------------------------------------
    @property
    def generic(self) -> Variant:
        """The generic build (serves every admissible shape)."""
        return self.table.generic

    @property
    def variants(self) -> dict[tuple, Variant]:
        """The exact-key (static) variants, by key."""
        return dict(self.table.exact)

    @property
    def buckets(self) -> list[Variant]:
        return list(self.table.buckets)

    @property
    def arenas(self) -> list[Arena]:
        return list(self._pool.arenas)

    @property
    def pending(self) -> list[dict]:
        """Keys whose background build is queued or running."""
        return [dict(zip(self._names, k)) for k in list(self._builder.pending)]

    # ---- building -------------------------------------------------------------------------------------------
    def _nonempty(self, graph: Graph, tensors_only: bool) -> tuple[Callable | None, Graph | None, Graph]:
        """(the per-call test for a key with a 0, the graph that serves such keys, the graph the builds use).

        Symbols that may be 0 (every undeclared dim: ONNX admits empty tensors) make inference write each
        broadcast as `max(a, b) * min(a, b, 1)` and leave unprovable the facts kernels need, so whole chains ran
        outside kernels (bert_small undeclared: 67 nodes, declared: 17). The builds here are made from the graph
        re-inferred with those symbols >= 1; the binder still admits 0, and a key with one runs a build of the
        original graph, made on first use (`empty_build`). No kernel is lost because a dim may be 0."""
        zero = [s.name for s in self.symbols if s.lo == 0]
        if not (self.options.nonempty_build and zero and tensors_only) or graph.rank_symbols or graph.dynamic:
            return None, None, graph
        from dynshape.ir.specialize import nonempty

        try:
            narrowed = nonempty(graph, zero)
        except DynshapeError as e:  # the model refuses nonzero values of a dim: keep the one build
            self.notes.append(f"no build for {', '.join(zero)} >= 1 ({e}); one build serves every key")
            return None, None, graph
        var = key_names(self._names)
        test = " or ".join(f"{var[n]} == 0" for n in zero)
        self.notes.append(f"keys with every one of {', '.join(zero)} >= 1 run the builds made for that; a key with "
                          "a 0 runs a second build of the model, made on its first call")
        return compile_key_function("has_zero", self._names, f"return {test}"), graph, narrowed

    @property
    def has_empty_build(self) -> bool:
        """Whether keys with a 0 run a build of their own (`empty_build`)."""
        return self._empty_graph is not None

    def empty_build(self) -> Executable:
        """The executable serving keys with a 0 in a symbol that may be 0 (built on first use, then kept)."""
        if self._empty_graph is None:
            raise DynshapeError("every key runs the main build (no symbol here may be 0, or nonempty_build=False)")
        if self._empty is None:
            with self._build_lock:
                if self._empty is None:
                    opts = self.options.replace(strategy="generic", profile=None, nonempty_build=False)
                    self._empty = Executable(self._empty_graph, None, opts)
        return self._empty

    def _variant(self, key: tuple | None, guard: Any, narrow: dict | None = None) -> Variant:
        """Build one variant: the generic build (key None), a bucket's (`narrow`) or a static one."""
        b = build(self.graph, self.symbols, self.options, key, narrow, parallel=not in_builder(), bodies=self._bodies)
        planner = Planner(b, self.symbols, self.options) if self.options.planned and plannable(b, self.symbols) \
            else None
        return Variant(b, guard, planner)

    def _why_unplanned(self) -> str:
        if not self.options.planned:
            return "planned=False"
        return "some value's shape does not follow from the symbols (data-dependent sizes, sequences, control flow)"

    def add_variant(self, values: dict) -> Variant:
        """Build the fully static variant for one assignment of the symbols (by name); it is never evicted."""
        key = self._key_of(values, "specialize")
        variant = self._variant(key, exact_guard(self.symbols, key, "declared (specialize= / add_variant)",
                                                 "compile"))
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
        if key in self.table.exact:
            return
        if not all(d.contains(v) for d, v in zip(declared(self.symbols), key)):
            self.notes.append(f"profile shape {self.table.fmt_key(key)} skipped: outside the declared dims")
            return
        n = counts.get(key, 0) if counts else 0
        why = f"profile {self.options.profile}: {n} of {sum(counts.values()) if counts else 0} calls"
        variant = self._variant(key, exact_guard(self.symbols, key, why, "compile",
                                                 pinned=self.choice.prebuild_pinned))
        self._install(variant, at_compile=True)

    def _add_buckets(self, specs: list) -> None:
        """Build one variant per bucket (guard first: implied clauses dropped) and compile their dispatch."""
        guards = [make_guard(self.symbols, spec, "bucket (no padding: the call runs at its exact shape)",
                             "compile: " + ("buckets=" if self.options.buckets else "strategy " + self.choice.name))
                  for spec in specs]
        order, notes = order_buckets(guards)
        self.notes += notes
        buckets = []
        for i in order:
            g = guards[i]
            if g.key is not None:  # a bucket of one shape is an exact key
                self._install(self._variant(g.key, g), at_compile=True)
                continue
            narrow = {}
            for s, d, decl in zip(self.symbols, g.doms, declared(self.symbols)):
                if d != decl:
                    narrow[s.name] = d.lo if d.lo == d.hi else sym(s.name, d.lo, d.hi, d.mult)
            variant = self._variant(None, g, narrow)
            if self.memory.bounded:
                self._admit(variant, at_compile=True)
            buckets.append(variant)
            self.stats_.builds += 1
        self.table.set_buckets(buckets, self._build_on_sight if self.choice.name == "static" else None)

    def _install(self, variant: Variant, at_compile: bool = False) -> bool:
        if self.memory.bounded and not self._admit(variant, at_compile):
            return False
        self.table.install(variant, self.stats_.calls)
        self.stats_.builds += 1
        return True

    def _admit(self, variant: Variant, at_compile: bool) -> bool:
        his = {s.name: d.hi for s, d in zip(self.symbols, variant.guard.doms)}
        what = "bucket " + variant.guard.text() if variant.key is None else self.table.fmt_key(variant.key)
        variant.worst = self.memory.admit(variant.planner, his, what, at_compile)
        if variant.worst is None:
            self._refused.add(variant.key)
            return False
        return True

    def _build_on_sight(self, key: tuple) -> Variant:
        """`static`: build the key's variant now, on the request path (the recompile-per-shape baseline)."""
        if key in self._refused:
            return self.generic
        with self._build_lock:
            variant = self.table.exact.get(key)
            if variant is None:
                variant = self._variant(key, exact_guard(self.symbols, key, "strategy static: compiled on first "
                                                         "sight", f"call {self.stats_.calls + 1}"))
                if not self._install(variant):
                    return self.generic
            return variant

    # ---- background builds of hot keys ---------------------------------------------------------------------
    def _hot(self, key: tuple) -> None:
        """Queue a build for a key that just became hot; returns at once (the call goes on with what exists)."""
        if key in self._refused or key in self._builder.pending or not self.profile_.is_hot(key):
            return  # (pending: queued already; a loop of calls keeps it waiting, and is_hot costs microseconds)
        p = self.profile_
        self._builder.submit(key, f"hot: {p.count(key)} calls, {p.share(key):.0%} of the last "
                                  f"{min(p.calls, p.window)}", f"built in the background from call {p.calls}",
                             skip=lambda: key in self.table.exact)

    def _build_hot(self, key: tuple, why: str, where: str) -> None:
        with pinned_cache_dir(self._cache):  # where the executable was compiled, whatever others do since
            variant = self._variant(key, exact_guard(self.symbols, key, why, where, pinned=False))
        if self.profile_.min_calls < self.options.hot_calls and data_dependent_dims(variant.build.graph):
            self.profile_.min_calls = self.options.hot_calls  # sizes that depend on the data itself (a NonZero's
            # count): a variant compiles no more than the generic build, so shapes earn one at the usual rate
        self._install(variant)

    def _build_failed(self, key: tuple, e: Exception) -> None:
        self._refused.add(key)
        self.build_errors.append(f"{self.table.fmt_key(key)}: {type(e).__name__}: {e}")

    def wait_for_builds(self, timeout: float | None = None) -> bool:
        """Block until no background build is queued or running; False if `timeout` seconds passed first."""
        return self._builder.wait(timeout)

    # ---- running --------------------------------------------------------------------------------------------
    def _general_bind(self, feed: dict) -> tuple:
        env = bind_inputs(self.graph, feed)
        return [feed[v.name] for v in self.graph.inputs], tuple(env[s.name] for s in self.symbols)

    def run(self, feed: dict, out: dict | None = None) -> dict[str, np.ndarray]:
        """Run one call. `out` (io-binding, as onnxruntime's IOBinding): output name -> a C-contiguous array of
        this call's shape and dtype, filled in place and returned (a decode loop keeps its KV cache in buffers it
        owns); each is checked before anything runs. Outputs not named come back as new arrays."""
        t0 = LAST_REQUEST[0] = _now()  # (the background builder yields while requests come)
        try:
            arrays, key = self.binder(feed)
        except ConstraintViolation:
            names = self._overrides.fed(feed) if self._overrides is not None else frozenset()
            if not names:
                raise
            return self._overrides.run(feed, names, out)
        if self._breaks is not None and self._breaks(key):
            if self._may_be_empty is not None and self._may_be_empty(key):
                return self.empty_build().run(feed, out)
            return _fill(self._assumed.run(key, feed), out)
        table = self.table
        if self.profile_.observe(key) and self._auto and key not in table.exact:
            self._hot(key)
        variant = table.exact.get(key) or table.default or table.pick(key)
        t1 = _now()
        if variant.planner is not None:
            pool = self._pool
            try:
                arena = pool.free.pop()
            except IndexError:
                arena = pool.take()
            if arena is not None:  # else every arena is in use: allocate this call's tensors instead
                try:
                    plan = arena.plans.get((variant.uid, key)) or self._plan(variant, key, arena)
                    res = plan.run(arrays, out)
                finally:
                    pool.free.append(arena)
                    if pool.waiting:
                        pool.wake()
                self._account(variant, t0, t1)
                return res
        if out:  # names, dtypes and layout before the unplanned steps run; shapes once they are known
            types = self.graph.types
            check_out(out, {v.name: (getattr(out.get(v.name), "shape", ()), types[v.name].dtype)
                            for v in self.graph.outputs if isinstance(types.get(v.name), TensorType)})
        res = _fill(self._interpret(variant, key, arrays), out)
        self._account(variant, t0, t1)
        return res

    def held(self) -> _Held:
        """For many calls in a row (a Loop body, once per iteration): one arena held for all of them and the plan
        of the last key kept. A context manager yielding `bind(feed) -> (arrays, plan)`: the binder's checks,
        then the plan serving this key in the held arena, to `plan.run(arrays)`; plan None: the planned path
        does not serve this call (no arena free, an empty / assumption-breaking key, an unplanned build),
        `run(feed)` does. Why: `run`'s per-call bookkeeping (arena pool, plan cache, profile, stats) cost about
        a third of a small body's iteration, and a caller holding the plan may drive it itself
        (`BoundPlan.load`). Calls made this way are not counted in `stats`. (A class, not a generator: ~1 us
        less per Loop call.)"""
        return _Held(self)

    def _interpret(self, variant: Variant, key: tuple, arrays: list) -> dict[str, np.ndarray]:
        """The unplanned path: every step allocates its outputs (the interpreter shared with graph.run)."""
        b = variant.build
        values: dict[Any, Any] = dict(b.fixed)  # by value name, and by PackedWeight
        if b.symbolic is not None:
            values.update(b.symbolic(key))
        for spec, a in zip(self.graph.inputs, arrays):
            values[spec.name] = self._contiguous(spec.name, a, key)
        interpret(b.steps, values, Scope(values, dict(zip(self._names, key)), key))
        return {v.name: values[v.name] for v in self.graph.outputs}

    def _contiguous(self, name: str, a: Any, key: tuple) -> Any:
        """An input as the unplanned steps read it (C-contiguous), refused before the copy when the machine
        cannot hold it (a broadcast view of 10**9 rows)."""
        if not isinstance(a, np.ndarray) or a.flags.c_contiguous:
            return a
        culprits, names = self._culprits(key)
        check_machine(a.nbytes, f"the contiguous copy of input {name!r} ({a.dtype}{list(a.shape)})", culprits, names)
        try:
            return np.ascontiguousarray(a) if a.ndim else a.copy()
        except MemoryError:
            raise machine_refusal(a.nbytes, f"the contiguous copy of input {name!r}", culprits, names) from None

    def _culprits(self, key: tuple) -> tuple[str, list[str]]:
        """The symbols of this call, largest first, with where each was read and whether it is bounded."""
        parts, names = [], []
        for s, v in sorted(zip(self.symbols, key), key=lambda sv: -sv[1]):
            bound = "unbounded" if s.hi is None else f"declared <= {s.hi}"
            parts.append(f"{s.name} = {v} ({self._where.get(s.name, 'a derived dim')}, {bound})")
            if s.hi is None:
                names.append(s.name)
        return "; ".join(parts) or "the model's static shapes", names or [s.name for s in self.symbols]

    def _account(self, variant: Variant, t0: float, t1: float) -> None:
        st = self.stats_
        st.calls += 1
        st.bind_s += t1 - t0
        end = LAST_REQUEST[0] = _now()
        st.run_s += end - t1
        variant.hits += 1
        variant.last_call = st.calls

    @staticmethod
    def _slots(arena: Arena, pl: Planner, shapes: dict) -> tuple[dict, int] | None:
        """A key whose first-fit layout outgrows the arena, but whose every buffer is no larger than in the layout
        the arena was grown for, takes that layout's offsets (each buffer inside its old slot, lifetimes the same)
        instead of growing it. Why: first-fit is not monotone in the shapes (byte_cls's arena, sized with 25%
        headroom for batch 4 x 2096 bytes, had to grow by 31% for the smaller 4 x 2058), so a stream of smaller
        shapes after the largest grew resident memory by a whole arena's 25% in one step. None: no such layout."""
        fit = arena.fit
        if fit is None or fit[0] is not pl:
            return None
        slots = fit[2]
        if all(n <= slots[b] for b, n in pl.sizes(shapes).items()):
            return fit[1], max(fit[1][b] + slots[b] for b in slots) if slots else 0
        return None

    def _plan(self, variant: Variant, key: tuple, arena: Arena) -> BoundPlan:
        """Lay out and bind this key's plan in the arena the caller holds (refused first if over budget); a key
        not seen in this arena before is served by its bucket's plan where one can be (bucket_dispatch.py)."""
        pl = variant.planner
        w = variant.worst
        if self.options.bucket_plans and not self.options.inputs_kept:
            plan = bucket_plan(self, variant, key, arena)
            if plan is not None:
                return plan
        if w is not None and w.monotone and w.reserve <= arena.buf.size:  # bounded: the max-key offsets fit all
            shapes, offsets, total = dict(zip(pl.values, pl.shapes(key))), w.offsets, w.layout
        else:
            shapes = dict(zip(pl.values, pl.shapes(key)))
            # a bucket plan's layout in this arena that holds the key: no first-fit to run (~40 us of the ~165 a
            # decoder step's second call at a past length spent binding its own plan)
            laid = holding_bucket(arena, variant.uid, pl, key, shapes)
            if laid is not None and laid.bucket.sizes is not None:
                offsets, total = laid.bucket.offsets, laid.bucket.total
            else:
                _, offsets, total = pl.layout(key)
                if total > arena.buf.size:
                    offsets, total = self._slots(arena, pl, shapes) or (offsets, total)
        try:
            self.memory.refuse(total, self.table.fmt_key(key))
        except ConstraintViolation:
            self._refused.add(key)
            raise
        if total > arena.buf.size:
            culprits, names = self._culprits(key)
            check_machine(total, f"this call's memory plan ({self.table.fmt_key(key)})", culprits, names)
            try:
                grow(arena, total)
            except MemoryError:
                raise machine_refusal(total, f"this call's memory plan ({self.table.fmt_key(key)})", culprits,
                                      names) from None
            arena.fit = (pl, offsets, pl.sizes(shapes))
        symvals = variant.build.symbolic(key) if variant.build.symbolic is not None else {}
        plan = pl.bind(key, arena.buf, shapes, offsets, symvals)
        arena.plans.keep((variant.uid, key), plan, self.memory.plan_bytes() - ks.remembered_bytes(arena),
                         self.options.plan_cache)
        return plan

    def __call__(self, **inputs: Any) -> list[np.ndarray]:
        out = self.run(inputs)
        return [out[v.name] for v in self.graph.outputs]

    # ---- reporting ------------------------------------------------------------------------------------------
    def worst_case_memory(self):
        """The generic build's worst-case arena over the declared ranges (None without a memory plan)."""
        return self.memory.report()

    def work(self, values: dict[str, int] | None = None) -> Work | dict[str, int]:
        """The FLOPs and bytes of one call as expressions of the symbols (a `Work`, see `dynshape.ir.work`), or,
        given `values` (every symbol it depends on), their ints at that binding. Why here: a caller choosing
        between shapes (a server padding and joining requests) predicts each call's cost from its shape
        before running it, through the public API."""
        w = self.__dict__.get("_work")
        if w is None:
            w = self.__dict__["_work"] = graph_work(self.graph)
        return w if values is None else w.at(values)

    def save_profile(self, path: str | os.PathLike) -> None:
        """Write the observed key counts (JSON, by symbol name) for `ds.compile(..., profile=path)`."""
        profile_io.save(path, self._names, dict(self.profile_.counts))

    def explain_strategy(self) -> dict:
        """The strategy and why, the hotness rule, every variant with its guard, buckets, evictions, memory."""
        p, c, t = self.profile_, self.choice, self.table
        variants = [{"values": dict(zip(self._names, k)), **v.guard.as_dict(), "hits": v.hits}
                    for k, v in t.exact.items()]
        mem = self.worst_case_memory()
        return {
            "requested": c.requested,
            "strategy": c.name,
            "reasons": list(c.reasons),
            "dispatch": f"exact key (dict, {len(t.exact)} variant(s)) -> {len(t.buckets)} bucket(s) "
                        f"-> {'build on first sight' if c.name == 'static' else 'generic'}",
            "auto_specialize": {"on": self._auto, "hot_calls": p.min_calls, "hot_share": p.min_share,
                                "window": p.window, "max_variants": self.options.max_variants},
            "generic": {**t.generic.guard.as_dict(), "hits": t.generic.hits},
            "variants": variants,
            "buckets": [{**v.guard.as_dict(), "hits": v.hits} for v in t.buckets],
            "evicted": list(t.evicted),
            "pending": self.pending,
            "errors": list(self.build_errors),
            "notes": list(self.notes),
            "profile": {"calls": p.calls, "distinct_keys": len(p.counts)},
            "plans": {**self.stats()["plans"], "rule": ks.rule(self.options.plan_cache, self.memory.plan_bytes())},
            "memory": None if mem is None else {**mem.as_dict(), "budget": self.memory.budget,
                                                "arena_bytes": self.memory.arena_bytes if self.memory.bounded
                                                else None, "arenas": self._pool.limit,
                                                "preallocated": self.options.preallocate,
                                                "kernel_scratch": self.kernel_scratch()},
        }

    def kernel_scratch(self) -> dict | None:
        """The largest scratch one kernel of the generic build allocates for a call (per thread, outside the arena;
        kernels run one after another, so this is the most held at once per call and thread), or None."""
        steps = [s for s in self.generic.build.steps if isinstance(s, KernelStep) and s.scratch_bytes]
        if not steps:
            return None
        top = max(steps, key=lambda s: s.scratch_bytes)
        return {"bytes_per_thread": top.scratch_bytes, "kernel": top.label,
                "text": f"plus up to {top.scratch_bytes / 2**20:.1f} MiB a thread of kernel scratch outside the "
                        f"arena while {top.label} runs"}

    def explain_build(self, key: tuple | None = None) -> dict:
        """The generic build (with `key`: the build serving that key, its hot variant once one is made): its
        kernels, and every node that runs without a generated kernel, how and why."""
        v = (self.table.exact.get(tuple(key)) if key is not None else None) or self.generic
        b, pl = v.build, v.planner
        once = {b.steps[i].label for i in pl.per_key} if pl is not None else set()
        views = {b.steps[i].label for i in pl.alias_step} if pl is not None else set()

        def when(label: str) -> str:
            if label in once:
                return "once per shape (it reads only constants and the shape), not per call"
            return "never: a view of its input's buffer" if label in views else "every call"

        return {
            "kernels": [{"kind": s.kind, "nodes": s.name, "shared_with": s.shared_with, "method": s.method}
                        for s in b.steps if isinstance(s, KernelStep)],
            "uncompiled": [{"node": u.label, "op": u.op, "runs": u.how, "why": u.why, "when": when(u.label)}
                           for u in b.uncompiled],
            # Loop / Scan nodes: whether each body runs compiled (called per iteration) or interpreted, and why
            "bodies": [{"node": u.label, "op": u.op, "body": u.body.partition(":")[0],
                        "why": u.body.partition(": ")[2]} for u in b.uncompiled if u.body],
            # branches written straight into their columns of a Concat, which then runs no step
            "concat_slices": [{"value": x, "into": j.into, "columns": [j.col, j.col + b.graph.types[x].shape[-1]]}
                              for x, j in (pl.joins.items() if pl is not None else ())],
            # the steps that read only constants and the shape: each key's own plan computes them once, a bucket
            # plan (a shape not seen before) runs the cheap ones on every call in its arena (runtime/per_key.py)
            "per_key": _per_key_steps(v),
            "folded": {"bytes": self.folded.nbytes, "nodes": dict(self.folded.by_op),
                       "cap": self.options.fold_bytes},
            "builds": self._which_build(),
            "options": self.options.explain(),
        }

    def _which_build(self) -> list[dict]:
        """Which keys take which build: the main one (and its variants), and the one for keys with a 0."""
        if self._may_be_empty is None:
            return [{"keys": "every admissible key", "build": "main (generic, variants, buckets)"}]
        zero = [s.name for s in self.symbols if s.lo == 0]
        return [{"keys": " and ".join(f"{n} >= 1" for n in zero), "build": "main (generic, variants, buckets)"},
                {"keys": " or ".join(f"{n} == 0" for n in zero),
                 "build": "empty-tensor build: " + ("made" if self._empty is not None else "made on first use")}]

    def stats(self) -> dict:
        st, t = self.stats_, self.table
        return {
            "calls": st.calls,
            "builds": 1 + st.builds,
            "hits": {"generic": t.generic.hits,
                     **{str(dict(zip(self._names, k))): v.hits for k, v in t.exact.items()},
                     **{v.guard.text(): v.hits for v in t.buckets}},
            "bind_seconds": st.bind_s,
            "run_seconds": st.run_s,
            "steps": len(t.generic.steps),
            "arena_bytes": self._pool.nbytes_total,
            # cached plans of single keys, bucket plans moved between the keys of a bucket (runtime/rekey.py), and
            # the keys whose bucket plan state is remembered (runtime/key_states.py)
            "plans": {"own": sum(len(a.plans) for a in self.arenas),
                      "bucket": sum(len(a.buckets) for a in self.arenas),
                      "remembered": sum(len(p.bucket.remembered) for a in self.arenas for p in a.buckets.values())},
            "planned": t.generic.planner is not None,
            "nodes": len(self.graph.nodes),
        }


def _per_key_steps(v: Variant) -> list[dict]:
    pl = v.planner
    if pl is None or not pl.per_key:
        return []
    arena = v.bucket_planner.keyed.in_arena
    return [{"node": v.build.steps[i].label, "own plans": "once per shape",
             "bucket plans": "every call, in the arena" if i in arena else "once per shape"} for i in pl.per_key]


def _fill(res: dict[str, np.ndarray], out: dict | None) -> dict[str, np.ndarray]:
    """An unplanned call's results copied into the caller's `out=` arrays (their shapes checked first)."""
    if not out:
        return res
    check_out(out, {name: (np.shape(v), np.asarray(v).dtype) for name, v in res.items()})
    for name, a in out.items():
        np.copyto(a, res[name])
        res[name] = a
    return res


def _symbol_sources(graph: Graph, names: list[str]) -> dict[str, str]:
    """symbol -> the first input axis that carries it ("input 'x' axis 0")."""
    out: dict[str, str] = {}
    for v in graph.inputs:
        t = graph.types.get(v.name)
        for ax, d in enumerate(t.shape if isinstance(t, TensorType) else ()):
            for n in getattr(d, "free_symbols", ()):
                out.setdefault(n, f"input {v.name!r} axis {ax}")
    return {n: w for n, w in out.items() if n in names}


def compile(graph: Graph, specialize: list | None = None, *, options: Options | None = None,  # noqa: A001
            **knobs: Any) -> Executable:
    """Compile a graph once; the result runs every admissible shape without recompiling.

    Every knob is a field of `dynshape.options.Options`: pass `options=Options(...)`, or the fields as keywords
    (`ds.compile(g, strategy="generic", fused_attention=False)`); `explain` prints them all. `fuse=False` keeps
    one step per op (no generated C); `planned=False` allocates every tensor per call instead of using the
    memory plan: the baselines those optimisations are measured against.

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
    opts = make(options, **knobs)
    check_precision(opts)  # precision="bf16" on a CPU without it: refused before anything is built
    if graph.rank_symbols:  # ranks fixed by input lengths: one build per length (runtime/rank_variants.py)
        from dynshape.runtime.rank_variants import RankVariants

        return settled(RankVariants(graph, specialize, opts, compile))  # type: ignore[return-value]
    decisive = branch_inputs(graph) if opts.fuse else []
    conds = shape_branches(graph) if opts.fuse and not decisive else []
    if decisive or conds:  # If conditions decided by a small input's value or by the shapes: one build per value
        from dynshape.runtime.branch_variants import BranchVariants  # (runtime/branch_variants.py)

        return settled(BranchVariants(graph, decisive, specialize, opts, compile, conds))  # type: ignore[return-value]
    with pinned_cache_dir(opts.cache_dir) if opts.cache_dir else contextlib.nullcontext():
        return settled(Executable(graph, specialize, opts))


class _Held:
    """`Executable.held()`: an arena taken from the pool on entry, given back on exit."""

    __slots__ = ("exe", "arena", "last")

    def __init__(self, exe: Executable):
        self.exe = exe

    def __enter__(self) -> Callable[[dict], tuple[list, BoundPlan | None]]:
        pool = self.exe._pool
        try:
            self.arena = pool.free.pop()
        except IndexError:
            self.arena = pool.take()
        self.last = [None, None, None]  # key, its plan, the arena buffer it is bound to
        return self.bind

    def bind(self, feed: dict) -> tuple[list, BoundPlan | None]:
        exe, arena, last = self.exe, self.arena, self.last
        arrays, key = exe.binder(feed)
        if key == last[0] and last[2] is arena.buf:
            return arrays, last[1]
        if arena is None or (exe._breaks is not None and exe._breaks(key)):
            return arrays, None
        table = exe.table
        variant = table.exact.get(key) or table.default or table.pick(key)
        if variant.planner is None:
            return arrays, None
        plan = arena.plans.get((variant.uid, key)) or exe._plan(variant, key, arena)
        last[:] = key, plan, arena.buf
        return arrays, plan

    def __exit__(self, *exc: object) -> None:
        arena, pool = self.arena, self.exe._pool
        if arena is not None:
            pool.free.append(arena)
            if pool.waiting:
                pool.wake()
