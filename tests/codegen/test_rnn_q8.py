"""The LSTM's 8-bit products (csrc/ds_rnn_q8.h): an R (and W) that is a scale times 8-bit integers (what
onnxruntime's DynamicQuantizeLSTM ships, dequantized by the frontend) runs on those integers, and must give the
float LSTM's results on the dequantized weights, within float32 summation error of the output's magnitude."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen import rnn_kernel as rk
from dynshape.ir import opdef

SLOTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
MODES = ["portable"] + (["native"] if rk.q8_native() else [])


def _quantized(rng: np.random.Generator, nd: int, rows: int, cols: int, dtype: type, per_row: bool, size: float):
    """A weight as the frontend dequantizes it ((q - z) * s in float32) and its scale, per direction or per row."""
    lo, hi = (0, 256) if dtype == np.uint8 else (-128, 128)
    q = rng.integers(lo, hi, (nd, rows, cols)).astype(dtype)
    shape = (nd, rows, 1) if per_row else (nd, 1, 1)
    z = rng.integers(lo, hi, shape).astype(dtype)
    s = (rng.uniform(0.5, 2.0, shape) * size / (64 * np.sqrt(cols))).astype(np.float32)
    r = (q.astype(np.float32) - z.astype(np.float32)) * s
    return r.astype(np.float32), s.reshape(nd, -1) if per_row else s.reshape(nd)


def _feeds(seed: int, direction: str, seq: int, batch: int, hid: int, dtype: type, per_row: bool,
           full: bool = True, inp: int = 6) -> tuple[dict, np.ndarray, np.ndarray]:
    """Feeds, R's scale and W's (both quantized alike)."""
    rng = np.random.default_rng(seed)
    nd = 2 if direction == "bidirectional" else 1
    r, s = _quantized(rng, nd, 4 * hid, hid, dtype, per_row, 0.5)
    w, ws = _quantized(rng, nd, 4 * hid, inp, dtype, per_row, 1.0)
    f = {"X": rng.standard_normal((seq, batch, inp)).astype(np.float32), "W": w, "R": r}
    if full:
        f["B"] = (rng.standard_normal((nd, 8 * hid)) * 0.2).astype(np.float32)
        lens = rng.integers(0, seq + 1, batch).astype(np.int32)
        lens[0] = seq
        f["sequence_lens"] = lens
        f["initial_h"] = (rng.standard_normal((nd, batch, hid)) * 0.5).astype(np.float32)
        f["initial_c"] = (rng.standard_normal((nd, batch, hid)) * 0.5).astype(np.float32)
    return f, s, ws


def _reference(feeds: dict, attrs: dict) -> list:
    """The float LSTM on the dequantized weights, in float64 (the answer both float32 kernels approximate)."""
    ins = [feeds.get(k) for k in SLOTS]
    ins = [v.astype(np.float64) if v is not None and v.dtype == np.float32 else v for v in ins]
    return opdef.lookup("LSTM").reference(ins, {"_opset": 22, **attrs})


def _run(feeds: dict, attrs: dict, scale: np.ndarray, mode: str, w_scale: np.ndarray | None = None) -> tuple:
    k = rk.bind("LSTM", feeds["W"], feeds["R"], attrs, r_scale=scale, w_scale=w_scale, q8=mode)
    assert k.rq is not None and (k.wq is not None) == (w_scale is not None)  # the 8-bit products ran
    return k(feeds["X"], *(feeds.get(s) for s in SLOTS[3:]))


def _check(got: tuple, want: list, rel: float = 1e-5) -> None:
    for g, w in zip(got, want):
        assert g.dtype == np.float32 and g.shape == w.shape
        scale = max(float(np.nanmax(np.abs(w))), 1e-30) if w.size else 1.0  # NaN where both have NaN
        np.testing.assert_allclose(g, w, rtol=0, atol=rel * scale)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("quantized_w", [False, True])
def test_matches_the_float_lstm_on_the_dequantized_weights(mode, dtype, per_row, direction, quantized_w):
    """Hidden and input sizes off every multiple of 4, 16 and 32 (padded depth, a last panel of fewer columns,
    an odd panel count); batch 1..5 with sequence lengths, initial states and bias."""
    for i, (seq, batch, hid, inp) in enumerate([(1, 1, 5, 3), (7, 3, 37, 6), (4, 5, 70, 33), (3, 2, 9, 1)]):
        feeds, s, ws = _feeds(i, direction, seq, batch, hid, dtype, per_row, full=i > 0, inp=inp)
        attrs = {"direction": direction, "hidden_size": hid}
        _check(_run(feeds, attrs, s, mode, ws if quantized_w else None), _reference(feeds, attrs))


def test_native_and_portable_give_identical_bits():
    if "native" not in MODES:
        pytest.skip("no vector int8 product here (AVX512-VNNI or AVX2)")
    feeds, s, ws = _feeds(3, "bidirectional", 6, 4, 45, np.uint8, True, inp=19)
    attrs = {"direction": "bidirectional"}
    for a, b in zip(_run(feeds, attrs, s, "native", ws), _run(feeds, attrs, s, "portable", ws)):
        np.testing.assert_array_equal(a, b)


def test_hidden_512_batch_1_as_in_ddddocr():
    """The shape the kernel was built for (its product splits over threads at this size)."""
    feeds, s, ws = _feeds(5, "bidirectional", 3, 1, 512, np.int8, False, full=False, inp=512)
    attrs = {"direction": "bidirectional", "hidden_size": 512}
    want = _reference(feeds, attrs)
    for mode in MODES:
        _check(_run(feeds, attrs, s, mode, ws), want)


@pytest.mark.parametrize("mode", MODES)
def test_layout_1_and_peepholes(mode):
    """Batch-major X and states (the projection's rows in X's order), input_forget, peepholes and a clip."""
    feeds, s, ws = _feeds(12, "bidirectional", 5, 3, 23, np.uint8, True, inp=10)
    rng = np.random.default_rng(4)
    for name in ("X", "initial_h", "initial_c"):
        feeds[name] = np.ascontiguousarray(feeds[name].swapaxes(0, 1))
    feeds["P"] = (rng.standard_normal((2, 3 * 23)) * 0.3).astype(np.float32)
    attrs = {"direction": "bidirectional", "layout": 1, "input_forget": 1, "clip": 2.5}
    _check(_run(feeds, attrs, s, mode, ws), _reference(feeds, attrs))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("magnitude", [0.0, 1e-30, 3e4, 1e30])
def test_states_of_any_magnitude(mode, magnitude):
    """A row's digits are relative to its largest value: zero, tiny and huge initial states and inputs (at 1e30
    the products overflow float32 in both kernels; the gates saturate identically)."""
    feeds, s, ws = _feeds(7, "forward", 3, 2, 21, np.int8, True)
    feeds["initial_h"] = (feeds["initial_h"] * np.float32(magnitude)).astype(np.float32)
    feeds["initial_h"][0, 1] = 0.0  # one row of zeros beside a scaled one
    feeds["X"][1, 0] *= np.float32(magnitude)
    attrs = {"direction": "forward"}
    _check(_run(feeds, attrs, s, mode, ws), _reference(feeds, attrs))


@pytest.mark.parametrize("mode", MODES)
def test_non_finite_states_and_inputs_act_as_in_float(mode):
    """NaN spreads through its row only; an infinite input saturates the gates (the float product's +-inf)."""
    feeds, s, ws = _feeds(8, "forward", 2, 3, 13, np.int8, False)
    feeds["initial_h"][0, 0, 3] = np.nan
    feeds["X"][1, 2, 0] = np.inf
    feeds["X"][0, 1, 1] = -np.inf
    feeds["sequence_lens"][:] = 2  # every row runs both steps
    got = _run(feeds, {"direction": "forward"}, s, mode, ws)
    with np.errstate(invalid="ignore"):  # inf * 0 in the reference's products: NaN columns, as in ours
        want = _reference(feeds, {"direction": "forward"})
    assert np.isnan(got[1][0, 0]).all() and np.isnan(want[1][0, 0]).all()
    _check(tuple(g[..., 1:, :] for g in got), [w[..., 1:, :] for w in want])


def test_weights_that_are_not_the_scale_times_8_bit_integers_run_in_float():
    feeds, s, _ = _feeds(9, "forward", 2, 1, 8, np.int8, False)
    attrs = {"direction": "forward"}
    r = feeds["R"].copy()
    r[0, 3, 2] = np.nextafter(r[0, 3, 2], np.float32(np.inf))  # one weight off by an ulp
    assert "not its scale times integers" in rk.pack_q8_weights(r, s)
    wide = feeds["R"].copy()
    wide[0, 0, :2] = (np.array([-200, 200], np.float32) * s[0]).astype(np.float32)  # spans 400 steps
    assert "spans more than 256" in rk.pack_q8_weights(wide, s)
    assert "scale has 3 values" in rk.pack_q8_weights(feeds["R"], np.ones(3, np.float32))
    assert "zeros" in rk.pack_q8_weights(feeds["R"], np.zeros(1, np.float32))
    with pytest.raises(rk.NotSupported, match="not its scale times integers"):
        rk.bind("LSTM", feeds["W"], r, attrs, r_scale=s, q8="portable")
    k = rk.bind("LSTM", feeds["W"], r, attrs, r_scale=s)  # auto: the float kernel, on the weights as they are
    assert k.rq is None
    _check(k(feeds["X"]), _reference({"X": feeds["X"], "W": feeds["W"], "R": r}, attrs))


def test_hidden_sizes_past_the_int32_bound_run_in_float(monkeypatch):
    feeds, s, _ = _feeds(10, "forward", 2, 1, 8, np.int8, False)
    monkeypatch.setattr(rk, "Q8_MAX_HIDDEN", 7)
    assert "hidden size 8 > 7" in rk.pack_q8_weights(feeds["R"], s)


def _dq_lstm_model(path: str, hid: int, inp: int, dtype: type, per_column: bool) -> tuple[np.ndarray, ...]:
    """A DynamicQuantizeLSTM as onnxruntime's quantizer writes it: weights [D, rows, 4H], transposed."""
    rng = np.random.default_rng(11)
    lo, hi = (0, 256) if dtype == np.uint8 else (-128, 128)
    wq = rng.integers(lo, hi, (2, inp, 4 * hid)).astype(dtype)
    rq = rng.integers(lo, hi, (2, hid, 4 * hid)).astype(dtype)
    shape = (2, 4 * hid) if per_column else (2,)
    ws, rs = (rng.uniform(0.002, 0.006, shape).astype(np.float32) for _ in range(2))
    wz, rz = (rng.integers(lo, hi, shape).astype(dtype) for _ in range(2))
    b = (rng.standard_normal((2, 8 * hid)) * 0.1).astype(np.float32)
    inits = {"wq": wq, "rq": rq, "b": b, "ws": ws, "wz": wz, "rs": rs, "rz": rz}
    node = helper.make_node("DynamicQuantizeLSTM", ["x", "wq", "rq", "b", "", "", "", "", "ws", "wz", "rs", "rz"],
                            ["y", "y_h", "y_c"], domain="com.microsoft", hidden_size=hid,
                            direction="bidirectional", name="qlstm")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", 1, inp])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "y_h", "y_c")],
                          [numpy_helper.from_array(a, n) for n, a in inits.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14),
                                                  helper.make_opsetid("com.microsoft", 1)]), path)

    def dq(q: np.ndarray, s: np.ndarray, z: np.ndarray) -> np.ndarray:
        shp = (2, 1, -1)
        f = (q.astype(np.float32) - z.astype(np.float32).reshape(shp)) * s.reshape(shp)
        return np.ascontiguousarray(f.transpose(0, 2, 1))

    return dq(wq, ws, wz), dq(rq, rs, rz), b


@pytest.mark.parametrize("dtype,per_column", [(np.int8, False), (np.uint8, True)])
def test_a_loaded_dynamic_quantize_lstm_runs_on_its_8_bit_r(tmp_path, monkeypatch, dtype, per_column):
    path = str(tmp_path / "q.onnx")
    w, r, b = _dq_lstm_model(path, 19, 7, dtype, per_column)
    packed = []
    real = rk.pack_q8_weights
    monkeypatch.setattr(rk, "pack_q8_weights", lambda *a: packed.append(real(*a)) or packed[-1])
    exe = ds.compile(ds.load_onnx(path))
    x = np.random.default_rng(2).standard_normal((9, 1, 7)).astype(np.float32)
    got = exe.run({"x": x})
    if rk.q8_native():  # R and W
        assert len(packed) == 2 and not any(isinstance(p, str) for p in packed)
    attrs = {"direction": "bidirectional", "hidden_size": 19}
    want = _reference({"X": x, "W": w, "R": r, "B": b}, attrs)
    _check(tuple(got[n] for n in ("y", "y_h", "y_c")), want)


def test_a_saved_graph_keeps_the_8_bit_weights_and_explain_says_so(tmp_path, monkeypatch):
    """ds.save of a Graph writes it as ONNX: the LSTM's weight scales must survive (node metadata), else the
    reloaded artefact silently runs the float LSTM; explain names the 8-bit products."""
    from dynshape.cli.explain_cmd import report

    path = str(tmp_path / "q.onnx")
    _dq_lstm_model(path, 19, 7, np.int8, False)
    graph = ds.load_onnx(path)
    want_attrs = {k: graph.nodes[0].attrs[k] for k in ("_r_scale", "_w_scale")}
    x = np.random.default_rng(3).standard_normal((5, 1, 7)).astype(np.float32)
    want = ds.compile(graph).run({"x": x})
    packed = []
    real = rk.pack_q8_weights
    monkeypatch.setattr(rk, "pack_q8_weights", lambda *a: packed.append(real(*a)) or packed[-1])
    ds.save(graph, tmp_path / "art")
    loaded = ds.load(tmp_path / "art")
    lstm = next(n for n in loaded.graph.nodes if n.op_type == "LSTM")
    assert {k: lstm.attrs.get(k) for k in want_attrs} == want_attrs
    got = loaded.run({"x": x})
    for n in ("y", "y_h", "y_c"):
        np.testing.assert_array_equal(got[n], want[n])
    steps = report(loaded, tmp_path, "test")["library_steps"]
    if rk.q8_native():
        assert packed and not any(isinstance(p, str) for p in packed)
        assert any(k.startswith("LSTM (native: W and R products on 8-bit weights") for k in steps), steps
    else:  # the float32 products, and explain says why (the weights are 8-bit, the CPU lacks VNNI)
        assert not any(k.startswith("LSTM (native: W and R products on 8-bit") for k in steps), steps
        assert any(k.startswith("LSTM (native: float32") and "8-bit" in k for k in steps), steps


def test_malformed_persisted_metadata_is_refused_by_name(tmp_path):
    path = str(tmp_path / "q.onnx")
    _dq_lstm_model(path, 4, 3, np.int8, False)
    m = onnx.load(path)
    m.graph.node[0].metadata_props.add(key="dynshape:_r_scale", value="[1.0, NaN]")
    bad = str(tmp_path / "bad.onnx")
    onnx.save(m, bad)
    with pytest.raises(ds.ModelError, match="qlstm.*dynshape:_r_scale"):
        ds.load_onnx(bad)
