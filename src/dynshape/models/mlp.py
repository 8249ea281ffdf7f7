"""A two-layer MLP with a dynamic batch, built with onnx.helper: the smallest model the runtime tests share."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build_mlp(inp: int = 64, hidden: int = 128, out: int = 64, seed: int = 0) -> onnx.ModelProto:
    """x (batch, inp) -> Gemm(+bias) -> Relu -> MatMul -> y (batch, out), float32, opset 17."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((inp, hidden)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((hidden, out)).astype(np.float32), "w2")
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", inp])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out])], [w1, b1, w2])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
