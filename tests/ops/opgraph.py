"""Shared by the shape-rule tests: build a one-graph ONNX model from nodes and run the real inference on it."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import dynshape.ops  # noqa: F401  (registers every op)
from dynshape.frontends.onnx import load_onnx
from dynshape.ir.graph import Graph


def infer(nodes: list, inputs: dict, consts: dict | None = None, opset: int = 21, **load: object) -> Graph:
    """inputs: name -> (elem_type, shape); every node output becomes a graph output of unknown type; `load`
    goes to `load_onnx` (dims=..., default_min=...)."""
    outs = [o for n in nodes for o in n.output]
    graph = helper.make_graph(
        nodes, "t",
        [helper.make_tensor_value_info(k, t, s) for k, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (consts or {}).items()])
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), **load)
