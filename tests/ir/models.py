"""Small ONNX models built with onnx.helper for the IR and frontend tests (no downloads)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


def const(name: str, arr: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr), name))


class Builder:
    """Accumulates nodes and initializers; `n()` adds a node with auto-named outputs."""

    def __init__(self, seed: int = 0):
        self.nodes: list = []
        self.inits: list = []
        self.rng = np.random.default_rng(seed)
        self.k = 0

    def w(self, name: str, *shape: int, scale: float = 0.1) -> str:
        self.inits.append(numpy_helper.from_array((self.rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def c(self, name: str, arr: object, dtype: type = np.int64) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(arr, dtype=dtype), name))
        return name

    def n(self, op: str, inputs: list, n_out: int = 1, **attrs: object) -> str | list:
        self.k += 1
        outs = [f"{op.lower()}{self.k}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=f"{op}_{self.k}", **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, inputs: list, outputs: list, opset: int = 17) -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, "g", inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        return m


def encoder_layer(b: Builder, x: str, mask_add: str, hidden: int, heads: int, ffn: int, tag: str,
                  weights: bool = True) -> str:
    """One BERT encoder layer; attention heads split with the exporters' Shape->Gather->Concat->Reshape."""
    hd = hidden // heads

    def lin(inp: str, n_in: int, n_out: int, name: str) -> str:
        wname = f"{tag}.{name}.w"
        if weights:
            b.w(wname, n_in, n_out)
        return b.n("Add", [b.n("MatMul", [inp, wname]), b.w(f"{tag}.{name}.b", n_out)])

    shape = b.n("Shape", [x])
    bsz = b.n("Unsqueeze", [b.n("Gather", [shape, b.c(f"{tag}.i0", 0)], axis=0), b.c(f"{tag}.ax0", [0])])
    seq = b.n("Unsqueeze", [b.n("Gather", [shape, b.c(f"{tag}.i1", 1)], axis=0), b.c(f"{tag}.ax0b", [0])])
    split_shape = b.n("Concat", [bsz, seq, b.c(f"{tag}.heads", [heads]), b.c(f"{tag}.hd", [hd])], axis=0)
    merge_shape = b.n("Concat", [bsz, seq, b.c(f"{tag}.hid", [hidden])], axis=0)

    def split(t: str) -> str:
        return b.n("Transpose", [b.n("Reshape", [t, split_shape])], perm=[0, 2, 1, 3])

    q, k, v = (split(lin(x, hidden, hidden, n)) for n in ("q", "k", "v"))
    scores = b.n("Div", [b.n("MatMul", [q, b.n("Transpose", [k], perm=[0, 1, 3, 2])]),
                         b.c(f"{tag}.scale", np.sqrt(hd), np.float32)])
    probs = b.n("Softmax", [b.n("Add", [scores, mask_add])], axis=-1)
    ctx = b.n("Reshape", [b.n("Transpose", [b.n("MatMul", [probs, v])], perm=[0, 2, 1, 3]), merge_shape])
    h = b.n("LayerNormalization", [b.n("Add", [lin(ctx, hidden, hidden, "o"), x]),
                                   b.w(f"{tag}.ln1.g", hidden), b.w(f"{tag}.ln1.b", hidden)], axis=-1)
    up = lin(h, hidden, ffn, "up")
    gelu = b.n("Mul", [b.n("Mul", [up, b.c(f"{tag}.half", 0.5, np.float32)]),
                       b.n("Add", [b.n("Erf", [b.n("Div", [up, b.c(f"{tag}.sqrt2", np.sqrt(2.0), np.float32)])]),
                                   b.c(f"{tag}.one", 1.0, np.float32)])])
    down = lin(gelu, ffn, hidden, "down")
    return b.n("LayerNormalization", [b.n("Add", [down, h]), b.w(f"{tag}.ln2.g", hidden),
                                      b.w(f"{tag}.ln2.b", hidden)], axis=-1)


def bert(layers: int = 1, hidden: int = 16, heads: int = 2, ffn: int = 32, weights: bool = True) -> onnx.ModelProto:
    """BERT-style encoder on x: (batch, seq, hidden) and mask: (batch, seq) bool (True = attend).

    With `weights=False` the MatMul weights are graph inputs of static shape instead of initializers
    (shape inference does not need their values; this keeps big benchmark graphs cheap to build).
    """
    b = Builder()
    m4 = b.n("Unsqueeze", ["mask", b.c("mask_axes", [1, 2])])
    mask_add = b.n("Where", [m4, b.c("zero", 0.0, np.float32), b.c("neg", -1e4, np.float32)])
    x = "x"
    for i in range(layers):
        x = encoder_layer(b, x, mask_add, hidden, heads, ffn, f"l{i}", weights)
    b.nodes.append(helper.make_node("Identity", [x], ["y"], name="output"))
    inputs = [helper.make_tensor_value_info("x", F32, ["batch", "seq", hidden]),
              helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", "seq"])]
    if not weights:
        for i in range(layers):
            for n, shp in (("q", (hidden, hidden)), ("k", (hidden, hidden)), ("v", (hidden, hidden)),
                           ("o", (hidden, hidden)), ("up", (hidden, ffn)), ("down", (ffn, hidden))):
                inputs.append(helper.make_tensor_value_info(f"l{i}.{n}.w", F32, list(shp)))
    return b.model(inputs, [helper.make_tensor_value_info("y", F32, ["batch", "seq", hidden])])


def cnn(channels: int = 4) -> onnx.ModelProto:
    """A stride-32 CNN on x: (N, 3, H, W): conv s2, maxpool s2, then three conv s2, global pool, classifier."""
    b = Builder(1)
    x = b.n("Relu", [b.n("Conv", ["x", b.w("c0", channels, 3, 3, 3)], strides=[2, 2], pads=[1, 1, 1, 1])])
    x = b.n("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for i in range(3):
        x = b.n("Relu", [b.n("Conv", [x, b.w(f"c{i + 1}", channels, channels, 3, 3), b.w(f"cb{i + 1}", channels)],
                             strides=[2, 2], pads=[1, 1, 1, 1])])
    b.nodes.append(helper.make_node("Identity", [x], ["features"], name="features"))
    pooled = b.n("Flatten", [b.n("GlobalAveragePool", ["features"])], axis=1)
    b.nodes.append(helper.make_node("Gemm", [pooled, b.w("fc", 10, channels), b.w("fcb", 10)], ["logits"],
                                    name="classifier", transB=1))
    return b.model([helper.make_tensor_value_info("x", F32, ["N", 3, "H", "W"])],
                   [helper.make_tensor_value_info("logits", F32, ["N", 10]),
                    helper.make_tensor_value_info("features", F32, None)])
