"""LSTM / GRU / RNN shape rules: seq_length and batch stay symbols, every input's dims are unified with them, and
disagreements are errors naming the node (at load time when decidable, else a ConstraintViolation per call)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from opgraph import infer
from test_rnn_cases import make_inputs, make_model

import dynshape as ds
from dynshape.errors import ConstraintViolation, ShapeError

F = TensorProto.FLOAT


def _weights(op: str, nd: int, inp: int, hid: int) -> dict:
    g = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    rng = np.random.default_rng(0)
    return {"W": rng.standard_normal((nd, g * hid, inp)).astype(np.float32),
            "R": rng.standard_normal((nd, g * hid, hid)).astype(np.float32),
            "B": np.zeros((nd, 2 * g * hid), np.float32)}


def _shape(graph, name: str) -> tuple:
    return tuple(str(d) for d in graph.types[name].shape)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction,nd", [("forward", 1), ("bidirectional", 2)])
def test_outputs_over_symbolic_seq_and_batch(op, layout, direction, nd):
    x = ["seq", "batch", 8] if layout == 0 else ["batch", "seq", 8]
    state = ["nd", "b2", 16] if layout == 0 else ["b2", "nd", 16]
    outs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    ins = ["X", "W", "R", "B", "", "h0"] + (["c0"] if op == "LSTM" else [])
    node = helper.make_node(op, ins, outs, hidden_size=16, direction=direction, layout=layout)
    inputs = {"X": (F, x), "h0": (F, state)} | ({"c0": (F, state)} if op == "LSTM" else {})
    g = infer([node], inputs, _weights(op, nd, 8, 16))
    b = _shape(g, "X")[0 if layout else 1]  # h0's batch is merged with X's, whichever name survives
    assert _shape(g, "h0") == ((str(nd), b, "16") if layout == 0 else (b, str(nd), "16"))
    assert _shape(g, "Y") == (("seq", str(nd), b, "16") if layout == 0 else (b, "seq", str(nd), "16"))
    for o in outs[1:]:
        assert _shape(g, o) == _shape(g, "h0")


def test_every_dim_symbolic_like_the_node_suite():
    """With W, R, B, P graph inputs of unknown dims, the attributes and X pin them down."""
    feeds = make_inputs("LSTM", seq=3, batch=2, inp=5, hid=4, direction="bidirectional", lens=True, h0=True,
                        c0=True, peep=True)
    g = ds.load_onnx(make_model("LSTM", feeds, symbolic=True, hidden_size=4, direction="bidirectional"))
    types = {v.name: tuple(str(d) for d in g.types[v.name].shape) for v in g.inputs}
    s, b, i = types["X"]
    assert types["W"] == ("2", "16", i) and types["R"] == ("2", "16", "4") and types["B"] == ("2", "32")
    assert types["sequence_lens"] == (b,) and types["initial_h"] == ("2", b, "4") and types["P"] == ("2", "12")
    assert _shape(g, "Y") == (s, "2", b, "4")
    out = g.run(feeds)
    assert out["Y"].shape == (3, 2, 2, 4)


def test_state_batch_that_disagrees_at_run_time_is_refused_before_the_call():
    feeds = make_inputs("LSTM", seq=3, batch=2, inp=5, hid=4, h0=True, c0=True)
    model = make_model("LSTM", feeds, symbolic=True, hidden_size=4)
    bad = dict(feeds, initial_h=np.zeros((1, 3, 4), np.float32))
    with pytest.raises(ConstraintViolation, match="initial_h"):
        ds.load_onnx(model).run(bad)
    exe = ds.compile(ds.load_onnx(model))
    exe.run(feeds)
    with pytest.raises(ConstraintViolation, match="initial_h"):
        exe.run(bad)


def test_static_state_batch_mismatch_names_the_node_and_both_sides():
    node = helper.make_node("GRU", ["X", "W", "R", "", "", "h0"], ["Y"], hidden_size=4, name="enc_gru")
    with pytest.raises(ShapeError, match=r"enc_gru.*initial_h's batch \(axis 1\) is 3 but X's batch \(axis 1\) is 2"):
        infer([node], {"X": (F, ["seq", 2, 5]), "h0": (F, [1, 3, 4])}, _weights("GRU", 1, 5, 4))


def test_declared_batch_range_contradicting_a_state_is_an_error():
    feeds = make_inputs("RNN", seq=3, batch=2, inp=5, hid=4, h0=True)
    node = helper.make_node("RNN", ["X", "W", "R", "", "", "h0"], ["Y", "Y_h"], hidden_size=4, name="r0")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", F, ["seq", "batch", 5]),
                                            helper.make_tensor_value_info("h0", F, [1, 9, 4])],
                              [helper.make_tensor_value_info("Y_h", F, None)],
                              [helper.make_tensor(k, F, v.shape, v.reshape(-1)) for k, v in feeds.items()
                               if k in ("W", "R")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    with pytest.raises(ShapeError, match="r0"):
        ds.load_onnx(model, dims={"batch": (1, 4)})


@pytest.mark.parametrize("attrs,inputs,message", [
    ({"hidden_size": 5}, {}, r"R's hidden size \(axis 2\) is 4 but the hidden_size attribute is 5"),
    ({"direction": "bidirectional"}, {}, r"W's axis 0 is 1 but num_directions \(direction='bidirectional'\) is 2"),
    ({"direction": "both"}, {}, "direction='both': expected one of forward, reverse, bidirectional"),
    ({"activations": ["Sigmoid", "Tanh"]}, {}, r"activations has 2 entries .* takes 3"),
    ({"activations": ["Sigmoid", "Tanh", "Gelu"]}, {}, "activation 'Gelu' is not one ONNX defines"),
    ({"layout": 2}, {}, "layout=2"),
    ({"clip": -1.0}, {}, "clip=-1.0"),
    ({}, {"X": (F, ["seq", "batch", 6])}, r"W's input size \(axis 2\) is 5 but X's input size \(axis 2\) is 6"),
    ({}, {"X": (TensorProto.INT32, ["seq", "batch", 5])}, "W is float32 but X is int32"),
])
def test_bad_attributes_and_inputs_name_the_node(attrs, inputs, message):
    node = helper.make_node("LSTM", ["X", "W", "R"], ["Y"], name="vad_lstm", **({"hidden_size": 4} | attrs))
    with pytest.raises(ShapeError, match="vad_lstm") as e:
        infer([node], {"X": (F, ["seq", "batch", 5])} | inputs, {k: v for k, v in _weights("LSTM", 1, 5, 4).items()
                                                                  if k != "B"})
    assert e.match(message)


def test_sequence_lens_must_be_int32_of_batch_length():
    node = helper.make_node("RNN", ["X", "W", "R", "", "L"], ["Y"], hidden_size=4, name="r1")
    w = {k: v for k, v in _weights("RNN", 1, 5, 4).items() if k != "B"}
    with pytest.raises(ShapeError, match="sequence_lens must be int32"):
        infer([node], {"X": (F, ["seq", 2, 5]), "L": (TensorProto.INT64, [2])}, w)
    with pytest.raises(ShapeError, match=r"sequence_lens' length is 3 but X's batch \(axis 1\) is 2"):
        infer([node], {"X": (F, ["seq", 2, 5]), "L": (TensorProto.INT32, [3])}, w)
