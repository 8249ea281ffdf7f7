"""ConvTranspose (kernel = stride: an FPN's or a UNet's 2x2 upsampling) under precision="bf16": its product of an
input block by every tap's weights runs on bf16 pairs (csrc/ds_gemm_bf16.c's panel product), against the float32
ConvTranspose of the rounded input and weights (its products are exact in float32: float32 accumulation's
tolerance). A deconv of few multiply-adds an output pixel (Ci x Co under bf16_min_conv_macs) stays float32."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen import bf16

NATIVE = bf16.native_available()
AMX = NATIVE and bool(bf16.LIBRARY.load().ds_bf16_use_amx(-1))



def _model(w: np.ndarray, k: int) -> onnx.ModelProto:
    """ConvTranspose(x, w, b) with kernel and stride k, then Relu."""
    co = w.shape[1]
    bias = np.linspace(-0.5, 0.5, co).astype(np.float32)
    nodes = [helper.make_node("ConvTranspose", ["x", "W", "B"], ["c"], kernel_shape=[k, k], strides=[k, k]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "deconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              ["n", w.shape[0], "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _method(exe) -> str:
    (m,) = [st.method for st in exe.generic.steps if getattr(st, "method", "").startswith("ConvTranspose")]
    return m


@pytest.mark.parametrize("precision", [
    "bf16-emulated", pytest.param("bf16", marks=pytest.mark.skipif(not NATIVE, reason="no AVX512-BF16 here")),
    pytest.param("bf16-vdpbf16ps", marks=pytest.mark.skipif(not AMX, reason="no AMX here: bf16 is VDPBF16PS"))])
@pytest.mark.parametrize("ci,co,k,shapes", [(64, 48, 2, [(1, 16, 16), (2, 5, 23)]),
                                            (33, 64, 2, [(1, 7, 9)]),  # odd Ci: the last pair half zero
                                            (40, 56, 3, [(2, 6, 41)])])  # 3x3 stride 3; rows past a block of 60
def test_bf16_deconvs_match_the_rounded_reference(tile_path, precision: str, ci: int, co: int, k: int,
                                                  shapes: list) -> None:
    if precision == "bf16-vdpbf16ps":
        precision = "bf16"
        tile_path(0)
    rng = np.random.default_rng(ci * co + k)
    w = (rng.standard_normal((ci, co, k, k)) * 0.2).astype(np.float32)
    exe = ds.compile(ds.load_onnx(_model(w, k)), precision=precision)
    assert "bf16" in _method(exe), _method(exe)
    exact = ds.compile(ds.load_onnx(_model(bf16.rounded(w), k)))
    for n, h, wd in shapes:
        x = rng.standard_normal((n, ci, h, wd)).astype(np.float32)
        want = exact.run({"x": bf16.rounded(x)})["y"]
        got = exe.run({"x": x})["y"]
        assert got.shape == (n, co, h * k, wd * k)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (n, h, wd)


def test_a_narrow_deconv_stays_float32_under_bf16() -> None:
    """16 -> 8 channels (128 multiply-adds an output pixel, under bf16_min_conv_macs): the float32 kernel, bit for
    bit the float32 build's, and explain says so."""
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((16, 8, 2, 2)) * 0.2).astype(np.float32)
    x = rng.standard_normal((1, 16, 9, 10)).astype(np.float32)
    narrow = ds.compile(ds.load_onnx(_model(w, 2)), precision="bf16-emulated")
    assert "bf16" not in _method(narrow)
    np.testing.assert_array_equal(narrow.run({"x": x})["y"], ds.compile(ds.load_onnx(_model(w, 2))).run({"x": x})["y"])
