"""The compile-time graph rewrites of inference (passes/fold.py, the softmax rule), each against the reference:
BatchNormalization and per-channel Mul / Add / Sub by constants folded into the conv before it (or BatchNormalization
into Mul + Add), Dropout in inference mode and an Expand to its own shape removed, an opset-11 Softmax over the last
axis compiled, and the channels-last layout's Transposes (passes/layout.py) where a model meets them."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.runtime.build import KernelStep, NodeStep
from tolerance import assert_f32_close

F = TensorProto.FLOAT
RNG = np.random.default_rng(3)


def _model(nodes, x_shape, inits, outputs=("y",), opset=19):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, x_shape)],
                          [helper.make_tensor_value_info(o, F, None) for o in outputs],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _bn_inits(c: int) -> dict:
    return {"s": RNG.uniform(0.5, 2, c).astype(np.float32), "b": RNG.standard_normal(c).astype(np.float32),
            "m": RNG.standard_normal(c).astype(np.float32), "v": RNG.uniform(0.1, 3, c).astype(np.float32)}


def _run_both(model, dims, shape, names=("y",)):
    g = ds.load_onnx(model, dims=dims)
    exe = ds.compile(g)
    x = RNG.standard_normal(shape).astype(np.float32)
    got, want = exe.run({"x": x}), g.run({"x": x})
    for n in names:
        assert_f32_close(got[n], want[n], rtol=1e-4, scale=1e-5)
    return exe


def _ops(exe) -> list[str]:
    out = []
    for s in exe.generic.steps:
        out += [n.op_type for n in s.nodes] if isinstance(s, KernelStep) else [s.node.op_type]
    return out


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_batchnorm_folds_into_the_conv_before_it(op):
    w = (RNG.standard_normal((6, 6, 2, 2)) * 0.3).astype(np.float32)
    attrs = {"strides": [2, 2]} if op == "ConvTranspose" else {"pads": [1, 0, 0, 1]}
    nodes = [helper.make_node(op, ["x", "w"], ["c"], **attrs),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], epsilon=1e-3)]
    exe = _run_both(_model(nodes, ["n", 6, "h", "w"], {"w": w, **_bn_inits(6)}), {"n": (1, 2), "h": (1, 9),
                                                                                  "w": (1, 9)}, (2, 6, 5, 7))
    assert "BatchNormalization" not in _ops(exe)


def test_batchnorm_without_a_conv_becomes_a_per_channel_multiply_add():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("BatchNormalization", ["r", "s", "b", "m", "v"], ["y"])]
    exe = _run_both(_model(nodes, ["n", 5, "l"], _bn_inits(5)), {"n": (1, 3), "l": (1, 20)}, (3, 5, 11))
    assert "BatchNormalization" not in _ops(exe)


def test_a_chain_of_scales_and_shifts_without_a_conv_becomes_one_multiply_add():
    """Relu -> BatchNormalization -> Mul -> Add -> Sub (DenseNet's normalisation and Caffe Scale before each layer,
    with nothing to fold into): one Mul and one Add of the combined constants; a lone Mul after a Relu read
    twice stays as written (nothing to combine)."""
    c = 5
    inits = {**_bn_inits(c), "k": RNG.uniform(0.5, 2, (c, 1)).astype(np.float32),
             "t": RNG.standard_normal((1, c, 1)).astype(np.float32), "u": np.float32(0.25)}
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("BatchNormalization", ["r", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Mul", ["bn", "k"], ["m1"]), helper.make_node("Add", ["t", "m1"], ["a1"]),
             helper.make_node("Sub", ["a1", "u"], ["y"]),
             helper.make_node("Mul", ["r", "k"], ["z0"]), helper.make_node("Add", ["z0", "r"], ["z"])]
    exe = _run_both(_model(nodes, ["n", c, "l"], inits, outputs=("y", "z")), {"n": (1, 3), "l": (1, 20)},
                    (3, c, 11), names=("y", "z"))
    ops = _ops(exe)
    assert "BatchNormalization" not in ops and "Sub" not in ops
    assert ops.count("Mul") == 2 and ops.count("Add") == 2  # the chain's one of each; z's own


def test_scalar_scales_on_a_huge_channel_axis_are_not_made_per_channel():
    """Fuzzer case 5483 (seed 1207): an input declared with 10^9 channels, scaled and shifted by one value each,
    took two float64 vectors of the channels (16 GB) before any check; past fold.MAX_CHANNELS the ops stay as
    written (one value each), and the results as the reference's."""
    import tracemalloc

    c = (1 << 23) + 1  # past MAX_CHANNELS: folding would take 2 x 64 MB of float64 and 2 x 32 MB of float32
    nodes = [helper.make_node("Mul", ["x", "k"], ["t"]), helper.make_node("Add", ["t", "u"], ["y"])]
    g = ds.load_onnx(_model(nodes, [1, c, 1], {"k": np.float32(2.0), "u": np.float32(0.5)}))
    tracemalloc.start()
    try:
        exe = ds.compile(g)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak
    x = RNG.standard_normal((1, c, 1)).astype(np.float32)
    assert_f32_close(exe.run({"x": x})["y"], x * np.float32(2.0) + np.float32(0.5), rtol=1e-6, scale=1e-6)


def test_batchnorm_after_a_conv_read_twice_is_not_folded_into_it():
    w = (RNG.standard_normal((4, 4, 1, 1))).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Add", ["bn", "c"], ["y"])]
    _run_both(_model(nodes, ["n", 4, "h", "w"], {"w": w, **_bn_inits(4)}), {"n": (1, 2), "h": (1, 9), "w": (1, 9)},
              (1, 4, 3, 8))


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_a_chain_of_per_channel_scales_and_shifts_folds_into_the_conv(op):
    """Conv -> BatchNormalization -> Mul -> Add (the converted Caffe Scale layer of Inception v2 and DenseNet),
    then a Sub and a scalar Mul with the constant first: all into the conv's weights and bias, no node left."""
    c = 6
    w = (RNG.standard_normal((c, c, 2, 2)) * 0.3).astype(np.float32)
    attrs = {"strides": [2, 2]} if op == "ConvTranspose" else {"pads": [1, 0, 0, 1]}
    inits = {"w": w, **_bn_inits(c), "k": RNG.uniform(0.5, 2, (c, 1, 1)).astype(np.float32),
             "t": RNG.standard_normal((1, c, 1, 1)).astype(np.float32), "u": RNG.standard_normal(c).reshape(c, 1, 1)
             .astype(np.float32), "two": np.array(2.0, np.float32)}
    nodes = [helper.make_node(op, ["x", "w"], ["c"], **attrs),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Mul", ["bn", "k"], ["scaled"]), helper.make_node("Add", ["t", "scaled"], ["shifted"]),
             helper.make_node("Sub", ["shifted", "u"], ["sub"]), helper.make_node("Mul", ["two", "sub"], ["y"])]
    exe = _run_both(_model(nodes, ["n", c, "h", "w"], inits), {"n": (1, 2), "h": (1, 9), "w": (1, 9)}, (2, c, 5, 7))
    assert not {"BatchNormalization", "Mul", "Add", "Sub"} & set(_ops(exe)), _ops(exe)


def test_scales_that_are_not_per_channel_or_a_shared_conv_output_are_not_folded():
    """A Mul by a per-pixel constant, a Sub with the constant first (c - x) and a conv whose output is also read
    elsewhere stay nodes (the result still matches the reference)."""
    w = (RNG.standard_normal((4, 4, 1, 1))).astype(np.float32)
    inits = {"w": w, "p": RNG.standard_normal((1, 1, 3, 8)).astype(np.float32),
             "u": RNG.standard_normal((4, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Mul", ["c", "p"], ["m"]),
             helper.make_node("Conv", ["m", "w"], ["c2"]), helper.make_node("Sub", ["u", "c2"], ["s"]),
             helper.make_node("Conv", ["s", "w"], ["c3"]), helper.make_node("Mul", ["c3", "u"], ["m3"]),
             helper.make_node("Add", ["m3", "c3"], ["y"])]
    exe = _run_both(_model(nodes, ["n", 4, 3, 8], inits), {"n": (1, 2)}, (2, 4, 3, 8))
    assert _ops(exe).count("Mul") == 2 and "Sub" in _ops(exe)


def test_inference_dropout_runs_no_step():
    ratio = np.array(0.3, np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Dropout", ["r", "ratio"], ["d"]),
             helper.make_node("Sigmoid", ["d"], ["y"])]
    exe = _run_both(_model(nodes, ["n", 7], {"ratio": ratio}), {"n": (1, 9)}, (4, 7))
    assert "Dropout" not in _ops(exe)


def test_dropout_kept_where_its_value_or_mask_is_read():
    # the mask is read: the node stays and runs the reference; its output is a graph output: also kept
    nodes = [helper.make_node("Dropout", ["x"], ["y", "mask"]), helper.make_node("Cast", ["mask"], ["mf"], to=F)]
    exe = _run_both(_model(nodes, ["n", 3], {}, outputs=("y", "mf")), {"n": (1, 4)}, (2, 3), ("y", "mf"))
    assert "Dropout" in _ops(exe)
    exe = _run_both(_model([helper.make_node("Dropout", ["x"], ["y"])], ["n", 3], {}), {"n": (1, 4)}, (2, 3))
    assert "Dropout" in _ops(exe)


def test_training_mode_dropout_is_not_removed():
    mode = np.array(True)
    nodes = [helper.make_node("Dropout", ["x", "", "t"], ["d"]), helper.make_node("Relu", ["d"], ["y"])]
    g = ds.load_onnx(_model(nodes, ["n", 3], {"t": mode}), dims={"n": (1, 4)})
    assert "Dropout" in _ops(ds.compile(g))


@pytest.mark.parametrize("shape,axis,compiled", [((3, 10), 1, True), ((2, 3, 4), 2, True), ((2, 3, 4), 1, False)])
def test_opset11_softmax_compiles_when_its_axis_is_the_last(shape, axis, compiled):
    # opset 11 flattens from `axis` on: over the last axis the rows are the same as opset 13's
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=axis)]
    exe = _run_both(_model(nodes, ["n", *shape[1:]], {}, opset=11), {"n": (1, 4)}, shape)
    kinds = [s.kind for s in exe.generic.steps if isinstance(s, KernelStep)]
    assert (kinds == ["softmax"]) == compiled, kinds
    assert compiled or any(isinstance(s, NodeStep) for s in exe.generic.steps)


def test_a_channel_shuffle_between_convs_stays_channels_last():
    """ShuffleNet's Reshape -> Transpose -> Reshape on a conv's output: the same values, and no conversion to
    channels first and back around it (one Transpose of the channels-last view instead)."""
    g, cg = 3, 4
    w1 = (RNG.standard_normal((g * cg, 5, 1, 1))).astype(np.float32)
    w2 = (RNG.standard_normal((6, g * cg, 3, 3)) * 0.2).astype(np.float32)
    i64 = np.int64
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Shape", ["a"], ["sh"]),
             helper.make_node("Gather", ["sh", "i0"], ["n"]), helper.make_node("Gather", ["sh", "i23"], ["hw"]),
             helper.make_node("Concat", ["n", "gcg", "hw"], ["s5"], axis=0),
             helper.make_node("Concat", ["n", "c", "hw"], ["s4"], axis=0),
             helper.make_node("Reshape", ["a", "s5"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t", "s4"], ["u"]),
             helper.make_node("Conv", ["u", "w2"], ["y"], pads=[1, 1, 1, 1])]
    model = _model(nodes, ["n", 5, "h", "w"], {"w1": w1, "w2": w2, "i0": np.array([0], i64),
                                              "i23": np.array([2, 3], i64), "gcg": np.array([g, cg], i64),
                                              "c": np.array([g * cg], i64)})
    exe = _run_both(model, {"n": (1, 2), "h": (1, 12), "w": (1, 12)}, (2, 5, 7, 9))
    names = [s.node.name for s in exe.generic.steps if isinstance(s, NodeStep) and s.node.op_type == "Transpose"]
    # the input to channels last, the shuffle itself, the output back: no round trip through channels first
    assert len(names) == 3 and sum("cl_shuffle" in n for n in names) == 1, names


@pytest.mark.parametrize("opset", [11, 13])
def test_a_split_between_convs_stays_channels_last(opset):
    """A YOLOv8 C2f block's channel Split of a conv's output, its halves through convs, then a Concat: the same
    values, and no conversion to channels first and back around it, whether the split sizes are an attribute
    (opset 11) or an input (opset 13: a parameter of the op, not an operand to permute)."""
    w1 = (RNG.standard_normal((8, 5, 1, 1))).astype(np.float32)
    w2 = (RNG.standard_normal((3, 3, 3, 3)) * 0.3).astype(np.float32)
    w3 = (RNG.standard_normal((6, 11, 1, 1)) * 0.3).astype(np.float32)
    sizes = np.array([3, 5], np.int64)
    split = helper.make_node("Split", ["a", "sizes"], ["p", "q"], axis=1) if opset >= 13 else \
        helper.make_node("Split", ["a"], ["p", "q"], axis=1, split=[3, 5])
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), split,
             helper.make_node("Conv", ["p", "w2"], ["r"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["r", "q", "p"], ["c"], axis=1),
             helper.make_node("Conv", ["c", "w3"], ["y"])]
    inits = {"w1": w1, "w2": w2, "w3": w3, **({"sizes": sizes} if opset >= 13 else {})}
    exe = _run_both(_model(nodes, ["n", 5, "h", "w"], inits, opset=opset), {"n": (1, 2), "h": (1, 12),
                                                                             "w": (1, 12)}, (2, 5, 7, 9))
    names = [s.node.name for s in exe.generic.steps if isinstance(s, NodeStep) and s.node.op_type == "Transpose"]
    assert len(names) == 2, names  # the input to channels last, the output back


@pytest.mark.parametrize("opset", [13, 18])
def test_a_global_pool_dropping_its_length_reads_the_channels_last_conv_output(opset):
    """A byte classifier's x.amax(dim=2) / x.mean(dim=2) (keepdims=0) after a Conv1d: both reduce the
    channels-last output directly (pool kernels), with no Transpose back to (N, C, L) before them; the same
    values as the reference."""
    w = (RNG.standard_normal((8, 4, 3)) * 0.3).astype(np.float32)
    if opset >= 18:
        nodes = [helper.make_node("ReduceMax", ["a", "ax"], ["p"], keepdims=0),
                 helper.make_node("ReduceMean", ["a", "ax"], ["q"], keepdims=0)]
        inits = {"w": w, "ax": np.array([2], np.int64)}
    else:
        nodes = [helper.make_node("ReduceMax", ["a"], ["p"], axes=[2], keepdims=0),
                 helper.make_node("ReduceMean", ["a"], ["q"], axes=[-1], keepdims=0)]
        inits = {"w": w}
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1]), *nodes,
             helper.make_node("Concat", ["p", "q"], ["y"], axis=1)]
    exe = _run_both(_model(nodes, ["n", 4, "l"], inits, opset=opset), {"n": (1, 4), "l": (1, 64)}, (3, 4, 37))
    assert "Transpose" not in [s.node.op_type for s in exe.generic.steps if isinstance(s, NodeStep)][1:]
    assert [s.kind for s in exe.generic.steps if isinstance(s, KernelStep)].count("pool") == 2


def test_a_reduction_whose_kept_axes_would_reorder_keeps_its_transpose():
    """ReduceMean over H of NCHW, dims dropped: the channels-last operand's kept axes (N, W, C) are not
    (N, C, W), so the reduction runs on the channels-first view; values as the reference."""
    w = (RNG.standard_normal((6, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["a"], ["y"], axes=[2], keepdims=0)]
    _run_both(_model(nodes, ["n", 3, "h", "w"], {"w": w}, opset=13), {"n": (1, 2), "h": (1, 9), "w": (1, 9)},
              (2, 3, 7, 5))


def test_an_expand_to_its_own_shape_runs_no_step():
    # the target is x's own shape (read by Shape, as transformers' mask code does): the identity, so no step;
    # an Expand that broadcasts a dim (n, 1) -> (n, 3) stays and still computes
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Expand", ["r", "s"], ["e"]), helper.make_node("Sigmoid", ["e"], ["y"])]
    exe = _run_both(_model(nodes, ["n", "m"], {}), {"n": (1, 9), "m": (1, 9)}, (4, 7))
    assert "Expand" not in _ops(exe)
    wide = np.array([1, 3], np.int64)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Expand", ["r", "wide"], ["e"]),
             helper.make_node("Sigmoid", ["e"], ["y"])]
    exe = _run_both(_model(nodes, ["n", 1], {"wide": wide}), {"n": (1, 9)}, (4, 1))
    assert "Expand" in _ops(exe)
    assert exe.run({"x": np.ones((2, 1), np.float32)})["y"].shape == (2, 3)


def test_a_model_in_and_out_channels_last_converts_nowhere():
    """An NHWC model (a TF export: Transpose to NCHW first, convs, Transpose back to NHWC last) runs its convs on the
    channels-last input as it lies and writes the channels-last output as it is: the Transpose pairs at both edges
    cancel, the output's (a graph output keeps its name) as a view of the value before both, so no step
    transposes (there were two passes over the output map: our conversion back, then the model's own)."""
    w = (RNG.standard_normal((8, 5, 3, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["xc", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1])]
    exe = _run_both(_model(nodes, ["n", "h", "w", 5], {"w": w}), {"n": (1, 2), "h": (1, 12), "w": (1, 12)},
                    (2, 7, 9, 5))
    assert "Transpose" not in _ops(exe), _ops(exe)
