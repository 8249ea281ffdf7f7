"""int8 products for dynamically quantized models (passes/quant.py, codegen/int8.py, csrc/ds_gemm_int8.c), against
independent references: onnx's ReferenceEvaluator and onnxruntime on the files onnxruntime's own `quantize_dynamic`
writes, and numpy on the C entry points.

The results must be exact: the integer part (MatMulInteger's int32) by construction, the float part because the
kernel applies the same float32 roundings in the same order (cast, then one multiply by the product of the scales).
The native tiles (AVX512-VNNI) run where the CPU has them; the portable ones everywhere, on the same cases.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import dynshape as ds
from dynshape.codegen import int8
from dynshape.ir.opdef import lookup
from dynshape.passes.quant import as_int8
from peer_exactness import ORT_INT8_EXACT

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

NATIVE = int8.native_available()
AMX = int8.amx_tiles()
# "+vpdpbusd": the native tile with AMX turned off, where AMX is what it would take (both native paths, one machine)
TILES = (["ds_q8_block", "ds_q8_block_e"] if NATIVE else ["ds_q8_block_e"]) \
    + (["ds_q8_block+vpdpbusd"] if AMX else []) + (["ds_q8_block_avx2"] if int8.avx2_tiles() else [])


def _reference_product(x: np.ndarray, w: np.ndarray, zp: np.ndarray, ws: np.ndarray) -> np.ndarray:
    """DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul, by onnx's own evaluator."""
    k, n = w.shape
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             helper.make_node("MatMulInteger", ["q", "w", "z", "wz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["s", "ws"], ["scale"]),
             helper.make_node("Mul", ["accf", "scale"], ["y"])]
    g = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(zp, "wz"),
                           numpy_helper.from_array(ws, "ws")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return ReferenceEvaluator(m).run(None, {"x": x})[0]


# AMX takes 32 rows, then 16, in chunks of 64 k: whole chunks (256, 64), a short last chunk (100), only one (37)
CASES = [(1, 5, 3, np.int8, False), (13, 37, 45, np.uint8, True), (70, 256, 96, np.int8, True),
         (8, 128, 70, np.uint8, False), (61, 64, 33, np.int8, True), (40, 100, 64, np.uint8, True),
         (32, 37, 45, np.int8, False)]


@pytest.mark.parametrize("m,k,n,wdt,per_column", CASES)
@pytest.mark.parametrize("tile", TILES)
def test_tiles_match_onnx_reference(m: int, k: int, n: int, wdt: type, per_column: bool, tile: str) -> None:
    rng = np.random.default_rng(m * 1000 + k)
    x = (rng.standard_normal((m, k)) * 3 + 0.5).astype(np.float32)
    cols = n if per_column else 1
    if wdt is np.int8:
        w = rng.integers(-128, 128, (k, n)).astype(np.int8)
        zp = rng.integers(-5, 5, cols).astype(np.int8)
    else:
        w = rng.integers(0, 256, (k, n)).astype(np.uint8)
        zp = rng.integers(120, 136, cols).astype(np.uint8)
    ws = (rng.random(cols) * 0.01 + 0.001).astype(np.float32)
    if not per_column:
        zp, ws = zp.reshape(()), ws.reshape(())
    want = _reference_product(x, w, zp, ws)
    lib = int8.LIBRARY.load()
    w8, z32 = as_int8(w, zp)
    bp = int8.pack_q8(w8)
    sc = np.ascontiguousarray(np.broadcast_to(ws.reshape(-1), (n,)), np.float32)
    tile, _, path = tile.partition("+")
    try:
        lib.ds_q8_use_amx(0 if path else 1)  # the activations are laid out for the path chosen when quantized
        _check_tiles(lib, tile, x, w, zp, ws, sc, bp, z32, want)
    finally:
        lib.ds_q8_use_amx(1)


def _check_tiles(lib, tile: str, x: np.ndarray, w: np.ndarray, zp: np.ndarray, ws: np.ndarray, sc: np.ndarray,
                 bp: np.ndarray, z32: np.ndarray, want: np.ndarray) -> None:
    (m, k), n = x.shape, w.shape[1]
    act = lib.ds_q8_quantize(x.ctypes.data, m, k)
    q_ref, s_ref, z_ref = lookup("DynamicQuantizeLinear").reference([x], {})
    s, z = ctypes.c_float(), ctypes.c_int32()
    lib.ds_q8_act_params(act, ctypes.byref(s), ctypes.byref(z))
    assert (s.value, z.value) == (float(s_ref), int(z_ref))
    row, total = np.zeros(-(-k // 4) * 4, np.uint8), ctypes.c_int32()
    lib.ds_q8_act_row(act, m - 1, row.ctypes.data, ctypes.byref(total))
    assert np.array_equal(row[:k], q_ref[m - 1]) and not row[k:].any() and total.value == int(q_ref[m - 1].sum())
    out = np.full((m, n), np.nan, np.float32)
    for q in range(-(-n // 32)):
        getattr(lib, tile)(act, bp.ctypes.data, out.ctypes.data, n, 0, m, q, n, k, z32.ctypes.data, sc.ctypes.data)
    assert np.array_equal(out, want)


def test_all_zero_activation() -> None:
    """A zero scale (x all zeros): DynamicQuantizeLinear picks zero point 0, the product is 0 (no division by 0)."""
    x = np.zeros((3, 8), np.float32)
    w = np.arange(-64, 64, dtype=np.int8).reshape(8, 16)
    assert np.array_equal(_reference_product(x, w, np.int8(3), np.float32(0.5)), np.zeros((3, 16), np.float32))
    lib = int8.LIBRARY.load()
    act = lib.ds_q8_quantize(x.ctypes.data, 3, 8)
    w8, z32 = as_int8(w, np.int8(3))
    out = np.full((3, 16), np.nan, np.float32)
    for tile in TILES:
        getattr(lib, tile.partition("+")[0])(act, int8.pack_q8(w8).ctypes.data, out.ctypes.data, 16, 0, 3, 0, 16, 8,
                                             z32.ctypes.data, np.full(16, 0.5, np.float32).ctypes.data)
        assert np.array_equal(out, np.zeros((3, 16), np.float32))


@pytest.mark.parametrize("tile", TILES)
def test_extreme_bytes_do_not_saturate(tile: str) -> None:
    """Activations at 255 against weights at -128 and 127: a pair of such products (+-65,280) is past int16, where
    VPMADDUBSW saturates; every tile must still equal the reference (the AVX2 one widens to int16 first)."""
    m, k, n = 5, 67, 40
    rng = np.random.default_rng(3)
    x = np.where(rng.random((m, k)) < 0.8, 10.0, 0.0).astype(np.float32)  # quantizes to 255 (and 0)
    w = np.where(rng.random((k, n)) < 0.5, -128, 127).astype(np.int8)
    w[:, :8] = -128  # whole columns of -128 pairs
    zp, ws = np.int8(0), np.float32(0.001)
    want = _reference_product(x, w, zp, ws)
    assert np.abs(want).max() > 0.5 * 255 * 128 * k * float(ws) * (10.0 / 255)  # the extreme sums are there
    lib = int8.LIBRARY.load()
    w8, z32 = as_int8(w, zp)
    sc = np.full(n, ws, np.float32)
    name, _, path = tile.partition("+")
    try:
        lib.ds_q8_use_amx(0 if path else 1)
        _check_tiles(lib, name, x, w, zp, ws, sc, int8.pack_q8(w8), z32, want)
    finally:
        lib.ds_q8_use_amx(1)


def test_pack_layout() -> None:
    rng = np.random.default_rng(1)
    w = rng.integers(-128, 128, (9, 40)).astype(np.int8)
    bp = int8.pack_q8(w)
    assert bp.ctypes.data % 64 == 0
    panels = bp[:2 * 3 * 32 * 4].view(np.int8).reshape(2, 3, 32, 4)  # ceil(40 / 32) panels, ceil(9 / 4) groups
    assert panels[1, 2, 7, 0] == w[8, 39] and panels[0, 1, 5, 3] == w[7, 5]
    assert not panels[1, :, 8:].any() and not panels[:, 2, :, 1:].any()  # zeros past n and past k
    sums = bp[2 * 3 * 32 * 4:].view(np.int32)
    assert np.array_equal(sums[:40], w.astype(np.int32).sum(0)) and not sums[40:].any()


# ---- whole models quantized by onnxruntime ------------------------------------------------------------------------
def _float_mlp(path: Path, k: int = 48, hidden: int = 80, n: int = 40) -> None:
    """x (batch, seq, k) -> MatMul + bias -> Gelu (erf form) -> MatMul + bias + residual-free output."""
    rng = np.random.default_rng(7)
    w1 = (rng.standard_normal((k, hidden)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((hidden, n)) * 0.2).astype(np.float32)
    b1 = rng.standard_normal(hidden).astype(np.float32)
    b2 = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Div", ["hb", "sqrt2"], ["hd"]), helper.make_node("Erf", ["hd"], ["he"]),
             helper.make_node("Add", ["he", "one"], ["hp"]), helper.make_node("Mul", ["hb", "hp"], ["hm"]),
             helper.make_node("Mul", ["hm", "half"], ["g"]),
             helper.make_node("MatMul", ["g", "w2"], ["o"]), helper.make_node("Add", ["o", "b2"], ["y"])]
    inits = [numpy_helper.from_array(v, nm) for nm, v in
             (("w1", w1), ("w2", w2), ("b1", b1), ("b2", b2), ("sqrt2", np.float32(np.sqrt(2))),
              ("one", np.float32(1)), ("half", np.float32(0.5)))]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", n])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture(scope="module")
def float_mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("int8") / "mlp.onnx"
    _float_mlp(path)
    return path


def _quantized(src: Path, weight_type: str, per_channel: bool) -> Path:
    out = src.with_name(f"{src.stem}_{weight_type}_{int(per_channel)}.onnx")
    if not out.exists():
        quantization.quantize_dynamic(str(src), str(out), weight_type=getattr(quantization.QuantType, weight_type),
                                      per_channel=per_channel)
    return out


@pytest.mark.parametrize("weight_type,per_channel", [("QInt8", False), ("QInt8", True), ("QUInt8", False)])
def test_quantized_mlp_exact(float_mlp: Path, weight_type: str, per_channel: bool) -> None:
    path = _quantized(float_mlp, weight_type, per_channel)
    model = onnx.load(path)
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in model.graph.node}
    exe = ds.compile(ds.load_onnx(str(path)))
    kinds = [s.kind for s in exe.generic.build.steps if hasattr(s, "kind")]
    assert kinds.count("qproduct") == 2, kinds
    ops = {getattr(s, "op", "") for s in exe.generic.build.steps}
    assert not ops & {"DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul"}, ops
    ref = ReferenceEvaluator(model)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for shape in ((1, 1, 48), (2, 7, 48), (3, 30, 48)):
        x = (rng.standard_normal(shape) * 2).astype(np.float32)
        got = exe.run({"x": x})["y"]
        want = ref.run(None, {"x": x})[0]
        # the integer part and the scales are exact; the epilogue (bias, erf) is float32 math of its own
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        if ORT_INT8_EXACT:  # (its u8s8 products saturate without VNNI: peer_exactness)
            np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_dequantized_product_is_bit_exact(float_mlp: Path) -> None:
    """Without an epilogue, the kernel's output is the graph's Mul to the last bit (ONNX reference)."""
    path = _quantized(float_mlp, "QInt8", True)
    model = onnx.load(path)
    muls = [n for n in model.graph.node if n.op_type == "Mul" and any("Cast" in i or "cast" in i for i in n.input)]
    target = muls[0].output[0] if muls else None
    assert target is not None
    # cut the graph at the first dequantized product: its output is the model's
    keep = []
    for n in model.graph.node:
        keep.append(n)
        if target in n.output:
            break
    del model.graph.node[:]
    model.graph.node.extend(keep)
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info(target, TensorProto.FLOAT, None))
    exe = ds.compile(ds.load_onnx(model))
    assert "qproduct" in [getattr(s, "kind", "") for s in exe.generic.build.steps]
    rng = np.random.default_rng(5)
    for shape in ((1, 1, 48), (2, 33, 48)):
        x = (rng.standard_normal(shape) * 2).astype(np.float32)
        assert np.array_equal(exe.run({"x": x})[target], ReferenceEvaluator(model).run(None, {"x": x})[0])


BERT = Path.home() / ".cache" / "dynshape-bench" / "models" / "bert_small.onnx"


@pytest.mark.skipif(not BERT.exists(), reason="python ../shared/bench/export_models.py writes bert_small.onnx")
def test_bert_small_quantized_by_onnxruntime(tmp_path: Path) -> None:
    """Every MatMulInteger of onnxruntime's dynamic quantization of BERT runs in an int8 kernel, and the outputs
    agree with dynshape's reference interpreter and onnxruntime. Not bit for bit: a one-ulp difference in a float
    op before a DynamicQuantizeLinear (a layer norm, GELU's erf) can move one activation to the next quantization
    step, and onnxruntime differs from the ONNX reference by the same amount (about 1e-2 here)."""
    path = tmp_path / "bert_q.onnx"
    quantization.quantize_dynamic(str(BERT), str(path), weight_type=quantization.QuantType.QInt8, per_channel=True)
    products = sum(n.op_type == "MatMulInteger" for n in onnx.load(path).graph.node)
    g = ds.load_onnx(str(path))
    exe = ds.compile(g, strategy="generic")
    assert [getattr(s, "kind", "") for s in exe.generic.build.steps].count("qproduct") == products > 0
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feed = {"input_ids": rng.integers(0, 1000, (2, 16)).astype(np.int64), "attention_mask": np.ones((2, 16), np.int64)}
    got, want = exe.run(feed), g.run(feed)
    theirs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
    for name, w in want.items():
        rms = float(np.sqrt(np.mean(np.square(w))))
        assert np.max(np.abs(got[name] - w)) <= 0.02 * rms, name
        if ORT_INT8_EXACT:  # (its u8s8 products saturate without VNNI: peer_exactness)
            assert np.max(np.abs(got[name] - theirs[name])) <= 0.02 * rms, name
