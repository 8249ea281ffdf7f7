"""The build step, pure: a graph, its symbols and the options -> a typed `Build` (steps, constants, kernels).

1. shape arithmetic compiled away (`passes.symbolic`): every value inference knows as an expression of the
   symbols is computed per key by one function; its producing nodes are dead, and so is whatever no output
   needs;
2. common subexpressions removed (`passes.cse`), scalar ops moved above data movement (`passes.hoist`);
3. fusion (`passes.fusion`) into a schedule of items; each fused item goes to its kernel lowering
   (`codegen.lower`), which builds kernel IR, printed to C and compiled (`codegen.library`); an item a
   lowering declines runs node by node, and the reason is kept (`Build.uncompiled`, shown by explain);
4. every other node becomes a `NodeStep`: bound natively per plan when its op has a native lowering that
   accepts it, else its numpy lowering, else its reference.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import dynshape.codegen.lower  # noqa: F401  (fills the lowering table)
from dynshape.codegen import bf16, packed_gemm
from dynshape.codegen.library import compile_kernels
from dynshape.codegen.lower import conv_storage
from dynshape.codegen.lower.elementwise import fusible
from dynshape.codegen.lowering import (
    KernelArg,
    LowerCtx,
    Lowered,
    NativeRule,
    PackedWeight,
    Unsupported,
    get_lowering,
)
from dynshape.ir import opdef
from dynshape.ir.execute import Scope
from dynshape.ir.graph import Graph, Node
from dynshape.ir.specialize import specialize
from dynshape.ir.types import TensorType
from dynshape.options import Options
from dynshape.passes import hoist
from dynshape.passes.commute import pointwise_before_resize
from dynshape.passes.cse import eliminate_common
from dynshape.passes.fold import drop_identities, fold_batchnorm
from dynshape.passes.fusion import fuse
from dynshape.passes.items import Item, Single
from dynshape.passes.layout import channels_last
from dynshape.passes.pads import fold_pads
from dynshape.passes.qconv import float_conv_integer
from dynshape.passes.qdq import fuse_qlinear
from dynshape.passes.quant import fuse_dynamic_quant
from dynshape.passes.symbolic import SymbolicValues, live_nodes, specialized, symbolic_values
from dynshape.runtime.pointers import address
from dynshape.sym import Expr, Symbol
from dynshape.sym.pysource import compile_key_function, key_names, to_py


@dataclass(frozen=True, eq=False)
class KernelStep:
    """A compiled kernel: its C entry (which takes the key's symbol values first), what it reads (graph values,
    packed weights) and writes, and per key the shapes of its outputs (`shapes`). `name`: its nodes' names
    joined by '+'; `label`: how messages name it."""

    label: str
    name: str
    kind: str
    nodes: tuple[Node, ...]
    inputs: tuple[KernelArg, ...]
    outputs: tuple[str, ...]
    entry: ctypes._CFuncPtr
    shapes: Callable[[tuple], tuple[tuple[int, ...], ...]]
    out_dtypes: tuple[np.dtype, ...]
    source: str
    shared_with: str
    row_stride: bool = False  # the kernel reads its output's row stride after the key (codegen's ROW_STRIDE)
    scratch_bytes: int = 0  # what the kernel mallocs per call and thread, outside the arena (Lowered.scratch_bytes)
    method: str = ""  # Lowered.method: how it computes, for explain

    @property
    def op(self) -> str:
        return self.kind

    def key_args(self, key: tuple, out: np.ndarray) -> np.ndarray:
        """The int64 array the kernel takes first: the key, then (row_stride kernels) the distance between the
        rows of `out`, the array it writes: its own width when dense, a Concat's when a slice of one."""
        return np.array(self.key_values(key, out), dtype=np.int64)

    def key_values(self, key: tuple, out: np.ndarray) -> tuple:
        """key_args' contents, as a tuple (a plan shares one array between the kernels that take the same)."""
        if not self.row_stride:
            return tuple(key)
        stride = out.strides[-2] // out.itemsize if out.ndim >= 2 else 1  # one row: no stride to keep
        return (*key, stride)

    def run(self, args: list, scope: Scope) -> list:
        """Unplanned execution: fresh output arrays, contiguous inputs."""
        outs = [np.empty(s, dt) for s, dt in zip(self.shapes(scope.key), self.out_dtypes)]
        d = self.key_args(scope.key, outs[0])
        ins = [np.ascontiguousarray(a) for a in args]
        # (pointers.address: ~0.1 us an array where .ctypes.data costs ~1 us; a bucket plan runs its per-key
        # kernels, a causal mask's, at every new key)
        self.entry(address(d), *[address(o) for o in outs], *[address(a) for a in ins])
        return outs


@dataclass(frozen=True, eq=False)
class NodeStep:
    """One node run outside a generated kernel: `native` (bound to the plan's buffers), `numpy` (a faster
    numpy/BLAS lowering) or `reference`; `why` says why it has no generated kernel."""

    label: str
    name: str
    node: Node
    attrs: dict
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    fn: Callable[[list], list]
    how: str
    why: str
    native: NativeRule | None = None
    # Loop / Scan / If: how the body runs ("compiled: ..." or "interpreted: why"); a compiled body takes the enclosing
    # values it reads as extra inputs (after the node's own), so the step needs no scope
    body: str = ""

    @property
    def op(self) -> str:
        return self.node.op_type

    def run(self, args: list, scope: Scope) -> list:
        if self.scoped:
            return self.fn(args, {**self.attrs, "_scope": scope.values, "_env": scope.env})
        return self.fn(args)

    @property
    def scoped(self) -> bool:
        """Runs bodies (If / Loop / Scan) that read the enclosing values: only the interpreter can run it."""
        return bool(self.node.subgraphs()) and not self.body.startswith("compiled")


Step = KernelStep | NodeStep
# (node, graph) -> an object with `run(args) -> outputs`, `outer` (extra input names) and `why`; or why not (str)
BodyHook = Callable[[Node, Graph], Any]


@dataclass(frozen=True)
class Uncompiled:
    """A node that runs without a generated kernel, how it runs, and why (for explain)."""

    label: str
    op: str
    how: str
    why: str
    body: str = ""


@dataclass(frozen=True, eq=False)
class Build:
    """One compiled build: the graph it compiled (the symbolic one, or with a variant's symbols substituted),
    its steps in order, the values fixed before any call (constants, packed weights; for a static variant also
    every symbolic value), the per-key symbolic values of a generic build, and what runs uncompiled."""

    graph: Graph
    key: tuple | None
    steps: tuple[Step, ...]
    fixed: Mapping[str | PackedWeight, np.ndarray]
    symbolic: SymbolicValues | None
    uncompiled: tuple[Uncompiled, ...]
    options: Options
    kernels: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)


def build(graph: Graph, symbols: list[Symbol], options: Options, key: tuple | None = None,
          narrow: Mapping[str, Any] | None = None, parallel: bool = True, bodies: BodyHook | None = None) -> Build:
    """The generic build (key None), a bucket's (`narrow`: name -> int or narrower symbol) or a static one.
    `bodies(node, graph)`: a Loop / Scan node's compiled body (a `run(args)` taking the node's inputs then the
    enclosing values in its `outer`, and a `why`), or why it is interpreted; None: every body is interpreted."""
    if key is not None and data_dependent_dims(graph):
        # a static build re-infers the graph at its key: a size inference could only name as data-dependent, one
        # computed from the shapes through float math (DPT's reassembly reshapes to int(seq_len ** 0.5)), is then
        # the number the key gives, and the steps that read it compile (they ran on numpy in every build)
        graph = specialize(graph, dict(zip((s.name for s in symbols), key)))
    consts = graph.constants()
    symvals = symbolic_values(graph, symbols)
    known = set(consts) | symvals.names
    live, needed = live_nodes(graph, known)
    outputs = {v.name for v in graph.outputs}
    live = eliminate_common(live, outputs)
    types = dict(graph.types)
    added: dict[str, np.ndarray] = {}
    for enabled, rewrite in ((options.fuse, float_conv_integer),
                             (options.fuse and options.packed_gemm, fuse_dynamic_quant),
                             (options.fuse and options.packed_gemm, fuse_qlinear),
                             (options.fuse, drop_identities),
                             (options.fuse, fold_pads),
                             (options.fuse and options.fold_batchnorm, fold_batchnorm),
                             (options.fuse and options.pointwise_before_resize,
                              functools.partial(pointwise_before_resize, opset=graph.opset)),
                             (options.fuse and options.channels_last, functools.partial(channels_last,
                                                                                         opset=graph.opset))):
        if enabled:
            rw = rewrite(live, types, {**consts, **added}, outputs)
            live = rw.nodes
            types.update(rw.types)
            added.update(rw.consts)
    consts = {**consts, **added}
    hoisted: dict[str, str] = {}
    if options.fuse and options.hoist:
        live, hoisted = hoist.hoist_scalar_ops(live, types, consts, outputs)
    needed |= {x for n in live for x in (*n.inputs, *n.free_names()) if x}
    names = [s.name for s in symbols]
    mapping = dict(zip(names, key)) if key is not None else narrow
    rewritten = dataclasses.replace(graph, types=types, initializers={**graph.initializers, **added})
    spec = hoist.with_types(specialized(rewritten, mapping) if mapping else rewritten, hoisted)
    if options.fuse:
        steps, uncompiled, nk = _fused_steps(live, known, spec, symbols, options, parallel, bodies)
    else:
        steps = [_node_step(n, spec, options, "fuse=False") for n in live]
        uncompiled, nk = [_uncompiled(s) for s in steps if s.how != "native"], 0
    fixed: dict[str | PackedWeight, np.ndarray] = {k: v for k, v in consts.items() if k in needed}
    wanted = list(dict.fromkeys(x for s in steps for x in s.inputs if isinstance(x, PackedWeight) and x not in fixed))
    packs = packed_gemm.packed_all([(consts[x.weight], x.trans, x.layout, x.groups) for x in wanted])
    fixed.update(zip(wanted, packs))
    if key is not None:
        fixed.update({k: v for k, v in symvals(key).items() if k in needed})
    if key is None:  # per key, only what the steps and outputs read
        symvals = symbolic_values(graph, symbols, only=needed | outputs | {x for s in steps for x in s.inputs
                                                                             if isinstance(x, str)})
    return Build(spec, key, tuple(steps), fixed, symvals if key is None else None, tuple(uncompiled), options, nk)


def data_dependent_dims(graph: Graph) -> bool:
    """Whether some value's shape has a dim inference named as data-dependent (a '?' symbol)."""
    return any(isinstance(d, Expr) and any(n.startswith("?") for n in d.free_symbols)
               for t in graph.types.values() if isinstance(t, TensorType) for d in t.shape)


def _fused_steps(live: list[Node], known: set[str], g: Graph, symbols: list[Symbol], options: Options,
                 parallel: bool, bodies: BodyHook | None = None) -> tuple[list[Step], list[Uncompiled], int]:
    items = fuse(live, g, known, options, fusible)
    key_names_ = tuple(s.name for s in symbols)
    # a compound item whose lowering declines (a ConvChain) runs as its parts, each lowered on its own
    lowered: dict[int, list[tuple[Item, Lowered | None, str]]] = {}
    for i, item in enumerate(items):
        if not isinstance(item, Single):
            lowered[i] = _lower(item, LowerCtx(g, f"ds_fused_{i}", key_names_, options))
    if options.bf16_storage and bf16.active(options):
        lowered = _with_bf16_storage(items, lowered, g, key_names_, options)
    kernels = [lk for parts in lowered.values() for _, lk, _ in parts if lk is not None]
    compiled = compile_kernels(kernels, g.name or "graph", options, parallel) if kernels else {}
    steps: list[Step] = []
    for i, item in enumerate(items):
        for part, lk, why in lowered.get(i, [(item, None, "")]):
            if lk is not None:
                steps.append(_kernel_step(part, lk, compiled[lk.kernel.name], g, symbols))
            else:
                steps += [_node_step(n, g, options, why, bodies) for n in part.nodes]
    uncompiled = [_uncompiled(s) for s in steps if isinstance(s, NodeStep) and s.how != "native"]
    return steps, uncompiled, len(kernels)


def _with_bf16_storage(items: list[Item], lowered: dict, g: Graph, key_names_: tuple[str, ...],
                       options: Options) -> dict:
    """The kernels again where values between bf16 convolutions are stored as bf16 (codegen/lower/conv_storage.py):
    those that write or read one lowered with them; the float32 kernels where any of those did not take exactly
    its values so (writer and readers must agree)."""
    def reads(item: Item, lk: Lowered | None) -> tuple[str, ...]:
        if lk is not None:
            return tuple(x for x in lk.inputs if isinstance(x, str))
        return tuple(x for n in item.nodes for x in (*n.inputs, *n.free_names()) if x)

    steps = [(lk, reads(part, lk)) for i, item in enumerate(items)
             for part, lk, _ in lowered.get(i, [(item, None, "")])]
    chosen = conv_storage.choose(steps, frozenset(v.name for v in g.outputs))
    if not chosen:
        return lowered
    again = dict(lowered)
    for i, parts in lowered.items():
        touched = [lk for _, lk, _ in parts if lk is not None
                   and chosen & {*lk.outputs, *(x for x in lk.inputs if isinstance(x, str))}]
        if not touched:
            continue
        again[i] = _lower(items[i], LowerCtx(g, f"ds_fused_{i}", key_names_, options, chosen))
        if any(lk is None or not conv_storage.confirmed(lk, chosen) for _, lk, _ in again[i]):
            return lowered
    return again


def _lower(item: Item, ctx: LowerCtx) -> list[tuple[Item, Lowered | None, str]]:
    """(item, its kernel or None, why not) for an item, or for each of its `parts` when it declines."""
    rule = get_lowering(item.kind, "kernel")
    if rule is None:
        return [(item, None, f"no kernel lowering for {item.kind} items")]
    try:
        return [(item, rule.rule(item, ctx), "")]
    except Unsupported as e:
        why = f"{item.kind} kernel declined: {e}"
        parts = getattr(item, "parts", None)
        if not parts:
            return [(item, None, why)]
    return [lowered for k, part in enumerate(parts)
            for lowered in _lower(part, dataclasses.replace(ctx, name=f"{ctx.name}_{k}"))]


def _kernel_step(item: Item, lk: Lowered, c: Any, g: Graph, symbols: list[Symbol]) -> KernelStep:
    names = key_names([s.name for s in symbols])
    shapes_src = ", ".join("(" + "".join(to_py(d, names) + ", " for d in g.types[o].shape) + ")" for o in lk.outputs)
    shapes = compile_key_function("shapes", list(names), f"return ({shapes_src},)")
    c.entry.argtypes = [ctypes.c_void_p] * (1 + len(lk.outputs) + len(lk.inputs))
    return KernelStep(f"kernel {item.label!r} ({item.kind})", item.label, item.kind, item.nodes, lk.inputs,
                      lk.outputs, c.entry, shapes,
                      tuple(np.dtype(g.types[o].dtype) for o in lk.outputs), c.source, c.shared_with,
                      lk.row_stride, lk.scratch_bytes, lk.method)


def _node_step(n: Node, g: Graph, options: Options, why: str, bodies: BodyHook | None = None) -> NodeStep:
    """How one node runs: native when its rule accepts it, else its numpy lowering, else its reference; a Loop /
    Scan with its body compiled (`bodies`) calls it per iteration, an If with its branches compiled the one it
    takes."""
    attrs = {**n.attrs, "_opset": g.opset, "_num_outputs": len(n.outputs)}
    op = opdef.require(n.op_type, n.domain, n.label())
    body = ""
    if n.op_type in ("Loop", "Scan", "If") and opdef.is_default_domain(n):
        made = ("compile_bodies=False" if not options.compile_bodies else "fuse=False" if not options.fuse
                else "no body compiler" if bodies is None else bodies(n, g))
        if not isinstance(made, str):
            reason = why or f"no kernel lowering for {n.op_type}"
            # planned: `made.bind` writes the results straight into the plan's buffers (no copy of each output)
            return NodeStep(n.label(), n.name, n, attrs, (*n.inputs, *made.outer), tuple(n.outputs), made.run,
                            "compiled body", reason, NativeRule(lambda node, graph: None, made.bind),
                            body=f"compiled: {made.why}")
        body = f"interpreted: {made}"
    native = get_lowering(n.op_type, "native", n.domain)
    declined = native.rule.accepts(n, g) if native is not None and _tensors(n, g) else "no native lowering"
    fast = get_lowering(n.op_type, "numpy", n.domain)
    fn = fast.rule(attrs, options) if fast is not None else None
    how = "numpy" if fn is not None else "reference"
    if fn is None:
        fn = op.reference if n.subgraphs() else (lambda args, ref=op.reference, a=attrs: ref(args, a))
    reason = why or f"no kernel lowering for {n.op_type}"
    if native is not None and declined is None:
        return NodeStep(n.label(), n.name, n, attrs, tuple(n.inputs), tuple(n.outputs), fn, "native", reason,
                        native.rule)
    if native is not None:
        reason += f"; native lowering declined: {declined}"
    return NodeStep(n.label(), n.name, n, attrs, tuple(n.inputs), tuple(n.outputs), fn, how, reason, body=body)


def _tensors(n: Node, g: Graph) -> bool:
    return all(isinstance(g.types.get(x), TensorType) for x in (*n.inputs, *n.outputs) if x)


def _uncompiled(s: NodeStep) -> Uncompiled:
    return Uncompiled(s.label, s.node.op_type, s.how, s.why, s.body)
