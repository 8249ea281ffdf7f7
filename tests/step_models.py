"""A decoder step's ONNX model around its nodes: the fed token ids, an int64 mask, the past keys and values in
(batch, heads, past, head dim), and the output with the present keys and values out (what a decode loop calls per
token; the bucket-plan tests build theirs on it)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def step_model(nodes: list, inits: dict, heads: int, head_dim: int, mask_dim: str):
    kv = ["b", heads, "past", head_dim]
    graph = helper.make_graph(
        nodes, "step",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", 1]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["b", mask_dim]),
         helper.make_tensor_value_info("past_k", TensorProto.FLOAT, kv),
         helper.make_tensor_value_info("past_v", TensorProto.FLOAT, kv)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "present_k", "present_v")],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
