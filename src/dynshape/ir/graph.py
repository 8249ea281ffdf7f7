"""The graph IR: values, nodes, graphs, and the signature inference derives for them.

A `Graph` is what every later layer consumes: nodes in topological order with decoded attributes, an inferred
type for every value, and a `Signature`: the symbols the caller's inputs bind plus every fact inference found,
each with the node it came from, so a violation can be explained instead of just reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynshape.ir.opdef import canonical_domain
from dynshape.ir.types import OptionalType, SequenceType, TensorType, ValueType

KINDS = ("tensor", "sequence", "optional", "optional_sequence")


@dataclass
class Value:
    """A named graph input or output as the model declares it (`shape` None: not declared)."""

    name: str
    dtype: np.dtype
    shape: tuple | None
    kind: str = "tensor"  # one of KINDS

    @property
    def type(self) -> ValueType:
        """The same declaration as a type object (TensorType / SequenceType / OptionalType)."""
        if self.kind == "tensor":
            return TensorType(self.dtype, self.shape if self.shape is not None else ())
        seq = _sequence_type(self.dtype, self.shape)
        if self.kind == "sequence":
            return seq
        return OptionalType(seq if self.kind == "optional_sequence" else TensorType(self.dtype, self.shape or ()))

    @staticmethod
    def of(name: str, t: ValueType) -> Value:
        """The Value declaring type `t` under `name`."""
        if isinstance(t, TensorType):
            return Value(name, t.dtype, t.shape)
        if isinstance(t, SequenceType):
            return Value(name, t.dtype, _sequence_shape(t), "sequence")
        inner = t.elem
        if isinstance(inner, SequenceType):
            return Value(name, inner.dtype, _sequence_shape(inner), "optional_sequence")
        return Value(name, inner.dtype, inner.shape, "optional")

    def __str__(self) -> str:
        return f"{self.name}: {format_type(self.type if self.shape is not None else None, self.dtype)}"


def _sequence_shape(t: SequenceType) -> tuple | None:
    """A sequence's element shape as a Value stores it: None entries where only the rank is known."""
    if t.shape is not None:
        return t.shape
    return None if t.rank is None else (None,) * t.rank


def _sequence_type(dtype: np.dtype, shape: tuple | None) -> SequenceType:
    if shape is not None and any(d is None or isinstance(d, str) for d in shape):
        return SequenceType(dtype, None, len(shape))
    return SequenceType(dtype, shape)


@dataclass
class Node:
    """One op application. `inputs`/`outputs` are value names; '' marks an omitted optional input/output."""

    op_type: str
    domain: str
    name: str
    attrs: dict[str, Any]
    inputs: list[str]
    outputs: list[str]

    def __post_init__(self) -> None:
        # one spelling of the default domain ('ai.onnx' and 'onnx' are ''), so passes compare one value
        self.domain = canonical_domain(self.domain)

    def subgraphs(self) -> list[Graph]:
        """Graph-valued attributes (If branches, Loop/Scan bodies), in attribute order."""
        out: list[Graph] = []
        for v in self.attrs.values():
            if isinstance(v, Graph):
                out.append(v)
            elif isinstance(v, list):
                out.extend(g for g in v if isinstance(g, Graph))
        return out

    def free_names(self) -> set[str]:
        """Names of the enclosing graphs that this node's subgraphs read: implicit inputs, for ordering
        and liveness."""
        out: set[str] = set()
        for g in self.subgraphs():
            local = {v.name for v in g.inputs} | set(g.initializers)
            for m in g.nodes:
                out |= {x for x in (*m.inputs, *m.free_names()) if x and x not in local}
                local |= set(m.outputs)
            out |= {v.name for v in g.outputs if v.name not in local}
        return out

    def label(self) -> str:
        op = f"{self.domain}::{self.op_type}" if self.domain else self.op_type
        return f"node {self.name!r} ({op})"


@dataclass
class Fact:
    """Something inference learned about the symbols, and where (`origin`) it learned it.

    `kind`: "eq" (two dims must be equal), "require" (a condition the inputs must meet), "derived" (a dim
    computed from the input symbols), "fresh" (a data-dependent size, known only at run time).
    `check`, when set, is a sym condition the executor evaluates against the bound symbols before running.
    """

    kind: str
    text: str
    origin: str
    check: Any = None

    def __str__(self) -> str:
        return f"{self.text}  [{self.kind}; {self.origin}]"


@dataclass
class Signature:
    """The symbols the caller's inputs bind (with ranges/divisibility) and the facts about them."""

    symbols: dict[str, Any] = field(default_factory=dict)  # name -> symbol expression
    facts: list[Fact] = field(default_factory=list)
    # Names whose declaration is the frontend's default range (`load_onnx(default_min=...)`), not the user's.
    defaulted: frozenset = frozenset()

    def __str__(self) -> str:
        lines = ["signature:"]
        for s in self.symbols.values():
            name = s.atom().name if hasattr(s, "atom") else str(s)
            lines.append(f"  {describe_symbol(s)}" + ("  (default range)" if name in self.defaulted else ""))
        if not self.symbols:
            lines.append("  (no symbols: every input shape is static)")
        for f in self.facts:
            lines.append(f"  {f}")
        return "\n".join(lines)


@dataclass
class Graph:
    """A model graph. `types` maps every value name (inputs, initializers, node outputs) to its type."""

    name: str
    inputs: list[Value]
    outputs: list[Value]
    nodes: list[Node]
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    types: dict[str, ValueType] = field(default_factory=dict)
    signature: Signature = field(default_factory=Signature)
    opset_imports: dict[str, int] = field(default_factory=dict)
    # Input symbols whose values fix a rank (the length of a shape/axes tensor fed at run time) -> why.
    # Non-empty: inference stopped at the first node that needs them; `run` specialises per value.
    rank_symbols: dict[str, str] = field(default_factory=dict)
    variants: dict = field(default_factory=dict, repr=False, compare=False)  # specialisations, by key
    # Set when a rank depends on tensor values (why, and where): inference stopped there; the nodes from that
    # one on have no types and the reference executor runs them op by op, unchecked.
    dynamic: str | None = None
    # Conditions a frontend knows the inputs must meet beyond what inference derives (torch's guards and
    # runtime asserts): Facts of kind "require" whose `check` is a sym condition. They live on the graph, not
    # in the signature, because `infer_graph` rebuilds the signature; it adds these to it each time.
    requires: list[Fact] = field(default_factory=list)
    # Initializers the file also lists as graph inputs (every initializer of an IR < 4 file; in later IRs, a default
    # value): constants unless a call feeds them, then a build that reads them as inputs (runtime/overrides.py).
    overridable: tuple[str, ...] = ()

    @property
    def opset(self) -> int:
        """The default-domain (ai.onnx) opset version."""
        return self.opset_imports.get("", 0)

    def constants(self) -> dict[str, np.ndarray]:
        """Every value whose numeric content is known: initializers plus whatever inference folded."""
        out = dict(self.initializers)
        for name, t in self.types.items():
            if isinstance(t, TensorType) and t.value is not None and t.value.dtype != object:
                out.setdefault(name, t.value)
        return out

    # ---- execution ------------------------------------------------------------------------------
    def run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Run with the numpy reference executor, checking inputs against the signature first.

        A graph with `rank_symbols` runs the variant specialised on those symbols' values in `inputs`
        (built on first sight of a value and cached, see `dynshape.ir.specialize`)."""
        from dynshape.ir.execute import run_graph

        if self.rank_symbols:
            from dynshape.ir.specialize import variant_for

            return variant_for(self, inputs).run(inputs)
        return run_graph(self, inputs)

    def specialize(self, values: dict[str, int]) -> Graph:
        """A copy of this graph with the named input symbols fixed to `values`, re-inferred (uncached)."""
        from dynshape.ir.specialize import specialize

        return specialize(self, values)

    # ---- sizes ----------------------------------------------------------------------------------
    def numel(self, name: str) -> Any:
        """Element count of tensor `name` as `int | Expr` (None for sequences / unknown)."""
        t = self.types.get(name)
        if not isinstance(t, TensorType):
            return None
        n: Any = 1
        for d in t.shape:
            n = n * d
        return n

    def numel_bound(self, name: str) -> int | None:
        """Upper bound of `numel(name)` over every admissible input; None when unbounded."""
        return upper_bound(self.numel(name))

    def memory_bound(self) -> MemoryBound:
        """Worst-case peak bytes of live tensors under the reference schedule (liveness-aware)."""
        from dynshape.ir.execute import memory_bound

        return memory_bound(self)

    # ---- printing -------------------------------------------------------------------------------
    def __str__(self) -> str:
        lines = [f"graph {self.name!r} (opset {self.opset})", str(self.signature), "inputs:"]
        lines += [f"  {v.name}: {format_type(self.types.get(v.name), v.dtype)}" for v in self.inputs]
        lines.append("nodes:")
        for n in self.nodes:
            outs = ", ".join(f"{o}: {format_type(self.types.get(o))}" for o in n.outputs if o)
            lines.append(f"  {n.op_type} {n.name!r} -> {outs}")
        lines.append("outputs:")
        lines += [f"  {v.name}: {format_type(self.types.get(v.name), v.dtype)}" for v in self.outputs]
        return "\n".join(lines)


@dataclass
class MemoryBound:
    """Result of `Graph.memory_bound`: `bytes` is None when some live tensor has no finite bound."""

    bytes: int | None
    peak_node: str | None
    unbounded: dict[str, list[str]]  # symbol name -> tensors whose size it leaves unbounded

    def __str__(self) -> str:
        if self.bytes is not None:
            return f"peak live memory <= {self.bytes} bytes (at {self.peak_node})"
        parts = [f"{s} (sizes of {', '.join(ts[:3])}{'...' if len(ts) > 3 else ''})"
                 for s, ts in self.unbounded.items()]
        return "memory is unbounded: no upper bound on " + "; ".join(parts) + "; declare max= for these dims"


def upper_bound(e: Any) -> int | None:
    """Upper bound of a dim expression (int passes through); None when unbounded or unknown."""
    if e is None:
        return None
    if isinstance(e, (int, np.integer)):
        return int(e)
    from dynshape.sym import bounds

    return bounds(e)[1]


def describe_symbol(s: Any) -> str:
    """`name in [lo, hi], multiple of k` for a bare symbol expression."""
    if hasattr(s, "is_atom") and s.is_atom() and hasattr(s.atom(), "describe"):
        return s.atom().describe()
    return str(s)


def format_type(t: ValueType | None, dtype: np.dtype | None = None) -> str:
    """`float32[batch, seq, 768]`, `seq(float32[n])`, `optional(...)`; '?' when not inferred."""
    if t is None:
        return f"{dtype}[?]" if dtype is not None else "?"
    if isinstance(t, OptionalType):
        return f"optional({format_type(t.elem)})"
    if isinstance(t, SequenceType):
        inner = ", ".join(str(d) for d in t.shape) if t.shape is not None else \
            ", ".join("?" * (t.rank or 0)) if t.rank else "?"
        return f"seq({t.dtype}[{inner}])"
    if t.shape is None:
        return f"{t.dtype}[?]"
    s = f"{t.dtype}[{', '.join(str(d) for d in t.shape)}]"
    if t.value is not None and t.value.size <= 8:
        s += " = [" + ", ".join(str(v) for v in t.value.reshape(-1).tolist()) + "]"
    return s
