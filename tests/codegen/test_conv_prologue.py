"""bf16 1x1 convolutions that take the per-channel scale, shift and Relu before them as a prologue
(rules.match_conv_prologue, csrc/ds_gemm_bf16.c's ds_conv_tile2_bf16_pre): DenseNet's BatchNormalization + Relu
of each layer's input, applied as the conv rounds its input rows instead of in a pass of its own.

The scales are signed powers of two, so x * s is exact and x * s + t one rounding whichever way it is computed
(fused multiply-add or not): the prologue's build then equals the unfused build bit for bit (the values the conv
rounds are the same), and the float32 reference to bf16's tolerance."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen import bf16

NATIVE = bf16.native_available()
AMX = NATIVE and bool(bf16.LIBRARY.load().ds_bf16_use_amx(-1))
PRO = "its input's per-channel scale, shift and Relu applied as its rows are rounded"



def _model(ci: int, co: int, s: np.ndarray, t: np.ndarray, w: np.ndarray, k: int = 1, relu: bool = True,
           extra_reader: bool = False) -> onnx.ModelProto:
    """x -> MaxPool 3x3 (a channels-last map, as DenseNet's pool and Concats; after a conv the scale and shift
    would fold into its weights) -> Mul(s) -> Add(t) -> [Relu] -> Conv k x k (bias) -> Relu -> y (and Neg of the
    prologue's output)."""
    nodes = [helper.make_node("MaxPool", ["x"], ["x0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["x0", "s"], ["m"]), helper.make_node("Add", ["m", "t"], ["a"])]
    pre = "a"
    if relu:
        nodes.append(helper.make_node("Relu", ["a"], ["r"]))
        pre = "r"
    nodes += [helper.make_node("Conv", [pre, "W", "B"], ["c"], pads=[k // 2] * 4),
              helper.make_node("Relu", ["c"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", [pre], ["z"]))
        outs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    inits = {"s": s.reshape(1, ci, 1, 1), "t": t.reshape(1, ci, 1, 1), "W": w,
             "B": np.linspace(-1, 1, co).astype(np.float32)}
    graph = helper.make_graph(nodes, "pre", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          ["n", ci, "h", "w"])], outs,
                              [numpy_helper.from_array(v, n) for n, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _case(ci: int, co: int, k: int = 1, seed: int = 0):
    rng = np.random.default_rng(seed + ci * co)
    s = rng.choice([0.25, 0.5, 1.0, 2.0, -0.5], ci).astype(np.float32)
    t = (rng.integers(-16, 17, ci) / 16).astype(np.float32)
    w = (rng.standard_normal((co, ci, k, k)) * 0.2).astype(np.float32)
    return rng, s, t, w


def _methods(exe) -> list[str]:
    return [getattr(st, "method", "") for st in exe.generic.steps if getattr(st, "method", "")]


@pytest.mark.parametrize("precision", [
    "bf16-emulated", pytest.param("bf16", marks=pytest.mark.skipif(not NATIVE, reason="no AVX512-BF16 here")),
    pytest.param("bf16-vdpbf16ps", marks=pytest.mark.skipif(not AMX, reason="no AMX here: bf16 is VDPBF16PS"))])
@pytest.mark.parametrize("ci,co,relu", [(64, 48, True), (48, 100, True), (96, 40, False)])
def test_the_prologue_equals_its_elementwise_pass(tile_path, precision: str, ci: int, co: int, relu: bool) -> None:
    """With and without the prologue (conv_prologue=False: the elementwise kernel writes the map the conv reads),
    bit for bit; both the rounded reference's to float32 accumulation's tolerance. 48 channels: a run's masked
    tail of 16; 96: three whole vectors; over several images and maps."""
    if precision == "bf16-vdpbf16ps":
        precision = "bf16"
        tile_path(0)
    rng, s, t, w = _case(ci, co)
    g = ds.load_onnx(_model(ci, co, s, t, w, relu=relu))
    fused = ds.compile(g, precision=precision)
    assert any(PRO in m for m in _methods(fused)), _methods(fused)
    apart = ds.compile(g, precision=precision, conv_prologue=False)
    assert not any(PRO in m for m in _methods(apart))
    for n, h, wd in [(1, 9, 13), (2, 16, 16), (3, 1, 5)]:
        x = rng.standard_normal((n, ci, h, wd)).astype(np.float32)
        got = fused.run({"x": x})["y"]
        np.testing.assert_array_equal(got, apart.run({"x": x})["y"])
        want = g.run({"x": x})["y"]  # the float32 reference
        assert np.abs(got - want).max() <= 3e-2 * np.abs(want).max(), (n, h, wd)


@pytest.mark.parametrize("case", ["fp32", "read twice", "3x3", "16 channels", "option off"])
def test_where_the_prologue_is_not_taken(case: str) -> None:
    """float32 builds (no rounding to fold it into), a prologue output something else reads, a 3x3 conv, fewer
    than 32 channels, or conv_prologue=False: the elementwise pass stays, results the reference's."""
    ci = 16 if case == "16 channels" else 64
    k = 3 if case == "3x3" else 1
    rng, s, t, w = _case(ci, 48, k)
    model = _model(ci, 48, s, t, w, k=k, extra_reader=case == "read twice")
    g = ds.load_onnx(model)
    options = {"fp32": {}, "option off": {"precision": "bf16-emulated", "conv_prologue": False}}.get(
        case, {"precision": "bf16-emulated"})
    exe = ds.compile(g, **options)
    assert not any(PRO in m for m in _methods(exe)), _methods(exe)
    x = rng.standard_normal((1, ci, 7, 6)).astype(np.float32)
    want = g.run({"x": x})["y"]
    tol = (1e-5 if case == "fp32" else 3e-2) * np.abs(want).max()
    assert np.abs(exe.run({"x": x})["y"] - want).max() <= tol



def test_a_prologue_that_broadcasts_its_input_is_not_taken() -> None:
    """A one-channel map times a per-channel scale (a broadcast to 64 channels) before the conv: its input is not
    the conv's rows, so the rule leaves the elementwise kernel and the conv kernel as they are (taken, the
    lowering would refuse it and the three nodes would run one by one)."""
    rng = np.random.default_rng(9)
    s = rng.choice([0.5, 2.0], 64).astype(np.float32).reshape(1, 64, 1, 1)
    w = (rng.standard_normal((48, 64, 1, 1)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("MaxPool", ["x"], ["x0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["x0", "s"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Conv", ["r", "W"], ["y"])]
    graph = helper.make_graph(nodes, "bc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(s, "s"), numpy_helper.from_array(w, "W")])
    g = ds.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    exe = ds.compile(g, precision="bf16-emulated")
    kinds = [getattr(st, "kind", None) for st in exe.generic.steps]
    assert kinds.count("elementwise") == 1 and kinds.count("conv") == 1, kinds
    assert not any(PRO in m for m in _methods(exe)), _methods(exe)
    x = rng.standard_normal((2, 1, 5, 6)).astype(np.float32)
    want = g.run({"x": x})["y"]
    assert np.abs(exe.run({"x": x})["y"] - want).max() <= 3e-2 * np.abs(want).max()
