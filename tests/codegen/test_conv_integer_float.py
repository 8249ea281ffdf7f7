"""Dynamically quantized convolutions run as float32 convolutions (passes/qconv.py, ops/dynquant_conv.py,
codegen/lower/qconv.py), checked bit for bit against onnxruntime (its graph optimisations off: op by op) on the
chain onnxruntime's `quantize_dynamic` writes: DynamicQuantizeLinear -> ConvInteger -> + int32 bias rounded per
call -> Cast -> Mul; onnx's ReferenceEvaluator for per-channel weight zero points, which onnxruntime's ConvInteger
refuses. On an all-zero activation the two pick different scales (1 and 1 / 255): dynshape follows onnxruntime.

Exact equality is the claim: the float convolution's partial sums are integers below 2^24 when the weights pass
the bound, and the elementwise ops apply the reference's float32 operations in its order. Weights past the bound
keep ConvInteger on its reference, with the same results.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import dynshape as ds
from dynshape.passes.qconv import centered_weights, exact_in_float32

ort = pytest.importorskip("onnxruntime")
F = TensorProto.FLOAT


def _layer(i: int, x: str, w: np.ndarray, wz: np.ndarray, bias: np.ndarray | None, ws: np.float32, attrs: dict,
           act: bool) -> tuple[list, list, str]:
    """One quantized conv as onnxruntime's quantize_dynamic writes it; (nodes, initializers, output name)."""
    p = f"l{i}_"
    inits = [numpy_helper.from_array(w, p + "w"), numpy_helper.from_array(wz, p + "wz"),
             numpy_helper.from_array(np.array(ws, np.float32), p + "ws")]
    nodes = [helper.make_node("DynamicQuantizeLinear", [x], [p + "q", p + "s", p + "z"]),
             helper.make_node("ConvInteger", [p + "q", p + "w", p + "z", p + "wz"], [p + "acc"], **attrs),
             helper.make_node("Mul", [p + "s", p + "ws"], [p + "scale"])]
    acc = p + "acc"
    if bias is not None:
        inits += [numpy_helper.from_array(bias, p + "b"),
                  numpy_helper.from_array(np.array([1, -1, 1, 1], np.int64), p + "bshape")]
        nodes += [helper.make_node("Div", [p + "b", p + "scale"], [p + "bq_f"]),
                  helper.make_node("Floor", [p + "bq_f"], [p + "bq_r"]),
                  helper.make_node("Cast", [p + "bq_r"], [p + "bq"], to=TensorProto.INT32),
                  helper.make_node("Reshape", [p + "bq", p + "bshape"], [p + "bq4"]),
                  helper.make_node("Add", [p + "acc", p + "bq4"], [p + "accb"])]
        acc = p + "accb"
    nodes += [helper.make_node("Cast", [acc], [p + "accf"], to=F),
              helper.make_node("Mul", [p + "accf", p + "scale"], [p + "y"])]
    y = p + "y"
    if act:
        nodes += [helper.make_node("Relu", [y], [p + "a"])]  # exact in every runtime, unlike Sigmoid
        y = p + "a"
    return nodes, inits, y


def _model(layers: list[dict], in_ch: int) -> bytes:
    nodes, inits, x = [], [], "x"
    for i, spec in enumerate(layers):
        n, w, x = _layer(i, x, **spec)
        nodes += n
        inits += w
    g = helper.make_graph(nodes, "qconv", [helper.make_tensor_value_info("x", F, [1, in_ch, "h", "w"])],
                          [helper.make_tensor_value_info(x, F, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _weights(rng: np.random.Generator, m: int, c: int, k: int, dtype: type, per_channel: bool, wide: bool):
    shape = (m, c, k, k)
    if dtype is np.uint8:
        w = rng.integers(0, 256, shape) if wide else rng.integers(96, 160, shape)
        wz = rng.integers(110, 146, m if per_channel else 1)
    else:
        w = rng.integers(-128, 128, shape) if wide else rng.integers(-30, 30, shape)
        wz = rng.integers(-4, 5, m if per_channel else 1)
    wz = wz.astype(dtype)
    return w.astype(dtype), (wz if per_channel else wz.reshape(()))


def _run_both(model: bytes, x: np.ndarray, per_channel: bool = False) -> tuple[np.ndarray, np.ndarray, ds.Executable]:
    if per_channel:
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    else:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    exe = ds.compile(ds.load_onnx(model))
    got = exe.run({"x": x})
    got = got[0] if isinstance(got, (list, tuple)) else next(iter(got.values()))
    return np.asarray(got), want, exe


def _outside(exe) -> set[str]:
    return {u["op"] for u in exe.explain_build()["uncompiled"] if u["runs"] != "native"}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([np.uint8, np.int8]), per_channel=st.booleans(),
       k=st.sampled_from([1, 3]), stride=st.sampled_from([1, 2]), bias=st.booleans(), act=st.booleans(),
       hw=st.tuples(st.integers(1, 13), st.integers(1, 13)), kind=st.sampled_from(["normal", "positive", "zeros"]))
def test_quantized_conv_chain_is_exact(seed: int, dtype: type, per_channel: bool, k: int, stride: int, bias: bool,
                                       act: bool, hw: tuple[int, int], kind: str) -> None:
    assume(not (per_channel and kind == "zeros"))  # the two references disagree there (module doc)
    rng = np.random.default_rng(seed)
    c0, c1, c2 = 3, 8, 5
    layers = []
    for m, c in ((c1, c0), (c2, c1)):
        w, wz = _weights(rng, m, c, k, dtype, per_channel, wide=False)
        b = (rng.standard_normal(m) * 0.5).astype(np.float32) if bias else None
        layers.append({"w": w, "wz": wz, "bias": b, "ws": np.float32(rng.random() * 0.02 + 0.001), "act": act,
                       "attrs": {"kernel_shape": [k, k], "pads": [k // 2] * 4, "strides": [stride, stride]}})
    x = (rng.standard_normal((1, c0, *hw)) * 2).astype(np.float32)
    if kind == "positive":
        x = np.abs(x) + np.float32(0.5)  # the range's low end is 0, not min(x)
    elif kind == "zeros":
        x = np.zeros_like(x)  # scale 0: every quantized value and zero point 0
    got, want, exe = _run_both(_model(layers, c0), x, per_channel)
    assert got.shape == want.shape
    assert np.array_equal(got, want), float(np.abs(got - want).max())
    assert not {"ConvInteger", "DynamicQuantizeLinear"} & _outside(exe)


def test_weights_past_the_bound_keep_the_reference() -> None:
    rng = np.random.default_rng(3)
    w = np.full((4, 64, 3, 3), -128, np.int8)  # 255 * 128 * 576 > 2^24: a float sum could round
    wz = np.array(0, np.int8)
    assert not exact_in_float32(centered_weights(w, wz))
    w[:, :, :, :] = rng.integers(-128, 128, w.shape)
    layers = [{"w": np.full((4, 64, 3, 3), -128, np.int8), "wz": wz, "bias": None, "ws": np.float32(0.01),
               "act": False, "attrs": {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}}]
    x = (rng.standard_normal((1, 64, 6, 7)) * 3).astype(np.float32)
    got, want, exe = _run_both(_model(layers, 64), x)
    assert np.array_equal(got, want)
    assert "ConvInteger" in _outside(exe)


def test_the_bound_is_the_largest_channel_sum() -> None:
    w = np.zeros((2, 1, 1, 1), np.uint8)
    w[1, 0, 0, 0] = 255  # |255 - 0| * 255 = 65025: far inside
    assert exact_in_float32(centered_weights(w, np.array(0, np.uint8)))
    big = np.full((2, 258, 1, 1), 255, np.uint8)  # 258 * 255 * 255 = 16,776,450 < 2^24 = 16,777,216
    assert exact_in_float32(centered_weights(big, np.array(0, np.uint8)))
    bigger = np.full((2, 259, 1, 1), 255, np.uint8)  # 16,841,475 >= 2^24
    assert not exact_in_float32(centered_weights(bigger, np.array(0, np.uint8)))
    per_channel = centered_weights(bigger, np.array([0, 255], np.uint8))
    assert per_channel is not None and not exact_in_float32(per_channel)  # channel 0 alone breaks it
    assert centered_weights(bigger, np.array([1, 2, 3], np.uint8)) is None  # a zero point of neither shape


@pytest.mark.parametrize("h,w", [(4, 4), (9, 17)])
def test_nan_input_propagates_instead_of_raising(h: int, w: int) -> None:
    """NaN leaves DynamicQuantizeLinear unspecified (the reference casts NaN to uint8); the compiled chain must
    neither crash nor write out of bounds: it gives NaN."""
    rng = np.random.default_rng(0)
    wq, wz = _weights(rng, 4, 2, 3, np.uint8, False, wide=False)
    layers = [{"w": wq, "wz": wz, "bias": None, "ws": np.float32(0.01), "act": False,
               "attrs": {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}}]
    x = rng.standard_normal((1, 2, h, w)).astype(np.float32)
    x[0, 1, 0, 0] = np.nan
    exe = ds.compile(ds.load_onnx(_model(layers, 2)))
    got = exe.run({"x": x})
    got = got[0] if isinstance(got, (list, tuple)) else next(iter(got.values()))
    assert np.isnan(got).all()


@pytest.mark.parametrize("spread", [1.0, 1e-3, 300.0])
def test_every_activation_quantizes_as_onnxruntime(spread: float) -> None:
    """A 1x1 convolution by the identity passes each quantized value through: a quarter of a million activations,
    many near a rounding boundary of x / scale (a product with the scale's reciprocal instead of the division
    moves some of them), compared one by one."""
    rng = np.random.default_rng(7)
    c = 4
    w = np.eye(c, dtype=np.uint8).reshape(c, c, 1, 1) + np.uint8(100)
    layers = [{"w": w, "wz": np.array(100, np.uint8), "bias": None, "ws": np.float32(1.0), "act": False,
               "attrs": {"kernel_shape": [1, 1]}}]
    x = (rng.standard_normal((1, c, 256, 256)) * spread).astype(np.float32)
    got, want, exe = _run_both(_model(layers, c), x)
    assert np.array_equal(got, want), int((got != want).sum())
    assert not {"ConvInteger", "DynamicQuantizeLinear"} & _outside(exe)
