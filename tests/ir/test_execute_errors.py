"""The reference executor rejects every bad feed before computing, with the input, axis, symbol and fact."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.frontends.onnx import load_onnx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType

F32 = TensorProto.FLOAT


def _model(nodes: list, inputs: list, outputs: list, inits: list = ()) -> object:
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _vi(name: str, shape: list, elem: int = F32) -> object:
    return helper.make_tensor_value_info(name, elem, shape)


@pytest.fixture(scope="module")
def add_graph():
    m = _model([helper.make_node("Add", ["x", "m"], ["y"], name="add")],
               [_vi("x", ["batch", "seq", 4]), _vi("m", ["batch", "seq", 4])], [_vi("y", None)])
    return load_onnx(m, dims={"batch": (1, 4), "seq": {"min": 1, "max": 64, "multiple_of": 8}})


def _f(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return np.ones(shape, dtype)


def test_good_feed_runs(add_graph) -> None:
    out = add_graph.run({"x": _f(2, 8, 4), "m": _f(2, 8, 4)})
    np.testing.assert_array_equal(out["y"], np.full((2, 8, 4), 2, np.float32))


@pytest.mark.parametrize(("feed", "pattern"), [
    ({"x": _f(2, 8, 4), "m": _f(2, 8, 4), "z": _f(1)}, r"unknown input 'z'.*x: float32\[batch, seq, 4\]"),
    ({"x": _f(2, 8, 4)}, r"missing input\(s\): 'm' \(float32\[batch, seq, 4\]\)"),
    ({"x": _f(2, 8), "m": _f(2, 8, 4)}, r"input 'x' has rank 2 .*expected rank 3"),
    ({"x": _f(2, 8, 4, dtype=np.float64), "m": _f(2, 8, 4)}, r"input 'x' has dtype float64, expected float32"),
    ({"x": _f(2, 8, 5), "m": _f(2, 8, 4)}, r"input 'x' axis 2 is 5, expected 4"),
    ({"x": _f(5, 8, 4), "m": _f(5, 8, 4)}, r"input 'x' axis 0.*batch = 5 is outside its range \[1, 4\]"),
    ({"x": _f(2, 12, 4), "m": _f(2, 12, 4)}, r"input 'x' axis 1.*seq = 12 is not a multiple of 8"),
    ({"x": _f(2, 72, 4), "m": _f(2, 72, 4)}, r"seq = 72 is outside its range \[8, 64\]"),
    ({"x": _f(2, 8, 4), "m": _f(2, 16, 4)}, r"input 'm' axis 1 is 16, but it must equal seq = 8.*input 'x' axis 1"),
])
def test_bad_feeds(add_graph, feed: dict, pattern: str) -> None:
    with pytest.raises(ds.ConstraintViolation, match=pattern):
        add_graph.run(feed)


def test_feed_must_be_a_dict(add_graph) -> None:
    with pytest.raises(ds.ConstraintViolation, match="dict"):
        add_graph.run([_f(2, 8, 4), _f(2, 8, 4)])


def test_refined_divisibility_explains_where_it_came_from() -> None:
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 4])
    m = _model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="to_rows")], [_vi("x", ["n"])],
               [_vi("y", None)], [shape])
    g = load_onnx(m)
    assert g.signature.symbols["n"].atom().mult == 4
    assert g.run({"x": _f(8)})["y"].shape == (2, 4)
    with pytest.raises(ds.ConstraintViolation, match=r"n = 6 is not a multiple of 4.*to_rows"):
        g.run({"x": _f(6)})


def test_residual_fact_is_checked_before_running() -> None:
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 4])
    nodes = [helper.make_node("Concat", ["a", "b"], ["ab"], name="cat", axis=0),
             helper.make_node("Reshape", ["ab", "shape"], ["y"], name="to_rows")]
    g = load_onnx(_model(nodes, [_vi("a", ["p"]), _vi("b", ["q"])], [_vi("y", None)], [shape]))
    facts = [f for f in g.signature.facts if f.check is not None]
    assert any("p + q" in f.text and "to_rows" in f.origin for f in facts)
    assert g.run({"a": _f(3), "b": _f(5)})["y"].shape == (2, 4)
    with pytest.raises(ds.ConstraintViolation, match=r"to_rows.*p = 3 \(from input 'a' axis 0\).*q = 4"):
        g.run({"a": _f(3), "b": _f(4)})


def test_undecided_broadcast_is_checked_before_running() -> None:
    g = load_onnx(_model([helper.make_node("Add", ["a", "b"], ["y"], name="add")],
                         [_vi("a", ["p"]), _vi("b", ["q"])], [_vi("y", None)]))
    p, q = g.signature.symbols["p"], g.signature.symbols["q"]
    assert g.outputs[0].shape == (ds.max_(p, q) * ds.min_(p, q, 1),)  # exact when one side may be 0
    assert g.run({"a": _f(1), "b": _f(5)})["y"].shape == (5,)
    assert g.run({"a": _f(1), "b": _f(0)})["y"].shape == (0,)
    g1 = load_onnx(_model([helper.make_node("Add", ["a", "b"], ["y"], name="add")],
                          [_vi("a", ["p"]), _vi("b", ["q"])], [_vi("y", None)]), default_min=1)
    assert g1.outputs[0].shape == (ds.max_(g1.signature.symbols["p"], g1.signature.symbols["q"]),)
    assert g.run({"a": _f(3), "b": _f(3)})["y"].shape == (3,)
    with pytest.raises(ds.ConstraintViolation, match=r"p == q or one of them is 1.*node 'add'.*p = 2.*q = 3"):
        g.run({"a": _f(2), "b": _f(3)})


def test_data_dependent_sizes_are_bound_on_first_sight() -> None:
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nz"),
             helper.make_node("Transpose", ["nz"], ["t"], name="t", perm=[1, 0])]
    g = load_onnx(_model(nodes, [_vi("x", ["n"])], [_vi("t", None, TensorProto.INT64)]))
    (u,) = [f for f in g.signature.facts if f.kind == "fresh"]
    assert "node 'nz'" in u.origin and g.outputs[0].shape[1] == 1
    for data in ([0, 1, 0, 2], [0, 0], [3, 3, 3]):
        x = np.array(data, np.float32)
        assert g.run({"x": x})["t"].shape == (np.count_nonzero(x), 1)


def _bad_rule(ctx) -> list:  # claims one more element than the reference produces
    x = ctx.inputs[0]
    return [TensorType(x.dtype, (x.shape[0] + 1,))]


register("OffByOne", reference=lambda ins, attrs: [ins[0].copy()], infer=_bad_rule, domain="test.dynshape")


def test_a_shape_rule_bug_fails_loudly_with_the_node_name() -> None:
    g = helper.make_graph([helper.make_node("OffByOne", ["x"], ["y"], name="buggy", domain="test.dynshape")],
                          "t", [_vi("x", ["n"])], [_vi("y", None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("test.dynshape", 1)])
    graph = load_onnx(m)
    with pytest.raises(ds.ShapeError, match=r"node 'buggy'.*float32\[3\].*n \+ 1.*disagree"):
        graph.run({"x": _f(3)})
