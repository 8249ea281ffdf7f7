"""Direct bf16 convolutions on AMX tiles (codegen/lower/conv_amx.py, csrc/ds_conv_amx.c): a stride-1 conv on a
multiple of 32 input channels reads its taps from a padded bf16 copy of the input instead of gathered patches.

The reference is the float32 conv of the bf16-rounded input and weights (their products are exact in float32), so
the tolerance is float32 accumulation's; the gathered implicit GEMM (Options.amx_direct_conv=False) computes the
same tile products in the same order of k, and the kernel's own fallback (a call that finds no AMX tiles) runs it.
Off AMX the direct path is never built: the tests say so and skip.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen import bf16

AMX = bf16.native_available() and bool(bf16.LIBRARY.load().ds_bf16_use_amx(-1))
pytestmark = pytest.mark.skipif(not AMX, reason="no AMX-BF16 here (or Linux refused its tiles): no direct convs")
DIRECT = "taps read from a padded bf16 copy"


@pytest.fixture
def tile_path():
    """Which native path bf16 products take for one test (0: VDPBF16PS, 1: AMX tiles); AMX again after."""
    lib = bf16.LIBRARY.load()
    yield lambda amx: lib.ds_bf16_use_amx(amx)
    lib.ds_bf16_use_amx(1)


def _model(ci: int, co: int, kernel: tuple[int, int], pads: list[int], w: np.ndarray, tail: str) -> onnx.ModelProto:
    """conv(x, w) + bias, then `tail`: "relu", "sum_relu" (Sum(conv, r) then Relu: a residual as Caffe2's ResNet
    writes it), "add" (Add(r, conv), no activation) or "concat" (Relu, then joined with r along channels: the conv
    writes into a wider buffer, its pixels LDY apart)."""
    bias = np.linspace(-1, 1, co).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=list(kernel), pads=pads)]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", ci, "h", "w"]),
           helper.make_tensor_value_info("r", TensorProto.FLOAT, ["n", co, "oh", "ow"])]
    if tail == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
        ins = ins[:1]
    elif tail == "sum_relu":
        nodes += [helper.make_node("Sum", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    elif tail == "add":
        nodes.append(helper.make_node("Add", ["r", "c"], ["y"]))
    else:
        nodes += [helper.make_node("Relu", ["c"], ["a"]), helper.make_node("Concat", ["a", "r"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "conv", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _methods(exe) -> list[str]:
    return [getattr(s, "method", "") for s in exe.generic.steps if getattr(s, "method", "")]


CASES = [  # (ci, co, kernel, pads (top, left, bottom, right), tail, (n, h, w) calls)
    (32, 48, (3, 3), [1, 1, 1, 1], "relu", [(2, 21, 13), (1, 16, 16), (3, 5, 7)]),
    (64, 70, (3, 5), [0, 2, 1, 0], "sum_relu", [(1, 14, 14), (2, 9, 23)]),
    (96, 40, (5, 5), [2, 2, 2, 2], "add", [(1, 7, 7), (2, 12, 30)]),
    (32, 64, (3, 3), [1, 1, 1, 1], "concat", [(1, 28, 28), (2, 6, 11)]),
]


@pytest.mark.parametrize("ci,co,kernel,pads,tail,calls", CASES)
def test_direct_convs_match_rounded_reference_and_the_gathered_tiles(tile_path, ci, co, kernel, pads, tail,
                                                                     calls) -> None:
    """Each map (several images, odd widths whose virtual rows run past a row's end, asymmetric pads, 3x5 and 5x5
    windows) against the rounded reference; the gathered tiles' build, and the same kernel at a call that finds no
    AMX tiles (its implicit GEMM on VDPBF16PS), against it too."""
    rng = np.random.default_rng(ci * co + len(tail))
    w = (rng.standard_normal((co, ci, *kernel)) * 0.2).astype(np.float32)
    g = ds.load_onnx(_model(ci, co, kernel, pads, w, tail))
    direct = ds.compile(g, precision="bf16")
    gathered = ds.compile(g, precision="bf16", amx_direct_conv=False)
    assert any(m.startswith(DIRECT) for m in _methods(direct)), _methods(direct)
    assert not any(m.startswith(DIRECT) for m in _methods(gathered))
    exact = ds.compile(ds.load_onnx(_model(ci, co, kernel, pads, bf16.rounded(w), tail)), winograd=False)
    for n, h, wd in calls:
        oh, ow = h + pads[0] + pads[2] - kernel[0] + 1, wd + pads[1] + pads[3] - kernel[1] + 1
        feed = {"x": rng.standard_normal((n, ci, h, wd)).astype(np.float32),
                "r": rng.standard_normal((n, co, oh, ow)).astype(np.float32)}
        feed = {k: v for k, v in feed.items() if k in {i.name for i in g.inputs}}
        want = exact.run({**feed, "x": bf16.rounded(feed["x"])})["y"]
        tol = 1e-5 * np.abs(want).max()
        got = direct.run(feed)["y"]
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= tol, (n, h, wd)
        assert np.abs(gathered.run(feed)["y"] - want).max() <= tol
        tile_path(0)
        try:
            assert np.abs(direct.run(feed)["y"] - want).max() <= tol  # the kernel's fallback: no tiles
        finally:
            tile_path(1)


def test_only_stride_one_convs_on_whole_tiles_of_channels_go_direct() -> None:
    """Stride 2, 1x1 (a block's gathered rows are its input rows: nothing to save), and 48 input channels (a tap's
    channels not whole tiles) keep the gathered tiles; the option turns the direct path off."""
    rng = np.random.default_rng(3)

    def methods(ci: int, k: int, stride: int, **options) -> list[str]:
        w = (rng.standard_normal((32, ci, k, k)) * 0.2).astype(np.float32)
        node = helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[k, k], strides=[stride] * 2,
                                pads=[k // 2] * 4)
        graph = helper.make_graph([node], "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              [1, ci, "h", "w"])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(w, "W")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        return _methods(ds.compile(ds.load_onnx(model), precision="bf16", **options))

    assert any(m.startswith(DIRECT) for m in methods(64, 3, 1))
    for ci, k, stride, options in ((64, 3, 2, {}), (64, 1, 1, {}), (48, 3, 1, {}),
                                   (64, 3, 1, {"amx_direct_conv": False})):
        got = methods(ci, k, stride, **options)
        assert got and not any(m.startswith(DIRECT) for m in got), (ci, k, stride, options, got)
