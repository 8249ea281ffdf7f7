"""Floor, Ceil and float <-> integer Casts compiled into elementwise kernels (codegen/lower/rounding.py), exactly
as the reference (numpy's astype on x86-64) computes them: truncation in range, the integer type's minimum for
NaN, infinities and values past its range, round-to-nearest-even from integers to float32."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds

F, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
EDGES = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2147483520.0, -2147483648.0, 2147483648.0, -2147483904.0,
                  9.3e18, -9.3e18, 9.2233715e18, -9.223372e18, -2.5, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, 7.999999,
                  -7.999999, 1e-30, 16777217.0, 123456.78], np.float32)


def _run(nodes: list, out_type: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, set]:
    g = helper.make_graph(nodes, "r", [helper.make_tensor_value_info("x", F, ["n"])],
                          [helper.make_tensor_value_info("y", out_type, ["n"])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    graph = ds.load_onnx(model)
    exe = ds.compile(graph)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns on NaN -> int
        want = graph.run({"x": x})["y"]
        got = exe.run({"x": x})["y"]
    outside = {u["op"] for u in exe.explain_build()["uncompiled"] if u["runs"] != "native"}
    return got, want, outside


@pytest.mark.parametrize("to,name", [(I32, "int32"), (I64, "int64")])
@pytest.mark.parametrize("n", [len(EDGES), 1000])
def test_float_to_integer_cast_matches_numpy(to: int, name: str, n: int) -> None:
    rng = np.random.default_rng(n)
    x = np.resize(EDGES, n) if n == len(EDGES) else np.concatenate(
        [EDGES, (rng.standard_normal(n - len(EDGES)) * 10.0 ** rng.integers(0, 20, n - len(EDGES)))
         .astype(np.float32)])
    got, want, outside = _run([helper.make_node("Cast", ["x"], ["y"], to=to)], to, x)
    assert got.dtype == np.dtype(name) and np.array_equal(got, want), (x[got != want], got[got != want])
    assert "Cast" not in outside


@pytest.mark.parametrize("op", ["Floor", "Ceil"])
def test_floor_ceil_then_cast_and_back(op: str) -> None:
    """The quantized bias's chain: Cast(Floor(x), int32), then back to float32 through an int32 sum."""
    x = np.concatenate([EDGES, np.linspace(-5, 5, 101, dtype=np.float32)])
    nodes = [helper.make_node(op, ["x"], ["f"]), helper.make_node("Cast", ["f"], ["i"], to=I32),
             helper.make_node("Add", ["i", "i"], ["s"]), helper.make_node("Cast", ["s"], ["y"], to=F)]
    got, want, outside = _run(nodes, F, x)
    assert np.array_equal(got, want, equal_nan=True), (x[got != want], got[got != want], want[got != want])
    assert not {op, "Cast"} & outside


def test_int64_to_float_rounds_to_nearest_even() -> None:
    big = np.array([2**24 + 1, 2**24 + 3, -(2**53) - 1, 2**62 + 2**38, 7, -7], np.int64)
    nodes = [helper.make_node("Cast", ["x"], ["i"], to=I64), helper.make_node("Add", ["i", "b"], ["j"]),
             helper.make_node("Cast", ["j"], ["y"], to=F)]
    g = helper.make_graph(nodes, "r", [helper.make_tensor_value_info("x", F, ["n"]),
                                       helper.make_tensor_value_info("b", I64, ["n"])],
                          [helper.make_tensor_value_info("y", F, ["n"])])
    graph = ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    exe = ds.compile(graph)
    feed = {"x": np.zeros(len(big), np.float32), "b": big}
    assert np.array_equal(exe.run(feed)["y"], graph.run(feed)["y"])


B = TensorProto.BOOL
_ONNX = {"float32": F, "int32": I32, "int64": I64, "bool": B}
_VALUES = {  # each type's edges: zero (and -0.0), signs, values past int32's range (wrapped by int64 -> int32)
    "float32": EDGES,
    "int64": np.array([0, 1, -1, 2**31 - 1, 2**31, -(2**31) - 1, 2**40 + 5, -(2**62), 2**63 - 1, -(2**63), 7, 256],
                      np.int64),
    "int32": np.array([0, 1, -1, 2**31 - 1, -(2**31), 65536, -7, 255, 256], np.int32),
    "bool": np.array([True, False, True, True, False], np.bool_),
}


@pytest.mark.parametrize("src,dst", [(a, b) for a in ("float32", "int64", "int32", "bool")
                                     for b in ("bool", "int64", "int32", "float32")
                                     if a != b and not (a == "float32" and b != "bool")])
def test_casts_among_int_bool_and_float_match_numpy(src: str, dst: str) -> None:
    """The casts a mask or an index takes (an attention mask int64 -> bool, a bool mask -> float32, int64 <-> int32
    indices), in a kernel with an elementwise op after them so they fuse; exact against numpy's astype."""
    x = _VALUES[src]
    after = {"bool": "Not", "float32": "Neg"}.get(dst, "Add")  # (an integer plus a fed zero: no overflow)
    nodes = [helper.make_node("Cast", ["x"], ["c"], to=_ONNX[dst]),
             helper.make_node(after, ["c", "z"] if after == "Add" else ["c"], ["y"])]
    ins = [helper.make_tensor_value_info("x", _ONNX[src], ["n"])]
    if after == "Add":
        ins.append(helper.make_tensor_value_info("z", _ONNX[dst], ["n"]))
    g = helper.make_graph(nodes, "r", ins, [helper.make_tensor_value_info("y", _ONNX[dst], ["n"])])
    graph = ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    exe = ds.compile(graph)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        cast = x.astype(dst)
        want = ~cast if dst == "bool" else -cast if dst == "float32" else cast
    for n in (len(x), 1):  # (a symbolic length: the kernel is built for every n)
        feed = {"x": x[:n], **({"z": np.zeros(n, dst)} if after == "Add" else {})}
        got = exe.run(feed)["y"]
        assert got.dtype == np.dtype(dst) and np.array_equal(got, want[:n]), (x[:n], got, want[:n])
    assert not {"Cast", after} & {u["op"] for u in exe.explain_build()["uncompiled"]}
