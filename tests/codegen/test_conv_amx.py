"""Direct bf16 convolutions on AMX tiles (codegen/lower/conv_amx.py, csrc/ds_conv_amx.c): a stride-1 conv on a
multiple of 16 input channels reads its taps from a padded bf16 copy of the input instead of gathered patches.

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
    # 16 and 48 channels: window rows ending in a half chunk (3 x 16 = 48 values: UNet's convs; 5 x 16, 3 x 48); 2x2
    # on 16 channels: rows of exactly one chunk
    (16, 16, (3, 3), [1, 1, 1, 1], "relu", [(2, 17, 13), (1, 32, 32), (1, 3, 5)]),
    (16, 40, (5, 5), [2, 1, 2, 3], "add", [(1, 9, 11), (2, 12, 7)]),
    (48, 20, (3, 3), [1, 0, 1, 2], "sum_relu", [(1, 10, 19), (3, 4, 6)]),
    (16, 48, (2, 2), [0, 0, 1, 1], "concat", [(1, 15, 15), (2, 8, 5)]),
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
    """Stride 2, 1x1 (a block's gathered rows are its input rows: nothing to save), 40 input channels (not a
    multiple of 16: a window row's chunks would split a pixel's bf16 pairs... and not end on one) and a 3x1 window
    on 16 (a window row of 16 values, under a tile row) keep the gathered tiles; the option turns the direct path
    off."""
    rng = np.random.default_rng(3)

    def methods(ci: int, k: int | tuple[int, int], stride: int, **options) -> list[str]:
        kh, kw = (k, k) if isinstance(k, int) else k
        w = (rng.standard_normal((64, ci, kh, kw)) * 0.2).astype(np.float32)
        node = helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[kh, kw], strides=[stride] * 2,
                                pads=[kh // 2, kw // 2] * 2)
        graph = helper.make_graph([node], "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              [1, ci, "h", "w"])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(w, "W")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        return _methods(ds.compile(ds.load_onnx(model), precision="bf16", **options))

    assert any(m.startswith(DIRECT) for m in methods(64, 3, 1))
    assert any(m.startswith(DIRECT) for m in methods(16, (1, 3), 1))
    for ci, k, stride, options in ((64, 3, 2, {}), (64, 1, 1, {}), (40, 3, 1, {}), (16, (3, 1), 1, {}),
                                   (64, 3, 1, {"amx_direct_conv": False})):
        got = methods(ci, k, stride, **options)
        assert got and not any(m.startswith(DIRECT) for m in got), (ci, k, stride, options, got)


def test_a_half_chunk_reads_nothing_outside_its_window() -> None:
    """A 16-channel 3x3 conv's window row ends in a half chunk, read as the row's last 32 values: an infinity in
    the input reaches only the outputs whose windows hold it (read one pixel further instead, and the outputs to
    its left would turn NaN). Finite outputs equal the rounded reference's."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((32, 16, 3, 3)) * 0.2).astype(np.float32)
    g = ds.load_onnx(_model(16, 32, (3, 3), [1, 1, 1, 1], w, "add"))
    direct = ds.compile(g, precision="bf16")
    assert any(m.startswith(DIRECT) for m in _methods(direct)), _methods(direct)
    exact = ds.compile(ds.load_onnx(_model(16, 32, (3, 3), [1, 1, 1, 1], bf16.rounded(w), "add")), winograd=False)
    x = rng.standard_normal((1, 16, 9, 12)).astype(np.float32)
    x[0, :, 4, 7] = np.inf
    feed = {"x": x, "r": np.zeros((1, 32, 9, 12), np.float32)}
    want = exact.run({**feed, "x": bf16.rounded(x)})["y"]
    got = direct.run(feed)["y"]
    finite = np.isfinite(want)
    assert finite.sum() == finite.size - 32 * 9  # the 3x3 outputs around the infinity, every channel
    assert (np.isfinite(got) == finite).all()
    assert np.abs(got[finite] - want[finite]).max() <= 1e-5 * np.abs(want[finite]).max()
