"""Shape rules of reductions, ArgMax/ArgMin, TopK and CumSum over symbolic dims (real inference engine)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from opgraph import infer

import dynshape as ds
import dynshape.ops  # noqa: F401  (registers every op)
from dynshape.ir.graph import Graph

ENV = {"b": 2, "s": 9, "h": 4}
X = {"x": (TensorProto.FLOAT, ["b", "s", "h"])}




def dims(g: Graph, name: str) -> tuple:
    return tuple(d.evaluate(ENV) if ds.is_expr(d) else d for d in g.types[name].shape)


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [13, 18])
def test_reduce_axes_as_attribute_or_input(keepdims: int, opset: int) -> None:
    if opset < 18:
        n = helper.make_node("ReduceMax", ["x"], ["y"], axes=[1, -1], keepdims=keepdims)
        g = infer([n], X, opset=opset)
    else:
        n = helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=keepdims)
        g = infer([n], X, {"axes": np.array([1, -1], np.int64)}, opset=opset)
    assert dims(g, "y") == ((2, 1, 1) if keepdims else (2,))
    assert g.types["y"].dtype == np.float32


def test_empty_axes_reduce_everything_or_nothing() -> None:
    g = infer([helper.make_node("ReduceSum", ["x"], ["all"], keepdims=0),
               helper.make_node("ReduceSum", ["x", "none"], ["same"], noop_with_empty_axes=1)],
              X, {"none": np.zeros(0, np.int64)})
    assert dims(g, "all") == () and dims(g, "same") == (2, 9, 4)


def test_runtime_axes_keep_the_rank_with_fresh_dims() -> None:
    g = infer([helper.make_node("ReduceMean", ["x", "axes"], ["y"])],
              {**X, "axes": (TensorProto.INT64, [1])})
    assert len(g.types["y"].shape) == 3 and all(ds.is_expr(d) for d in g.types["y"].shape)
    # keepdims=0 and an axes input of symbolic length k: the rank is 3 - k, so the graph specialises on k
    g = infer([helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)],
              {**X, "axes": (TensorProto.INT64, ["k"])})
    assert set(g.rank_symbols) == {"k"} and "axes" in g.rank_symbols["k"]
    x = np.arange(2 * 9 * 4, dtype=np.float32).reshape(2, 9, 4)
    for axes in ([1], [0, 2], [2, 0, 1]):
        y = g.run({"x": x, "axes": np.array(axes, np.int64)})["y"]
        np.testing.assert_allclose(y, x.mean(axis=tuple(axes)), rtol=1e-6)


def test_reduce_prod_of_a_shape_value() -> None:
    g = infer([helper.make_node("Shape", ["x"], ["sh"]),
               helper.make_node("ReduceProd", ["sh"], ["numel"], keepdims=0)], X)
    (v,) = g.types["numel"].value.ravel()
    assert v.evaluate(ENV) == 2 * 9 * 4 and g.types["numel"].shape == ()


def test_out_of_range_axis_is_an_error() -> None:
    with pytest.raises(ds.ShapeError, match="out of range"):
        infer([helper.make_node("ArgMax", ["x"], ["y"], axis=3)], X)


def test_argmax_shape_and_dtype() -> None:
    g = infer([helper.make_node("ArgMin", ["x"], ["y"], axis=-2, keepdims=0)], X)
    assert dims(g, "y") == (2, 4) and g.types["y"].dtype == np.int64


def test_topk_shapes_and_k_constraint() -> None:
    g = infer([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)], X, {"k": np.array([5], np.int64)})
    assert dims(g, "v") == (2, 5, 4) and g.types["i"].dtype == np.int64
    assert any("5" in f.text and "s" in f.text for f in g.signature.facts)  # s >= 5 is required
    with pytest.raises(ds.ShapeError, match="k=5"):
        infer([helper.make_node("TopK", ["x", "k"], ["v", "i"])], {"x": (TensorProto.FLOAT, ["b", 4])},
              {"k": np.array([5], np.int64)})


def test_cumsum_keeps_shape() -> None:
    g = infer([helper.make_node("CumSum", ["x", "ax"], ["y"], exclusive=1)], X, {"ax": np.array(1, np.int64)})
    assert dims(g, "y") == (2, 9, 4)
