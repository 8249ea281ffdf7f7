"""ScatterND / ScatterElements / Scatter through their native lowering (codegen/lower/scatter.py,
csrc/ds_scatter.c), exact against the ops' references: data of any plain dtype, int32 / int64 indices with
negative and repeated ones (a later duplicate wins; add / mul apply one update after the other, as numpy's
ufunc.at), every axis. An index out of range raises naming the node and writes nothing; max / min stay on the
reference (numpy's NaN and signed-zero rules), said by explain."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.codegen.lower import scatter
from dynshape.errors import DynshapeError
from dynshape.ir.opdef import lookup

RNG = np.random.default_rng(11)
_ONNX = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int64: TensorProto.INT64,
         np.int32: TensorProto.INT32, np.uint8: TensorProto.UINT8, np.float16: TensorProto.FLOAT16,
         np.bool_: TensorProto.BOOL}
NUMERIC = [np.float32, np.float64, np.int64, np.int32]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list:
    """The scatter entry points the binds looked up (the reference computes the same values: this shows the C
    ran)."""
    got: list = []
    lib = scatter.LIBRARY.load()

    class Proxy:
        def __getattr__(self, name: str):
            got.append(name)
            return getattr(lib, name)

    monkeypatch.setattr(scatter, "LIBRARY", SimpleNamespace(try_load=lambda: Proxy()))
    return got


def _model(op: str, dtype, idx_dtype, ranks: tuple[int, int, int], opset: int = 18, **attrs):
    node = helper.make_node(op, ["x", "i", "u"], ["y"], name="sc", **attrs)
    ins = [helper.make_tensor_value_info(n, t, [f"{n}{k}" for k in range(r)])
           for n, t, r in zip("xiu", (_ONNX[dtype], _ONNX[idx_dtype], _ONNX[dtype]), ranks)]
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", _ONNX[dtype], None)])
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))


def _data(dtype, shape) -> np.ndarray:
    if dtype == np.bool_:
        return RNG.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)  # the extremes too: add and mul wrap as numpy's
        return RNG.choice(np.array([info.min, info.max, info.min // 2 + 3, 0, 1, 2, 5], dtype), shape)
    return (RNG.standard_normal(shape) * 4).astype(dtype)


def _reductions(dtype) -> list[str]:
    return ["none", "add", "mul"] if dtype in NUMERIC else ["none"]


@pytest.mark.parametrize("dtype", [*NUMERIC, np.uint8, np.float16, np.bool_])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("axis,cases", [
    (1, [((2, 7), (2, 3)), ((3, 5), (3, 5)), ((1, 4), (1, 9))]),  # BART's: (batch, seq) ids, (batch, 1) indices
    (0, [((4, 3, 2), (6, 3, 2)), ((5, 2, 3), (1, 1, 3))]),
    (-1, [((2, 3, 7), (2, 3, 4)), ((1, 2, 1), (1, 1, 5))]),
])
def test_scatter_elements_native_and_exact(calls, dtype, idx_dtype, axis, cases):
    for reduction in _reductions(dtype):
        attrs = {"axis": axis} if reduction == "none" else {"axis": axis, "reduction": reduction}
        exe = ds.compile(_model("ScatterElements", dtype, idx_dtype, (len(cases[0][0]),) * 3, **attrs))
        assert [s.how for s in exe.generic.steps] == ["native"], exe.explain_build()["uncompiled"]
        for xs, ids in cases:
            x, u = _data(dtype, xs), _data(dtype, ids)
            n = xs[axis]
            i = RNG.integers(-n, n, ids).astype(idx_dtype)  # negative and repeated ones
            want = lookup("ScatterElements").reference([x, i, u], attrs)[0]
            got = exe.run({"x": x, "i": i, "u": u})["y"]
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
    assert "ds_scatter_elements" in calls


@pytest.mark.parametrize("dtype", [*NUMERIC, np.uint8, np.bool_])
@pytest.mark.parametrize("case", [
    ((4, 6), (3, 1), (3, 6)),  # whole rows
    ((4, 6), (5, 2), (5,)),  # single elements
    ((2, 3, 4), (2, 2, 2), (2, 2, 4)),  # a batch of index tuples, slices of the last axis
    ((2, 16), (2, 15, 2), (2, 15)),  # BART's shift_tokens_right: (batch, seq - 1) positions of (batch, seq) ids
])
def test_scatter_nd_native_and_exact(calls, dtype, case):
    xs, ids, us = case
    k = ids[-1]
    for reduction in _reductions(dtype):
        attrs = {} if reduction == "none" else {"reduction": reduction}
        exe = ds.compile(_model("ScatterND", dtype, np.int64, (len(xs), len(ids), len(us)), **attrs))
        assert [s.how for s in exe.generic.steps] == ["native"], exe.explain_build()["uncompiled"]
        x, u = _data(dtype, xs), _data(dtype, us)
        i = np.stack([RNG.integers(-d, d, ids[:-1]) for d in xs[:k]], -1).astype(np.int64)
        want = lookup("ScatterND").reference([x, i, u], attrs)[0]
        got = exe.run({"x": x, "i": i, "u": u})["y"]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert "ds_scatter_nd" in calls


def test_the_old_scatter_is_scatter_elements(calls):
    exe = ds.compile(_model("Scatter", np.float32, np.int64, (2, 2, 2), opset=9, axis=1))
    x, u = _data(np.float32, (3, 5)), _data(np.float32, (3, 2))
    i = np.array([[0, 4], [1, 1], [3, 2]], np.int64)
    np.testing.assert_array_equal(exe.run({"x": x, "i": i, "u": u})["y"],
                                  lookup("ScatterElements").reference([x, i, u], {"axis": 1})[0])
    assert calls == ["ds_scatter_elements"]


@pytest.mark.parametrize("op,bad", [("ScatterElements", 5), ("ScatterElements", -6), ("ScatterND", 4),
                                    ("ScatterND", 2**40)])
def test_an_index_out_of_range_raises_naming_the_node_and_writes_nothing(calls, op, bad):
    exe = ds.compile(_model(op, np.float32, np.int64, (2, 2, 2), axis=1) if op == "ScatterElements"
                     else _model(op, np.float32, np.int64, (2, 2, 2)))
    x = _data(np.float32, (4, 5))
    u = _data(np.float32, (4, 2) if op == "ScatterElements" else (4, 5))
    i = np.zeros((4, 2) if op == "ScatterElements" else (4, 1), np.int64)
    first = exe.run({"x": x, "i": i, "u": u})["y"].copy()
    i[2, -1] = bad
    with pytest.raises(DynshapeError, match="sc.*out of range.*nothing was written"):
        exe.run({"x": x, "i": i, "u": u})
    i[2, -1] = 0
    np.testing.assert_array_equal(exe.run({"x": x, "i": i, "u": u})["y"], first)  # the next call runs as before
    assert calls


def test_max_and_min_stay_on_the_reference_and_explain_says_why():
    exe = ds.compile(_model("ScatterElements", np.float32, np.int64, (2, 2, 2), axis=1, reduction="max"))
    [unc] = exe.explain_build()["uncompiled"]
    assert unc["runs"] == "reference" and "reduction 'max'" in unc["why"]
    x = np.float32([[0.0, np.nan, 1.0]])
    i = np.array([[0, 0, 1]], np.int64)
    u = np.float32([[-0.0, 2.0, 3.0]])
    np.testing.assert_array_equal(exe.run({"x": x, "i": i, "u": u})["y"],
                                  lookup("ScatterElements").reference([x, i, u], {"axis": 1, "reduction": "max"})[0])
