"""Build a one-node ONNX model, load it through the real frontend and run it with the reference executor."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto, helper

import dynshape.ops  # noqa: F401  (registers every op)
from dynshape.frontends.onnx import load_onnx
from dynshape.ir.graph import Graph
from dynshape.ops.dtypes import np_dtype

_ELEM = {np_dtype(code): code for code in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
                                           TensorProto.BFLOAT16, TensorProto.INT64, TensorProto.INT32,
                                           TensorProto.INT8, TensorProto.UINT8, TensorProto.BOOL,
                                           TensorProto.STRING, TensorProto.INT16, TensorProto.UINT16)}


def elem(dtype: Any) -> int:
    return _ELEM[np.dtype(dtype)]


def one_node(op: str, inputs: dict[str, Any], n_out: int = 1, *, domain: str = "", opset: int = 23,
             dims: dict[str, list] | None = None, extra_opsets: dict[str, int] | None = None, **attrs: Any) -> Graph:
    """A graph of one `op` node. `inputs`: name -> array (its dtype and rank; dims from `dims` if given,
    else named d_<input>_<axis>), None for an omitted optional input."""
    vis, names = [], []
    for name, x in inputs.items():
        if x is None:
            names.append("")
            continue
        names.append(name)
        x = np.asarray(x)
        shape = (dims or {}).get(name, [f"d_{name}_{i}" for i in range(x.ndim)])
        vis.append(helper.make_tensor_value_info(name, elem(x.dtype), shape))
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, domain=domain or None, **attrs)
    graph = helper.make_graph([node], "t", vis, [helper.make_tensor_value_info(o, 0, None) for o in outs])
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    return load_onnx(helper.make_model(graph, opset_imports=opsets))


def run_one(op: str, inputs: dict[str, Any], n_out: int = 1, **kw: Any) -> list:
    g = one_node(op, inputs, n_out, **kw)
    out = g.run({k: np.asarray(v) for k, v in inputs.items() if v is not None})
    return [out[f"out{i}"] for i in range(n_out)]
