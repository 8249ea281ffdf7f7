"""LSTM / GRU / RNN references against onnxruntime (every attribute it implements), torch.nn (exported models,
bidirectional and stacked), and the spec's definitions where neither applies (layout=1, float16/double)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from test_rnn_cases import make_inputs, make_model

import dynshape as ds
from dynshape.errors import ConstraintViolation, ModelError
from dynshape.ir import opdef
from tolerance import assert_f32_close

ACTS = ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu",
        "Softsign", "Softplus"]


def _ds(model: bytes, feeds: dict) -> list:
    g = ds.load_onnx(model)
    out = g.run(feeds)
    return [out[v.name] for v in g.outputs]


def _ort(model: bytes, feeds: dict) -> list:
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


def _close(got: list, want: list, scale: float = 1e-5) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert_f32_close(a, b, rtol=1e-5, scale=scale)


# ---- onnxruntime ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lens", [False, True])
def test_directions_states_lengths_match_onnxruntime(op, direction, lens):
    feeds = make_inputs(op, seq=7, batch=4, inp=5, hid=6, direction=direction, lens=lens, h0=True, c0=True,
                        peep=True, seed=len(op) * 10 + len(direction) + lens)
    if lens:
        feeds["sequence_lens"] = np.array([7, 0, 3, 1], np.int32)  # full, empty, partial, a single step
    model = make_model(op, feeds, hidden_size=6, direction=direction)
    _close(_ds(model, feeds), _ort(model, feeds))


@pytest.mark.parametrize("op,attrs", [
    ("LSTM", {"clip": 0.3}), ("GRU", {"clip": 0.3}), ("GRU", {"clip": 0.3, "linear_before_reset": 1}),
    ("RNN", {"clip": 0.3}), ("LSTM", {"input_forget": 1}), ("GRU", {"linear_before_reset": 1}),
])
def test_clip_input_forget_linear_before_reset_match_onnxruntime(op, attrs):
    feeds = make_inputs(op, seq=6, batch=3, inp=4, hid=5, h0=True, c0=True, peep=True, lens=True, scale=1.5)
    model = make_model(op, feeds, hidden_size=5, **attrs)
    _close(_ds(model, feeds), _ort(model, feeds))


def _act_lists(act: str) -> list:
    return [("LSTM", ["Sigmoid", act, act]), ("LSTM", [act, "Tanh", "Tanh"]), ("GRU", [act, "Tanh"]),
            ("GRU", ["Sigmoid", act]), ("RNN", [act])]


@pytest.mark.parametrize("op,acts", [c for a in ACTS for c in _act_lists(a)], ids=str)
def test_every_activation_with_alpha_beta_matches_onnxruntime(op, acts):
    """alpha / beta go, in order, to the activations that take them (the second LSTM activation of
    ['Sigmoid', 'Elu', 'Elu'] gets 0.7, the third 0.3)."""
    feeds = make_inputs(op, seq=4, batch=2, inp=3, hid=4, h0=True, c0=True, scale=0.7)
    model = make_model(op, feeds, hidden_size=4, activations=acts, activation_alpha=[0.7, 0.3, 0.45],
                       activation_beta=[0.2, 0.6, 0.1])
    _close(_ds(model, feeds), _ort(model, feeds), scale=1e-4)


def test_bidirectional_activations_per_direction_match_onnxruntime():
    feeds = make_inputs("LSTM", seq=5, batch=2, inp=3, hid=4, direction="bidirectional", h0=True, c0=True)
    model = make_model("LSTM", feeds, hidden_size=4, direction="bidirectional",
                       activations=["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Softsign", "ScaledTanh"],
                       activation_alpha=[0.25, 0.9], activation_beta=[0.45, 1.2])
    _close(_ds(model, feeds), _ort(model, feeds))


# ---- torch.nn ---------------------------------------------------------------------------------------------
def _export(module, args: tuple, names: list, outs: list, axes: dict) -> bytes:
    torch = pytest.importorskip("torch")
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.no_grad():
                torch.onnx.export(module, args, f, dynamo=False, input_names=names, output_names=outs,
                                  dynamic_axes=axes, opset_version=17)
        except Exception as e:  # noqa: BLE001 - the TorchScript exporter is deprecated; a torch without it skips
            pytest.skip(f"torch.onnx.export(dynamo=False) failed: {type(e).__name__}: {e}")
    return f.getvalue()


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN_TANH", "RNN_RELU"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_stacked_bidirectional_torch_modules(kind, batch_first):
    """Exported torch modules (two bidirectional layers, initial states as inputs) at several seq / batch sizes
    from one load with symbolic dims."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    cls = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}.get(kind, torch.nn.RNN)
    extra = {"nonlinearity": kind[4:].lower()} if kind.startswith("RNN") else {}
    m = cls(6, 8, num_layers=2, bidirectional=True, batch_first=batch_first, **extra).eval()
    lstm = kind == "LSTM"
    x0 = torch.randn(2, 5, 6) if batch_first else torch.randn(5, 2, 6)
    h0 = torch.randn(4, 2, 8)
    args = (x0, (h0, torch.randn(4, 2, 8))) if lstm else (x0, h0)
    names = ["x", "h0", "c0"] if lstm else ["x", "h0"]
    outs = ["y", "hn", "cn"] if lstm else ["y", "hn"]
    xa = {0: "batch", 1: "seq"} if batch_first else {0: "seq", 1: "batch"}
    axes = {"x": xa, "y": xa, **{n: {1: "batch"} for n in names[1:] + outs[1:]}}
    model = _export(m, args, names, outs, axes)
    g = ds.load_onnx(model, dims={"seq": (1, 64), "batch": (1, 8)})
    for seq, batch in [(1, 1), (9, 3), (20, 2)]:
        x = torch.randn(batch, seq, 6) if batch_first else torch.randn(seq, batch, 6)
        states = [torch.randn(4, batch, 8) for _ in names[1:]]
        with torch.no_grad():
            y, hn = m(x, tuple(states) if lstm else states[0])
        want = [y] + (list(hn) if lstm else [hn])
        got = g.run({n: t.numpy() for n, t in zip(names, [x, *states])})
        for name, w in zip(outs, want):
            assert_f32_close(got[name], w.numpy(), rtol=1e-4, scale=1e-5)


# ---- the spec where onnxruntime does not go -----------------------------------------------------------------
def _ref(op: str, feeds: dict, **attrs) -> list:
    ins = [feeds.get(k) for k in ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")]
    return opdef.lookup(op).reference(ins if op == "LSTM" else ins[:6], {"_opset": 22, **attrs})


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_layout_1_is_layout_0_transposed(op):
    f0 = make_inputs(op, seq=5, batch=3, inp=4, hid=3, direction="bidirectional", h0=True, c0=True, lens=True)
    f1 = dict(f0, X=f0["X"].swapaxes(0, 1).copy(), initial_h=f0["initial_h"].swapaxes(0, 1).copy())
    if op == "LSTM":
        f1["initial_c"] = f0["initial_c"].swapaxes(0, 1).copy()
    a = _ref(op, f0, hidden_size=3, direction="bidirectional")
    b = _ref(op, f1, hidden_size=3, direction="bidirectional", layout=1)
    np.testing.assert_array_equal(b[0], a[0].transpose(2, 0, 1, 3))
    for x, y in zip(a[1:], b[1:]):
        np.testing.assert_array_equal(y, x.swapaxes(0, 1))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_sequence_lens_entry_is_its_own_shorter_sequence(op, direction):
    """An entry of length L gives what running it alone on its first L steps gives, and zeros after."""
    feeds = make_inputs(op, seq=6, batch=3, inp=4, hid=3, direction=direction, h0=True, c0=True, peep=True)
    lens = np.array([6, 2, 4], np.int32)
    y, *states = _ref(op, dict(feeds, sequence_lens=lens), direction=direction)
    for b, n in enumerate(lens):
        alone = {k: (v[:n, b:b + 1] if k == "X" else v[:, b:b + 1] if k.startswith("initial") else v)
                 for k, v in feeds.items()}
        ya, *sa = _ref(op, alone, direction=direction)
        # float32 products of a 3-row and a 1-row batch take different numpy / BLAS kernels, whose summation
        # order is the CPU's: 0.8 of the old atol (1e-7) under AVX2 alone, so relative to the outputs (~1)
        assert_f32_close(y[:n, :, b:b + 1], ya, rtol=1e-6, scale=1e-6)
        assert not y[n:, :, b].any()
        for s, t in zip(states, sa):
            assert_f32_close(s[:, b:b + 1], t, rtol=1e-6, scale=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_float16_computes_in_float32_and_double_natively(dtype):
    f64 = make_inputs("LSTM", seq=4, batch=2, inp=3, hid=4, h0=True, c0=True, peep=True, dtype=np.float64)
    feeds = {k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in f64.items()}
    got = _ref("LSTM", feeds)
    exact = _ref("LSTM", {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in feeds.items()})
    for a, b in zip(got, exact):
        assert a.dtype == dtype
        np.testing.assert_allclose(a.astype(np.float64), b, rtol=1e-3 if dtype == np.float16 else 1e-12, atol=1e-3)


def test_optional_outputs_may_each_be_omitted():
    feeds = make_inputs("LSTM", seq=3, batch=2, inp=3, hid=4)
    full = _ds(make_model("LSTM", feeds, hidden_size=4), feeds)
    for outs in [("Y",), ("", "Y_h"), ("", "", "Y_c"), ("Y", "", "Y_c")]:
        got = _ds(make_model("LSTM", feeds, outputs=outs, hidden_size=4), feeds)
        assert len(got) == len([o for o in outs if o])
        for o, g in zip([o for o in outs if o], got):
            np.testing.assert_array_equal(g, full[["Y", "Y_h", "Y_c"].index(o)])


def test_bad_sequence_lens_values_are_refused():
    feeds = make_inputs("GRU", seq=4, batch=2, inp=3, hid=2, lens=True)
    with pytest.raises(ConstraintViolation, match=r"sequence_lens\[1\] = 5 .*0\.\.seq_length \(4\)"):
        _ref("GRU", dict(feeds, sequence_lens=np.array([4, 5], np.int32)))


def test_bad_attributes_are_model_errors():
    feeds = make_inputs("RNN", seq=2, batch=1, inp=2, hid=2)
    with pytest.raises(ModelError, match="direction='sideways'"):
        _ref("RNN", feeds, direction="sideways")
    with pytest.raises(ModelError, match="activation 'Swish'"):
        _ref("RNN", feeds, activations=["Swish"])
    with pytest.raises(ModelError, match="takes 2"):
        _ref("GRU", make_inputs("GRU", seq=2, batch=1, inp=2, hid=2), activations=["Sigmoid"])
