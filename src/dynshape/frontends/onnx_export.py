"""A dynshape Graph back as an ONNX model, so graphs built in memory (`ds.from_torch`) can be saved.

`ds.save` compiles and writes an artefact from an ONNX model (the artefact keeps `model.onnx` and recompiles
from it on `dynshape compile`), so a Graph must become a ModelProto first:

    graph = ds.from_torch(model, args, dynamic_shapes=...)
    ds.save(graph, "out")        # does to_onnx + dims_of itself, and keeps graph.requires

Symbolic input dims become `dim_param`s named after their symbols, and `dims_of` gives each symbol's declared
range, so `load_onnx` on the result rebuilds the same signature. The frontend's stated requirements
(`Graph.requires`: torch's runtime asserts beyond what inference derives) are not representable in ONNX; `ds.save`
stores them beside the model, a bare `to_onnx` drops them.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from dynshape.errors import ModelError
from dynshape.frontends.onnx_contrib import PERSISTED_ATTRS, PERSISTED_PREFIX
from dynshape.ir.graph import Graph, Node
from dynshape.ir.types import TensorType
from dynshape.sym import is_expr


def to_onnx(graph: Graph, *, producer: str = "dynshape") -> Any:
    """The ONNX ModelProto of a dynshape Graph (top-level tensors only; subgraph attributes are converted)."""
    from onnx import helper

    g = _graph_proto(graph, top=True)
    opsets = [helper.make_opsetid(d, v) for d, v in (graph.opset_imports or {"": 18}).items()]
    model = helper.make_model(g, opset_imports=opsets, producer_name=producer)
    model.ir_version = 8
    return model


def dims_of(graph: Graph) -> dict[str, dict]:
    """`dims=` for load_onnx / ds.save: each input symbol with its range and divisor."""
    out = {}
    for name, e in graph.signature.symbols.items():
        s = e.atom()
        out[name] = {"min": s.lo, "max": s.hi, "multiple_of": s.mult}
    return out


def _graph_proto(graph: Graph, top: bool) -> Any:
    from onnx import numpy_helper

    inits = [numpy_helper.from_array(np.ascontiguousarray(a), name) for name, a in graph.initializers.items()]
    inputs = [_value_info(v.name, graph.types.get(v.name), v.dtype, v.shape) for v in graph.inputs]
    outputs = [_value_info(v.name, graph.types.get(v.name), v.dtype, v.shape) for v in graph.outputs]
    nodes = [_node(n) for n in graph.nodes]
    from onnx import helper

    return helper.make_graph(nodes, graph.name or "main", inputs, outputs, inits)


def _value_info(name: str, t: Any, dtype: Any, shape: Any) -> Any:
    from onnx import helper

    if isinstance(t, TensorType):
        dtype, shape = t.dtype, t.shape
    dims = None
    if shape is not None:
        dims = [int(d) if isinstance(d, (int, np.integer)) else (d.atom().name if is_expr(d) and d.is_atom()
                                                                else str(d)) for d in shape]
    return helper.make_tensor_value_info(name, _elem(dtype), dims)


def _elem(dtype: Any) -> int:
    from onnx import helper

    try:
        return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except Exception:
        raise ModelError(f"dtype {dtype} has no ONNX element type") from None


def _node(n: Node) -> Any:
    from onnx import helper, numpy_helper

    attrs = {}
    for k, v in n.attrs.items():
        if k.startswith("_"):
            continue
        if isinstance(v, Graph):
            v = _graph_proto(v, top=False)
        elif isinstance(v, np.ndarray):
            v = numpy_helper.from_array(v)
        elif isinstance(v, list) and v and isinstance(v[0], Graph):
            v = [_graph_proto(x, top=False) for x in v]
        attrs[k] = v
    try:
        proto = helper.make_node(n.op_type, list(n.inputs), list(n.outputs), name=n.name, domain=n.domain or None,
                                 **attrs)
    except Exception as e:
        raise ModelError(f"{n.label()}: cannot write its attributes as ONNX ({e})") from None
    for k in PERSISTED_ATTRS:
        if k in n.attrs:
            proto.metadata_props.add(key=PERSISTED_PREFIX + k, value=json.dumps([float(v) for v in n.attrs[k]]))
    return proto
