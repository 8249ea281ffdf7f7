"""Zero-sized dims: named dims admit 0 by default, and every op runs on empty inputs wherever ONNX allows.

`bench/zero_dims.py` checks this over the whole node suite against ONNX's own evaluator; these are the cases
it found broken, pinned here, plus the Reshape assumption that keeps one symbolic shape for the generic graph.
"""

from __future__ import annotations

import numpy as np
import pytest
from nodecase import run_one
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.frontends.onnx import load_onnx


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("shape", [(0, 4), (3, 0)])
def test_normalisations_of_empty_tensors(op: str, shape: tuple) -> None:
    (y,) = run_one(op, {"x": np.zeros(shape, np.float32)}, axis=1, opset=13)
    assert y.shape == shape


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pooling_an_empty_batch_and_a_too_short_axis(op: str) -> None:
    (y,) = run_one(op, {"x": np.zeros((0, 3, 8, 8), np.float32)}, kernel_shape=[2, 2])
    assert y.shape == (0, 3, 7, 7)
    (y,) = run_one("Conv", {"x": np.zeros((1, 1, 0, 5), np.float32), "w": np.ones((1, 1, 3, 3), np.float32)},
                   pads=[1, 1, 1, 1])
    assert y.shape == (1, 1, 0, 5)


def test_exclusive_cumsum_of_nothing() -> None:
    (y,) = run_one("CumSum", {"x": np.zeros(0, np.float32), "axis": np.array(0, np.int32)}, exclusive=1)
    assert y.shape == (0,)


def test_gather_elements_with_indices_smaller_than_the_data() -> None:
    """The output has the indices' shape on every axis, not the data's (no broadcasting)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[2, 0], [1, 1]], np.int64)
    (y,) = run_one("GatherElements", {"x": x, "idx": idx}, axis=0)
    np.testing.assert_array_equal(y, [[x[2, 0], x[0, 1]], [x[1, 0], x[1, 1]]])
    (y,) = run_one("GatherElements", {"x": x, "idx": np.zeros((0, 4), np.int64)}, axis=0)
    assert y.shape == (0, 4)


def test_reshape_assumes_a_symbolic_entry_is_not_zero_and_specialises_when_it_is() -> None:
    """Reshape(x, [len(y), -1]): for len(y) = 0 the 0 means "copy x's dim 0" (allowzero=0), which the
    generic graph (one symbolic shape) does not cover; those inputs run on a static specialisation."""
    nodes = [helper.make_node("Shape", ["y"], ["n"]),
             helper.make_node("Concat", ["n", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["out"], name="reshape")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b"]),
                                       helper.make_tensor_value_info("y", TensorProto.FLOAT, ["k"])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                          [helper.make_tensor("minus1", TensorProto.INT64, [1], [-1])])
    graph = load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]))
    (fact,) = [f for f in graph.signature.facts if f.kind == "assume"]
    assert "node 'reshape'" in fact.origin and fact.check is not None
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert graph.run({"x": x, "y": np.zeros(3, np.float32)})["out"].shape == (3, 2)
    assert graph.run({"x": x, "y": np.zeros(0, np.float32)})["out"].shape == (2, 3)  # 0 copied x's dim
    assert any(k[0] == "static" for k in graph.variants)
    with pytest.raises(ds.ConstraintViolation):
        graph.run({"x": x, "y": np.zeros(4, np.float32)})  # 6 elements do not split into 4 rows


def test_an_empty_batch_through_attention() -> None:
    q = np.zeros((0, 2, 3, 4), np.float32)
    y = run_one("Attention", {"Q": q, "K": np.zeros((0, 2, 5, 4), np.float32),
                              "V": np.zeros((0, 2, 5, 6), np.float32)})[0]
    assert y.shape == (0, 2, 3, 6)
