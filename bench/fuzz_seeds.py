"""The seed models `fuzz_models.py` mutates: a dozen small, valid ONNX models that onnxruntime and dynshape both run,
covering the op families the hardening issue found defects in (conv/pool, reshape/softmax, gather/slice,
matmul + LayerNorm, shape arithmetic, pad/TopK, Loop/If, attention, an MLP, resize / ConvTranspose, reductions
and casts, control-flow scans).

Every seed declares its outputs' element types (onnxruntime refuses undeclared ones) and has symbolic input dims,
so mutants exercise the binder too. `Seed.env` gives the symbol values feeds are drawn at; `Seed.int_ranges`
bounds the integer inputs that index something (indices, token ids).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


@dataclass(frozen=True)
class Seed:
    name: str
    build: Callable[[], onnx.ModelProto]
    env: dict[str, int]
    int_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)


def _vi(name: str, elem: int, shape: list | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes: list, inputs: list, outputs: list, inits: dict | None = None, opset: int = 18) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "seed", inputs, outputs,
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _w(*shape: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 0.5).astype(np.float32)


def conv_pool() -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("AveragePool", ["p"], ["q"], kernel_shape=[2, 2], pads=[0, 0, 1, 1], name="avg"),
             helper.make_node("GlobalAveragePool", ["q"], ["y"], name="gap")]
    return _model(nodes, [_vi("x", F32, ["N", 3, "H", "W"])], [_vi("y", F32, ["N", 4, 1, 1])],
                  {"w": _w(4, 3, 3, 3), "b": _w(4, seed=1)})


def fire_concat() -> onnx.ModelProto:
    """SqueezeNet's fire module: the expands write their columns of the Concat (runtime/concat_joins.py)."""
    nodes = [helper.make_node("Conv", ["x", "ws"], ["s"], name="squeeze"),
             helper.make_node("Relu", ["s"], ["sr"], name="squeeze_relu"),
             helper.make_node("Conv", ["sr", "w1"], ["e1"], name="expand1"),
             helper.make_node("Conv", ["sr", "w3", "b3"], ["e3"], pads=[1, 1, 1, 1], name="expand3"),
             helper.make_node("Concat", ["e1", "e3"], ["c"], axis=1, name="concat"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes, [_vi("x", F32, ["N", 3, "H", "W"])], [_vi("y", F32, ["N", 10, "H", "W"])],
                  {"ws": _w(4, 3, 1, 1), "w1": _w(6, 4, 1, 1, seed=1), "w3": _w(4, 4, 3, 3, seed=2),
                   "b3": _w(4, seed=3)})


def reshape_softmax() -> onnx.ModelProto:
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3], name="transpose"),
             helper.make_node("Softmax", ["t"], ["s"], axis=-1, name="softmax"),
             helper.make_node("Flatten", ["s"], ["y"], axis=2, name="flatten")]
    return _model(nodes, [_vi("x", F32, ["B", "S", 8])], [_vi("y", F32, ["o0", "o1"])],
                  {"shape": np.array([0, 0, 2, 4], np.int64)})


def gather_slice() -> onnx.ModelProto:
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0, name="embed"),
             helper.make_node("Slice", ["e", "starts", "ends", "axes", "steps"], ["s"], name="slice"),
             helper.make_node("Concat", ["s", "s"], ["c"], axis=-1, name="concat"),
             helper.make_node("GatherElements", ["c", "gi"], ["y"], axis=2, name="gather_el")]
    return _model(nodes, [_vi("ids", I64, ["B", "S"]), _vi("gi", I64, ["B", "S", 2])], [_vi("y", F32, ["B", "S", 2])],
                  {"table": _w(10, 6), "starts": np.array([1]), "ends": np.array([5]), "axes": np.array([2]),
                   "steps": np.array([2])})


def matmul_layernorm() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["a"], name="bias"),
             helper.make_node("LayerNormalization", ["a", "g", "beta"], ["n"], axis=-1, epsilon=1e-5, name="ln"),
             helper.make_node("Gelu", ["n"], ["y"], name="gelu")]
    return _model(nodes, [_vi("x", F32, ["B", "S", 8])], [_vi("y", F32, ["B", "S", 16])],
                  {"w": _w(8, 16), "b": _w(16, seed=2), "g": np.ones(16, np.float32),
                   "beta": np.zeros(16, np.float32)}, opset=20)


def shape_arith() -> onnx.ModelProto:
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0, name="g0"),
             helper.make_node("Gather", ["s", "i1"], ["d1"], axis=0, name="g1"),
             helper.make_node("Mul", ["d0", "d1"], ["m"], name="mul"),
             helper.make_node("Unsqueeze", ["m", "ax"], ["mu"], name="unsq"),
             helper.make_node("Concat", ["mu", "c4"], ["ns"], axis=0, name="cat"),
             helper.make_node("Reshape", ["x", "ns"], ["r"], name="reshape"),
             helper.make_node("Expand", ["r", "es"], ["e"], name="expand"),
             helper.make_node("ReduceSum", ["e", "rax"], ["y"], keepdims=0, name="sum")]
    return _model(nodes, [_vi("x", F32, ["B", "S", 4])], [_vi("y", F32, ["o0", 4])],
                  {"i0": np.array(0), "i1": np.array(1), "ax": np.array([0]), "c4": np.array([4]),
                   "es": np.array([2, 1, 1]), "rax": np.array([0])})


def pad_topk() -> onnx.ModelProto:
    nodes = [helper.make_node("Pad", ["x", "pads", "cv"], ["p"], mode="constant", name="pad"),
             helper.make_node("TopK", ["p", "k"], ["v", "i"], axis=-1, largest=1, name="topk"),
             helper.make_node("Cast", ["i"], ["fi"], to=F32, name="cast"),
             helper.make_node("Add", ["v", "fi"], ["y"], name="add")]
    return _model(nodes, [_vi("x", F32, ["B", "L"])], [_vi("y", F32, ["B", 3])],
                  {"pads": np.array([0, 1, 0, 2]), "cv": np.array(0.5, np.float32), "k": np.array([3])})


def loop_scan() -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "x"], ["acc2"], name="b_add"),
         helper.make_node("Mul", ["acc2", "half"], ["sc"], name="b_mul"),
         helper.make_node("Identity", ["cond"], ["cond2"], name="b_id")],
        "body", [_vi("it", I64, []), _vi("cond", BOOL, []), _vi("acc", F32, ["N"])],
        [_vi("cond2", BOOL, []), _vi("acc2", F32, ["N"]), _vi("sc", F32, ["N"])])
    nodes = [helper.make_node("Loop", ["trips", "", "init"], ["final", "scan"], body=body, name="loop"),
             helper.make_node("ReduceMax", ["scan", "ax0"], ["m"], keepdims=0, name="rmax"),
             helper.make_node("Sub", ["final", "m"], ["y"], name="sub")]
    return _model(nodes, [_vi("x", F32, ["N"]), _vi("init", F32, ["N"]), _vi("trips", I64, [])],
                  [_vi("y", F32, ["N"])], {"half": np.array(0.5, np.float32), "ax0": np.array([0])})


def if_branches() -> onnx.ModelProto:
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="t_relu")], "then", [],
                               [_vi("t", F32, ["B", 4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="e_neg")], "else", [],
                               [_vi("e", F32, ["B", 4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g, name="if"),
             helper.make_node("Mul", ["r", "x"], ["y"], name="mul")]
    return _model(nodes, [_vi("x", F32, ["B", 4])], [_vi("y", F32, ["B", 4])], {"zero": np.array(0, np.float32)})


def attention() -> onnx.ModelProto:
    """Self-attention with an additive key mask: a masked key's logit is lowered by 30 (e^-30: it weighs ~1e-13).
    Not the customary 1e4: in float32 a logit of magnitude 1e4 keeps ~3 decimals, so two correct evaluation
    orders (the reference's numpy products, a kernel's own) agree only to ~1e-3, and the seed stopped testing the
    runtime and tested float32 (the hardening property compares at rtol 1e-4). A fully masked row then still
    weighs its keys by their scores, the sum unchanged."""
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
             helper.make_node("MatMul", ["x", "wv"], ["v"], name="v"),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
             helper.make_node("MatMul", ["q", "kt"], ["sc"], name="scores"),
             helper.make_node("Div", ["sc", "scale"], ["sd"], name="scale"),
             helper.make_node("Cast", ["mask"], ["mf"], to=F32, name="mcast"),
             helper.make_node("Sub", ["one", "mf"], ["inv"], name="inv"),
             helper.make_node("Mul", ["inv", "neg"], ["bias"], name="mbias"),
             helper.make_node("Unsqueeze", ["bias", "ax1"], ["b3"], name="unsq"),
             helper.make_node("Add", ["sd", "b3"], ["sm"], name="masked"),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="ctx")]
    return _model(nodes, [_vi("x", F32, ["B", "S", 8]), _vi("mask", I64, ["B", "S"])], [_vi("y", F32, ["B", "S", 8])],
                  {"wq": _w(8, 8, seed=3), "wk": _w(8, 8, seed=4), "wv": _w(8, 8, seed=5),
                   "scale": np.array(np.sqrt(8.0), np.float32), "one": np.array(1, np.float32),
                   "neg": np.array(-30.0, np.float32), "ax1": np.array([1])})


def mlp() -> onnx.ModelProto:
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1, name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]
    return _model(nodes, [_vi("x", F32, ["batch", 16])], [_vi("y", F32, ["batch", 8])],
                  {"w1": _w(32, 16, seed=6), "b1": _w(32, seed=7), "w2": _w(32, 8, seed=8)})


def resize_convt() -> onnx.ModelProto:
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["u"], mode="nearest", name="resize"),
             helper.make_node("ConvTranspose", ["u", "w"], ["ct"], strides=[2, 2], pads=[1, 1, 1, 1], name="convt"),
             helper.make_node("Sigmoid", ["ct"], ["y"], name="sigmoid")]
    return _model(nodes, [_vi("x", F32, ["N", 2, "H", "W"])], [_vi("y", F32, ["N", 3, "o2", "o3"])],
                  {"scales": np.array([1, 1, 2, 2], np.float32), "w": _w(2, 3, 3, 3, seed=9)})


def reduce_cast() -> onnx.ModelProto:
    nodes = [helper.make_node("ReduceMean", ["x", "ax"], ["m"], keepdims=1, name="mean"),
             helper.make_node("Sub", ["x", "m"], ["c"], name="center"),
             helper.make_node("CumSum", ["c", "cax"], ["cs"], name="cumsum"),
             helper.make_node("Greater", ["cs", "zero"], ["g"], name="gt"),
             helper.make_node("Where", ["g", "cs", "zero"], ["w"], name="where"),
             helper.make_node("Cast", ["w"], ["i"], to=I64, name="cast"),
             helper.make_node("ArgMax", ["i"], ["y"], axis=1, keepdims=0, name="argmax")]
    return _model(nodes, [_vi("x", F32, ["B", "L"])], [_vi("y", I64, ["B"])],
                  {"ax": np.array([1]), "cax": np.array(1), "zero": np.array(0, np.float32)})


def split_scatter() -> onnx.ModelProto:
    nodes = [helper.make_node("Split", ["x", "sp"], ["a", "b"], axis=1, name="split"),
             helper.make_node("Mul", ["a", "b"], ["m"], name="mul"),
             helper.make_node("ScatterND", ["m", "idx", "upd"], ["s"], name="scatter"),
             helper.make_node("Tile", ["s", "reps"], ["y"], name="tile")]
    return _model(nodes, [_vi("x", F32, ["B", 4])], [_vi("y", F32, ["B", 4])],
                  {"sp": np.array([2, 2]), "idx": np.array([[0, 1]]), "upd": np.array([5.0], np.float32),
                   "reps": np.array([1, 2])})


SEEDS = [
    Seed("conv_pool", conv_pool, {"N": 2, "H": 8, "W": 6}),
    Seed("fire_concat", fire_concat, {"N": 2, "H": 5, "W": 7}),
    Seed("reshape_softmax", reshape_softmax, {"B": 2, "S": 3}),
    Seed("gather_slice", gather_slice, {"B": 2, "S": 3}, {"ids": (0, 10), "gi": (0, 4)}),
    Seed("matmul_layernorm", matmul_layernorm, {"B": 2, "S": 3}),
    Seed("shape_arith", shape_arith, {"B": 2, "S": 3}),
    Seed("pad_topk", pad_topk, {"B": 2, "L": 5}),
    Seed("loop_scan", loop_scan, {"N": 3}, {"trips": (1, 4)}),
    Seed("if_branches", if_branches, {"B": 3}),
    Seed("attention", attention, {"B": 2, "S": 4}, {"mask": (0, 2)}),
    Seed("mlp", mlp, {"batch": 3}),
    Seed("resize_convt", resize_convt, {"N": 1, "H": 3, "W": 4}),
    Seed("reduce_cast", reduce_cast, {"B": 2, "L": 5}),
    Seed("split_scatter", split_scatter, {"B": 2}),
]
