"""`ds.compile`: a symbolic graph turned once into an executable that serves every admissible shape.

What compiling does today:
- the per-call shape work (binding, every check, the dispatch key) becomes one generated Python function
  (`binder.py`), so a bad input is rejected before any kernel runs;
- shape arithmetic disappears: every value inference knows symbolically (Shape -> Gather -> Concat chains)
  becomes a per-call expression of the bound symbols, and its producing nodes are dead code;
- dead code is dropped, constants are folded into the plan;
- ops run through their lowering to a direct numpy/BLAS call when one is registered, else their reference;
- `specialize=[{...}]` adds fully static variants (all symbolic values precomputed) found by an O(1) dict
  lookup on the tuple of symbol values.
"""

from __future__ import annotations

import builtins
import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynshape.codegen import numpy_lowering
from dynshape.codegen.cc import DEFAULT_FLAGS, compile_c
from dynshape.codegen.cgen import prelude
from dynshape.codegen.fused_c import emit_group, emit_softmax, make_step
from dynshape.errors import ConstraintViolation, DynshapeError
from dynshape.ir.execute import bind_inputs
from dynshape.ir.graph import Graph
from dynshape.ir.types import TensorType
from dynshape.ops import registry
from dynshape.passes.fusion import Group, SoftmaxGroup, fuse
from dynshape.runtime.binder import InputSpec, make_binder, to_py
from dynshape.runtime.memory import tune_allocator
from dynshape.runtime.plan import Planner, plannable
from dynshape.sym import Cond, Expr


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
    """One build: generic (key None) or static for one tuple of symbol values."""

    key: tuple | None
    steps: list
    fixed: dict  # values known before the call: constants, and for static variants all symbolic values
    symbolic: Any  # key -> {name: array} of symbolic values (None for static variants)
    hits: int = 0
    graph: Any = None  # the graph this build compiled: the symbolic one, or with the key's dims substituted
    planner: Any = None  # plan.Planner when every value's shape follows from the key
    plans: dict = field(default_factory=dict)  # key -> BoundPlan in the current arena


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


numpy_lowering.install()


def _lower(node, opset: int):
    op = registry.get(node.op_type, node.domain)
    attrs = dict(node.attrs)
    attrs["_opset"] = opset
    attrs["_num_outputs"] = len(node.outputs)
    fast = op.lower.get("numpy") if op is not None else None
    if fast is not None:
        fn = fast(attrs)
        if fn is not None:
            return fn
    ref = op.reference
    if node.subgraphs():
        return lambda args, scope, env: ref(args, {**attrs, "_scope": scope, "_env": env})
    return lambda args: ref(args, attrs)


class Executable:
    """The result of `ds.compile`: call it with arrays; every shape the signature admits runs."""

    def __init__(self, graph: Graph, specialize: list | None = None, fuse: bool = True, planned: bool = True):
        tune_allocator()
        self.graph = graph
        self.fuse = fuse
        self.planned = planned
        self._arena = np.empty(0, np.uint8)
        self._arena_lock = threading.Lock()
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
        self._lock = threading.Lock()
        self.stats_ = Stats()
        self._generic = self._build(None)
        self._variants: dict[tuple, Variant] = {}
        for spec in specialize or []:
            self.add_variant(spec)

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

    def _specialized(self, key: tuple) -> Graph:
        """The graph with every dim the key determines replaced by its value: what static variants compile."""
        env = {s.name: v for s, v in zip(self.symbols, key)}
        types = {}
        for name, t in self.graph.types.items():
            if isinstance(t, TensorType) and any(isinstance(d, Expr) for d in t.shape):
                shape = tuple(d.evaluate(env) if isinstance(d, Expr) and d.free_symbols <= env.keys() else d
                              for d in t.shape)
                t = TensorType(t.dtype, shape, t.value)
            types[name] = t
        return dataclasses.replace(self.graph, types=types)

    def _build(self, key: tuple | None) -> Variant:
        g = self.graph
        consts = g.constants()
        sym_names = {n for n, t in g.types.items() if isinstance(t, TensorType) and t.value is not None
                     and t.value.dtype == object}
        symvals = _symbolic_values(g, sym_names, self.symbols)
        # a symbolic value is "known" when the compiled function can produce it
        probe_names = self._probe_symbolic(symvals)
        known = set(consts) | probe_names
        live, needed = self._live_nodes(known)
        spec = self._specialized(key) if key is not None else g
        steps = self._steps(live, known, spec) if self.fuse else [self._node_step(n) for n in live]
        fixed = {k: v for k, v in consts.items() if k in needed}
        if key is not None:
            fixed.update({k: v for k, v in symvals(key).items() if k in needed})
            variant = Variant(key, steps, fixed, None, graph=spec)
        else:
            variant = Variant(None, steps, fixed, symvals, graph=g)
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
        for i, item in enumerate(items):
            if isinstance(item, (Group, SoftmaxGroup)):
                emit = emit_group if isinstance(item, Group) else emit_softmax
                k = emit(item, g, f"ds_fused_{i}", key_names)
                if k is not None:
                    kernels[i] = k
        lib = None
        if kernels:
            src = prelude() + "#include <stdlib.h>\n" + "".join(k.source for k in kernels.values())
            lib = compile_c(src, f"{g.name or 'graph'}_fused", flags=(*DEFAULT_FLAGS, "-fopenmp-simd"),
                            symbols=[k.name for k in kernels.values()])
        steps = []
        for i, item in enumerate(items):
            if i in kernels:
                k = kernels[i]
                fn = make_step(k, lib, self.symbols)
                steps.append(_Step(fn, tuple(k.inputs), tuple(k.outputs), "+".join(n.name for n in item.nodes),
                                   needs_key=True, op_type="fused", kernel=fn.raw))
            else:
                for n in (item.nodes if isinstance(item, (Group, SoftmaxGroup)) else [item]):
                    steps.append(self._node_step(n))
        return steps

    def _probe_symbolic(self, symvals) -> set:
        """Names the symbolic-value function computes (evaluated at the symbols' lower bounds)."""
        key = tuple(max(s.lo, 1) for s in self.symbols)
        try:
            return set(symvals(key))
        except Exception:  # noqa: BLE001 - a probe failure just means "compute at run time instead"
            return set()

    def add_variant(self, values: dict) -> Variant:
        """Build the fully static variant for one assignment of the symbols (by name)."""
        missing = [s.name for s in self.symbols if s.name not in values]
        if missing:
            raise DynshapeError(f"specialize: no value for {missing} (symbols: {[s.name for s in self.symbols]})")
        key = tuple(int(values[s.name]) for s in self.symbols)
        for s, v in zip(self.symbols, key):
            if v < s.lo or (s.hi is not None and v > s.hi) or v % s.mult:
                raise ConstraintViolation(f"specialize: {s.name} = {v} violates {s.describe()}")
        variant = self._build(key)
        with self._lock:
            self._variants = {**self._variants, key: variant}  # copy-on-write: readers never see a torn dict
            self.stats_.builds += 1
        return variant

    def _general_bind(self, feed: dict) -> tuple:
        env = bind_inputs(self.graph, feed)
        return [feed[v.name] for v in self.graph.inputs], tuple(env[s.name] for s in self.symbols)

    # ---- running --------------------------------------------------------------------------------
    def run(self, feed: dict) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        arrays, key = self._bind(feed)
        variant = self._variants.get(key) or self._generic
        t1 = time.perf_counter()
        if variant.planner is not None and self._arena_lock.acquire(blocking=False):
            try:  # one arena per executable; a concurrent call takes the allocating path below instead
                plan = variant.plans.get(key) or self._plan(variant, key)
                out = plan.run(arrays)
            finally:
                self._arena_lock.release()
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
                outs = step.fn(args, values, dict(zip((s.name for s in self.symbols), key)))
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

    def _plan(self, variant: Variant, key: tuple):
        """Lay out and bind this key's plan (the caller holds the arena lock); grow the arena if needed."""
        shapes, offsets, total = variant.planner.layout(key)
        if total > self._arena.size:
            self._arena = np.empty(total + total // 4, np.uint8)
            for v in (self._generic, *self._variants.values()):
                v.plans.clear()  # they point into the old arena
        symvals = variant.symbolic(key) if variant.symbolic is not None else {}
        plan = variant.planner.bind(key, self._arena, shapes, offsets, symvals)
        if len(variant.plans) >= 256:
            variant.plans.pop(next(iter(variant.plans)))
        variant.plans[key] = plan
        return plan

    def __call__(self, **inputs: Any) -> list[np.ndarray]:
        out = self.run(inputs)
        return [out[v.name] for v in self.graph.outputs]

    def stats(self) -> dict:
        st = self.stats_
        return {
            "calls": st.calls,
            "builds": 1 + st.builds,
            "hits": {"generic": self._generic.hits,
                     **{str(dict(zip([s.name for s in self.symbols], k))): v.hits for k, v in self._variants.items()}},
            "bind_seconds": st.bind_s,
            "run_seconds": st.run_s,
            "steps": len(self._generic.steps),
            "arena_bytes": int(self._arena.size),
            "planned": self._generic.planner is not None,
            "nodes": len(self.graph.nodes),
        }


def compile(graph: Graph, specialize: list | None = None, fuse: bool = True,  # noqa: A001
            planned: bool = True) -> Executable:
    """Compile a graph once; the result runs every admissible shape without recompiling.

    `fuse=False` keeps one step per op (no generated C); `planned=False` allocates every tensor per call
    instead of using the memory plan: the baselines those optimisations are measured against.
    """
    return Executable(graph, specialize, fuse, planned)
