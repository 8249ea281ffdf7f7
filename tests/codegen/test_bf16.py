"""precision="bf16" / "bf16-emulated" (codegen/bf16.py, csrc/ds_gemm_bf16.c), against independent references.

The rounding is checked against ml_dtypes' bfloat16 (an independent implementation of round-to-nearest-even) on
normal values, with hypothesis; products against float64 products of the rounded operands, whose only difference
from a bf16 kernel is float32 accumulation, so the tolerance is float32's, scaled by the sum of |products|. The
native kernels (AVX512-BF16) run where the CPU has them; the emulated ones everywhere, and the native results are
compared with the emulated ones so both paths are checked on one machine.
"""

from __future__ import annotations

import ctypes
import math

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen import bf16, cc, cgen
from dynshape.errors import DynshapeError
from dynshape.models.encoder import build_encoder
from dynshape.options import Options

NATIVE = bf16.native_available()
needs_native = pytest.mark.skipif(not NATIVE, reason="this CPU has no AVX512-BF16 (the emulated path is tested)")
AMX = NATIVE and bool(bf16.LIBRARY.load().ds_bf16_use_amx(-1))
needs_amx = pytest.mark.skipif(not AMX, reason="no AMX-BF16 here (or Linux refused its tiles): VDPBF16PS is tested")


def _c_round(x: np.ndarray) -> np.ndarray:
    lib = bf16.LIBRARY.load()
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(x.shape, np.uint16)
    lib.ds_round_bf16(x.ctypes.data, x.size, out.ctypes.data)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=True), min_size=1, max_size=64))
def test_rounding_matches_ml_dtypes_on_normals(values: list[float]) -> None:
    x = np.array(values, np.float32)
    normal = (np.abs(x) >= np.finfo(np.float32).tiny) | ~np.isfinite(x)
    want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    got = bf16.round_bf16(x)
    assert np.array_equal(got[normal], want[normal])
    assert np.array_equal(_c_round(x), got)  # the C and numpy roundings are one definition


def test_rounding_special_values() -> None:
    x = np.array([0.0, -0.0, 1e-40, -1e-40, np.inf, -np.inf, np.nan, 1.0 + 2**-8, 1.0 + 3 * 2**-8],
                 np.float32)
    got = bf16.round_bf16(x)
    assert np.array_equal(_c_round(x), got)
    back = bf16.bf16_to_f32(got)
    assert back[0] == 0 and back[2] == 0 and np.signbit(back[3]) and back[3] == 0  # denormals flush to zero
    assert np.isinf(back[4]) and np.isinf(back[5]) and np.isnan(back[6])
    assert back[7] == 1.0 and back[8] == 1.0 + 4 * 2**-8  # ties to even, both ways


def test_pack_layout() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((7, 37)).astype(np.float32)  # k odd, n over one panel
    p = bf16.pack_b_bf16(w)
    assert p.shape == (2, 4, 64) and p.ctypes.data % 64 == 0
    r = bf16.round_bf16(w).reshape(w.shape)
    for q in range(2):
        for pp in range(4):
            for j in range(32):
                col = q * 32 + j
                for h in range(2):
                    kk = 2 * pp + h
                    want = r[kk, col] if kk < 7 and col < 37 else 0
                    assert p[q, pp, 2 * j + h] == want
    assert np.array_equal(bf16.pack_b_bf16(w.T.copy(), trans=True), p)


def _product_model(k: int, n: int, gemm: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(k * 1000 + n)
    w = rng.standard_normal((n, k) if gemm else (k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    if gemm:
        nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["y0"], transB=1), helper.make_node("Relu", ["y0"], ["y"])]
    else:
        nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["y0"]),
                 helper.make_node("Relu", ["y0"], ["y"])]
    g = helper.make_graph(nodes, "p", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", n])],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "B")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _reference(model: onnx.ModelProto, x: np.ndarray, gemm: bool) -> tuple[np.ndarray, np.ndarray]:
    """relu(round(x) @ round(W) + B) in float64, and the sum of |products| per output (the scale of float32's
    accumulation error)."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w = inits["W"].T if gemm else inits["W"]
    xr, wr = bf16.rounded(x).astype(np.float64), bf16.rounded(np.ascontiguousarray(w)).astype(np.float64)
    return np.maximum(xr @ wr + inits["B"], 0), np.abs(xr) @ np.abs(wr) + np.abs(inits["B"])


@pytest.mark.parametrize("precision", ["bf16-emulated", pytest.param("bf16", marks=needs_native)])
@pytest.mark.parametrize("k,n,gemm", [(64, 32, False), (257, 100, False), (31, 7, True), (300, 96, True)])
def test_products_match_rounded_reference(precision: str, k: int, n: int, gemm: bool) -> None:
    model = _product_model(k, n, gemm)
    exe = ds.compile(ds.load_onnx(model), precision=precision)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((150, k)).astype(np.float32)
    want, scale = _reference(model, x, gemm)
    for rows in (1, 5, 12, 13, 61, 80, 150):  # every micro-tile height, a short tail, several row blocks
        got = exe.run({"x": x[:rows]})["y"]
        err = np.abs(got - want[:rows])
        assert np.all(err <= 4 * k * 2.0**-24 * scale[:rows] + 1e-30), (rows, float(err.max()))
    # and they are bf16, not float32: the error against the float32 product is of bf16's size
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w = inits["W"].T if gemm else inits["W"]
    exact = np.maximum(x.astype(np.float64) @ w + inits["B"], 0)
    assert np.abs(exe.run({"x": x})["y"] - exact).max() > 1e-4



@needs_amx
def test_amx_products_load_their_tile_configuration_after_another_librarys() -> None:
    """The tiles stay configured between calls (csrc/ds_amx.h: no LDTILECFG / TILERELEASE per call); a call whose
    thread's tiles another library configured otherwise (here 8 rows a tile) loads its own again, and answers as
    before (with 8-row tiles half of every tile's rows would be lost)."""
    model = _product_model(256, 64, False)
    exe = ds.compile(ds.load_onnx(model), precision="bf16")
    x = np.random.default_rng(5).standard_normal((96, 256)).astype(np.float32)
    first = exe.run({"x": x})["y"]
    lib = bf16.LIBRARY.load()
    for rows in (8, 1, 16):
        assert lib.ds_amx_configure_other(rows) == 1
        np.testing.assert_array_equal(exe.run({"x": x})["y"], first)
    want, scale = _reference(model, x, False)
    assert np.all(np.abs(first - want) <= 4 * 256 * 2.0**-24 * scale + 1e-30)


@pytest.mark.parametrize("amx", [pytest.param(0, marks=needs_native, id="vdpbf16ps"),
                                 pytest.param(1, marks=needs_amx, id="amx")])
@pytest.mark.parametrize("m,k,n", [(16, 32, 32), (17, 33, 7), (64, 256, 96), (60, 300, 100), (48, 31, 40),
                                   (33, 64, 33), (95, 70, 64), (1, 64, 64), (1, 37, 40), (128, 1024, 32), (6, 40, 40),
                                   (3, 64, 32)])
def test_both_native_paths_match_rounded_reference(tile_path, amx: int, m: int, k: int, n: int) -> None:
    """The product tiles on each native path (AMX: 32 rows, then 16, a last part under 16 rows as a tile ending at
    the last row or, under 16 rows in all, over zeroed rows; k in chunks of 32 with a zeroed last chunk of B;
    columns short of a panel through a bounce buffer; under 4 rows VDPBF16PS) equal float64 products of the rounded
    operands to float32 accumulation, on rows and columns read and written with strides past their ends, whose
    cells they must not touch; whole blocks (ds_gemm_block_bf16) and single panels (ds_gemm_panel_bf16)."""
    lib = bf16.LIBRARY.load()
    assert tile_path(amx) == amx
    rng = np.random.default_rng(m * 7 + k + n)
    lda, ldc = k + 3, n + 5
    a = rng.standard_normal((m + 2, lda)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bp = bf16.pack_b_bf16(w)
    ar, wr = bf16.rounded(a[:, :k]).astype(np.float64), bf16.rounded(w).astype(np.float64)
    want, scale = ar @ wr, np.abs(ar) @ np.abs(wr)
    for i0, i1 in ((0, m), (1, m + 1), (m // 3, m + 2)):  # the whole, shifted by a row, a block within
        for whole in (True, False):
            c = np.full((m + 2, ldc), 7.0, np.float32)
            ep = lib.ds_bf16_epoch()
            for q in range(-(-n // 32)):
                if whole:
                    lib.ds_gemm_block_bf16(a.ctypes.data, lda, bp.ctypes.data, c.ctypes.data, ldc, i0, i1, q, n, k, ep)
                else:
                    lib.ds_gemm_panel_bf16(a.ctypes.data, lda, bp[q].ctypes.data, c[:, 32 * q:].ctypes.data, ldc,
                                           i0, i1, min(32, n - 32 * q), k, ep)
            err = np.abs(c[i0:i1, :n] - want[i0:i1])
            assert np.all(err <= 4 * k * 2.0**-24 * scale[i0:i1] + 1e-30), (i0, i1, whole, float(err.max()))
            untouched = np.ones(c.shape, bool)
            untouched[i0:i1, :n] = False
            assert np.all(c[untouched] == 7.0), (i0, i1, whole)


@needs_amx
def test_amx_builds_take_row_blocks_of_its_tiles() -> None:
    """Where products run on AMX, a bf16 build says so in explain and blocks rows by 64 (4 tiles of 16), float32
    builds keep their blocks of 60; and the VDPBF16PS path, chosen at run time, computes the same build's answers."""
    model = _product_model(256, 64, False)
    exe = ds.compile(ds.load_onnx(model), precision="bf16")
    fp32 = ds.compile(ds.load_onnx(model))
    (step,) = [s for s in exe.generic.steps if getattr(s, "kind", "") == "product"]
    (step32,) = [s for s in fp32.generic.steps if getattr(s, "kind", "") == "product"]
    assert "AMX" in step.method and "(r0 + 64)" in step.source and "/ 16) * 16)" in step.source
    assert "AMX" not in step32.method and "(r0 + 60)" in step32.source
    x = np.random.default_rng(4).standard_normal((200, 256)).astype(np.float32)
    lib = bf16.LIBRARY.load()
    try:
        lib.ds_bf16_use_amx(0)
        avx = exe.run({"x": x})["y"]
    finally:
        lib.ds_bf16_use_amx(1)
    amx = exe.run({"x": x})["y"]
    want, scale = _reference(model, x, False)
    for got in (amx, avx):
        assert np.all(np.abs(got - want) <= 4 * 256 * 2.0**-24 * scale + 1e-30)


@needs_amx
def test_amx_takes_3x3_convs_as_implicit_gemm() -> None:
    """On AMX a 3x3 stride-1 conv under bf16 runs on the tiles, not Winograd (whose float32 transforms cost more
    than the multiplies they save there): its taps read from a padded bf16 copy (tests/codegen/test_conv_amx.py),
    and equals the float32 conv of the rounded input and weights up to float32 accumulation; float32 builds keep
    Winograd."""
    ci, co, h = 32, 48, 21
    rng = np.random.default_rng(9)
    w = (rng.standard_normal((co, ci, 3, 3)) * 0.2).astype(np.float32)
    x = rng.standard_normal((2, ci, h, h)).astype(np.float32)
    r = rng.standard_normal((2, co, h, h)).astype(np.float32)
    exe = ds.compile(ds.load_onnx(_conv_model(ci, co, 3, 1, 1, 1, w)), precision="bf16")
    methods = [getattr(st, "method", "") for st in exe.generic.steps if getattr(st, "method", "")]
    assert any(m.startswith("taps read from a padded bf16 copy on AMX tiles") and "AMX TDPBF16PS" in m
               for m in methods), methods
    fp32 = ds.compile(ds.load_onnx(_conv_model(ci, co, 3, 1, 1, 1, w)))
    assert any(getattr(st, "method", "").startswith("Winograd") for st in fp32.generic.steps)
    want = ds.compile(ds.load_onnx(_conv_model(ci, co, 3, 1, 1, 1, bf16.rounded(w))), winograd=False).run(
        {"x": bf16.rounded(x), "r": r})["y"]
    got = exe.run({"x": x, "r": r})["y"]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@needs_native
def test_native_matches_emulated_on_an_encoder() -> None:
    """An encoder (heads-folded QKV products, FFN with GELU, layer norms): the native kernels equal the emulated ones
    up to float32 accumulation order, and both stay within 2% of the float32 build (max error over the RMS)."""
    model = build_encoder(layers=2, hidden=64, heads=4, ffn=128)
    exes = {p: ds.compile(ds.load_onnx(model), precision=p) for p in ("fp32", "bf16", "bf16-emulated")}
    rng = np.random.default_rng(2)
    for b, s in ((1, 5), (3, 17), (2, 64)):
        feed = {"input_ids": rng.integers(0, 1000, (b, s), dtype=np.int64),
                "attention_mask": np.ones((b, s), np.int64)}
        out = {p: e.run(feed)["last_hidden_state"] for p, e in exes.items()}
        rms = float(np.sqrt(np.mean(out["fp32"].astype(np.float64) ** 2)))
        assert np.abs(out["bf16"] - out["bf16-emulated"]).max() <= 1e-3 * rms
        for p in ("bf16", "bf16-emulated"):
            assert np.abs(out[p] - out["fp32"]).max() <= 0.02 * rms


def test_emulated_encoder_within_two_percent() -> None:
    model = build_encoder(layers=2, hidden=64, heads=4, ffn=128)
    fp32 = ds.compile(ds.load_onnx(model))
    emu = ds.compile(ds.load_onnx(model), precision="bf16-emulated")
    rng = np.random.default_rng(3)
    feed = {"input_ids": rng.integers(0, 1000, (2, 33), dtype=np.int64), "attention_mask": np.ones((2, 33), np.int64)}
    a, b = fp32.run(feed)["last_hidden_state"], emu.run(feed)["last_hidden_state"]
    low = {s.kind for s in emu.generic.steps if getattr(s, "method", "").startswith("bf16")}
    assert low == {"product", "attention"}  # both kernel kinds took the bf16 path
    assert not any(getattr(s, "method", "").startswith("bf16") for s in fp32.generic.steps)
    rms = float(np.sqrt(np.mean(a.astype(np.float64) ** 2)))
    err = float(np.abs(a - b).max())
    assert 1e-5 * rms < err <= 0.02 * rms  # rounded (not float32), and close


def test_bf16_refused_without_the_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bf16, "native_available", lambda: False)
    with pytest.raises(DynshapeError, match="bf16-emulated"):
        ds.compile(ds.load_onnx(_product_model(8, 8, False)), precision="bf16")


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1MiB"])
def test_a_bad_bf16_min_recurrent_bytes_is_refused_by_name(bad) -> None:
    with pytest.raises(DynshapeError, match="bf16_min_recurrent_bytes"):
        Options(bf16_min_recurrent_bytes=bad)


def test_unknown_precision_refused() -> None:
    with pytest.raises(DynshapeError, match="precision='fp16'"):
        ds.compile(ds.load_onnx(_product_model(8, 8, False)), precision="fp16")


def test_artefact_keeps_its_precision(tmp_path) -> None:
    """precision is a build option: saved in the artefact, so the loaded build computes what the saved one did."""
    model = _product_model(40, 33, False)
    exe = ds.save(model, tmp_path / "a", precision="bf16-emulated")
    x = np.random.default_rng(4).standard_normal((9, 40)).astype(np.float32)
    loaded = ds.load(tmp_path / "a")
    assert loaded.options.precision == "bf16-emulated"
    assert np.array_equal(loaded.run({"x": x})["y"], exe.run({"x": x})["y"])
    want, _ = _reference(model, x, False)
    assert np.abs(loaded.run({"x": x})["y"] - want).max() < 1e-4 * np.abs(want).max()


def _conv_model(ci: int, co: int, k: int, s: int, g: int, pad: int, w: np.ndarray) -> onnx.ModelProto:
    """relu(conv(x, w) + bias + r): the tiles' bias, residual and activation in one kernel."""
    bias = np.linspace(-1, 1, co).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[k, k], strides=[s, s], group=g,
                              pads=[pad] * 4),
             helper.make_node("Add", ["c", "r"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", ci, "h", "w"]),
                        helper.make_tensor_value_info("r", TensorProto.FLOAT, ["n", co, "oh", "ow"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", co, "oh", "ow"])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("precision", ["bf16-emulated", pytest.param("bf16", marks=needs_native),
                                       pytest.param("bf16-vdpbf16ps", marks=needs_amx)])
@pytest.mark.parametrize("ci,co,k,s,g,pad,h", [(16, 48, 1, 1, 1, 0, 9), (3, 40, 7, 2, 1, 3, 23),
                                                (32, 64, 3, 2, 1, 1, 15), (8, 70, 3, 1, 2, 1, 11)])
def test_convolutions_match_rounded_reference(tile_path, precision: str, ci: int, co: int, k: int, s: int, g: int,
                                              pad: int, h: int) -> None:
    """Implicit-GEMM convolutions in bf16 equal the float32 convolution of the rounded input and weights (its
    products are exact in float32) up to float32 accumulation: 1x1, a 7x7 stride-2 stem of 3 channels (odd k),
    grouped 3x3 with an output tail, bias + residual + Relu in the tile's finish. "bf16" runs AMX where there is
    AMX; "bf16-vdpbf16ps" the other native path on the same machine."""
    if precision == "bf16-vdpbf16ps":
        precision = "bf16"
        tile_path(0)
    rng = np.random.default_rng(ci * co)
    w = (rng.standard_normal((co, ci // g, k, k)) * 0.2).astype(np.float32)
    x = rng.standard_normal((2, ci, h, h)).astype(np.float32)
    oh = (h + 2 * pad - k) // s + 1
    r = rng.standard_normal((2, co, oh, oh)).astype(np.float32)
    want = ds.compile(ds.load_onnx(_conv_model(ci, co, k, s, g, pad, bf16.rounded(w)))).run(
        {"x": bf16.rounded(x), "r": r})["y"]
    exe = ds.compile(ds.load_onnx(_conv_model(ci, co, k, s, g, pad, w)), precision=precision,
                     bf16_min_conv_macs=0,  # (the narrow ones too: these test the bf16 tiles)
                     amx_direct_conv=False)  # (gathered patches: the direct paths are test_conv_amx.py's)
    got = exe.run({"x": x, "r": r})["y"]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    methods = [getattr(st, "method", "") for st in exe.generic.steps]
    assert any(m.startswith("implicit GEMM on packed weights; bf16") for m in methods)


@pytest.mark.parametrize("precision", ["bf16-emulated", pytest.param("bf16", marks=needs_native)])
def test_a_silu_after_a_bf16_convolution_is_applied(precision: str) -> None:
    """Conv + Mul(c, Sigmoid(c)) finished in the conv's C: the bf16 tiles' finish applies the SiLU too (a finish
    that knew only Relu and HardSwish would return the conv unactivated)."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((48, 16, 1, 1)) * 0.2).astype(np.float32)
    x = rng.standard_normal((2, 16, 9, 9)).astype(np.float32)

    def model(weights: np.ndarray) -> onnx.ModelProto:
        nodes = [helper.make_node("Conv", ["x", "W"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"]),
                 helper.make_node("Mul", ["c", "s"], ["y"])]
        x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16, "h", "w"])
        y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        graph = helper.make_graph(nodes, "silu", [x_info], [y_info], [numpy_helper.from_array(weights, "W")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    want = ds.compile(ds.load_onnx(model(bf16.rounded(w)))).run({"x": bf16.rounded(x)})["y"]
    got = ds.compile(ds.load_onnx(model(w)), precision=precision, bf16_min_conv_macs=0).run({"x": x})["y"]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("precision", ["bf16-emulated", pytest.param("bf16", marks=needs_native)])
def test_a_narrow_convolution_stays_in_float32_under_bf16(precision: str) -> None:
    """Under bf16, a conv of fewer than bf16_min_conv_macs multiply-adds a pixel (16 -> 2 1x1: 32) runs the float32
    kernel: explain says so and the result is the float32 build's bit for bit; at the threshold (16 -> 128 1x1:
    2048) and with the option at 0 it runs in bf16."""
    rng = np.random.default_rng(16)
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    r = rng.standard_normal((1, 2, 12, 12)).astype(np.float32)
    w = (rng.standard_normal((2, 16, 1, 1)) * 0.2).astype(np.float32)

    def conv_method(exe) -> str:
        (m,) = [st.method for st in exe.generic.steps if getattr(st, "op", "") == "conv"]
        return m

    narrow = ds.compile(ds.load_onnx(_conv_model(16, 2, 1, 1, 1, 0, w)), precision=precision)
    fp32 = ds.compile(ds.load_onnx(_conv_model(16, 2, 1, 1, 1, 0, w)))
    assert "bf16" not in conv_method(narrow)
    np.testing.assert_array_equal(narrow.run({"x": x, "r": r})["y"], fp32.run({"x": x, "r": r})["y"])
    forced = ds.compile(ds.load_onnx(_conv_model(16, 2, 1, 1, 1, 0, w)), precision=precision, bf16_min_conv_macs=0)
    assert "bf16" in conv_method(forced)
    w128 = (rng.standard_normal((128, 16, 1, 1)) * 0.2).astype(np.float32)
    wide = ds.compile(ds.load_onnx(_conv_model(16, 128, 1, 1, 1, 0, w128)), precision=precision)
    assert "bf16" in conv_method(wide)
    with pytest.raises(ds.DynshapeError, match="bf16_min_conv_macs"):
        ds.compile(ds.load_onnx(_conv_model(16, 2, 1, 1, 1, 0, w)), precision=precision, bf16_min_conv_macs=-1)


@pytest.mark.parametrize("k,n", [(64, 128), (7, 37), (33, 1), (130, 65)])
def test_run_time_packers_equal_the_scalar_reference(k: int, n: int) -> None:
    """Attention's per-call packers (vectorised where the native path is compiled) write exactly what the scalar
    reference writes, denormals, odd k and column tails included; and their layout is pack_b_bf16's."""
    lib = bf16.LIBRARY.load()
    rng = np.random.default_rng(k + n)
    b = rng.standard_normal((k, n)).astype(np.float32)
    b.flat[::7] *= np.float32(1e-39)  # some denormals
    a = np.ascontiguousarray(b.T)
    size = -(-n // 32) * -(-k // 2) * 64
    for fn, src, ld in (("ds_pack_panels_bf16", b, n), ("ds_pack_panels_t_bf16", a, k)):
        got, ref = np.full(size, 7, np.uint16), np.full(size, 9, np.uint16)
        getattr(lib, fn)(src.ctypes.data, ld, k, n, got.ctypes.data)
        getattr(lib, fn + "_ref")(src.ctypes.data, ld, k, n, ref.ctypes.data)
        assert np.array_equal(got, ref), fn
        assert np.array_equal(got, bf16.pack_b_bf16(b).ravel()), fn


@pytest.mark.parametrize("ci,co,h", [(32, 48, 40), (64, 96, 10), (96, 128, 12)])
def test_winograd_products_in_bf16(tile_path, ci: int, co: int, h: int) -> None:
    """3x3 stride-1 convs under bf16 run Winograd F(2x2) with each position's product on the bf16 tiles (never
    F(4x4), whose transforms amplify bf16's rounding): native equals emulated up to float32 accumulation, and both
    stay within 3% of the output's RMS of the float32 direct sum (the direct sum in bf16: about 1.5%). Where
    products run on AMX a 3x3 conv is an implicit GEMM (test_amx_takes_3x3_convs_as_implicit_gemm): here the
    Winograd build is made and run with AMX turned off, as on a CPU with VDPBF16PS alone."""
    tile_path(0)
    rng = np.random.default_rng(ci + h)
    w = (rng.standard_normal((co, ci, 3, 3)) * 0.2).astype(np.float32)
    x = rng.standard_normal((1, ci, h, h)).astype(np.float32)
    r = rng.standard_normal((1, co, h, h)).astype(np.float32)
    model = _conv_model(ci, co, 3, 1, 1, 1, w)
    exact = ds.compile(ds.load_onnx(model), winograd=False).run({"x": x, "r": r})["y"]
    rms = float(np.sqrt(np.mean(exact.astype(np.float64) ** 2)))
    outs = {}
    for precision in ("bf16-emulated", *(("bf16",) if NATIVE else ())):
        # (the narrow one only with bf16_min_winograd_macs off: test_narrow_winograd_convs_stay_float32_under_bf16)
        exe = ds.compile(ds.load_onnx(model), precision=precision,
                         bf16_min_winograd_macs=0 if 9 * ci * co < 9 * 64 * 128 else 9 * 64 * 128)
        method = next(st.method for st in exe.generic.steps if getattr(st, "method", ""))
        assert method.startswith("Winograd F(2x2);") and "; products bf16" in method and "F(4x4)" not in method, \
            method
        outs[precision] = exe.run({"x": x, "r": r})["y"]
        assert 1e-4 * rms < np.abs(outs[precision] - exact).max() <= 0.03 * rms
    if NATIVE:
        assert np.abs(outs["bf16"] - outs["bf16-emulated"]).max() <= 1e-4 * rms


def test_bf16_erf_within_two_millionths() -> None:
    """ds_erff_bf16 (bf16 product epilogues' erf): absolute error < 2e-6 everywhere, sign and NaN kept."""
    src = cgen.PRELUDE + ("void v(const float *x, float *y, int64_t n) "
                          "{ for (int64_t i = 0; i < n; i++) y[i] = ds_erff_bf16(x[i]); }\n")
    lib = cc.compile_c(src, "erf_bf16")
    mags = np.float32(10.0) ** np.linspace(-30, 2, 40001, dtype=np.float32)
    x = np.concatenate([np.linspace(-110, 110, 400001, dtype=np.float32), mags, -mags,
                        np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)])
    y = np.empty_like(x)
    lib.v(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data), ctypes.c_int64(x.size))
    ref = np.vectorize(math.erf, otypes=[np.float64])(x[:-5].astype(np.float64))
    assert np.abs(y[:-5] - ref).max() < 2e-6
    assert np.isnan(y[-5]) and y[-4] == 1.0 and y[-3] == -1.0 and y[-2] == 0.0 and np.signbit(y[-1])


def _gelu_model(k: int, n: int) -> onnx.ModelProto:
    """x @ W + B then GELU as exporters write it: v * 0.5 * (1 + erf(v / sqrt 2))."""
    rng = np.random.default_rng(k + n)
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) / np.sqrt(k).astype(np.float32),
                                     "W"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "B"),
             numpy_helper.from_array(np.array(1.4142135, np.float32), "r2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["v"]),
             helper.make_node("Div", ["v", "r2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["v", "e1"], ["g"]),
             helper.make_node("Mul", ["g", "half"], ["y"])]
    g = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("precision", ["bf16-emulated", pytest.param("bf16", marks=needs_native)])
def test_gelu_epilogue_takes_the_bf16_erf(precision: str) -> None:
    """Under bf16 a product's GELU epilogue calls ds_erff_bf16 (float32 keeps ds_erff) and equals GELU of the
    rounded operands' product: float32 accumulation's error times GELU's slope (< 1.13) plus the erf's 2e-6."""
    model = _gelu_model(96, 80)
    exes = {p: ds.compile(ds.load_onnx(model), precision=p) for p in ("fp32", precision)}
    srcs = {p: "".join(s.source for s in e.generic.steps if getattr(s, "kind", "") == "product")
            for p, e in exes.items()}
    assert "ds_erff_bf16(" in srcs[precision] and "ds_erff(" not in srcs[precision]
    assert "ds_erff(" in srcs["fp32"] and "ds_erff_bf16" not in srcs["fp32"]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    x = np.random.default_rng(4).standard_normal((70, 96)).astype(np.float32)
    xr, wr = bf16.rounded(x).astype(np.float64), bf16.rounded(inits["W"]).astype(np.float64)
    v = xr @ wr + inits["B"]
    want = v * 0.5 * (1 + np.vectorize(math.erf, otypes=[np.float64])(v / math.sqrt(2)))
    scale = np.abs(xr) @ np.abs(wr) + np.abs(inits["B"])
    err = np.abs(exes[precision].run({"x": x})["y"] - want)
    assert np.all(err <= 1.13 * 4 * 96 * 2.0**-24 * scale + 1e-6 * np.abs(v) + 4e-7 * np.abs(want) + 1e-30)


def _attention_model(dv: int) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["b", 2, "m", 32]),
              helper.make_tensor_value_info("kt", TensorProto.FLOAT, ["b", 2, 32, "n"]),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, ["b", 2, "n", dv])]
    g = helper.make_graph(nodes, "att", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("precision", ["bf16-emulated", pytest.param("bf16", marks=needs_native)])
def test_attention_rounds_each_block_of_scores_once(precision: str) -> None:
    """bf16 attention over several full blocks of query rows and two panels of V: each block's exponentiated scores
    are rounded once (under an epoch of their own) for both panels, and O equals round(E) @ round(V) / sum(E) of
    the rounded Q and K (E = exp(S - max), float32 accumulation; a bf16 step of E at most either way)."""
    exe = ds.compile(ds.load_onnx(_attention_model(64)), precision=precision)
    (src,) = [s.source for s in exe.generic.steps if getattr(s, "kind", "") == "attention"]
    # the call's (Q) and a block's (the scores), that block printed twice: in the region for a team of threads
    # and in its one-thread branch (codegen/printer.py: Printer.team)
    assert src.count("ds_bf16_epoch()") == 3 and src.count("#pragma omp parallel") == 1
    assert "ds_softmax_exp_sum_bf16(" in src  # exps to bf16's need
    (src32,) = [s.source for s in ds.compile(ds.load_onnx(_attention_model(64))).generic.steps
                if getattr(s, "kind", "") == "attention"]
    assert "ds_softmax_exp_sum(" in src32 and "_bf16" not in src32 and src32.count("ds_bf16_epoch") == 0
    rng = np.random.default_rng(5)
    for b, m, n in ((1, 150, 130), (2, 121, 64)):  # 60-row blocks: 60 + 60 + 30 and 60 + 61 (a short tail joined)
        q, kt = (rng.standard_normal((b, 2, m, 32)) * 0.5).astype(np.float32), rng.standard_normal(
            (b, 2, 32, n)).astype(np.float32)
        v = rng.standard_normal((b, 2, n, 64)).astype(np.float32)
        got = exe.run({"q": q, "kt": kt, "v": v})["y"]
        s = bf16.rounded(q).astype(np.float64) @ bf16.rounded(kt).astype(np.float64)
        e = np.exp(s - s.max(-1, keepdims=True))
        vr, total = bf16.rounded(v).astype(np.float64), e.sum(-1, keepdims=True)
        want = bf16.rounded(e.astype(np.float32)).astype(np.float64) @ vr / total
        tol = (2.0**-8 * e @ np.abs(vr) + 1e-5 * np.abs(e) @ np.abs(vr)) / total
        assert np.all(np.abs(got - want) <= tol), float((np.abs(got - want) / tol).max())


@pytest.mark.parametrize("isa", ["native", "no-avx512"])
def test_bf16_softmax_exp_within_four_millionths(isa: str) -> None:
    """ds_expf_nonpos16_bf16 (a bf16 attention's softmax exps), its AVX-512 form and the lane-by-lane one of CPUs
    without it: relative error < 4e-6 on [-87, 0], exp(0) = 1, NaN kept, 0 far below (and at -inf)."""
    src = ('#include "ds_vmath.h"\nvoid v(const float *x, float *y, int64_t n) {\n'
           "  for (int64_t i = 0; i + 16 <= n; i += 16) ds_st16(y + i, ds_expf_nonpos16_bf16(ds_ld16(x + i)));\n}\n")
    lib = cc.compile_c(src, "exp_bf16", flags=[*cc.DEFAULT_FLAGS, *(("-mno-avx512f",) if isa != "native" else ())])
    mags = -(np.float32(10.0) ** np.linspace(-30, 1.9, 16000, dtype=np.float32))
    x = np.concatenate([np.linspace(-87, 0, 400000, dtype=np.float32), mags,
                        np.array([0.0, np.nan, -np.inf, -200.0] + [0.0] * 12, np.float32)])
    y = np.empty_like(x)
    lib.v(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data), ctypes.c_int64(x.size))
    body = x.size - 16
    ref = np.exp(x[:body].astype(np.float64))
    assert (np.abs(y[:body] / ref - 1)).max() < 4e-6
    assert y[body] == 1.0 and np.isnan(y[body + 1]) and y[body + 2] == 0.0 and y[body + 3] == 0.0


def _heads_model() -> onnx.ModelProto:
    """x @ W + B as (b, s, 3 heads, 32) transposed to (b, heads, s, 32): the product writes the heads' layout."""
    rng = np.random.default_rng(6)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 96)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), "B"),
             numpy_helper.from_array(np.array([0, 0, 3, 32], np.int64), "shape")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["v"]),
             helper.make_node("Reshape", ["v", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3])]
    g = helper.make_graph(nodes, "heads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("precision", ["bf16-emulated", pytest.param("bf16", marks=needs_native)])
def test_heads_folded_product_blocks_within_each_sequence(precision: str) -> None:
    """A bf16 product written as (b, heads, s, d) takes its 60-row blocks within each b (no block across two
    sequences: csrc/ds_gemm_bf16.c's memo of rounded rows then serves every panel): every row computed once, equal
    to the rounded operands' product over sequences shorter than a block, with a short tail joined (70) or not (61,
    130) and several b's."""
    model = _heads_model()
    exe = ds.compile(ds.load_onnx(model), precision=precision)
    (src,) = [s.source for s in exe.generic.steps if getattr(s, "kind", "") == "product"]
    assert "BPS" in src and "dst" in src  # the heads' layout, blocks per sequence
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    wr = bf16.rounded(inits["W"]).astype(np.float64)
    rng = np.random.default_rng(7)
    for b, s in ((3, 61), (2, 130), (2, 70), (4, 7), (1, 1)):
        x = rng.standard_normal((b, s, 64)).astype(np.float32)
        xr = bf16.rounded(x).astype(np.float64)
        want = (xr @ wr + inits["B"]).reshape(b, s, 3, 32).transpose(0, 2, 1, 3)
        scale = (np.abs(xr) @ np.abs(wr) + np.abs(inits["B"])).reshape(b, s, 3, 32).transpose(0, 2, 1, 3)
        got = exe.run({"x": x})["y"]
        assert got.shape == want.shape and np.all(np.abs(got - want) <= 4 * 64 * 2.0**-24 * scale), (b, s)


@pytest.mark.parametrize("n", [256, 100, 1])
def test_tree_layernorm_row_matches_float64(n: int) -> None:
    """ds_layernorm_row_tree (bf16 products' fused LayerNormalization): float32's accuracy against float64, in place
    and out, with and without a bias, over a row of whole 32-value steps, one with a tail, one value."""
    from dynshape.codegen import packed_gemm

    lib = packed_gemm.LIBRARY.load()
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3 + 5).astype(np.float32)
    scale, bias = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x64 = x.astype(np.float64)
    norm = (x64 - x64.mean()) / np.sqrt(x64.var() + 1e-5)
    for with_bias in (True, False):
        want = norm * scale + (bias if with_bias else 0.0)
        for in_place in (False, True):
            y = x.copy() if in_place else np.empty_like(x)
            src = y if in_place else x
            lib.ds_layernorm_row_tree(src.ctypes.data, y.ctypes.data, scale.ctypes.data,
                                      bias.ctypes.data if with_bias else None, n, ctypes.c_float(1e-5))
            assert np.all(np.abs(y - want) <= 2e-6 * (np.abs(norm * scale) + 1) + 1e-7), (with_bias, in_place)


def test_bf16_products_fuse_the_tree_layernorm() -> None:
    """A product's fused LayerNormalization calls ds_layernorm_row_tree under bf16, ds_layernorm_row in float32."""
    model = build_encoder(layers=1, hidden=64, heads=4, ffn=128)
    for precision, fn in (("bf16-emulated", "ds_layernorm_row_tree("), ("fp32", "ds_layernorm_row(")):
        exe = ds.compile(ds.load_onnx(model), precision=precision)
        srcs = [s.source for s in exe.generic.steps if getattr(s, "kind", "") == "product" and "LayerNorm" in s.name]
        assert srcs and all(fn in src for src in srcs), precision


@pytest.mark.parametrize("name", ["bf16_storage", "amx_direct_conv", "fuse"])
@pytest.mark.parametrize("bad", ["false", 0, 1, None])
def test_a_switch_that_is_not_true_or_false_is_refused_by_name(name, bad) -> None:
    """A string ("false" from a config file) would read as on: every bool option takes True or False only."""
    with pytest.raises(DynshapeError, match=f"{name}=.*True or False"):
        Options(**{name: bad})
    assert getattr(Options(**{name: False}), name) is False


@pytest.mark.parametrize("ci,co", [(16, 32), (32, 64)])
def test_narrow_winograd_convs_take_float32_f4_under_bf16(tile_path, ci: int, co: int) -> None:
    """A 3x3 conv that Winograd takes, on fewer than bf16_min_winograd_macs multiply-adds a pixel, runs float32's
    F(4x4) under bf16 where its map pays for it (its 4x fewer products beat F(2x2)'s at bf16's rate where products
    run on VDPBF16PS), and F(2x2) with bf16 products on a map too small for F(4x4): on a large map the very values
    of the float32 build, bit for bit; on a small one bf16's (not float32's), native equal to emulated."""
    tile_path(0)
    rng = np.random.default_rng(ci)
    w = (rng.standard_normal((co, ci, 3, 3)) * 0.2).astype(np.float32)
    model = _conv_model(ci, co, 3, 1, 1, 1, w)
    wide = {"winograd_min_channels": 16}  # Winograd on 16 channels on any CPU (AVX2's default starts at 32)
    fp32 = ds.compile(ds.load_onnx(model), **wide)
    small = {}
    for precision in ("bf16-emulated", *(("bf16",) if NATIVE else ())):
        exe = ds.compile(ds.load_onnx(model), precision=precision, **wide)
        method = next(st.method for st in exe.generic.steps if getattr(st, "method", ""))
        assert method.startswith("Winograd F(4x4)") and "F(2x2)'s products bf16" in method \
            and "F(4x4)'s float32" in method, method
        for h, wd in ((40, 36), (8, 8)):
            x = rng.standard_normal((1, ci, h, wd)).astype(np.float32)
            r = rng.standard_normal((1, co, h, wd)).astype(np.float32)
            got, want = exe.run({"x": x, "r": r})["y"], fp32.run({"x": x, "r": r})["y"]
            if h == 40:
                np.testing.assert_array_equal(got, want)
            else:
                rms = float(np.sqrt(np.mean(want.astype(np.float64) ** 2)))
                assert 1e-4 * rms < np.abs(got - want).max() <= 0.03 * rms
                small[precision] = (x, r, got)
    if NATIVE:
        x, r, emulated = small["bf16-emulated"]
        native = ds.compile(ds.load_onnx(model), precision="bf16", **wide).run({"x": x, "r": r})["y"]
        assert np.abs(native - emulated).max() <= 1e-4 * float(np.abs(emulated).max())
