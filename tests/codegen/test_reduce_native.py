"""ReduceSum / Mean / Max / Min / L2 / SumSquare / L1 over any consecutive axes run natively (codegen/row_kernels.py,
csrc/ds_rows.c's ds_reduce_f32): the last axes as contiguous rows, middle ones as strided rows vectorised over the
inner positions (magika's jax2tf LayerNorm sums over axis 1 of (batch, 512, 256), its softmax's max over the
logits), where no generated kernel (a global pool's reduction) takes them first. Against the op's reference
within float32 tolerance, NaN / infinite lanes and empty slices as the reference gives them; axes that are not
consecutive stay on the reference, and say so in `explain`."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.ir.opdef import lookup

RNG = np.random.default_rng(5)


def _model(op: str, axes: list[int] | None, keepdims: int, rank: int, opset: int):
    """axes as an attribute below opset 18 (ReduceSum: 13), as a constant input from there."""
    as_input = axes is not None and (opset >= 18 or (op == "ReduceSum" and opset >= 13))
    inputs, inits, attrs = ["x"], [], {"keepdims": keepdims}
    if as_input:
        inputs.append("axes")
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
    elif axes is not None:
        attrs["axes"] = axes
    node = helper.make_node(op, inputs, ["y"], **attrs)
    dims = [f"d{i}" for i in range(rank)]
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))


def _reference(op: str, x: np.ndarray, axes: list[int] | None, keepdims: int) -> np.ndarray:
    return lookup(op).reference([x], {"keepdims": keepdims, **({} if axes is None else {"axes": axes})})[0]


def _close(got: np.ndarray, want: np.ndarray, n: int) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_array_equal(np.signbit(got[np.isinf(want)]), np.signbit(want[np.isinf(want)]))
    fin = np.isfinite(want)
    # a sum of n terms of magnitude <= 6 * 4 (the inputs' scale) in another order: float32 rounding grows with n
    scale = 24.0 * max(1, n)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=2e-7 * scale)


def _generated(exe) -> bool:  # noqa: ANN001
    """Whether a generated kernel (the pool kernels' global reductions) took the node instead."""
    return all(type(s).__name__ == "KernelStep" for s in exe.generic.steps)


CASES = [  # axes, keepdims, opset, shapes seen by one build
    ([1], 0, 18, [(2, 512, 256), (1, 3, 70), (3, 1, 1)]),  # magika's LayerNorm sums: a middle axis
    ([-1], 1, 13, [(4, 9, 33), (1, 1, 1)]),  # the last axis: rows
    ([1, 2], 1, 13, [(2, 5, 6, 7), (1, 2, 3, 130)]),  # two middle axes
    ([0], 0, 13, [(5, 3), (1, 130)]),  # the first axis: outer 1
    (None, 0, 13, [(3, 4, 5), (2, 1, 2)]),  # every axis
    ([2, 1, 3], 0, 18, [(2, 3, 4, 5)]),  # unsorted
]


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("axes,keepdims,opset,shapes", CASES)
def test_reduce_over_consecutive_axes_is_native(spy_row_kernels, op, axes, keepdims, opset, shapes):
    used = spy_row_kernels
    exe = ds.compile(_model(op, axes, keepdims, len(shapes[0]), opset))
    assert not [u for u in exe.explain_build()["uncompiled"] if u["runs"] != "native"]
    for shape in shapes:
        x = (RNG.standard_normal(shape) * 6).astype(np.float32)
        n = int(np.prod([shape[a] for a in (range(len(shape)) if axes is None else axes)]))
        _close(exe.run({"x": x})["y"], _reference(op, x, axes, keepdims), n)
    assert "ds_reduce_args" in used or _generated(exe)


@pytest.mark.parametrize("op", ["ReduceL2", "ReduceSumSquare", "ReduceL1"])
@pytest.mark.parametrize("axes,keepdims,opset,shapes", CASES)
def test_norms_and_sums_of_squares_over_consecutive_axes_are_native(spy_row_kernels, op, axes, keepdims, opset,
                                                                      shapes):
    """ReduceL2 (ConvNeXt V2's global response norm: each channel's map's norm), ReduceSumSquare, ReduceL1: sums of
    positive terms, so float32's error in another order is relative, at most n roundings."""
    exe = ds.compile(_model(op, axes, keepdims, len(shapes[0]), opset))
    assert not [u for u in exe.explain_build()["uncompiled"] if u["runs"] != "native"]
    for shape in shapes:
        x = (RNG.standard_normal(shape) * 6).astype(np.float32)
        n = int(np.prod([shape[a] for a in (range(len(shape)) if axes is None else axes)]))
        got, want = exe.run({"x": x})["y"], _reference(op, x, axes, keepdims)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6 + 1.2e-7 * n, atol=0)
    assert "ds_reduce_args" in spy_row_kernels


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceL1"])
@pytest.mark.parametrize("axes", [[1], [2]])
@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_nan_infinite_and_empty_slices_as_the_reference(spy_row_kernels, op, axes):
    used = spy_row_kernels
    exe = ds.compile(_model(op, axes, 0, 3, 18))
    x = RNG.standard_normal((4, 16, 70)).astype(np.float32)
    x[0, 3, 0] = np.nan  # a NaN in one slice (either axis)
    x[1, 5, 1] = np.inf
    x[2, :, :] = -np.inf  # whole slices of -inf
    x[3, 7, 4] = -np.inf
    x[:, :, 5] = 1e30
    _close(exe.run({"x": x})["y"], _reference(op, x, axes, 0), 70)
    empty = np.zeros((2, 0, 3) if axes == [1] else (2, 3, 0), np.float32)  # empty slices: 0, NaN, -inf, +inf
    _close(exe.run({"x": empty})["y"], _reference(op, empty, axes, 0), 1)
    assert used or _generated(exe)


def test_axes_that_are_not_consecutive_stay_on_the_reference():
    exe = ds.compile(_model("ReduceMax", [0, 2], 1, 3, 18))
    why = [u["why"] for u in exe.explain_build()["uncompiled"] if u["op"] == "ReduceMax"]
    assert why and "not consecutive" in why[0]
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(exe.run({"x": x})["y"], _reference("ReduceMax", x, [0, 2], 1))
