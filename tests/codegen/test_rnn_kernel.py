"""The native LSTM / GRU / RNN kernel (csrc/ds_rnn.c) against the numpy references, its activations against
float64, its binding's refusals, and its place in a program of native calls."""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import dynshape as ds
from dynshape.codegen import program
from dynshape.codegen import rnn_kernel as rk
from dynshape.errors import ConstraintViolation
from dynshape.ir import opdef

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from test_rnn_cases import make_inputs  # noqa: E402

SLOTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


def _reference(op: str, feeds: dict, attrs: dict, dtype: type = np.float64) -> list:
    """The numpy reference in `dtype` (float64: the exact answer the float32 kernel is judged against)."""
    ins = [feeds.get(k) for k in SLOTS]
    ins = [v.astype(dtype) if v is not None and v.dtype == np.float32 else v for v in ins]
    return opdef.lookup(op).reference(ins if op == "LSTM" else ins[:6], {"_opset": 22, **attrs})


def _native(op: str, feeds: dict, attrs: dict, outputs: tuple = (True, True, True)) -> tuple:
    k = rk.bind(op, feeds["W"], feeds["R"], attrs)
    return k(feeds["X"], *(feeds.get(s) for s in SLOTS[3:]), outputs=outputs)


def _check(got: tuple, want: list) -> None:
    """Within 1e-5 of the float64 answer, relative to the output's magnitude (elementwise relative error is
    float32 rounding of the products, the same for numpy's float32 reference)."""
    for g, w in zip(got, want):
        assert g.dtype == np.float32 and g.shape == w.shape
        scale = max(float(np.max(np.abs(w))), 1e-3) if w.size else 1.0
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * scale)


def _inputs(op: str, **kw) -> dict:
    hid = kw["hid"]
    return make_inputs(op, h0=True, c0=True, peep=True, bias=True, scale=0.7 / np.sqrt(hid), **kw)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("seq,batch", [(1, 1), (7, 3), (100, 1), (30, 16)])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_matches_reference_hidden_128(op, seq, batch, direction):
    feeds = _inputs(op, seq=seq, batch=batch, inp=64, hid=128, direction=direction, lens=batch > 1,
                    seed=seq + batch)
    attrs = {"direction": direction, "hidden_size": 128}
    _check(_native(op, feeds, attrs), _reference(op, feeds, attrs))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("layout", [0, 1])
def test_odd_sizes_layout_and_lengths(op, layout):
    """Hidden and input sizes that are not multiples of the 32-column panels, batch-first, ragged lengths."""
    feeds = _inputs(op, seq=11, batch=5, inp=21, hid=37, direction="bidirectional", lens=True, layout=layout)
    feeds["sequence_lens"] = np.array([11, 0, 4, 1, 10], np.int32)
    attrs = {"direction": "bidirectional", "layout": layout}
    _check(_native(op, feeds, attrs), _reference(op, feeds, attrs))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("hid", [1, 5, 37, 96])
def test_one_row_products_at_every_panel_count(op, hid):
    """Batch 1 takes the kernel's own one-row product (two panels at a time): odd and partial panel counts."""
    feeds = _inputs(op, seq=6, batch=1, inp=9, hid=hid, direction="bidirectional", seed=hid)
    attrs = {"direction": "bidirectional", "linear_before_reset": int(hid % 2)} if op == "GRU" else \
        {"direction": "bidirectional"}
    _check(_native(op, feeds, attrs), _reference(op, feeds, attrs))


@pytest.mark.parametrize("op,attrs", [
    ("LSTM", {"input_forget": 1}), ("LSTM", {"clip": 0.05}), ("GRU", {"linear_before_reset": 1}),
    ("GRU", {"clip": 0.05, "linear_before_reset": 1}), ("GRU", {"clip": 0.05}),
    ("RNN", {"activations": ["Relu"]}), ("RNN", {"activations": ["Sigmoid"], "clip": 0.05}),
    ("RNN", {"activations": ["relu", "tanh"], "direction": "bidirectional"}),
])
def test_attributes_the_kernel_implements(op, attrs):
    feeds = _inputs(op, seq=9, batch=4, inp=16, hid=48, lens=True, direction=attrs.get("direction", "forward"))
    _check(_native(op, feeds, attrs), _reference(op, feeds, attrs))


def test_without_optional_inputs_and_outputs():
    feeds = make_inputs("LSTM", seq=6, batch=2, inp=8, hid=32, bias=False)
    y, y_h, y_c = _native("LSTM", feeds, {}, outputs=(False, True, False))
    assert y is None and y_c is None
    _check((y_h,), _reference("LSTM", feeds, {})[1:2])
    y, y_h = rk.gru_f32(feeds["X"], *(make_inputs("GRU", seq=6, batch=2, inp=8, hid=32)[k] for k in ("W", "R")))
    assert y.shape == (6, 1, 2, 32) and y_h.shape == (1, 2, 32)


def test_empty_sequence_and_all_zero_lengths():
    feeds = _inputs("LSTM", seq=0, batch=2, inp=8, hid=16)
    _check(_native("LSTM", feeds, {}), _reference("LSTM", feeds, {}))
    feeds = _inputs("GRU", seq=5, batch=3, inp=8, hid=16, lens=True, direction="reverse")
    feeds["sequence_lens"] = np.zeros(3, np.int32)
    y, y_h, _ = _native("GRU", feeds, {"direction": "reverse"})
    assert not y.any() and not y_h.any()


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_nan_propagates_like_the_reference(op):
    feeds = _inputs(op, seq=5, batch=2, inp=4, hid=20)
    feeds["X"][2, 0, 1] = np.nan
    got, want = _native(op, feeds, {}), _reference(op, feeds, {})
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    assert np.isnan(got[0][2:, 0, 0]).all() and not np.isnan(got[0][:, 0, 1]).any()


def test_torch_style_multilayer_stack():
    """Two stacked bidirectional LSTM layers (a CRNN head) through the kernel: layer 2 reads layer 1's Y."""
    f1 = _inputs("LSTM", seq=40, batch=2, inp=96, hid=96, direction="bidirectional")
    f2 = _inputs("LSTM", seq=40, batch=2, inp=192, hid=96, direction="bidirectional", seed=1)
    attrs = {"direction": "bidirectional"}
    y1 = _native("LSTM", f1, attrs)[0]
    f2["X"] = y1.transpose(0, 2, 1, 3).reshape(40, 2, 192).copy()
    ref1 = _reference("LSTM", f1, attrs)[0]
    _check((y1,), [ref1])
    _check(_native("LSTM", f2, attrs), _reference("LSTM", dict(f2, X=ref1.transpose(0, 2, 1, 3).reshape(40, 2, 192)),
                                                  attrs))


# ---- activations ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,exact", [("sigmoid", lambda v: 1 / (1 + np.exp(-v))), ("tanh", np.tanh)])
def test_activations_are_accurate_to_a_few_ulp(kind, exact):
    x = np.concatenate([np.linspace(-90, 90, 400001), np.geomspace(1e-30, 2, 20000),
                        -np.geomspace(1e-30, 2, 20000)]).astype(np.float32)
    with np.errstate(over="ignore"):
        want = exact(x.astype(np.float64))
    got = rk.activation(x, kind).astype(np.float64)
    normal = np.abs(want) > 1.2e-38
    assert np.max(np.abs(got - want)[normal] / np.abs(want[normal])) < 4e-7
    special = rk.activation(np.array([np.nan, np.inf, -np.inf, 0.0], np.float32), kind)
    assert np.isnan(special[0])
    np.testing.assert_allclose(special[1:], [1.0, 0.0 if kind == "sigmoid" else -1.0, 0.5 if kind == "sigmoid"
                                             else 0.0], atol=1e-37)


# ---- what it declines, and bad calls ------------------------------------------------------------------------
@pytest.mark.parametrize("op,attrs,dtype,reason", [
    ("LSTM", {}, np.float64, "float32 only"),
    ("LSTM", {"activations": ["Sigmoid", "Relu", "Tanh"]}, np.float32, r"only the defaults \['sigmoid'"),
    ("GRU", {"activations": ["HardSigmoid", "Tanh"]}, np.float32, "only the defaults"),
    ("RNN", {"activations": ["Softsign"]}, np.float32, "tanh, relu, sigmoid"),
    ("RNN", {"direction": "up"}, np.float32, "direction='up'"),
    ("Conv", {}, np.float32, "not a recurrent op"),
])
def test_supported_says_why_not(op, attrs, dtype, reason):
    why = rk.supported(op, attrs, dtype)
    assert why is not None and re.search(reason, why)


def test_supported_nodes_and_refusals():
    assert rk.supported("LSTM", {"direction": "bidirectional", "clip": 3.0, "input_forget": 1, "layout": 1}) is None
    assert rk.supported("GRU", {"activations": ["sigmoid", "TANH"], "linear_before_reset": 1}) is None
    feeds = make_inputs("LSTM", seq=3, batch=2, inp=4, hid=8)
    with pytest.raises(rk.NotSupported, match="only the defaults"):
        rk.bind("LSTM", feeds["W"], feeds["R"], {"activations": ["Sigmoid", "Elu", "Tanh"]})
    with pytest.raises(ConstraintViolation, match="direction='bidirectional'"):
        rk.bind("LSTM", feeds["W"], feeds["R"], {"direction": "bidirectional"})
    k = rk.bind("LSTM", feeds["W"], feeds["R"], {})
    with pytest.raises(ConstraintViolation, match="input size 5"):
        k(np.zeros((3, 2, 5), np.float32))
    with pytest.raises(ConstraintViolation, match="initial_h has shape"):
        k(feeds["X"], h0=np.zeros((1, 3, 8), np.float32))
    with pytest.raises(ConstraintViolation, match=r"sequence_lens must be 2 values in 0\.\.3"):
        k(feeds["X"], seq_lens=np.array([3, 4], np.int32))
    with pytest.raises(ConstraintViolation, match="float32"):
        k(feeds["X"].astype(np.float64))


# ---- the contract the compiler binds against ------------------------------------------------------------------
def test_workspace_formula_matches_the_kernel_and_works_on_symbols():
    lib = rk.library()
    for op, code in rk.OP_CODE.items():
        for args in [(1, 1, 128, 1), (100, 4, 96, 2), (0, 3, 7, 2)]:
            assert rk.workspace_floats(op, *args) == lib.ds_rnn_workspace(code, *args)
    seq, batch = ds.sym("seq"), ds.sym("batch")
    w = rk.workspace_floats("LSTM", seq, batch, 128, 2)
    assert w.evaluate({"seq": 50, "batch": 3}) == rk.workspace_floats("LSTM", 50, 3, 128, 2)


def test_one_step_of_a_native_program():
    """[fn, 1, &args]: the kernel called by program.py's runner, as a compiled plan would call it."""
    runner = program.LIBRARY.try_load()
    if runner is None:
        pytest.skip("no C compiler")
    feeds = _inputs("GRU", seq=12, batch=2, inp=16, hid=32, direction="bidirectional", lens=True)
    attrs = {"direction": "bidirectional"}
    k = rk.bind("GRU", feeds["W"], feeds["R"], attrs)
    y = np.empty((12, 2, 2, 32), np.float32)
    y_h = np.empty((2, 2, 32), np.float32)
    ws = np.empty(k.workspace_floats(12, 2), np.float32)
    block = k.args(x=feeds["X"].ctypes.data, seq=12, batch=2, ws=ws.ctypes.data, b=feeds["B"].ctypes.data,
                   seq_lens=feeds["sequence_lens"].ctypes.data, h0=feeds["initial_h"].ctypes.data,
                   y=y.ctypes.data, y_h=y_h.ctypes.data)
    assert block.shape == (rk.N_ARGS,)
    prog = np.array([k.entry, 1, block.ctypes.data], np.int64)
    runner.ds_run_program(prog.ctypes.data, ctypes.c_int64(1))
    _check((y, y_h), _reference("GRU", feeds, attrs))
