"""The elementwise rules for bool, comparison and integer ops, compiled, against the op's reference: exact,
with the values that differ between C and numpy when done naively (NaN in comparisons, integer overflow, an
int64 compared with a constant above float32's exact range)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.ir.opdef import lookup

BIG = 2**40 + 1  # not a float32: an int64 compared as float would equal its neighbours


COMPARE = ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]


def _floats(rng) -> np.ndarray:
    x = np.round(rng.standard_normal(500) * 3).astype(np.float32)  # many exact ties between the two operands
    return np.concatenate([x, np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, np.nan, 1.0, 2.0, 3.0, np.nan])])


def _ints(rng, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    x = rng.integers(-4, 4, 500).astype(dtype)
    near = [BIG - 1, BIG, BIG + 1] if dtype == np.int64 else [1, 2, 3]
    return np.concatenate([x, np.array([info.max, info.min, info.max, -1, info.min, 0, 3, *near], dtype)])


def _values(dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.float32:
        return _floats(rng)
    if dtype == np.bool_:
        return rng.integers(0, 2, 510).astype(np.bool_)
    return _ints(rng, dtype)


def _run(op: str, dtype, n_inputs: int, const: np.ndarray | None = None):
    """Compile the one-node model (every node compiled), run it, and return (got, the op's reference)."""
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    out = TensorProto.BOOL if op in COMPARE else et
    names = ["a", "b"][:n_inputs]
    fed = names if const is None else names[:1]  # a constant second operand is inlined as a literal
    inits = [] if const is None else [numpy_helper.from_array(const, "b")]
    g = helper.make_graph([helper.make_node(op, names, ["y"])], "g",
                          [helper.make_tensor_value_info(x, et, ["n"]) for x in fed],
                          [helper.make_tensor_value_info("y", out, None)], inits)
    graph = ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))
    exe = ds.compile(graph)
    assert not exe.explain_build()["uncompiled"], exe.explain_build()["uncompiled"]
    feed = {x: _values(dtype, k) for k, x in enumerate(fed)}
    args = [feed[x] if x in feed else const for x in names]
    return exe.run(feed)["y"], lookup(op).reference(args, {})[0]




@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
@pytest.mark.parametrize("op", COMPARE)
def test_comparisons_match_the_reference_exactly(op, dtype):
    got, want = _run(op, dtype, 2)
    assert got.dtype == np.bool_ and want.dtype == np.bool_
    assert np.array_equal(got, want)


def test_equal_of_bools():
    got, want = _run("Equal", np.bool_, 2)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("op", COMPARE)
def test_an_int64_compared_with_a_big_constant_is_not_rounded_to_float(op):
    got, want = _run(op, np.int64, 2, const=np.array(BIG, np.int64))
    assert np.array_equal(got, want)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical_ops(op):
    got, want = _run(op, np.bool_, 2)
    assert np.array_equal(got, want)


def test_not():
    got, want = _run("Not", np.bool_, 1)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
def test_integer_arithmetic_wraps_as_numpy(op, dtype):
    got, want = _run(op, dtype, 2)
    assert got.dtype == want.dtype == dtype
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_, np.float32])
def test_where_selects_integers_and_bools_in_the_kernel(dtype):
    """A masked_fill of token ids (BART's decoder inputs: Where(ids == -100, pad, ids) on int64) compiled, with a
    constant branch broadcast from a scalar, exact."""
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g = helper.make_graph([helper.make_node("Where", ["c", "k", "x"], ["y"])], "g",
                          [helper.make_tensor_value_info("c", TensorProto.BOOL, ["b", "n"]),
                           helper.make_tensor_value_info("x", et, ["b", "n"])],
                          [helper.make_tensor_value_info("y", et, None)],
                          [numpy_helper.from_array(_values(dtype, 3)[-1:].reshape(()), "k")])
    exe = ds.compile(ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])))
    assert not exe.explain_build()["uncompiled"], exe.explain_build()["uncompiled"]
    rng = np.random.default_rng(5)
    c, x = rng.integers(0, 2, (3, 170)).astype(np.bool_), _values(dtype, 4)[:510].reshape(3, 170)
    got = exe.run({"c": c, "x": x})["y"]
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.where(c, _values(dtype, 3)[-1], x))

