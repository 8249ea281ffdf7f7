"""1x1 convolutions to at most 4 outputs (a segmentation head: 16 -> 2) run as dot products over the input channels
summed across lanes (csrc/ds_conv.c's ds_conv_few), not as a 32-column panel's micro-tiles: against numpy, with a
bias, a residual, the activations the tiles apply, outputs written into a Concat's columns (rows wider than the
outputs: each pixel finished on its own), input channels that are not a multiple of 16, and pixel counts that end
in a partial block."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds


def _model(ci: int, co: int, tail: str, w: np.ndarray, b: np.ndarray) -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[1, 1])]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", ci, "h", "w"])]
    if tail == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif tail == "silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    elif tail == "add":
        nodes.append(helper.make_node("Add", ["c", "r"], ["y"]))
        ins.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["n", co, "h", "w"]))
    else:  # "concat": Relu, then joined with another conv of x (8 outputs) along channels, then halved: both
        # convs write straight into the Concat's columns (rows co + 8 floats apart)
        nodes += [helper.make_node("Relu", ["c"], ["a"]),
                  helper.make_node("Conv", ["x", "W8"], ["e"], kernel_shape=[1, 1]),
                  helper.make_node("Concat", ["a", "e"], ["j"], axis=1), helper.make_node("Mul", ["j", "half"], ["y"])]
    graph = helper.make_graph(nodes, "head", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B"),
                               numpy_helper.from_array(np.float32(0.5), "half"),
                               numpy_helper.from_array(_w8(ci), "W8")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _w8(ci: int) -> np.ndarray:
    return np.linspace(-1, 1, 8 * ci, dtype=np.float32).reshape(8, ci, 1, 1)


def _reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, tail: str, r: np.ndarray | None) -> np.ndarray:
    c = np.einsum("nchw,oc->nohw", x.astype(np.float64), w[:, :, 0, 0].astype(np.float64)) + b[None, :, None, None]
    if tail == "relu":
        return np.maximum(c, 0)
    if tail == "silu":
        return c / (1 + np.exp(-c))
    if tail == "add":
        return c + r
    e = np.einsum("nchw,oc->nohw", x.astype(np.float64), _w8(x.shape[1])[:, :, 0, 0].astype(np.float64))
    return np.concatenate([np.maximum(c, 0), e], axis=1) * 0.5


@pytest.mark.parametrize("ci,co,tail", [(16, 2, "add"), (5, 1, "relu"), (40, 3, "silu"), (16, 4, "concat"),
                                        (64, 2, "relu"), (1, 4, "add"), (33, 2, "concat")])
def test_few_output_heads_match_numpy(ci: int, co: int, tail: str) -> None:
    rng = np.random.default_rng(ci * 10 + co)
    w = rng.standard_normal((co, ci, 1, 1)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    exe = ds.compile(ds.load_onnx(_model(ci, co, tail, w, b)))
    for n, h, wd in ((1, 40, 48), (2, 7, 9), (1, 1, 3)):
        x = rng.standard_normal((n, ci, h, wd)).astype(np.float32)
        feed = {"x": x}
        r = None
        if tail == "add":
            r = feed["r"] = rng.standard_normal((n, co, h, wd)).astype(np.float32)
        want = _reference(x, w, b, tail, r)
        got = exe.run(feed)["y"]
        assert got.shape == want.shape
        # float32 sums of ci products, in another order than numpy's: scaled by the terms' magnitude
        scale = np.sqrt(ci) * np.abs(x).max() * np.abs(w).max() + np.abs(b).max() + 1
        assert np.abs(got - want).max() <= 1e-5 * scale, (n, h, wd)
