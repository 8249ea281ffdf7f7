"""The symbolic work count (`dynshape.ir.work`, `Executable.work`): at every shape it equals a count made by hand
from the model's definition, for products, attention (decomposed and the ONNX Attention op), convolutions and
elementwise nodes; views and folded nodes count nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.ir.work import graph_work

F32 = TensorProto.FLOAT
H, D, E = 2, 4, 8  # heads, head dim, model width (= H * D)


def _attention_block():
    """x[b, s, E] -> q, k, v = x @ W* -> heads [b, H, s, D] -> softmax(q k^T) v -> [b, s, E]."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((E, E)).astype(np.float32), n) for n in ("wq", "wk", "wv")]
    inits.append(numpy_helper.from_array(np.array([0, 0, H, D], np.int64), "heads"))
    inits.append(numpy_helper.from_array(np.array([0, 0, E], np.int64), "merged"))
    n = helper.make_node
    nodes = [n("MatMul", ["x", "wq"], ["q0"]), n("MatMul", ["x", "wk"], ["k0"]), n("MatMul", ["x", "wv"], ["v0"]),
             n("Reshape", ["q0", "heads"], ["q1"]), n("Reshape", ["k0", "heads"], ["k1"]),
             n("Reshape", ["v0", "heads"], ["v1"]),
             n("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]), n("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
             n("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
             n("MatMul", ["q", "kt"], ["scores"]), n("Softmax", ["scores"], ["p"], axis=-1),
             n("MatMul", ["p", "v"], ["ctx"]), n("Transpose", ["ctx"], ["ctx1"], perm=[0, 2, 1, 3]),
             n("Reshape", ["ctx1", "merged"], ["y"])]
    x = helper.make_tensor_value_info("x", F32, ["batch", "seq", E])
    y = helper.make_tensor_value_info("y", F32, ["batch", "seq", E])
    m = helper.make_model(helper.make_graph(nodes, "attn", [x], [y], inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    return ds.load_onnx(m, dims={"batch": (1, 64), "seq": (1, 512)})


def _by_hand(b: int, s: int) -> dict[str, int]:
    """FLOPs (2 per multiply-add) and bytes of `_attention_block` at (b, s), from its definition."""
    tokens = b * s
    dense = 3 * 2 * tokens * E * E + 2 * (2 * b * H * s * s * D)  # projections; q k^T and p v
    elementwise = 4 * tokens * E + b * H * s * s  # the four Transposes, the Softmax
    act, w, scores = 4 * tokens * E, 4 * E * E, 4 * b * H * s * s  # float32 bytes
    nbytes = 3 * (act + w + act) + 4 * 2 * act + (2 * act + scores) + 2 * scores + (scores + 2 * act)
    return {"flops": dense + elementwise, "dense": dense, "elementwise": elementwise, "bytes": nbytes}


ATTN = _attention_block()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.integers(1, 512))
def test_attention_block_work_equals_the_hand_count(b, s):
    assert graph_work(ATTN).at({"batch": b, "seq": s}) == _by_hand(b, s)


def test_work_is_symbolic_and_the_executable_exposes_it():
    w = graph_work(ATTN)
    assert w.symbols == {"batch", "seq"}
    assert "batch*seq**2" in str(w.dense).replace(" ", "")  # the attention term, quadratic in seq
    exe = ds.compile(ATTN)
    assert exe.work({"batch": 3, "seq": 10}) == _by_hand(3, 10)
    assert exe.work().at({"batch": 2, "seq": 7}) == _by_hand(2, 7)
    with pytest.raises(KeyError, match="seq"):
        exe.work({"batch": 2})
    assert set(w.by_op) == {"MatMul", "Transpose", "Softmax"}  # Reshape is a view: no work


def _ops_model():
    """Gemm (transA), Conv (groups 2, 3x3, stride 2), ConvTranspose and the ONNX Attention op (opset 23)."""
    rng = np.random.default_rng(1)

    def w(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    n = helper.make_node
    nodes = [n("Gemm", ["a", "gw"], ["g"], transA=1),
             n("Conv", ["img", "cw"], ["c"], group=2, strides=[2, 2], pads=[1, 1, 1, 1]),
             n("ConvTranspose", ["c", "tw"], ["t"], strides=[2, 2]),
             n("Attention", ["q", "k", "v"], ["att"])]
    inputs = [helper.make_tensor_value_info("a", F32, [16, "m"]),
              helper.make_tensor_value_info("img", F32, ["n", 4, "h", "h"]),
              helper.make_tensor_value_info("q", F32, ["n", 2, "sq", 8]),
              helper.make_tensor_value_info("k", F32, ["n", 2, "skv", 8]),
              helper.make_tensor_value_info("v", F32, ["n", 2, "skv", 6])]
    outputs = [helper.make_tensor_value_info(x, F32, None) for x in ("g", "t", "att")]
    m = helper.make_model(helper.make_graph(nodes, "ops", inputs, outputs,
                                            [w("gw", 16, 5), w("cw", 6, 2, 3, 3), w("tw", 6, 3, 2, 2)]),
                          opset_imports=[helper.make_opsetid("", 23)])
    return ds.load_onnx(m, dims={"m": (1, 64), "n": (1, 8), "h": (4, 64), "sq": (1, 32), "skv": (1, 32)})


OPS = _ops_model()


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 64), st.integers(1, 8), st.integers(4, 64), st.integers(1, 32), st.integers(1, 32))
def test_product_and_conv_ops_count_their_multiply_adds(m, n, h, sq, skv):
    got = graph_work(OPS).at({"m": m, "n": n, "h": h, "sq": sq, "skv": skv})
    ho = (h + 2 - 3) // 2 + 1  # Conv: pad 1, kernel 3, stride 2
    gemm = 2 * m * 5 * 16  # Y[m, 5] = A^T[m, 16] B[16, 5]
    conv = 2 * (n * 6 * ho * ho) * (2 * 3 * 3)  # each output: C_in/group * 3 * 3 multiply-adds
    convt = 2 * (n * 6 * ho * ho) * (3 * 2 * 2)  # each input element: C_out/group * 2 * 2 multiply-adds
    att = 2 * n * 2 * sq * skv * (8 + 6)  # q k^T then p v
    assert got["dense"] == gemm + conv + convt + att
    assert got["elementwise"] == 0
