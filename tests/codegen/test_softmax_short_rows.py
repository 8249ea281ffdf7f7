"""A softmax over a short static last axis (at most lower/softmax.SHORT_ROW values: a detector's two classes over a
channels-last map) runs as straight-line code per row (lower/softmax.short_rows), not the three passes over a row
buffer. Against ONNX's reference within float32 tolerance, NaN / infinity rows as the reference gives them, with a
producer and a consumer group fused around it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen.lower.softmax import SHORT_ROW
from dynshape.ir.opdef import lookup
from dynshape.runtime.build import KernelStep

RNG = np.random.default_rng(5)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=2e-6)


def _softmax_kernel(exe) -> KernelStep:
    (step,) = [s for s in exe.generic.steps if isinstance(s, KernelStep) and s.kind == "softmax"]
    return step


@pytest.mark.parametrize("n", [1, 2, 3, 5, SHORT_ROW])
@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_a_short_last_axis_softmax_as_the_reference(n: int) -> None:
    node = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    exe = ds.compile(ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])))
    assert "row = " not in _softmax_kernel(exe).source  # (no row buffer: the short path)
    for shape in ((3, 70, n), (1, 1, n), (2, 9, n)):
        x = (RNG.standard_normal(shape) * 6).astype(np.float32)
        if shape[1] == 70:
            x[0, 0, 0] = np.nan  # a row with a NaN
            x[0, 1, -1] = np.inf  # one with +inf
            x[0, 2, :] = -np.inf  # one all -inf
            x[0, 3, 0] = -np.inf  # one -inf among finite values (n > 1)
            x[0, 4, :] = 1e30  # huge but equal values
            x[0, 5, :] = -1e30
        _close(exe.run({"x": x})["y"], lookup("Softmax").reference([x], {"axis": -1, "_opset": 17})[0])


def test_a_long_static_axis_keeps_the_row_passes() -> None:
    node = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", SHORT_ROW + 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    exe = ds.compile(ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])))
    assert "row = " in _softmax_kernel(exe).source
    x = RNG.standard_normal((7, SHORT_ROW + 1)).astype(np.float32)
    _close(exe.run({"x": x})["y"], lookup("Softmax").reference([x], {"axis": -1, "_opset": 17})[0])


def test_a_two_class_map_softmax_with_its_producer_and_consumer() -> None:
    """A conv head's two classes, softmax over channels (axis 1 of NCHW: the last axis channels-last), a per-class
    bias added before and a scale after: both groups in the kernel, each class reading its own operand values."""
    w = (RNG.standard_normal((2, 4, 1, 1)) * 0.5).astype(np.float32)
    bias = np.array([[[[0.5]], [[-1.5]]]], np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "bias"], ["p"]),
             helper.make_node("Softmax", ["p"], ["s"], axis=1), helper.make_node("Mul", ["s", "k"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, "h", "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias"),
                           numpy_helper.from_array(np.array(3.0, np.float32), "k")])
    graph = ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    exe = ds.compile(graph)
    assert "row = " not in _softmax_kernel(exe).source
    for shape in ((1, 4, 30, 41), (2, 4, 1, 3)):
        x = RNG.standard_normal(shape).astype(np.float32)
        want = graph.run({"x": x})["y"]
        np.testing.assert_allclose(exe.run({"x": x})["y"], want, rtol=1e-5, atol=2e-6 * float(np.abs(want).max()))
