"""Conv/pool output-size rules: exact floor/ceil expressions over symbolic dims, equal to the references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tensor_rules import infer, tt

import dynshape as ds
from dynshape.errors import ShapeError
from dynshape.ir import opdef

F32 = np.float32


def _ref_shape(op, x_shape, w_shape=None, **attrs):
    x = np.zeros(x_shape, F32)
    ins = [x] if w_shape is None else [x, np.zeros(w_shape, F32)]
    return opdef.lookup(op).reference(ins, {**attrs, "_opset": 22, "_num_outputs": 1})[0].shape


def test_conv_chain_on_symbolic_height_is_exact():
    h, w = ds.sym("H"), ds.sym("W")
    (y,), _ = infer("Conv", [tt((1, 3, h, w)), tt((8, 3, 3, 3))], strides=[2, 2], pads=[1, 1, 1, 1])
    assert y.shape == (1, 8, (h + 2 - 3) // 2 + 1, (w + 2 - 3) // 2 + 1)
    (z,), _ = infer("Conv", [y, tt((16, 4, 3, 3))], strides=[2, 1], dilations=[2, 1], group=2)
    assert z.shape[2] == ((h + 2 - 3) // 2 + 1 - 2 * 2 - 1) // 2 + 1
    (p,), _ = infer("MaxPool", [z], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)
    for hv in range(11, 40):
        env = {"H": hv, "W": 16}
        conv1 = _ref_shape("Conv", (1, 3, hv, 16), (8, 3, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1])
        conv2 = _ref_shape("Conv", conv1, (16, 4, 3, 3), strides=[2, 1], dilations=[2, 1], group=2)
        pool = _ref_shape("MaxPool", conv2, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)
        assert [d.evaluate(env) if ds.is_expr(d) else d for d in p.shape] == list(pool)


window = st.fixed_dictionaries(
    {
        "k": st.integers(1, 4),
        "s": st.integers(1, 3),
        "d": st.integers(1, 3),
        "pb": st.integers(0, 3),
        "pe": st.integers(0, 3),
        "ceil": st.booleans(),
        "auto": st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]),
    }
)


def _attrs(p, pool):
    a = {"strides": [p["s"]], "dilations": [p["d"]]}
    if p["auto"] == "NOTSET":
        a["pads"] = [min(p["pb"], p["k"] - 1), min(p["pe"], p["k"] - 1)]
    else:
        a["auto_pad"] = p["auto"]
    if pool:
        a["kernel_shape"] = [p["k"]]
        a["ceil_mode"] = int(p["ceil"] and p["auto"] == "NOTSET")
    return a


def _count_windows(h, k, s, d, pb, pe, ceil, auto):
    """Brute force: enumerate window starts (independent of the closed forms in conv.py)."""
    span = d * (k - 1) + 1
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return len(range(0, h, s))  # the spec: ceil(H / stride) outputs
    if auto == "VALID":
        pb = pe = 0
    padded = h + pb + pe
    count = 0
    for start in range(0, padded + s):
        if start % s:
            continue
        fits = start + span <= padded
        overhang_ok = ceil and start < h + pb and start + span <= padded + s - 1
        count += fits or overhang_ok
    return count


@settings(max_examples=150, deadline=None)
@given(p=window, op=st.sampled_from(["Conv", "MaxPool", "AveragePool", "LpPool"]))
def test_symbolic_window_size_is_exact_for_every_height(p, op):
    h = ds.sym("H", min=0)
    pool = op != "Conv"
    attrs = _attrs(p, pool)
    ins = [tt((1, 1, h))] + ([] if pool else [tt((2, 1, p["k"]))])
    (y,), _ = infer(op, ins, **attrs)
    pads = attrs.get("pads", [0, 0])
    span = p["d"] * (p["k"] - 1) + 1
    for hv in range(span, span + 12):
        want = _count_windows(hv, p["k"], p["s"], p["d"], *pads, attrs.get("ceil_mode", 0), p["auto"])
        got = y.shape[2].evaluate({"H": hv}) if ds.is_expr(y.shape[2]) else y.shape[2]
        assert got == want, (hv, attrs)
        if hv < span + 3:  # and the reference produces that many windows
            assert _ref_shape(op, (1, 1, hv), None if pool else (2, 1, p["k"]), **attrs)[2] == want


@settings(max_examples=80, deadline=None)
@given(
    k=st.integers(1, 3),
    s=st.integers(1, 3),
    d=st.integers(1, 2),
    pb=st.integers(0, 2),
    pe=st.integers(0, 2),
    op_=st.integers(0, 2),
    auto=st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER"]),
    g=st.sampled_from([1, 2]),
)
def test_conv_transpose_size(k, s, d, pb, pe, op_, auto, g):
    attrs = {"strides": [s], "dilations": [d], "output_padding": [min(op_, s - 1)], "group": g}
    attrs |= {"pads": [pb, pe]} if auto == "NOTSET" else {"auto_pad": auto}
    h = ds.sym("H")
    (y,), _ = infer("ConvTranspose", [tt((1, 2, h)), tt((2, 3, k))], **attrs)
    assert y.shape[1] == 3 * g
    for hv in range(1, 9):
        if auto == "NOTSET" and s * (hv - 1) + attrs["output_padding"][0] + d * (k - 1) + 1 - pb - pe < 1:
            continue
        full = s * (hv - 1) + attrs["output_padding"][0] + d * (k - 1) + 1
        want = full - pb - pe if auto == "NOTSET" else hv * s  # the spec's two cases
        assert y.shape[2].evaluate({"H": hv}) == want
        assert _ref_shape("ConvTranspose", (1, 2, hv), (2, 3, k), **attrs)[2] == want


def test_conv_transpose_output_shape_attr():
    h = ds.sym("H")
    (y,), _ = infer("ConvTranspose", [tt((1, 1, h, 3)), tt((1, 2, 3, 3))], strides=[3, 2], output_shape=[10, 8])
    assert y.shape == (1, 2, 10, 8)


def test_maxpool_indices_output_and_global_pools():
    n, h = ds.sym("n"), ds.sym("H")
    ys, _ = infer("MaxPool", [tt((n, 3, h, h))], nout=2, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    assert ys[0].shape == (n, 3, h, h) and ys[1].dtype == np.int64 and ys[1].shape == ys[0].shape
    (g,), _ = infer("GlobalAveragePool", [tt((n, 3, h, h, 2))])
    assert g.shape == (n, 3, 1, 1, 1)


def test_conv_channel_mismatch_is_an_error():
    with pytest.raises(ShapeError):
        infer("Conv", [tt((1, 4, 8, 8)), tt((8, 3, 3, 3))])
    with pytest.raises(ShapeError, match="window"):
        infer("MaxPool", [tt((1, 1, 2, 2))], kernel_shape=[3, 3])
