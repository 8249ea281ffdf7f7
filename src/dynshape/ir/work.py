"""A graph's work as expressions of its symbols: the FLOPs its nodes compute and the bytes they read and write.

Why: one build serves every shape, so what a call costs is a function of the bound symbols, and that function is
known before any call runs. A server deciding whether to pad a short sequence to a long one and join the two
(`dynshape.serve`) needs to predict the joined call against the two apart; a call's time on a CPU is close to
`a + b * flops + c * bytes` (fixed overhead, arithmetic, memory traffic), so the counts here, evaluated at each
candidate's shape and calibrated by measured call times, are what such a prediction is made of.

The counts (`graph_work`), per node whose outputs are not constants (folded nodes cost nothing at run time):
- dense products, 2 FLOPs per multiply-add: MatMul (and its integer / quantised forms) `2 * numel(Y) * K`,
  Gemm the same, Conv `2 * numel(Y) * C_in/group * prod(kernel)` (= `numel(W) / C_out` per output element),
  ConvTranspose `2 * numel(X) * C_out/group * prod(kernel)`, Attention `2 * B * H * S_q * S_kv * (D_qk + D_v)`
  (as `2 * S_kv * (numel(Q) + numel(Y))`), LSTM / GRU / RNN `2 * seq * batch * (numel(W) + numel(R))`;
- every other node: one FLOP per output element (`elementwise`; softmax and normalisations do a few per
  element, which the calibration's byte coefficient absorbs, since they are bound by memory);
- bytes: every tensor a node reads (constants included: weights are read every call) and writes, at its
  dtype's size (a Gather reads as many bytes of its table as it writes, not the whole table). Views (Reshape,
  Squeeze, Unsqueeze, Flatten, Identity) and shape queries move nothing.
This is the work of the graph as written (after constant folding), not of the generated code: fusion saves
some of the bytes counted here. It is a feature for a fitted model, not a roofline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynshape.ir.graph import Graph, Node
from dynshape.ir.types import TensorType

_VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size"})
_MATMULS = frozenset({"MatMul", "MatMulInteger", "QLinearMatMul", "FusedMatMul", "Gemm", "MatMulNBits",
                      "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})
_CONVS = frozenset({"Conv", "ConvInteger", "QLinearConv", "FusedConv"})
_RNNS = frozenset({"LSTM", "GRU", "RNN"})
_GATHERS = frozenset({"Gather", "GatherElements", "GatherND"})
_ATTENTION = frozenset({"Attention", "MultiHeadAttention"})


@dataclass(frozen=True)
class Work:
    """FLOPs and bytes of one call as `int | Expr` of the graph's symbols; `at(values)` evaluates them.

    `dense`: FLOPs of the products (MatMul, Gemm, Conv, attention, recurrences), `elementwise`: one per output
    element of every other node, `flops`: their sum, `bytes`: read and written by all nodes. `by_op`: each op
    type's (dense + elementwise FLOPs, bytes), for explaining where the work is."""

    dense: Any
    elementwise: Any
    bytes: Any
    by_op: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    @property
    def flops(self) -> Any:
        return self.dense + self.elementwise

    @property
    def symbols(self) -> frozenset:
        """Names of the symbols the counts depend on."""
        out: set[str] = set()
        for e in (self.dense, self.elementwise, self.bytes):
            out |= set(getattr(e, "free_symbols", ()))
        return frozenset(out)

    def at(self, values: Mapping[str, int]) -> dict[str, int]:
        """The counts at one binding of the symbols: {'flops', 'dense', 'elementwise', 'bytes'} as ints.
        KeyError names a symbol the counts need that `values` lacks."""
        missing = sorted(self.symbols - set(values))
        if missing:
            raise KeyError(f"work counts need values for {missing}")
        env = dict(values)
        dense, elem, nbytes = (_value(e, env) for e in (self.dense, self.elementwise, self.bytes))
        return {"flops": dense + elem, "dense": dense, "elementwise": elem, "bytes": nbytes}

    def __str__(self) -> str:
        return f"flops = {self.flops}; bytes = {self.bytes}"


def _value(e: Any, env: dict[str, int]) -> int:
    return int(e.evaluate(env)) if hasattr(e, "evaluate") else int(e)


def graph_work(graph: Graph) -> Work:
    """The work of one call of `graph` (see the module docstring); nodes with untyped tensors count nothing."""
    dense: Any = 0
    elem: Any = 0
    nbytes: Any = 0
    by_op: dict[str, tuple[Any, Any]] = {}
    for node in graph.nodes:
        if node.op_type in _VIEWS or _folded(graph, node):
            continue
        d, e, b = _node_work(graph, node)
        dense, elem, nbytes = dense + d, elem + e, nbytes + b
        f0, b0 = by_op.get(node.op_type, (0, 0))
        by_op[node.op_type] = (f0 + d + e, b0 + b)
    return Work(dense, elem, nbytes, by_op)


def _tensor(graph: Graph, name: str) -> TensorType | None:
    t = graph.types.get(name) if name else None
    return t if isinstance(t, TensorType) and t.shape is not None else None


def _folded(graph: Graph, node: Node) -> bool:
    """Every output is a constant inference computed: the node does not run."""
    outs = [_tensor(graph, o) for o in node.outputs if o]
    return bool(outs) and all(t is not None and t.value is not None for t in outs)


def _numel(t: TensorType | None) -> Any:
    if t is None:
        return 0
    n: Any = 1
    for d in t.shape:
        n = n * d
    return n


def _bytes(t: TensorType | None) -> Any:
    return _numel(t) * np.dtype(t.dtype).itemsize if t is not None and t.dtype != object else 0


def _prod(dims: Any) -> Any:
    n: Any = 1
    for d in dims:
        n = n * d
    return n


def _node_work(graph: Graph, node: Node) -> tuple[Any, Any, Any]:
    """(dense FLOPs, elementwise FLOPs, bytes) of one node."""
    ins = [_tensor(graph, x) for x in node.inputs]
    outs = [_tensor(graph, o) for o in node.outputs]
    nbytes: Any = 0
    read = ins[1:] if node.op_type in _GATHERS else ins  # a gather reads the rows it writes, not its whole table
    for t in (*read, *outs, *(outs[:1] if node.op_type in _GATHERS else ())):
        nbytes = nbytes + _bytes(t)
    dense = _dense(node, ins, outs)
    if dense is not None:
        return dense, 0, nbytes
    elem: Any = 0
    for t in outs:
        elem = elem + _numel(t)
    return 0, elem, nbytes


def _dense(node: Node, ins: list, outs: list) -> Any | None:
    """A product's FLOPs, or None when the node is not one (or its operands are untyped)."""
    op = node.op_type
    y = outs[0] if outs else None
    a = ins[0] if ins else None
    if y is None or a is None:
        return None
    if op in _MATMULS:
        if op == "Gemm":
            k = a.shape[0] if node.attrs.get("transA", 0) else a.shape[-1]
        else:
            k = a.shape[-1]
        return 2 * _numel(y) * k
    if op in _CONVS:
        w = ins[3] if op == "QLinearConv" and len(ins) > 3 else (ins[1] if len(ins) > 1 else None)
        return None if w is None else 2 * _numel(y) * _prod(w.shape[1:])
    if op == "ConvTranspose":
        w = ins[1] if len(ins) > 1 else None
        return None if w is None else 2 * _numel(a) * _prod(w.shape[1:])
    if op in _ATTENTION:
        k = ins[1] if len(ins) > 1 else None
        if k is None:
            return None
        s_kv = k.shape[-2] if len(k.shape) == 4 else k.shape[1]
        return 2 * s_kv * (_numel(a) + _numel(y))
    if op in _RNNS:
        w, r = (ins[1] if len(ins) > 1 else None), (ins[2] if len(ins) > 2 else None)
        if w is None or r is None or len(a.shape) != 3:
            return None
        return 2 * a.shape[0] * a.shape[1] * (_numel(w) + _numel(r))
    return None
