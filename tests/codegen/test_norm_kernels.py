"""InstanceNormalization and GroupNormalization run natively (whole feature maps a row, per-channel affine),
channels first and, inside a channels-last CNN, channels last; against the numpy reference."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.runtime.build import NodeStep

F = TensorProto.FLOAT
RNG = np.random.default_rng(7)


def _graph(nodes, x_shape, inits, opset=21):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, x_shape)],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return ds.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def _close(out, ref):
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


def _how(exe, op):
    return {s.how for s in exe.generic.steps if isinstance(s, NodeStep) and op in (s.op, s.node.attrs.get("op"))}


@pytest.mark.parametrize("shape", [(2, 8, 37), (1, 16, 9, 11), (3, 4, 5, 6, 2)])
def test_instance_norm_channels_first_is_native_and_matches(shape):
    c = shape[1]
    inits = {"s": RNG.standard_normal(c).astype(np.float32), "b": RNG.standard_normal(c).astype(np.float32)}
    g = _graph([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)],
               ["n", c, *[f"d{i}" for i in range(len(shape) - 2)]], inits)
    exe = ds.compile(g, channels_last=False)
    assert _how(exe, "InstanceNormalization") == {"native"}
    axes = tuple(range(2, len(shape)))
    per_channel = (1, c) + (1,) * (len(shape) - 2)
    for offset in (1.0, 1000.0):  # an offset far above the spread: the statistics must not lose it
        x = (RNG.standard_normal(shape) + offset).astype(np.float32)
        x64 = x.astype(np.float64)
        mean, var = x64.mean(axis=axes, keepdims=True), x64.var(axis=axes, keepdims=True)
        exact = inits["s"].reshape(per_channel) * (x64 - mean) / np.sqrt(var + np.float32(1e-3)) \
            + inits["b"].reshape(per_channel)
        _close(exe.run({"x": x})["y"], exact)  # float64 statistics: the float32 reference drifts at offset 1000


@pytest.mark.parametrize("groups", [1, 4, 8])
def test_group_norm_is_native_and_matches(groups):
    c = 8
    inits = {"s": RNG.standard_normal(c).astype(np.float32), "b": RNG.standard_normal(c).astype(np.float32)}
    g = _graph([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups, epsilon=1e-5)],
               ["n", c, "h", "w"], inits)
    exe = ds.compile(g, channels_last=False)
    assert _how(exe, "GroupNormalization") == {"native"}
    x = RNG.standard_normal((2, c, 5, 7)).astype(np.float32)
    _close(exe.run({"x": x})["y"], g.run({"x": x})["y"])


def test_instance_norm_between_convs_runs_channels_last_natively():
    """Conv -> InstanceNormalization -> Relu -> Conv (a style-transfer / UNet block): the norm runs on the
    channels-last map between the convs, no transposes around it."""
    w1 = (RNG.standard_normal((16, 3, 3, 3)) * 0.2).astype(np.float32)
    w2 = (RNG.standard_normal((8, 16, 3, 3)) * 0.2).astype(np.float32)
    inits = {"w1": w1, "w2": w2, "s": RNG.standard_normal(16).astype(np.float32),
             "b": RNG.standard_normal(16).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("InstanceNormalization", ["c1", "s", "b"], ["n1"]),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1])]
    g = _graph(nodes, ["n", 3, "h", "w"], inits)
    exe = ds.compile(g)
    assert _how(exe, "InstanceNormalization") == {"native"}
    transposes = [s for s in exe.generic.steps if isinstance(s, NodeStep) and s.op == "Transpose"]
    assert len(transposes) <= 2  # into the region and out of it, none around the norm
    for shape in ((1, 3, 12, 10), (2, 3, 7, 9)):
        x = RNG.standard_normal(shape).astype(np.float32)
        _close(exe.run({"x": x})["y"], g.run({"x": x})["y"])


def _torch_group_norm(x: str, scale: str, bias: str, out: str) -> list:
    """GroupNorm as torch exports it: x reshaped to (N, groups, -1) by the initializer `target`, an
    InstanceNormalization of the groups (`scale`, `bias`: ones and zeros), reshaped back to x's shape, then the
    per-channel `gamma` and `beta`."""
    return [helper.make_node("Reshape", [x, "target"], ["r1"]),
            helper.make_node("InstanceNormalization", ["r1", scale, bias], ["n1"]),
            helper.make_node("Shape", [x], ["shape1"]),
            helper.make_node("Reshape", ["n1", "shape1"], ["r2"]),
            helper.make_node("Mul", ["r2", "gamma"], ["m"]),
            helper.make_node("Add", ["m", "beta"], [out])]


def test_torch_groupnorm_export_between_conv1ds_stays_channels_last():
    """torch exports GroupNorm(C, C) (wav2vec2's feature encoder) as Reshape to (N, C, -1), InstanceNormalization
    with unit scale, Reshape back, Mul and Add per channel: the Reshapes are the identity, so they run no step and
    the whole block stays channels last (two Transposes for the whole graph)."""
    c = 16
    inits = {"w1": (RNG.standard_normal((c, 1, 10)) * 0.3).astype(np.float32),
             "w2": (RNG.standard_normal((c, c, 3)) * 0.2).astype(np.float32),
             "ones": np.ones(c, np.float32), "zeros": np.zeros(c, np.float32),
             "target": np.array([0, c, -1], np.int64),
             "gamma": RNG.standard_normal((c, 1)).astype(np.float32),
             "beta": RNG.standard_normal((c, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[5]),
             *_torch_group_norm("c1", "ones", "zeros", "a"),
             helper.make_node("Relu", ["a"], ["g"]),
             helper.make_node("Conv", ["g", "w2"], ["y"], strides=[2])]
    g = _graph(nodes, ["n", 1, "t"], inits)
    exe = ds.compile(g)
    ops = [s.op for s in exe.generic.steps if isinstance(s, NodeStep)]
    assert ops.count("Transpose") == 2 and "Reshape" not in ops, ops
    assert _how(exe, "InstanceNormalization") == {"native"}
    for shape in ((1, 1, 400), (2, 1, 253)):
        x = RNG.standard_normal(shape).astype(np.float32)
        _close(exe.run({"x": x})["y"], g.run({"x": x})["y"])


def test_torch_groupnorm_of_one_group_runs_as_one_row_an_image(spy_row_kernels):
    """torch exports GroupNorm(1, C) (PoolFormer) as Reshape to (N, 1, -1) and an InstanceNormalization of one
    channel, which the layout runs channels last on (N, C*H*W, 1): the same bytes as the channels-first (N, 1,
    C*H*W), so it takes the row kernel, one long row an image (the channels-last kernel looped over the positions
    with one channel each, ~8x slower: PoolFormer at 224x224 0.66x -> 1.01x onnxruntime, 1 thread)."""
    c = 8
    inits = {"w1": (RNG.standard_normal((c, 3, 3, 3)) * 0.3).astype(np.float32),
             "w2": (RNG.standard_normal((4, c, 1, 1)) * 0.3).astype(np.float32),
             "one": np.ones(1, np.float32), "zero": np.zeros(1, np.float32),
             "target": np.array([0, 1, -1], np.int64),
             "gamma": RNG.standard_normal((c, 1, 1)).astype(np.float32),
             "beta": RNG.standard_normal((c, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             *_torch_group_norm("c1", "one", "zero", "y0"),
             helper.make_node("Conv", ["y0", "w2"], ["y"])]
    g = _graph(nodes, ["n", 3, "h", "w"], inits)
    exe = ds.compile(g)
    assert _how(exe, "InstanceNormalization") == {"native"}
    for shape in ((1, 3, 12, 10), (2, 3, 7, 9)):
        x = (RNG.standard_normal(shape) * 4 + 3).astype(np.float32)
        _close(exe.run({"x": x})["y"], g.run({"x": x})["y"])
    assert "ds_chan_norm_args" in spy_row_kernels and "ds_instnorm_nhwc_f32" not in spy_row_kernels


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
@pytest.mark.parametrize("axes,keepdims,native", [([-1], 1, True), ([2], 0, True), ([1, 2], 1, True),
                                                 ([-2, -1], 0, True), (None, 0, True), ([1], 1, True),
                                                 ([0, 2], 1, False)])
@pytest.mark.parametrize("opset", [13, 18])
def test_last_axes_reductions_run_natively_and_match(op, axes, keepdims, native, opset):
    """ReduceMean / ReduceSum over the trailing axes (T5's RMSNorm, a channels-last LayerNorm written by hand):
    rows of contiguous elements in C; a middle axis as strided rows (tests/codegen/test_reduce_native.py); axes
    that are not consecutive stay on numpy. Empty rows: sum 0, mean NaN, as numpy."""
    if op == "ReduceMean" and opset < 18:  # axes an attribute before opset 18 (ReduceSum: before 13)
        attrs, ins, inits = ({} if axes is None else {"axes": axes}), ["x"], {}
    else:
        attrs, ins = {}, ["x"] + ([] if axes is None else ["axes"])
        inits = {} if axes is None else {"axes": np.array(axes, np.int64)}
    g = _graph([helper.make_node(op, ins, ["y"], keepdims=keepdims, **attrs)], ["a", "b", "c"], inits, opset=opset)
    exe = ds.compile(g, channels_last=False)
    assert (_how(exe, op) == {"native"}) == native
    for shape in ((2, 3, 5), (1, 1, 1), (4, 7, 33), (2, 0, 3), (3, 2, 0)):
        x = RNG.standard_normal(shape).astype(np.float32) + 3
        ref = g.run({"x": x})["y"]
        out = exe.run({"x": x})["y"]
        assert out.shape == ref.shape
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * max(1.0, float(np.nanmax(np.abs(ref), initial=0))))
