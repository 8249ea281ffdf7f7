"""Constant subgraphs computed once, at compile time, whatever their size.

Inference folds only small constants (`ir.infer.FOLD_LIMIT` elements): it runs on every load and reasons about
shapes, not weights. Real exports make their weights with nodes: the `light_*` CNNs in the onnx package build
each one with `ConstantOfShape`, converters `Cast` float16 weights, quantisers `DequantizeLinear` int8 ones,
exporters `Transpose` or `Reshape` an initializer. Left in the graph, each such node runs on every call, and the
passes after it (BatchNorm folding, the channels-last layout, weight packing) see a computed tensor where a
constant was meant: ResNet-50 as shipped ran 35 ConstantOfShape and 34 ChannelsLast steps per call.

`fold_constant_nodes` runs each node whose inputs are all constants (and that is neither random nor carries a
subgraph) through its reference once, and hands back a graph where its outputs are initializers. Folding is
bounded by memory, not by an element count: the folded bytes are counted and capped (`Options.fold_bytes`); a
model past the cap is refused with the node, its bytes and the option named, never left to run per call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from dynshape.errors import ModelError
from dynshape.ir import opdef
from dynshape.ir.graph import Graph
from dynshape.ir.types import TensorType

__all__ = ["Folded", "fold_constant_nodes"]


@dataclass
class Folded:
    """What folding did: the graph to build, the bytes it holds, and the nodes folded by op type."""

    graph: Graph
    nbytes: int = 0
    by_op: dict[str, int] = field(default_factory=dict)


def _static_nbytes(t: object) -> int | None:
    if not isinstance(t, TensorType) or not all(isinstance(d, int) for d in t.shape):
        return None
    return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize


def fold_constant_nodes(graph: Graph, cap_bytes: int) -> Folded:
    """The graph with every foldable node replaced by initializers (a shallow copy; `graph` is not changed).

    Graph outputs are not folded (the executable returns what its steps compute) and neither is a node whose
    outputs' shapes are not all static (their sizes would follow from the values: data-dependent)."""
    consts = graph.constants()
    outputs = {v.name for v in graph.outputs}
    added: dict[str, np.ndarray] = {}
    kept = []
    report = Folded(graph)
    for n in graph.nodes:
        ins = [x for x in n.inputs if x]
        outs = [o for o in n.outputs if o]
        sizes = [_static_nbytes(graph.types.get(o)) for o in outs]
        foldable = (outs and all(x in consts for x in ins) and not opdef.is_random(n)
                    and not n.subgraphs() and not outputs.intersection(outs) and None not in sizes
                    and not all(o in consts for o in outs))
        op = opdef.lookup(n.op_type, n.domain) if foldable else None
        if op is None or op.reference is None:
            kept.append(n)
            continue
        need = sum(sizes)
        if report.nbytes + need > cap_bytes:
            raise ModelError(f"{n.label()}: folding this constant subgraph needs {need:,} bytes more, "
                             f"{report.nbytes + need:,} in all, over fold_bytes={cap_bytes:,} "
                             "(raise Options.fold_bytes, or feed the value as an input)")
        attrs = {**n.attrs, "_opset": graph.opset, "_num_outputs": len(n.outputs)}
        try:
            res = op.reference([consts[x] if x else None for x in n.inputs], attrs)
        except Exception:  # the run-time step reports it with its context if the model really runs it
            kept.append(n)
            continue
        values = dict(zip(n.outputs, res))
        arrays = {o: values.get(o) for o in outs}
        if not all(isinstance(a, np.ndarray) and _fits(a, graph.types[o]) for o, a in arrays.items()):
            kept.append(n)
            continue
        for o, a in arrays.items():
            a = np.ascontiguousarray(a)
            a.flags.writeable = False
            consts[o] = added[o] = a
        report.nbytes += need
        report.by_op[n.op_type] = report.by_op.get(n.op_type, 0) + 1
    if added:
        report.graph = dataclasses.replace(graph, nodes=kept, initializers={**graph.initializers, **added},
                                           variants={})
    return report


def _fits(a: np.ndarray, t: TensorType) -> bool:
    return a.dtype == np.dtype(t.dtype) and tuple(a.shape) == tuple(t.shape)
