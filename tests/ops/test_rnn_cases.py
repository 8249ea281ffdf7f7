"""Shared by the recurrent-op tests (no tests here): one-node LSTM / GRU / RNN models and random feeds."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DIRS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def make_inputs(op: str, *, seq: int, batch: int, inp: int, hid: int, direction: str = "forward",
                bias: bool = True, lens: bool = False, h0: bool = False, c0: bool = False, peep: bool = False,
                layout: int = 0, seed: int = 0, dtype: type = np.float32, scale: float = 0.5) -> dict:
    """name -> array for the inputs asked for ('' slots are left out); lens has a full and a short entry."""
    rng = np.random.default_rng(seed)
    nd, g = DIRS[direction], GATES[op]

    def rnd(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(dtype)

    feeds = {"X": rnd(seq, batch, inp) if layout == 0 else rnd(batch, seq, inp),
             "W": rnd(nd, g * hid, inp), "R": rnd(nd, g * hid, hid)}
    if bias:
        feeds["B"] = rnd(nd, 2 * g * hid)
    if lens:
        lv = rng.integers(0, seq + 1, batch).astype(np.int32)
        lv[0] = seq
        if batch > 1:
            lv[1] = max(1, seq // 2)
        feeds["sequence_lens"] = lv
    state = (nd, batch, hid) if layout == 0 else (batch, nd, hid)
    if h0:
        feeds["initial_h"] = rnd(*state)
    if c0 and op == "LSTM":
        feeds["initial_c"] = rnd(*state)
    if peep and op == "LSTM":
        feeds["P"] = rnd(nd, 3 * hid)
    return feeds


SLOTS = {"LSTM": ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"],
         "GRU": ["X", "W", "R", "B", "sequence_lens", "initial_h"],
         "RNN": ["X", "W", "R", "B", "sequence_lens", "initial_h"]}


def make_model(op: str, feeds: dict, outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c"), opset: int = 22,
               symbolic: bool = False, **attrs) -> bytes:
    """A one-node model whose graph inputs are `feeds` (every dim symbolic with `symbolic`)."""
    slots = SLOTS[op]
    used = [s for s in slots if s in feeds]
    last = max(slots.index(s) for s in used)
    node_inputs = [s if s in feeds else "" for s in slots[:last + 1]]
    outs = [o for o in outputs if op == "LSTM" or o != "Y_c"]
    node = helper.make_node(op, node_inputs, outs, **attrs)
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
            np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.int32): TensorProto.INT32}
    ins = []
    for k in used:
        shape = [f"{k}_{i}" for i in range(feeds[k].ndim)] if symbolic else list(feeds[k].shape)
        ins.append(helper.make_tensor_value_info(k, elem[feeds[k].dtype], shape))
    graph = helper.make_graph([node], "rnn", ins,
                              [helper.make_tensor_value_info(o, elem[feeds["X"].dtype], None) for o in outs if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model.SerializeToString()
