"""`ds.quantize_dynamic` (passes/quant.py): per-column int8 weights, per-token int8 activations, on the int8 kernel.

The kernel must compute exactly the op's definition (DynamicQuantizeMatMul with per_token=1, ops/dynquant.py), checked
on the C entry points against a numpy model written here; and the quantized model must stay close to the float one
(the accuracy is the point of an opt-in approximation): on a small MLP and, where it is exported, bert_small.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen import int8
from dynshape.ir.opdef import lookup
from dynshape.passes.quant import quantize_weights

NATIVE = int8.native_available()
TILES = (["ds_q8_block", "ds_q8_block_e"] if NATIVE else ["ds_q8_block_e"]) \
    + (["ds_q8_block_avx2"] if int8.avx2_tiles() else [])


def _numpy_model(x: np.ndarray, w8: np.ndarray, ws: np.ndarray) -> np.ndarray:
    """Per-token symmetric quantization and the product, independently of ops/dynquant.py."""
    out = np.zeros((x.shape[0], w8.shape[1]), np.float32)
    for i, row in enumerate(x):
        s = np.float32(np.abs(row).max()) / np.float32(127)
        q = np.zeros(row.shape, np.int64) if s == 0 else np.clip(np.rint(row / s), -127, 127).astype(np.int64)
        acc = (q @ w8.astype(np.int64)).astype(np.int32)
        out[i] = (acc.astype(np.float32) * ws) * s
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 40), k=st.integers(1, 200), n=st.integers(1, 70), zero_row=st.booleans(),
       seed=st.integers(0, 2**31))
def test_per_token_tiles_match_definition(m: int, k: int, n: int, zero_row: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 100, (m, 1))).astype(np.float32)
    if zero_row:
        x[m // 2] = 0
    w8, ws = quantize_weights((rng.standard_normal((k, n)) * 0.1).astype(np.float32))
    want = _numpy_model(x, w8, ws)
    zp = np.zeros(n, np.int32)
    ref = lookup("DynamicQuantizeMatMul", "dynshape").reference([x, w8, zp, ws], {"per_token": 1})[0]
    assert np.array_equal(ref, want)
    lib = int8.LIBRARY.load()
    bp = int8.pack_q8(w8)
    for tile in TILES:
        act = lib.ds_q8_quantize_tokens(x.ctypes.data, m, k)
        out = np.full((m, n), np.nan, np.float32)
        for q in range(-(-n // 32)):
            getattr(lib, tile)(act, bp.ctypes.data, out.ctypes.data, n, 0, m, q, n, k, zp.ctypes.data, ws.ctypes.data)
        assert np.array_equal(out, want), tile


def test_weights_per_column() -> None:
    w = np.array([[1.0, 0.0, -0.5], [-2.54, 0.0, 0.25]], np.float32)
    w8, s = quantize_weights(w)
    f = np.float32
    assert np.array_equal(s, np.array([f(2.54) / f(127), 1.0, f(0.5) / f(127)], np.float32))
    assert w8[1, 0] == -127 and w8[0, 2] == -127 and not w8[:, 1].any()


def _mlp(k: int = 64, hidden: int = 96, n: int = 48):
    rng = np.random.default_rng(7)
    w1 = (rng.standard_normal((k, hidden)) / np.sqrt(k)).astype(np.float32)
    w2 = (rng.standard_normal((n, hidden)) / np.sqrt(hidden)).astype(np.float32)  # Gemm transB
    b1, b2 = rng.standard_normal(hidden).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", n])],
                          [numpy_helper.from_array(v, nm) for nm, v in (("w1", w1), ("w2", w2), ("b1", b1),
                                                                         ("b2", b2))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.sqrt(np.mean(np.square(want.astype(np.float64)))))


def test_quantize_dynamic_mlp() -> None:
    g = ds.load_onnx(_mlp())
    q = ds.quantize_dynamic(g)
    assert [n.op_type for n in q.nodes].count("DynamicQuantizeMatMul") == 2
    assert not {"w1", "w2"} & set(q.initializers)  # the float weights are gone
    exe, fp = ds.compile(q), ds.compile(g)
    kinds = [getattr(s, "kind", "") for s in exe.generic.build.steps]
    assert kinds.count("qproduct") == 2, kinds
    rng = np.random.default_rng(1)
    for rows in (1, 7, 33):
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        got, want = exe.run({"x": x})["y"], fp.run({"x": x})["y"]
        # the kernel computes the quantized graph (its reference interpreter) up to the epilogue's float rounding
        np.testing.assert_allclose(got, q.run({"x": x})["y"], rtol=1e-5, atol=1e-5)
        assert _err(got, want) < 0.03, _err(got, want)  # and the quantized graph stays near the float one


def test_quantize_dynamic_leaves_other_graphs() -> None:
    """No product by a constant matrix: nothing to quantize, the graph runs as before."""
    g = ds.load_onnx(helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], "mm",
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, [4, 4]) for v in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])]), opset_imports=[helper.make_opsetid("", 17)]))
    q = ds.quantize_dynamic(g)
    assert [n.op_type for n in q.nodes] == ["MatMul"]


BERT = Path.home() / ".cache" / "dynshape-bench" / "models" / "bert_small.onnx"


@pytest.mark.skipif(not BERT.exists(), reason="python ../shared/bench/export_models.py writes bert_small.onnx")
def test_quantize_dynamic_bert_small_accuracy() -> None:
    """Every product by a weight matrix quantized; outputs within 5% of the fp32 build's RMS (measured: 1.5-3.6%)."""
    g = ds.load_onnx(str(BERT))
    q = ds.quantize_dynamic(g)
    products = [n for n in g.nodes if n.op_type in ("MatMul", "Gemm")]
    quantized = [n for n in q.nodes if n.op_type == "DynamicQuantizeMatMul"]
    assert 0 < len(quantized) < len(products)  # the attention's two products (no constant operand) stay float
    exe, fp = ds.compile(q, strategy="generic"), ds.compile(g, strategy="generic")
    assert [getattr(s, "kind", "") for s in exe.generic.build.steps].count("qproduct") == len(quantized)
    rng = np.random.default_rng(0)
    feed = {"input_ids": rng.integers(0, 1000, (2, 24)).astype(np.int64), "attention_mask": np.ones((2, 24), np.int64)}
    got, want = exe.run(feed), fp.run(feed)
    for name in want:
        assert _err(got[name], want[name]) < 0.05, (name, _err(got[name], want[name]))
