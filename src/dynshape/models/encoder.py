"""A small BERT-style encoder built with onnx.helper, shaped like what a PyTorch exporter emits.

The demo needs a realistic dynamic-shape model without downloading one. Exporters do not write
`Reshape(x, [b, s, heads, dh])` with known sizes: they read the sizes back with Shape -> Gather -> Unsqueeze ->
Concat at run time, slice the position table to the sequence length and turn the 0/1 attention mask into an
additive bias. This builder reproduces those patterns so the symbolic engine has the same work to do as on a
real export.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18
MAX_POSITIONS = 512


class _Builder:
    """Accumulates nodes and initializers with unique, readable names."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count: dict[str, int] = {}

    def name(self, base: str) -> str:
        self.count[base] = self.count.get(base, 0) + 1
        return f"{base}_{self.count[base]}"

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, base: str, *shape: int, scale: float = 0.02) -> str:
        return self.const(base, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        name = self.name(op_type)
        self.nodes.append(helper.make_node(op_type, inputs, [f"{name}_out"], name=name, **attrs))
        return f"{name}_out"

    # ---- exporter idioms ------------------------------------------------------------------------------
    def dim(self, x: str, axis: int) -> str:
        """Shape(x)[axis] as a 1-element int64 tensor (Shape -> Gather -> Unsqueeze)."""
        shape = self.op("Shape", [x])
        scalar = self.op("Gather", [shape, self.const("axis", np.array(axis, np.int64))], axis=0)
        return self.op("Unsqueeze", [scalar, self.const("axes", np.array([0], np.int64))])

    def linear(self, x: str, d_in: int, d_out: int, prefix: str) -> str:
        y = self.op("MatMul", [x, self.weight(f"{prefix}.weight", d_in, d_out)])
        return self.op("Add", [y, self.const(f"{prefix}.bias", np.zeros(d_out, np.float32))])

    def layer_norm(self, x: str, hidden: int, prefix: str) -> str:
        gamma = self.const(f"{prefix}.weight", np.ones(hidden, np.float32))
        beta = self.const(f"{prefix}.bias", np.zeros(hidden, np.float32))
        return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-12)

    def gelu(self, x: str) -> str:
        """0.5 * x * (1 + erf(x / sqrt 2)): the exact GELU as opset-18 exporters spell it."""
        half = self.const("half", np.array(0.5, np.float32))
        one = self.const("one", np.array(1.0, np.float32))
        inner = self.op("Div", [x, self.const("sqrt2", np.array(math.sqrt(2.0), np.float32))])
        erf = self.op("Add", [self.op("Erf", [inner]), one])
        return self.op("Mul", [self.op("Mul", [x, half]), erf])


def build_encoder(layers: int = 2, hidden: int = 64, heads: int = 4, ffn: int = 128, vocab: int = 1000,
                  seed: int = 0) -> onnx.ModelProto:
    """A `layers`-deep post-norm transformer encoder with random (seeded) weights.

    Inputs `input_ids`, `attention_mask`: int64 (batch, seq); output `last_hidden_state`: float32
    (batch, seq, hidden). Sequences longer than 512 positions are not representable (the position table).
    """
    if hidden % heads:
        raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
    dh = hidden // heads
    b = _Builder(seed)
    ids, mask = "input_ids", "attention_mask"

    # embeddings: word table gathered by id, position table sliced to the sequence length
    words = b.op("Gather", [b.weight("embeddings.word", vocab, hidden), ids], axis=0)
    seq_len = b.dim(ids, 1)
    positions = b.op("Slice", [b.weight("embeddings.position", MAX_POSITIONS, hidden),
                               b.const("starts", np.array([0], np.int64)), seq_len,
                               b.const("axes", np.array([0], np.int64))])
    x = b.op("Add", [words, positions])
    x = b.op("Add", [x, b.weight("embeddings.token_type", hidden)])
    x = b.layer_norm(x, hidden, "embeddings.norm")

    # additive attention bias: (1 - mask) * -10000, shaped (batch, 1, 1, seq)
    m = b.op("Unsqueeze", [mask, b.const("axes", np.array([1, 2], np.int64))])
    m = b.op("Cast", [m], to=TensorProto.FLOAT)
    m = b.op("Sub", [b.const("one", np.array(1.0, np.float32)), m])
    bias = b.op("Mul", [m, b.const("neg_large", np.array(-10000.0, np.float32))])

    for i in range(layers):
        p = f"layer{i}"
        batch, seq = b.dim(x, 0), b.dim(x, 1)
        heads_shape = b.op("Concat", [batch, seq, b.const("heads", np.array([heads, dh], np.int64))], axis=0)

        def split_heads(t: str, perm: list[int], heads_shape: str = heads_shape) -> str:
            return b.op("Transpose", [b.op("Reshape", [t, heads_shape])], perm=perm)

        q = split_heads(b.linear(x, hidden, hidden, f"{p}.query"), [0, 2, 1, 3])
        k = split_heads(b.linear(x, hidden, hidden, f"{p}.key"), [0, 2, 3, 1])
        v = split_heads(b.linear(x, hidden, hidden, f"{p}.value"), [0, 2, 1, 3])
        scores = b.op("Div", [b.op("MatMul", [q, k]), b.const("scale", np.array(math.sqrt(dh), np.float32))])
        probs = b.op("Softmax", [b.op("Add", [scores, bias])], axis=-1)
        ctx = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        merged = b.op("Concat", [batch, seq, b.const("hidden", np.array([hidden], np.int64))], axis=0)
        ctx = b.op("Reshape", [ctx, merged])
        attn = b.linear(ctx, hidden, hidden, f"{p}.attention.output")
        x = b.layer_norm(b.op("Add", [attn, x]), hidden, f"{p}.attention.norm")
        h = b.gelu(b.linear(x, hidden, ffn, f"{p}.intermediate"))
        h = b.linear(h, ffn, hidden, f"{p}.output")
        x = b.layer_norm(b.op("Add", [h, x]), hidden, f"{p}.output.norm")

    out = "last_hidden_state"
    b.nodes.append(helper.make_node("Identity", [x], [out], name="output"))
    graph = helper.make_graph(
        b.nodes, "encoder",
        [helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info(mask, TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", "seq", hidden])],
        b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="dynshape")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model
