"""GatherElements' native lowering (codegen/lower/movement.py, ds_gather_elements in csrc/ds_program.c): any
axis, indices smaller than the data on the other axes, negative indices counted from the end as ONNX defines,
int32 / int64 indices, data of any plain dtype; exact against the op's reference. An index out of range is never
read: the call raises, naming the node."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.codegen.lower import movement
from dynshape.errors import DynshapeError
from dynshape.ir.opdef import lookup

RNG = np.random.default_rng(7)
_ONNX = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64, np.int32: TensorProto.INT32,
         np.uint8: TensorProto.UINT8, np.float16: TensorProto.FLOAT16, np.bool_: TensorProto.BOOL}


def _model(dtype, idx_dtype, axis: int, rank: int):
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis, name="ge")
    ins = [helper.make_tensor_value_info("x", _ONNX[dtype], [f"x{k}" for k in range(rank)]),
           helper.make_tensor_value_info("i", _ONNX[idx_dtype], [f"i{k}" for k in range(rank)])]
    g = helper.make_graph([node], "g", ins,
                          [helper.make_tensor_value_info("y", _ONNX[dtype], None)])
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))


def _data(dtype, shape):
    return (RNG.standard_normal(shape) * 100).astype(dtype)


@pytest.fixture
def calls(spy_native) -> list:
    return spy_native(movement, "ds_gather_elements")


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.float16, np.bool_])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("axis,cases", [
    (1, [((2, 16), (2, 16)), ((3, 5), (2, 9))]),  # roberta's; indices longer on the axis, shorter on the other
    (0, [((4, 3, 2), (6, 3, 2)), ((5, 2, 3), (1, 1, 3))]),
    (-1, [((2, 3, 7), (2, 3, 4)), ((1, 2, 1), (1, 1, 5))]),
    (-2, [((2, 9, 3), (2, 4, 2))]),
])
def test_gather_elements_native_and_exact(calls, dtype, idx_dtype, axis, cases):
    exe = ds.compile(_model(dtype, idx_dtype, axis, len(cases[0][0])))
    assert [s.how for s in exe.generic.steps] == ["native"], exe.explain_build()["uncompiled"]
    for xs, ids in cases:
        x = _data(dtype, xs)
        n = xs[axis]
        i = RNG.integers(-n, n, ids).astype(idx_dtype)  # negative ones too
        want = lookup("GatherElements").reference([x, i], {"axis": axis})[0]
        got = exe.run({"x": x, "i": i})["y"]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert calls


@pytest.mark.parametrize("bad", [3, -4, 2**40])
def test_an_index_out_of_range_raises_naming_the_node(calls, bad):
    exe = ds.compile(_model(np.float32, np.int64, 1, 2))
    x = _data(np.float32, (2, 3))
    i = np.zeros((2, 5), np.int64)
    np.testing.assert_array_equal(exe.run({"x": x, "i": i})["y"], x[:, [0] * 5])
    i[1, 2] = bad
    with pytest.raises(DynshapeError, match="ge.*out of range"):
        exe.run({"x": x, "i": i})
    assert calls
