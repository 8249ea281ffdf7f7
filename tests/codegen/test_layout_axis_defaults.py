"""The layout pass moves an axis op between channels-last convolutions by permuting its axis: an op without the
attribute takes its own default first (-1 for Softmax / LogSoftmax from opset 13, 0 for Split). A LogSoftmax
without `axis` was moved to axis perm[1] (wrong values, 5.2 of 17.7)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds

RNG = np.random.default_rng(13)
F = TensorProto.FLOAT


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Split"])
def test_an_axis_op_without_the_attribute_between_convolutions(op):
    w = (RNG.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((4, 8, 3, 3)) * 0.3).astype(np.float32)
    mid = [helper.make_node(op, ["r"], ["s"])] if op != "Split" else \
        [helper.make_node("Split", ["r"], ["s0", "s1"]), helper.make_node("Concat", ["s1", "s0"], ["s"], axis=0)]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             *mid, helper.make_node("Conv", ["s", "w2"], ["y"], pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["n", 3, "h", "w"])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w2, "w2")])
    graph = ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    exe = ds.compile(graph)
    for shape in [(2, 3, 12, 10), (4, 3, 5, 7)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        want = graph.run({"x": x})["y"]
        got = exe.run({"x": x})["y"]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
