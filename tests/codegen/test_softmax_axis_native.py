"""Softmax / LogSoftmax over any axis run natively (codegen/row_kernels.py, csrc/ds_rows.c): the last axis as
contiguous rows, another as strided rows vectorised over the inner positions (yolov8's DFL head: a softmax over
16 bins of (N, 4, 16, A)), opset < 13's flattened block as contiguous rows. Against the op's reference within
float32 tolerance, NaN / infinity lanes as the reference gives them."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.ir.opdef import lookup

RNG = np.random.default_rng(11)


def _model(op: str, axis: int | None, opset: int, rank: int):
    node = helper.make_node(op, ["x"], ["y"], **({} if axis is None else {"axis": axis}))
    dims = [f"d{i}" for i in range(rank)]
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    scale = max(1.0, float(np.abs(want[fin]).max())) if fin.any() else 1.0
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=2e-6 * scale)


CASES = [  # op, axis, opset, shapes seen by one build, the entry point
    ("Softmax", 2, 13, [(1, 4, 16, 2100), (2, 4, 16, 7), (1, 4, 16, 65)], "ds_softmax_mid_f32"),
    ("Softmax", 0, 13, [(5, 3), (1, 130)], "ds_softmax_mid_f32"),
    ("Softmax", -2, 13, [(3, 9, 70), (2, 1, 4)], "ds_softmax_mid_f32"),
    ("Softmax", None, 13, [(2, 3, 33), (4, 1, 5)], None),  # the last axis: a generated kernel
    ("Softmax", 1, 11, [(2, 3, 4, 5), (1, 7, 2, 2)], "ds_softmax_f32"),  # the flattened block (3*4*5)
    ("LogSoftmax", 1, 13, [(2, 40, 67), (3, 2, 1)], "ds_softmax_mid_f32"),
    ("LogSoftmax", -1, 13, [(6, 50), (1, 3)], "ds_logsoftmax_f32"),
    ("LogSoftmax", None, 11, [(4, 3, 8)], "ds_logsoftmax_f32"),  # opset 11's default axis 1
]


@pytest.mark.parametrize("op,axis,opset,shapes,entry", CASES)
def test_softmax_over_any_axis_is_native(spy_row_kernels, op, axis, opset, shapes, entry):
    used = spy_row_kernels
    exe = ds.compile(_model(op, axis, opset, len(shapes[0])))
    assert not [u for u in exe.explain_build()["uncompiled"] if u["runs"] != "native"]
    attrs = {"_opset": opset, **({} if axis is None else {"axis": axis})}
    for shape in shapes:
        x = (RNG.standard_normal(shape) * 6).astype(np.float32)
        _close(exe.run({"x": x})["y"], lookup(op).reference([x], attrs)[0])
    assert entry is None or entry in used


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_nan_and_infinite_lanes_as_the_reference(spy_row_kernels, op, axis):
    used = spy_row_kernels
    exe = ds.compile(_model(op, axis, 13, 3))
    assert [s.how for s in exe.generic.steps] == ["native"]
    x = RNG.standard_normal((16, 16, 70)).astype(np.float32)
    lanes = (slice(None),) * axis
    x[lanes + (3,)][..., 0] = np.nan  # one lane with a NaN
    x[lanes + (5,)][..., 1] = np.inf  # one with +inf
    x[lanes + (slice(None),)][..., 2] = -np.inf  # one all -inf
    x[lanes + (7,)][..., 4] = -np.inf  # one -inf among finite values
    x[..., 5] = 1e30  # huge but equal values
    _close(exe.run({"x": x})["y"], lookup(op).reference([x], {"axis": axis, "_opset": 13})[0])
    assert used
