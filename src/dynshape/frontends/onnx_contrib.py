"""onnxruntime's contrib ops (domain com.microsoft) that shipped models carry, rewritten into standard ONNX.

Why: files made by onnxruntime's tools (its quantizer, its transformer optimizer) use ops outside the ONNX
standard; a user who loads such a file expects it to run. Each rewrite here keeps the op's meaning and turns it
into ops dynshape compiles, so no contrib op needs a kernel of its own.

- `DynamicQuantizeLSTM` (what `quantize_dynamic` makes of an LSTM): int8 weights stored transposed,
  `[directions, input, 4*hidden]`, with a scale and zero point per direction (or per direction and column).
  The weights are constant, so they are dequantized once here into a standard `LSTM`'s
  `[directions, 4*hidden, input]` float weights. onnxruntime also quantizes the activations to uint8 per
  step; dynshape computes the step in float32 with the dequantized weights, so its results are the float
  LSTM's on those weights (closer to the unquantized model than onnxruntime's, differing from them by
  onnxruntime's activation rounding). The LSTM carries R's and W's scales as its `_r_scale` and `_w_scale`
  attributes: the native kernel recovers their 8-bit values from them and multiplies those (VPDPBUSD, R
  streamed at a quarter of the bytes each step; codegen/rnn_kernel.py), with the float LSTM's results up to
  float32 rounding.
"""

from __future__ import annotations

import numpy as np

from dynshape.errors import ModelError
from dynshape.ir.graph import Graph, Node

CONTRIB = "com.microsoft"
_LSTM_ATTRS = ("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size",
               "input_forget")


def lower_contrib(graph: Graph) -> None:
    """Rewrite, in place, every contrib op this module knows into standard ops (subgraphs included)."""
    for node in graph.nodes:
        for sub in node.subgraphs():
            lower_contrib(sub)
    graph.nodes = [_RULES[n.op_type](graph, n) if n.domain == CONTRIB and n.op_type in _RULES else n
                   for n in graph.nodes]


def _const(graph: Graph, node: Node, index: int, what: str) -> np.ndarray:
    name = node.inputs[index] if index < len(node.inputs) else ""
    if not name or name not in graph.initializers:
        raise ModelError(f"node {node.name!r} ({CONTRIB}::{node.op_type}): its {what} (input {index}, "
                         f"{name or 'omitted'!r}) must be an initializer; dynshape dequantizes it once at load")
    return np.asarray(graph.initializers[name])


def _dequantize_lstm_weight(graph: Graph, node: Node, w: int, scale: int, zero: int, what: str) -> np.ndarray:
    """`[D, rows, 4H]` int8/uint8 and per-direction (or per-column) scale/zero -> float `[D, 4H, rows]`, and the
    scale (`[D]` or `[D, 4H]`)."""
    q = _const(graph, node, w, what)
    s = _const(graph, node, scale, f"{what} scale").astype(np.float32)
    z = _const(graph, node, zero, f"{what} zero point")
    if q.ndim != 3 or q.dtype not in (np.int8, np.uint8):
        raise ModelError(f"node {node.name!r} ({CONTRIB}::{node.op_type}): {what} must be int8 or uint8 of rank 3 "
                         f"[directions, rows, 4*hidden], got {q.dtype}{list(q.shape)}")
    d, _, cols = q.shape
    shapes = {(d,): (d, 1, 1), (d, cols): (d, 1, cols)}
    if s.shape not in shapes or z.shape != s.shape:
        raise ModelError(f"node {node.name!r} ({CONTRIB}::{node.op_type}): {what} scale {list(s.shape)} and zero "
                         f"point {list(z.shape)} must both be [{d}] or [{d}, {cols}]")
    f = (q.astype(np.float32) - z.astype(np.float32).reshape(shapes[s.shape])) * s.reshape(shapes[s.shape])
    return np.ascontiguousarray(f.transpose(0, 2, 1)), s


def _dynamic_quantize_lstm(graph: Graph, node: Node) -> Node:
    w, w_scale = _dequantize_lstm_weight(graph, node, 1, 8, 9, "W")
    r, r_scale = _dequantize_lstm_weight(graph, node, 2, 10, 11, "R")
    names = []
    for tag, arr in (("W", w), ("R", r)):
        name = f"{node.name or node.outputs[0]}__{tag}_dequantized"
        while name in graph.initializers:
            name += "_"
        graph.initializers[name] = arr
        names.append(name)
    rest = list(node.inputs[3:8])
    while rest and not rest[-1]:
        rest.pop()
    attrs = {k: v for k, v in node.attrs.items() if k in _LSTM_ATTRS}
    attrs["_r_scale"] = [float(v) for v in r_scale.reshape(-1)]  # per direction, or per direction and row
    attrs["_w_scale"] = [float(v) for v in w_scale.reshape(-1)]
    return Node("LSTM", "", node.name, attrs, [node.inputs[0], *names, *rest], list(node.outputs))


# The private attributes a saved model must keep: the LSTM's weight scales (without them a reloaded artefact runs
# the float LSTM). frontends/onnx_export.py writes them as node metadata ("dynshape:<name>", JSON) and
# frontends/onnx.py reads them back; every other private attribute is recomputed on load.
PERSISTED_ATTRS = ("_r_scale", "_w_scale")
PERSISTED_PREFIX = "dynshape:"

_RULES = {"DynamicQuantizeLSTM": _dynamic_quantize_lstm}
