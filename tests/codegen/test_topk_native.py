"""TopK runs natively (codegen/row_kernels.py, csrc/ds_rows.c's ds_topk): each slice's indices merge-sorted, values
and indices exactly the reference's — ties by ascending index, a NaN above every number, largest and smallest,
any axis, k from 0 to the axis' size, float32 / int32 / int64. A k that is not a constant stays on the reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.ir.opdef import lookup

RNG = np.random.default_rng(8)
ELEM = {np.float32: TensorProto.FLOAT, np.int32: TensorProto.INT32, np.int64: TensorProto.INT64}


def _model(dtype: type, rank: int, axis: int, largest: int, k: int | None):
    """k a constant input (k=None: a graph input, only known per call)."""
    inputs = [helper.make_tensor_value_info("x", ELEM[dtype], [f"d{i}" for i in range(rank)])]
    inits = []
    if k is None:
        inputs.append(helper.make_tensor_value_info("k", TensorProto.INT64, [1]))
    else:
        inits.append(numpy_helper.from_array(np.array([k], np.int64), "k"))
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("v", ELEM[dtype], None),
                                                helper.make_tensor_value_info("i", TensorProto.INT64, None)],
                          initializer=inits)
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def _input(dtype: type, shape: tuple) -> np.ndarray:
    """Few distinct values (ties everywhere); floats with NaN, infinities and both zeros among them."""
    if dtype is np.float32:
        pool = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.0, 3.0, 1.5], np.float32)
    else:
        pool = np.array([5, -3, 0, 5, 7, -3, np.iinfo(dtype).max, np.iinfo(dtype).min], dtype)
    return RNG.choice(pool, size=shape)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis,shape,ks", [(-1, (3, 17), [0, 1, 5, 17]), (0, (9, 4), [3, 9]),
                                           (1, (2, 33, 5), [1, 16, 33])])
def test_topk_is_native_and_exact(spy_row_kernels, dtype, largest, axis, shape, ks):
    used = spy_row_kernels
    for k in ks:
        exe = ds.compile(_model(dtype, len(shape), axis, largest, k))
        assert not [u for u in exe.explain_build()["uncompiled"] if u["op"] == "TopK" and u["runs"] != "native"]
        for s in (shape, tuple(d + 1 if i != axis % len(shape) else d for i, d in enumerate(shape))):
            x = _input(dtype, s)
            got = exe.run({"x": x})
            want = lookup("TopK").reference([x, np.array([k], np.int64)], {"axis": axis, "largest": largest})
            np.testing.assert_array_equal(got["i"], want[1])
            np.testing.assert_array_equal(got["v"], want[0])  # (NaN equals NaN here)
            assert np.array_equal(np.signbit(got["v"]), np.signbit(want[0])) if dtype is np.float32 else True
    assert "ds_topk_args" in used


def test_a_k_known_only_per_call_stays_on_the_reference():
    exe = ds.compile(_model(np.float32, 2, -1, 1, None))
    why = [u["why"] for u in exe.explain_build()["uncompiled"] if u["op"] == "TopK"]
    assert why and "k is not a constant" in why[0]
    x = _input(np.float32, (2, 6))
    got = exe.run({"x": x, "k": np.array([3], np.int64)})
    want = lookup("TopK").reference([x, np.array([3], np.int64)], {"axis": -1, "largest": 1})
    np.testing.assert_array_equal(got["i"], want[1])
