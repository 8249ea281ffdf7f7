"""Initializers the file also lists as graph inputs (IR < 4): constants unless a call feeds them (issue 29)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.errors import ConstraintViolation
from dynshape.runtime import overrides


def _ir3_model() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    f32 = TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])], "ir3",
        [helper.make_tensor_value_info("x", f32, ["n", 6]), helper.make_tensor_value_info("W", f32, [6, 5]),
         helper.make_tensor_value_info("B", f32, [5])],
        [helper.make_tensor_value_info("y", f32, ["n", 5])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 8)])
    m.ir_version = 3
    return m, w, b


def test_initializer_inputs_are_constants_unless_fed() -> None:
    m, w, b = _ir3_model()
    g = ds.load_onnx(m)
    assert [v.name for v in g.inputs] == ["x"] and g.overridable == ("W", "B")
    exe = ds.compile(g)
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})["y"], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
    b2 = np.linspace(-3, 3, 5).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x, "B": b2})["y"], np.maximum(x @ w + b2, 0), rtol=1e-5, atol=1e-5)
    w2 = -w
    np.testing.assert_allclose(exe.run({"x": x, "W": w2, "B": b2})["y"], np.maximum(x @ w2 + b2, 0), rtol=1e-5,
                               atol=1e-5)
    # the plain call still runs the constants' build, and each set of fed names has its own
    np.testing.assert_allclose(exe.run({"x": x})["y"], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
    assert exe._overrides.builds == [["B"], ["B", "W"]]


@pytest.mark.parametrize("bad,what", [(np.zeros(4, np.float32), "float32 (4,)"),
                                      (np.zeros(5, np.float64), "float64 (5,)"),
                                      ([0.0] * 5, "list (5,)")])
def test_a_wrong_override_is_refused_by_name(bad, what) -> None:
    m, w, b = _ir3_model()
    exe = ds.compile(ds.load_onnx(m))
    x = np.ones((2, 6), np.float32)
    with pytest.raises(ConstraintViolation, match=rf"input 'B': it overrides the initializer 'B' of float32 \(5,\).*"
                                                  rf"{what.replace('(', '[(]').replace(')', '[)]')}"):
        exe.run({"x": x, "B": bad})
    np.testing.assert_allclose(exe.run({"x": x})["y"], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
    assert exe._overrides.builds == []  # refused before any build


def test_unknown_names_are_still_refused() -> None:
    m, _, _ = _ir3_model()
    exe = ds.compile(ds.load_onnx(m))
    with pytest.raises(ConstraintViolation, match="unexpected"):
        exe.run({"x": np.ones((2, 6), np.float32), "nope": np.ones(1, np.float32)})


def test_override_builds_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(overrides, "MAX_OVERRIDE_BUILDS", 1)
    m, w, b = _ir3_model()
    exe = ds.compile(ds.load_onnx(m))
    x = np.ones((2, 6), np.float32)
    exe.run({"x": x, "B": b})
    with pytest.raises(ConstraintViolation, match="other sets of fed initializers"):
        exe.run({"x": x, "W": w})
