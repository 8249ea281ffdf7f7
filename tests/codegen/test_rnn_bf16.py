"""precision="bf16" on recurrent layers (csrc/ds_rnn.c, flags bit 6): the input projection, a product by constant
weights, takes W as bf16 pairs and X's rows rounded to bf16 with float32 sums; the recurrent product, the gates and
the state stay float32. So a layer in bf16 equals the float32 layer of the rounded X and W up to float32
accumulation, on both native paths (AMX tiles and VDPBF16PS), for LSTM, GRU and RNN, both layouts, every
direction, sequence_lens; and it is not the float32 layer of the unrounded ones (the projection did take bf16)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen import bf16

pytestmark = pytest.mark.skipif(not bf16.native_available(),
                                reason="this CPU has no AVX512-BF16: precision='bf16' is refused here")
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _model(op: str, inp: int, hid: int, direction: str, layout: int, w: np.ndarray, r: np.ndarray, b: np.ndarray,
           lens: bool) -> onnx.ModelProto:
    outs = ["y", "yh", "yc"] if op == "LSTM" else ["y", "yh"]
    nodes = [helper.make_node(op, ["x", "W", "R", "B", "lens" if lens else ""], outs, hidden_size=hid,
                              direction=direction, layout=layout)]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", "b", inp] if layout == 0 else ["b", "s", inp])]
    if lens:
        ins.append(helper.make_tensor_value_info("lens", TensorProto.INT32, ["b"]))
    graph = helper.make_graph(nodes, "rnn", ins, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                  for o in outs],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R"),
                               numpy_helper.from_array(b, "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@pytest.mark.parametrize("amx", [1, 0])
@pytest.mark.parametrize("op,inp,hid,direction,layout,lens", [
    ("LSTM", 256, 96, "bidirectional", 0, False), ("LSTM", 33, 16, "reverse", 1, True),
    ("GRU", 40, 24, "forward", 0, True), ("RNN", 70, 32, "bidirectional", 1, False)])
def test_a_bf16_layer_is_the_float32_layer_of_rounded_inputs(tile_path, amx: int, op: str, inp: int, hid: int,
                                                             direction: str, layout: int, lens: bool) -> None:
    tile_path(amx)
    rng = np.random.default_rng(inp + hid)
    nd, g = (2 if direction == "bidirectional" else 1), GATES[op]
    w = (rng.standard_normal((nd, g * hid, inp)) * 0.1).astype(np.float32)
    r = (rng.standard_normal((nd, g * hid, hid)) * 0.1).astype(np.float32)
    b = (rng.standard_normal((nd, 2 * g * hid)) * 0.1).astype(np.float32)
    low = ds.compile(ds.load_onnx(_model(op, inp, hid, direction, layout, w, r, b, lens)), precision="bf16")
    exact = ds.compile(ds.load_onnx(_model(op, inp, hid, direction, layout, bf16.rounded(w), r, b, lens)))
    plain = ds.compile(ds.load_onnx(_model(op, inp, hid, direction, layout, w, r, b, lens)))
    apart = 0.0  # how far the bf16 layer lies from the float32 one of the unrounded inputs
    for seq, batch in ((40, 4), (3, 1), (70, 2)):
        x = rng.standard_normal((seq, batch, inp) if layout == 0 else (batch, seq, inp)).astype(np.float32)
        feed = {"x": x}
        if lens:
            feed["lens"] = rng.integers(0, seq + 1, batch).astype(np.int32)
        got, want = low.run(feed), exact.run({**feed, "x": bf16.rounded(x)})
        far = plain.run(feed)
        for name, v in want.items():
            assert got[name].shape == v.shape
            assert np.abs(got[name] - v).max() <= 1e-5 * (np.abs(v).max() + 1), (op, name, seq, batch)
        apart = max(apart, *(float(np.abs(got[k] - far[k]).max()) for k in want))
    assert apart > 1e-4  # the projection took bf16 (a length-0 batch alone may not show it)


def test_explain_says_the_projection_runs_in_bf16(tmp_path) -> None:
    """explain's library steps name the bf16 projection under precision="bf16", and nothing of it in float32."""
    from dynshape.cli.explain_cmd import report

    rng = np.random.default_rng(2)
    w = (rng.standard_normal((1, 64, 24)) * 0.1).astype(np.float32)
    r = (rng.standard_normal((1, 64, 16)) * 0.1).astype(np.float32)
    b = np.zeros((1, 128), np.float32)
    graph = ds.load_onnx(_model("LSTM", 24, 16, "forward", 0, w, r, b, False))
    low = report(ds.compile(graph, precision="bf16"), tmp_path, "test")["library_steps"]
    assert any(k.startswith("LSTM (native: input projection in bf16") for k in low), low
    plain = report(ds.compile(graph), tmp_path, "test")["library_steps"]
    assert plain and not any("bf16" in k for k in plain), plain
