"""Sizes rounded through floats (`ceil(H / 2.0) * 2` as MobileViT exports it: Cast to float, Div, Ceil, Mul,
Cast back) stay exact dim expressions, checked by brute force against numpy's float arithmetic.

The proof in `ops/elementwise._Quotient` (exact for num < 2**p) is what these tests check; sizes past that bound
break an assumption, and a call with one is served by a build at its exact shape (numpy's rounding, not ours).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from opgraph import infer

import dynshape as ds

F32_EXACT = 2 ** 24


def _rounding_graph(rounding: str, den: float, dtype: int = TensorProto.FLOAT, mul: float | None = None):
    """n -> Cast(dtype) -> Div den -> rounding -> [Mul mul] -> Cast int64."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Cast", ["n"], ["f"], to=dtype), helper.make_node("Div", ["f", "den"], ["q"]),
             helper.make_node(rounding, ["q"], ["r"])]
    last = "r"
    if mul is not None:
        nodes.append(helper.make_node("Mul", ["r", "k"], ["m"]))
        last = "m"
    nodes.append(helper.make_node("Cast", [last], ["y"], to=TensorProto.INT64))
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    consts = {"zero": np.array(0, np.int64), "den": np.array(den, np_dtype)}
    if mul is not None:
        consts["k"] = np.array(mul, np_dtype)
    return infer(nodes, {"x": (TensorProto.UINT8, ["n"])}, consts)


@settings(max_examples=300, deadline=None)
@given(n=st.one_of(st.integers(0, 4096), st.integers(0, F32_EXACT - 1)), den=st.integers(1, 5000),
       rounding=st.sampled_from(["Ceil", "Floor"]))
def test_float32_rounded_quotient_equals_numpy(n: int, den: int, rounding: str) -> None:
    g = _rounding_graph(rounding, float(den))
    value = g.types["y"].value
    assert value is not None and value.dtype == object, "the size should stay a dim expression"
    got = value.item().evaluate({"n": n}) if ds.is_expr(value.item()) else int(value.item())
    fn = np.ceil if rounding == "Ceil" else np.floor
    want = int(fn(np.float32(n) / np.float32(den)))
    assert got == want, (n, den, rounding)


def test_the_exactness_bound_is_assumed_not_required() -> None:
    g = _rounding_graph("Ceil", 3.0)
    assumed = [f for f in g.signature.facts if f.kind == "assume"]
    assert any(f.check is not None and f.check.evaluate({"n": F32_EXACT - 1}) for f in assumed)
    assert any(f.check is not None and not f.check.evaluate({"n": F32_EXACT}) for f in assumed)
    assert not [f for f in g.signature.facts if f.kind == "require"], "large sizes are valid, not refused"


def test_quotients_do_not_leak_into_other_arithmetic() -> None:
    """ceil(n / 3.0) * 3 is a dim (the Ceil made it one); (n / 3.0) * 3 is not: float rounding may differ."""
    assert _rounding_graph("Ceil", 3.0, mul=3.0).types["y"].value is not None
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["f", "den"], ["q"]), helper.make_node("Mul", ["q", "den"], ["m"]),
             helper.make_node("Equal", ["q", "den"], ["e"])]
    g = infer(nodes, {"x": (TensorProto.UINT8, ["n"])}, {"den": np.array([3.0], np.float32)})
    assert g.types["m"].value is None and g.types["e"].value is None


def test_float16_bound_is_its_own() -> None:
    g = _rounding_graph("Floor", 2.0, dtype=TensorProto.FLOAT16)
    assumed = [f.check for f in g.signature.facts if f.kind == "assume" and f.check is not None]
    assert any(c.evaluate({"n": 2047}) and not c.evaluate({"n": 2049}) for c in assumed)


@pytest.mark.parametrize("n,den", [(7, 3.0), (2048, 1.0), (2049, 1.0), (4099, 1.0), (4099, 3.0), (6001, 7.0)])
def test_compiled_rounding_matches_numpy_on_both_sides_of_the_float16_bound(n: int, den: float) -> None:
    """float16 holds integers exactly only to 2048: past it the call breaks the assumption and runs on an
    exact-shape build, whose result is numpy's float16 rounding (2049 -> 2048, not the exact 2049)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["f"], to=TensorProto.FLOAT16),
             helper.make_node("Div", ["f", "den"], ["q"]), helper.make_node("Ceil", ["q"], ["r"]),
             helper.make_node("Cast", ["r"], ["i"], to=TensorProto.INT64),
             helper.make_node("ConstantOfShape", ["i"], ["y"],
                              value=numpy_helper.from_array(np.array([1], np.uint8)))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              [numpy_helper.from_array(np.array([den], np.float16), "den")])
    exe = ds.compile(ds.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])))
    got = exe.run({"x": np.zeros(n, np.uint8)})["y"]
    want = int(np.ceil(np.float16(n) / np.float16(den)))
    assert got.shape == (want,)
    if (n, den) == (2049, 1.0):
        assert want != n  # the case where an exact dim expression would be wrong


@pytest.mark.parametrize("dtype,start,delta", [(TensorProto.FLOAT, 0.0, 1.0), (TensorProto.FLOAT, 3.0, 2.0),
                                               (TensorProto.DOUBLE, 0.0, 1.0), (TensorProto.DOUBLE, -2.0, 3.0)])
def test_float_range_over_a_size_has_a_symbolic_length(dtype: int, start: float, delta: float) -> None:
    """YOLO's anchor grid, arange(start, float(w), delta): its length is a dim, and the values match numpy,
    empty and non-empty."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Cast", ["n"], ["f"], to=dtype), helper.make_node("Range", ["a", "f", "d"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, ["n"])],
                              [helper.make_tensor_value_info("y", dtype, None)],
                              [numpy_helper.from_array(np.array(0, np.int64), "zero"),
                               numpy_helper.from_array(np.array(start, np_dtype), "a"),
                               numpy_helper.from_array(np.array(delta, np_dtype), "d")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    g = ds.load_onnx(model)
    (length,) = g.types["y"].shape
    assert ds.is_expr(length) and {str(v) for v in length.free_symbols} == {"n"}, length
    exe = ds.compile(g)
    for n in (0, 1, 5, 2047, 2049, 2051, 4099):
        got = exe.run({"x": np.zeros(n, np.uint8)})["y"]
        lim = np_dtype.type(n)
        want = np.arange(np_dtype.type(start), lim, np_dtype.type(delta), dtype=np_dtype)
        count = max(int(np.ceil((float(lim) - start) / delta)), 0)
        assert got.shape == (count,) and want.shape == (count,), (n, got.shape, want.shape)
        np.testing.assert_array_equal(got, want)
