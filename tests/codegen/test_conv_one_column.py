"""A KH x 1 convolution over a map one pixel wide runs as the 1 x KH convolution over one row
(codegen/lower/conv_geometry.py's `columns_for_rows`: the same bytes in channels-last, only the geometry swapped), as
magika's 5 x 1 conv over 508 x 1 does. Checked against a float64 numpy convolution over strides, dilations, top and
bottom pads, groups (dense, grouped, depthwise), a bias and a ReLU, with the map's height symbolic and its width a
static 1; and the swap's own rule (which geometries it takes, and that it takes nothing else)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen.lower.conv_geometry import columns_for_rows
from dynshape.sym import sym


def _model(w: np.ndarray, b: np.ndarray, stride: int, dilation: int, pads: tuple[int, int], group: int,
           relu: bool) -> onnx.ModelProto:
    c = w.shape[1] * group
    conv = helper.make_node("Conv", ["x", "W", "B"], ["c" if relu else "y"], kernel_shape=[w.shape[2], 1],
                            strides=[stride, 1], dilations=[dilation, 1], pads=[pads[0], 0, pads[1], 0], group=group)
    nodes = [conv] + ([helper.make_node("Relu", ["c"], ["y"])] if relu else [])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, "h", 1])
    graph = helper.make_graph(nodes, "column", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, dilation: int, pads: tuple[int, int],
               group: int, relu: bool) -> np.ndarray:
    n, c, h, _ = x.shape
    oc, cg, kh, _ = w.shape
    xp = np.pad(x[:, :, :, 0].astype(np.float64), ((0, 0), (0, 0), pads))
    oh = (h + sum(pads) - dilation * (kh - 1) - 1) // stride + 1
    out = np.zeros((n, oc, oh))
    ocg = oc // group
    for g in range(group):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = w[g * ocg:(g + 1) * ocg, :, :, 0].astype(np.float64)
        for k in range(kh):
            taps = xs[:, :, k * dilation: k * dilation + stride * (oh - 1) + 1: stride]  # (n, cg, oh)
            out[:, g * ocg:(g + 1) * ocg] += np.einsum("nco,dc->ndo", taps, ws[:, :, k])
    out += b[None, :, None]
    return (np.maximum(out, 0) if relu else out)[:, :, :, None]


@pytest.mark.parametrize("c,oc,kh,stride,dilation,pads,group,relu", [
    (32, 64, 5, 1, 1, (0, 0), 1, False),  # magika's shape, smaller
    (24, 40, 3, 2, 1, (1, 1), 1, True),
    (16, 16, 3, 1, 2, (2, 0), 1, False),
    (3, 70, 7, 3, 1, (3, 2), 1, True),  # few input channels, a panel's tail of outputs
    (32, 32, 5, 1, 1, (2, 2), 32, True),  # depthwise
    (8, 8, 3, 1, 1, (1, 1), 8, False),  # depthwise, few channels
    (32, 48, 3, 1, 1, (1, 1), 4, False),  # grouped
])
def test_one_pixel_wide_conv_matches_numpy(c, oc, kh, stride, dilation, pads, group, relu) -> None:
    rng = np.random.default_rng(c * 1000 + oc * 10 + kh)
    w = rng.standard_normal((oc, c // group, kh, 1)).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32)
    exe = ds.compile(ds.load_onnx(_model(w, b, stride, dilation, pads, group, relu)))
    for n, h in ((1, 508), (2, 37), (3, kh * dilation)):
        x = rng.standard_normal((n, c, h, 1)).astype(np.float32)
        want = _reference(x, w, b, stride, dilation, pads, group, relu)
        got = exe.run({"x": x})["y"]
        assert got.shape == want.shape, (n, h)
        # float32 sums of c / group x kh products in another order than numpy's: scaled by their magnitude
        scale = np.sqrt(c // group * kh) * np.abs(x).max() * np.abs(w).max() + np.abs(b).max() + 1
        assert np.abs(got - want).max() <= 1e-5 * scale, (n, h)


def _geo(**over) -> dict:
    geo = {"N": 1, "H": 508, "W": 1, "C": 256, "OH": 504, "OW": 1, "OC": 512, "KH": 5, "KW": 1, "SH": 1, "SW": 1,
           "DH": 1, "DW": 1, "PT": 0, "PL": 0, "G": 1, "CG": 256, "OCG": 512}
    return {**geo, **over}


def test_the_swap_takes_only_one_pixel_wide_columns() -> None:
    swapped = columns_for_rows(_geo(SH=2, DH=3, PT=1, OH=253))
    assert (swapped["H"], swapped["W"], swapped["OH"], swapped["OW"]) == (1, 508, 1, 253)
    assert (swapped["KH"], swapped["KW"], swapped["SH"], swapped["SW"]) == (1, 5, 1, 2)
    assert (swapped["DH"], swapped["DW"], swapped["PT"], swapped["PL"]) == (1, 3, 0, 1)
    assert {k: swapped[k] for k in ("N", "C", "OC", "G", "CG", "OCG")} == \
        {"N": 1, "C": 256, "OC": 512, "G": 1, "CG": 256, "OCG": 512}
    w = sym("w")  # a width that is 1 only at some keys: the kernel serves every key, so no swap
    for kept in (_geo(W=2, OW=2), _geo(KW=3), _geo(PL=1), _geo(KH=1, OH=508), _geo(OW=2), _geo(W=w, OW=w)):
        assert columns_for_rows(kept) == kept
