"""The conv/pool references against an independent implementation (onnxruntime), on random geometries."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dynshape.ir import opdef
from tolerance import assert_f32_close

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def run_ort(op, inputs, attrs, n_out=1):
    names = [f"x{i}" for i in range(len(inputs))]
    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in zip(names, inputs)
    ]
    outs = [
        helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT if i == 0 else TensorProto.INT64, None)
        for i in range(n_out)
    ]
    node = helper.make_node(op, names, [o.name for o in outs], **attrs)
    model = helper.make_model(helper.make_graph([node], "g", ins, outs), opset_imports=[helper.make_opsetid("", 19)])
    so = ort.SessionOptions()
    so.log_severity_level = 4
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, dict(zip(names, inputs)))


def check(op, inputs, attrs, n_out=1):
    want = run_ort(op, inputs, attrs, n_out)
    got = opdef.lookup(op).reference(inputs, {**attrs, "_opset": 19, "_num_outputs": n_out})
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if g.dtype.kind == "f":  # onnxruntime's kernels sum in another order, CPU-dependent
            assert_f32_close(g, w, rtol=1e-4, scale=1e-5)
        else:  # MaxPool's indices
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


geometry = st.fixed_dictionaries(
    {
        "nd": st.integers(1, 2),
        "k": st.integers(1, 3),
        "s": st.integers(1, 3),
        "d": st.integers(1, 2),
        "pad": st.integers(0, 2),
        "h": st.integers(0, 5),
        "ceil": st.integers(0, 1),
        "auto": st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]),
        "seed": st.integers(0, 99),
    }
)


def _setup(g):
    nd, k, d = g["nd"], g["k"], g["d"]
    rng = np.random.default_rng(g["seed"])
    span = d * (k - 1) + 1
    x = rng.standard_normal((2, 4, *[span + g["h"] + i for i in range(nd)])).astype(np.float32)
    attrs = {"strides": [g["s"]] * nd}
    if g["auto"] == "NOTSET":
        attrs["pads"] = [min(g["pad"], k - 1)] * nd + [min(g["pad"] + 1, k - 1)] * nd
    else:
        attrs["auto_pad"] = g["auto"]
    return rng, x, attrs


@settings(max_examples=40, deadline=None)
@given(g=geometry, group=st.sampled_from([1, 2, 4]), bias=st.booleans())
def test_conv(g, group, bias):
    rng, x, attrs = _setup(g)
    if g["auto"].startswith("SAME"):
        g["d"] = 1  # onnxruntime rejects dilation with SAME_* for Conv
    w = rng.standard_normal((8, 4 // group, *[g["k"]] * g["nd"])).astype(np.float32)
    ins = [x, w] + ([rng.standard_normal(8).astype(np.float32)] if bias else [])
    check("Conv", ins, {**attrs, "dilations": [g["d"]] * g["nd"], "group": group})


@settings(max_examples=40, deadline=None)
@given(g=geometry, group=st.sampled_from([1, 2]), out_pad=st.integers(0, 2))
def test_conv_transpose(g, group, out_pad):
    rng, x, attrs = _setup(g)
    if g["auto"] != "NOTSET":  # onnxruntime clips SAME_* pads at 0, the spec does not: compare explicit pads
        attrs = {"strides": attrs["strides"], "pads": [0] * 2 * g["nd"]}
    w = rng.standard_normal((4, 6 // group, *[g["k"]] * g["nd"])).astype(np.float32)
    op = [min(out_pad, g["s"] - 1)] * g["nd"]  # onnxruntime needs output_padding < stride
    check("ConvTranspose", [x, w], {**attrs, "dilations": [g["d"]] * g["nd"], "group": group, "output_padding": op})


@settings(max_examples=60, deadline=None)
@given(
    g=geometry,
    op=st.sampled_from(["MaxPool", "AveragePool", "LpPool"]),
    include_pad=st.integers(0, 1),
    storage_order=st.integers(0, 1),
)
def test_pools(g, op, include_pad, storage_order):
    _, x, attrs = _setup(g)
    attrs["kernel_shape"] = [g["k"]] * g["nd"]
    same = g["auto"].startswith("SAME")
    # onnxruntime's pools (not its Conv) let SAME_* pads go negative when kernel < stride; we never do
    assume(not (same and g["k"] < g["s"]))
    if op != "LpPool":
        attrs["dilations"] = [1 if same else g["d"]] * g["nd"]  # onnxruntime sizes SAME_* without dilation
        attrs["ceil_mode"] = 0 if g["auto"] != "NOTSET" else g["ceil"]
    if op == "AveragePool":
        attrs["count_include_pad"] = include_pad
    if op == "MaxPool":
        attrs["storage_order"] = storage_order
    check(op, [x], attrs, n_out=2 if op == "MaxPool" else 1)


def test_global_pools():
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype(np.float32)
    for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        check(op, [x], {})
