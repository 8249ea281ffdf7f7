"""passes/commute.py: a 1x1 convolution after an upsampling Resize runs before it, on the smaller map. Checked
against onnxruntime (the reference order) on nearest, linear and cubic Resizes given by scales or by sizes, and the
cases it must leave alone (a Resize of the channels, a downscale, a 3x3 conv, a Resize read twice, a graph output)
left as the model wrote them."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.runtime.build import KernelStep
from tolerance import assert_f32_close

F = TensorProto.FLOAT


def _model(mode: str, scales=None, sizes=None, k: int = 1, extra_reader: bool = False, resize_out: bool = False,
           ci: int = 8, co: int = 5, coord: str = "half_pixel"):
    """x (1, ci, h, w) -> Resize -> Conv k x k (ci -> co, bias) -> Relu -> y."""
    rng = np.random.default_rng(ci * co + k)
    inits = {"W": rng.standard_normal((co, ci, k, k)).astype(np.float32),
             "B": rng.standard_normal(co).astype(np.float32)}
    ins = ["x", "", ""]
    if scales is not None:
        inits["scales"] = np.asarray(scales, np.float32)
        ins[2] = "scales"
    if sizes is not None:
        inits["sizes"] = np.asarray(sizes, np.int64)
        ins.append("sizes")
    nodes = [helper.make_node("Resize", ins, ["u"], mode=mode, coordinate_transformation_mode=coord),
             helper.make_node("Conv", ["u", "W", "B"], ["c"], pads=[k // 2] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    outs = ["y"]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["u"], ["z"]))
        outs.append("z")
    if resize_out:
        outs.append("u")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, ci, 6, 7])],
                          [helper.make_tensor_value_info(o, F, None) for o in outs],
                          [numpy_helper.from_array(v, n) for n, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _conv_pixels(exe) -> int:
    """The pixels of the conv kernel's output (its key-0 shape's product over N, H, W)."""
    (step,) = [s for s in exe.generic.steps if isinstance(s, KernelStep) and getattr(s, "op", "") == "conv"]
    shape = exe.generic.build.graph.types[step.outputs[0]].shape
    return int(np.prod(shape[:-1]))


@pytest.mark.parametrize("mode,scales,sizes,coord", [
    ("linear", [1, 1, 2, 2], None, "half_pixel"), ("nearest", [1, 1, 3, 2], None, "asymmetric"),
    ("cubic", [1, 1, 2, 2], None, "align_corners"), ("linear", None, [1, 8, 11, 15], "pytorch_half_pixel")])
def test_the_conv_runs_on_the_small_map_and_matches_onnxruntime(mode, scales, sizes, coord) -> None:
    model = _model(mode, scales, sizes, coord=coord)
    x = np.random.default_rng(1).standard_normal((1, 8, 6, 7)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    exe = ds.compile(ds.load_onnx(model))
    assert_f32_close(exe.run({"x": x})["y"], want)
    assert _conv_pixels(exe) == 6 * 7  # the input's map, not the upsampled one
    kept = ds.compile(ds.load_onnx(model), pointwise_before_resize=False)
    assert _conv_pixels(kept) == int(np.prod(want.shape[2:]))
    assert_f32_close(kept.run({"x": x})["y"], want)


@pytest.mark.parametrize("case", ["channels", "downscale", "3x3", "read twice", "graph output"])
def test_what_does_not_commute_stays_as_written(case: str) -> None:
    """A Resize of the channel axis (the conv would see other channels), a downscale (the conv would run on the
    larger map), a 3x3 conv (not pointwise), a Resize another node reads or the graph returns: left alone,
    results the reference's."""
    kw = {"channels": dict(mode="nearest", scales=[1, 2, 2, 2], ci=4, co=5),
          "downscale": dict(mode="linear", scales=[1, 1, 0.5, 0.5]),
          "3x3": dict(mode="linear", scales=[1, 1, 2, 2], k=3),
          "read twice": dict(mode="linear", scales=[1, 1, 2, 2], extra_reader=True),
          "graph output": dict(mode="linear", scales=[1, 1, 2, 2], resize_out=True)}[case]
    ci = kw.get("ci", 8)
    if case == "channels":
        kw["ci"] = 8  # the conv reads the doubled channels
        model = _model(**kw)
        model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 4
    else:
        model = _model(**kw)
    x = np.random.default_rng(2).standard_normal((1, 4 if case == "channels" else ci, 6, 7)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})
    exe = ds.compile(ds.load_onnx(model))
    got = exe.run({"x": x})
    for name, w in zip([o.name for o in model.graph.output], want):
        assert_f32_close(got[name], w)
    assert _conv_pixels(exe) == int(np.prod(want[0].shape[2:]))
