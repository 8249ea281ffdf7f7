"""Graphs whose output rank depends on an input dim's value (a shape or axes tensor fed at run time).

Inference stops at the node that needs the number, records the symbol in `graph.rank_symbols`, and
`graph.run` specialises a copy of the graph on each value it sees (cached), every other dim staying symbolic.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.frontends.onnx import load_onnx

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes: list, inputs: list, outputs: list) -> object:
    g = helper.make_graph(nodes, "t", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _vi(name: str, shape: list | None, elem: int = F32) -> object:
    return helper.make_tensor_value_info(name, elem, shape)


@pytest.fixture()
def reshape_graph() -> ds.Graph:
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node("Relu", ["r"], ["y"], name="relu")]
    return load_onnx(_model(nodes, [_vi("x", ["n"]), _vi("shape", ["k"], I64)], [_vi("y", None)]))


def test_rank_symbol_is_recorded_with_its_origin(reshape_graph: ds.Graph) -> None:
    g = reshape_graph
    assert set(g.rank_symbols) == {"k"} and "node 'reshape'" in g.rank_symbols["k"]
    (fact,) = [f for f in g.signature.facts if f.kind == "rank"]
    assert fact.text.startswith("k:") and "node 'reshape'" in fact.origin
    assert set(g.signature.symbols) == {"n", "k"}


def test_each_length_runs_its_own_variant_and_is_cached(reshape_graph: ds.Graph) -> None:
    g = reshape_graph
    x = np.arange(-12, 12, dtype=np.float32)
    for shape in ([24], [4, 6], [2, 3, 4], [2, -1, 3]):
        y = g.run({"x": x, "shape": np.array(shape, np.int64)})["y"]
        np.testing.assert_array_equal(y, np.maximum(x.reshape(shape), 0))
    assert sorted(k for ((_, k),) in g.variants) == [1, 2, 3]
    v3 = g.variants[(("k", 3),)]
    g.run({"x": np.zeros(6, np.float32), "shape": np.array([1, 2, 3], np.int64)})
    assert g.variants[(("k", 3),)] is v3  # a seen length is never re-inferred
    assert v3.types["y"].rank == 3 and not v3.rank_symbols


def test_a_bad_feed_is_a_constraint_violation(reshape_graph: ds.Graph) -> None:
    with pytest.raises(ds.ConstraintViolation, match="rank 2"):
        reshape_graph.run({"x": np.zeros((2, 3), np.float32), "shape": np.array([6], np.int64)})
    with pytest.raises(ds.DynshapeError, match="reshape"):
        reshape_graph.run({"x": np.zeros(6, np.float32), "shape": np.array([4, 2], np.int64)})


def test_nested_rank_symbols_specialise_in_turn() -> None:
    """The first variant still needs a second symbol (Unsqueeze's axes after a Reshape)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node("Unsqueeze", ["r", "axes"], ["y"], name="unsqueeze")]
    g = load_onnx(_model(nodes, [_vi("x", ["n"]), _vi("shape", ["k"], I64), _vi("axes", ["j"], I64)],
                         [_vi("y", None)]))
    assert set(g.rank_symbols) == {"k"}
    x = np.arange(6, dtype=np.float32)
    y = g.run({"x": x, "shape": np.array([2, 3], np.int64), "axes": np.array([0, 3], np.int64)})["y"]
    assert y.shape == (1, 2, 3, 1)
    (v,) = g.variants.values()
    assert set(v.rank_symbols) == {"j"}


def test_a_rank_fixed_by_data_runs_the_rest_unchecked() -> None:
    """A length only the data fixes (NonZero's count) is no input dim: nothing to specialise on. The graph
    keeps the types inferred before that node, says why, and the reference executor runs the rest as is:
    here the positions of x's non-zeros become the shape x is reshaped to."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Flatten", ["nz"], ["flat"], axis=0),
             helper.make_node("Squeeze", ["flat", "zero"], ["s"]),
             helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")]
    m = _model(nodes, [_vi("x", ["n"])], [_vi("y", None)])
    m.graph.initializer.append(helper.make_tensor("zero", I64, [1], [0]))
    g = load_onnx(m)
    assert "node 'reshape'" in g.dynamic and not g.rank_symbols
    assert "nz" in g.types and "y" not in g.types  # typed up to the node that needs the values
    (fact,) = [f for f in g.signature.facts if f.kind == "dynamic"]
    assert "node 'reshape'" in fact.origin
    x = np.array([0, 0, 3, 0, 3, 0, 0, 0], np.float32)  # non-zeros at 2 and 4: reshaped to (2, 4)
    np.testing.assert_array_equal(g.run({"x": x})["y"], x.reshape(2, 4))
    with pytest.raises(ds.ConstraintViolation, match="node 'reshape'"):
        g.run({"x": np.array([0, 3, 0, 4], np.float32)})  # (1, 3) does not hold 4 elements
