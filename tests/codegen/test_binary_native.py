"""Native float32 Add / Sub / Mul / Div for a broadcast only the call's shape decides (codegen/lower/
binary_native.py, ds_binary_f32 in csrc/ds_program.c): dims inference cannot prove equal nor 1 (ppocr_det's FPN
adds, ceil(H / 16) against 2 * ceil(H / 32)). Bit for bit numpy's result whichever way the key broadcasts; a shape
that does not broadcast still raises."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.codegen.lower import binary_native
from dynshape.errors import DynshapeError

RNG = np.random.default_rng(3)
F = TensorProto.FLOAT
NP = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}


def _model(op: str, xdims: list, ydims: list):
    nodes = [helper.make_node(op, ["x", "y"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, xdims),
                                       helper.make_tensor_value_info("y", F, ydims)],
                          [helper.make_tensor_value_info("z", F, None)])
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.fixture
def calls(spy_native) -> list:
    return spy_native(binary_native, "ds_binary_f32")


@pytest.mark.parametrize("op", list(NP))
def test_a_broadcast_decided_per_call(calls, op):
    exe = ds.compile(_model(op, ["n", 96, "a", "b"], ["n", 96, "c", "d"]))
    assert [s.how for s in exe.generic.steps] == ["native"], exe.explain_build()["uncompiled"]
    for xs, ys in [((1, 96, 4, 5), (1, 96, 4, 5)), ((2, 96, 1, 1), (2, 96, 2, 3)), ((1, 96, 2, 1), (1, 96, 1, 7)),
                   ((3, 96, 5, 2), (3, 96, 5, 1)), ((1, 96, 0, 3), (1, 96, 1, 3))]:
        x = RNG.standard_normal(xs).astype(np.float32)
        y = RNG.standard_normal(ys).astype(np.float32)
        y.reshape(-1)[:1] = 0.0  # Div: an infinity, as numpy's
        with np.errstate(divide="ignore"):
            want = NP[op](x, y)
        got = exe.run({"x": x, "y": y})["z"]
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    assert calls


def test_ranks_differ_and_a_mismatch_raises(calls):
    exe = ds.compile(_model("Add", ["a", "b", "c"], ["d"]))
    for xs, ys in [((2, 3, 4), (4,)), ((2, 3, 4), (1,)), ((2, 3, 1), (6,))]:
        x = RNG.standard_normal(xs).astype(np.float32)
        y = RNG.standard_normal(ys).astype(np.float32)
        np.testing.assert_array_equal(exe.run({"x": x, "y": y})["z"], x + y)
    with pytest.raises(DynshapeError):
        exe.run({"x": np.zeros((2, 3, 4), np.float32), "y": np.zeros(3, np.float32)})
    assert calls


def test_merged_dims():
    """A bias add over (N, C, H, W): (N, C, H * W), the bias's strides 0, 1, 0; two contiguous operands: flat."""
    assert binary_native._merged((2, 3, 4, 5), [60, 20, 5, 1], [0, 1, 0, 0]) == ([2, 3, 20], [60, 20, 1], [0, 1, 0])
    assert binary_native._merged((2, 3, 4), [12, 4, 1], [12, 4, 1]) == ([24], [1], [1])
    assert binary_native._merged((1, 1), [0, 0], [0, 0]) == ([1], [0], [0])
