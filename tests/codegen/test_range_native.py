"""Range's native lowering (codegen/lower/range_native.py, ds_range_int in csrc/ds_program.c): integer Ranges whose
start and delta are known when the plan is bound (constants, values computed from the key) run in C, exact against
the op's reference (numpy's start + arange(n) * delta, wrapping in the output's width), the limit read where it lies
(its count is the output's length); float Ranges and bounds read at run time keep the reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen.lower import range_native
from dynshape.ir import opdef

_T = {np.int64: TensorProto.INT64, np.int32: TensorProto.INT32, np.float32: TensorProto.FLOAT}


def _model(dtype, start: int, delta: int, scale: int = 1):
    """y = Range(start, scale * n + start, delta) + 0 for an input of length n: the limit a value of the key."""
    n = helper.make_node
    inits = [numpy_helper.from_array(np.array(v, dtype), k) for k, v in
             (("start", start), ("delta", delta), ("scale", scale), ("zero", 0))]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "i0"))
    nodes = [n("Shape", ["x"], ["s"]), n("Gather", ["s", "i0"], ["n1"]), n("Squeeze", ["n1"], ["n"]),
             n("Cast", ["n"], ["nc"], to=_T[dtype]), n("Mul", ["nc", "scale"], ["ns"]),
             n("Add", ["ns", "start"], ["limit"]), n("Range", ["start", "limit", "delta"], ["r"], name="rng"),
             n("Add", ["r", "zero"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                          [helper.make_tensor_value_info("y", _T[dtype], None)], inits)
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.fixture
def calls(spy_native) -> list:
    return spy_native(range_native, "ds_range_int")


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("start,delta,scale", [(0, 1, 1), (5, 3, 2), (7, -2, -3), (-4, 1, 1)])
def test_integer_ranges_run_in_c_and_equal_the_reference(calls, dtype, start, delta, scale):
    ref = opdef.lookup("Range").reference
    for strategy in ("generic", "auto"):
        exe = ds.compile(_model(dtype, start, delta, scale), strategy=strategy)
        for n in (0, 1, 5, 17, 6, 40, 17):  # new keys, moved bucket plans, a key seen again
            limit = scale * n + start
            want = ref([np.array(start, dtype), np.array(limit, dtype), np.array(delta, dtype)], {})[0]
            got = exe.run({"x": np.zeros(n, np.float32)})["y"]
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
    assert calls


def test_an_int32_limit_past_its_type_is_refused_by_name():
    """A limit the shapes put past int32's top: numpy would wrap it (and the Range's length inferred from it
    would not hold), so the call is refused with a ConstraintViolation, not a raw OverflowError; the next key runs."""
    top = int(np.iinfo(np.int32).max) - 3
    exe = ds.compile(_model(np.int32, top, 1))
    np.testing.assert_array_equal(exe.run({"x": np.zeros(3, np.float32)})["y"], np.arange(top, top + 3))
    with pytest.raises(ds.ConstraintViolation, match="does not fit its integer type"):
        exe.run({"x": np.zeros(8, np.float32)})
    np.testing.assert_array_equal(exe.run({"x": np.zeros(2, np.float32)})["y"], np.arange(top, top + 2))


def test_a_float_range_keeps_the_reference(calls):
    exe = ds.compile(_model(np.float32, 0, 1))
    np.testing.assert_array_equal(exe.run({"x": np.zeros(6, np.float32)})["y"], np.arange(6, dtype=np.float32))
    assert not calls
