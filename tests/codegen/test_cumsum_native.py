"""CumSum's native lowering (codegen/row_kernels.py, csrc/ds_rows.c): float32 / int32 / int64 over any axis given
as a constant input, `exclusive` and `reverse`; exact against the op's reference (integers wrap as numpy's do,
float32 sums in numpy's accumulate order). roberta's position ids were its corpus case."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.ir.opdef import lookup

RNG = np.random.default_rng(29)
_ONNX = {np.float32: TensorProto.FLOAT, np.int32: TensorProto.INT32, np.int64: TensorProto.INT64}


def _model(dtype, axis: int, rank: int, attrs: dict, axis_dtype=np.int64):
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], **attrs)
    dims = [f"d{i}" for i in range(rank)]
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", _ONNX[dtype], dims)],
                          [helper.make_tensor_value_info("y", _ONNX[dtype], None)],
                          [numpy_helper.from_array(np.array(axis, axis_dtype), "axis")])
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]))


def _data(dtype, shape):
    if dtype == np.float32:
        x = (RNG.standard_normal(shape) * 100).astype(np.float32)
        x.reshape(-1)[:1] = -0.0
        return x
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)  # sums that overflow and wrap


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
@pytest.mark.parametrize("axis,shapes", [(1, [(2, 16), (4, 1), (3, 300)]), (0, [(5, 3, 2), (1, 4, 4)]),
                                         (-2, [(2, 7, 33), (1, 1, 5)])])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_is_native_and_exact(spy_row_kernels, dtype, axis, shapes, exclusive, reverse):
    bound = spy_row_kernels
    attrs = {"exclusive": exclusive, "reverse": reverse}
    exe = ds.compile(_model(dtype, axis, len(shapes[0]), attrs, np.int32 if axis == 0 else np.int64))
    assert [s.how for s in exe.generic.steps] == ["native"], exe.explain_build()["uncompiled"]
    for shape in shapes:
        x = _data(dtype, shape)
        with np.errstate(over="ignore"):
            want = lookup("CumSum").reference([x, np.array(axis)], attrs)[0]
        got = exe.run({"x": x})["y"]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))  # -0.0 as the reference keeps it
    assert "ds_cumsum_args" in bound  # bound natively: no fallback to the reference at run time


def test_roberta_position_ids():
    """mask.cumsum(1) * mask + padding_idx over int64 token ids (roberta's embeddings)."""
    nodes = [helper.make_node("Equal", ["ids", "pad"], ["eq"]), helper.make_node("Not", ["eq"], ["m"]),
             helper.make_node("Cast", ["m"], ["mi"], to=TensorProto.INT64),
             helper.make_node("CumSum", ["mi", "one"], ["c"]), helper.make_node("Mul", ["c", "mi"], ["cm"]),
             helper.make_node("Add", ["cm", "pad"], ["pos"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
                          [helper.make_tensor_value_info("pos", TensorProto.INT64, None)],
                          [numpy_helper.from_array(np.array(1, np.int64), "pad"),
                           numpy_helper.from_array(np.array(1, np.int64), "one")])
    exe = ds.compile(ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])))
    assert not [u for u in exe.explain_build()["uncompiled"] if u["runs"] != "native"]
    for shape in [(1, 16), (4, 128), (2, 3)]:
        ids = RNG.integers(0, 5, shape)
        mask = (ids != 1).astype(np.int64)
        np.testing.assert_array_equal(exe.run({"ids": ids})["pos"], np.cumsum(mask, axis=1) * mask + 1)
