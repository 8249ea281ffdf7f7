"""A decoder step's ONNX model around its nodes: the fed token ids, an int64 mask, the past keys and values in
(batch, heads, past, head dim), and the output with the present keys and values out (what a decode loop calls per
token; the bucket-plan tests build theirs on it)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def step_model(nodes: list, inits: dict, heads: int, head_dim: int, mask_dim: str):
    kv = ["b", heads, "past", head_dim]
    graph = helper.make_graph(
        nodes, "step",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", 1]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["b", mask_dim]),
         helper.make_tensor_value_info("past_k", TensorProto.FLOAT, kv),
         helper.make_tensor_value_info("past_v", TensorProto.FLOAT, kv)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "present_k", "present_v")],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def attend(q: str, k: str, v: str) -> list:
    """The nodes from a step's query and its keys / values (heads first) to its output y: the scores, the fed
    mask's row (value "mrow") as an additive bias, the softmax, the values, the heads merged and projected by "wo"
    (the initializers hold "axes12", "onef", "big" and "out2")."""
    n = helper.make_node
    return [n("Transpose", [k], ["kT"], perm=[0, 1, 3, 2]), n("MatMul", [q, "kT"], ["s"]),
            n("Cast", ["mrow"], ["maskf"], to=TensorProto.FLOAT), n("Unsqueeze", ["maskf", "axes12"], ["mask4"]),
            n("Sub", ["onef", "mask4"], ["hole"]), n("Mul", ["hole", "big"], ["bias"]),
            n("Add", ["s", "bias"], ["sb"]), n("Softmax", ["sb"], ["p"], axis=-1),
            n("MatMul", ["p", v], ["o"]), n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
            n("Reshape", ["ot", "out2"], ["o2"]), n("MatMul", ["o2", "wo"], ["y"])]


def step_feed(rng, batch: int, past: int, heads: int, head_dim: int, vocab: int, mlen: int | None = None) -> dict:
    """A step's feed: token ids, a mask of past + 1 (or `mlen`) positions left-padded at random, random pasts."""
    mask = np.ones((batch, past + 1 if mlen is None else mlen), np.int64)
    mask[:, : rng.integers(0, min(past + 1, mask.shape[1]))] = 0  # left padding
    return {"ids": rng.integers(0, vocab, (batch, 1)), "mask": mask,
            **{k: rng.standard_normal((batch, heads, past, head_dim)).astype(np.float32) for k in ("past_k", "past_v")}}


def same_answers(fast, own, feed: dict) -> dict:
    """Run both executables on `feed`; their answers must be equal bit for bit (the first's are returned)."""
    a, b = fast.run(feed), own.run(feed)
    for k in b:
        np.testing.assert_array_equal(a[k], b[k])
    return a
