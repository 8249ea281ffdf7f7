"""Explicit zero Pads before a Conv (TensorFlow-style "same" padding: transformers' MobileNetV2) folded into the
Conv's pads, and Pads of nothing dropped (passes/pads.py), each against the reference interpreter; and the Pads that
must stay: another value, a negative (cropping) pad, a pad of the batch or channel axis, a Pad something else reads
too, a Conv with auto_pad."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from tolerance import assert_f32_close

F = TensorProto.FLOAT
RNG = np.random.default_rng(23)


def _model(pads: list[int] | None, *, value: float = 0.0, opset: int = 17, axes: list[int] | None = None,
           conv: dict | None = None, extra_reader: bool = False, kernel: int = 3) -> tuple:
    w = RNG.standard_normal((6, 4, kernel, kernel)).astype(np.float32)
    inits = {"w": w, "b": RNG.standard_normal(6).astype(np.float32)}
    if opset < 11:
        pad = helper.make_node("Pad", ["x"], ["p"], name="the_pad", pads=pads, value=value)
    else:
        ins = ["x", "pads", "value"]
        inits["pads"] = np.array(pads, np.int64)
        inits["value"] = np.array(value, np.float32)
        if axes is not None:
            ins.append("axes")
            inits["axes"] = np.array(axes, np.int64)
        pad = helper.make_node("Pad", ins, ["p"], name="the_pad", mode="constant")
    nodes = [pad, helper.make_node("Conv", ["p", "w", "b"], ["y"], name="conv", **(conv or {}))]
    outputs = [helper.make_tensor_value_info("y", F, None)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["p"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", F, None))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["n", 4, "h", "w"])], outputs,
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _pad_runs(model, shapes=((1, 4, 9, 11), (2, 4, 16, 7))) -> bool:
    """Whether a step of the compiled build still runs the Pad (checked equal to the reference at each shape)."""
    g = ds.load_onnx(model)
    exe = ds.compile(g)
    for shape in shapes:
        x = RNG.standard_normal(shape).astype(np.float32)
        got, want = exe.run({"x": x}), g.run({"x": x})
        for k in want:
            assert_f32_close(got[k], want[k], rtol=1e-4, scale=1e-5)
    return any("the_pad" in s.label for s in exe.generic.steps)


@pytest.mark.parametrize("pads", [
    [0, 0, 0, 0, 0, 0, 1, 1],  # TF "same", stride 2, even map: the end only
    [0, 0, 1, 1, 0, 0, 1, 1],  # symmetric
    [0, 0, 2, 0, 0, 0, 1, 3],  # uneven, on top of the conv's own
])
def test_a_zero_pad_of_the_spatial_axes_folds_into_the_conv(pads):
    assert not _pad_runs(_model(pads))
    assert not _pad_runs(_model(pads, conv={"pads": [1, 0, 0, 1], "strides": [2, 2]}))
    assert not _pad_runs(_model(pads, opset=10))  # pads and value as attributes


def test_a_pad_given_by_axes_folds():
    assert not _pad_runs(_model([1, 0, 1, 2], opset=18, axes=[2, 3]))
    assert not _pad_runs(_model([1, 2], opset=18, axes=[-1]))


def test_a_pad_of_nothing_is_dropped_whoever_reads_it():
    assert not _pad_runs(_model([0] * 8, kernel=1, extra_reader=True))


@pytest.mark.parametrize("kw", [
    {"value": 1.5},  # not a zero: the kernel pads with zeros
    {"extra_reader": True},  # the padded map is read by another op
    {"conv": {"auto_pad": "SAME_UPPER"}},  # the conv's pads follow from the padded map's size
])
def test_pads_that_must_stay(kw):
    assert _pad_runs(_model([0, 0, 1, 1, 0, 0, 1, 1], **kw))


@pytest.mark.parametrize("pads", [[0, 0, -1, 0, 0, 0, 1, 1], [0, 1, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]])
def test_cropping_and_non_spatial_pads_stay(pads):
    if pads[1]:  # one more input channel, for the conv's four
        model = _model(pads)
        model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 3
        assert _pad_runs(model, shapes=((1, 3, 9, 11),))
    else:
        assert _pad_runs(_model(pads))
