"""Direct bf16 convolutions on AMX tiles (codegen/lower/conv_amx.py, csrc/ds_conv_amx.c): a stride-1 conv on a
multiple of 16 input channels, and a conv of any stride on at most 8 (a stem's whole window rows, "narrow"), read
their taps from a padded bf16 copy of the input instead of gathered patches.

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
PADDED = "taps read from a padded bf16 copy, its pixels padded with zero channels"



def _model(ci: int, co: int, kernel: tuple[int, int], pads: list[int], w: np.ndarray, tail: str,
           strides: tuple[int, int] = (1, 1)) -> onnx.ModelProto:
    """conv(x, w) + bias, then `tail`: "relu", "sum_relu" (Sum(conv, r) then Relu: a residual as Caffe2's ResNet
    writes it), "add" (Add(r, conv), no activation) or "concat" (Relu, then joined with r along channels: the conv
    writes into a wider buffer, its pixels LDY apart)."""
    bias = np.linspace(-1, 1, co).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=list(kernel), pads=pads,
                              strides=list(strides))]
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


def _one_conv_methods(w: np.ndarray, attrs: dict, **options) -> list[str]:
    """The methods of a bf16 build of one Conv (weights w, its attributes), on 1 x C x h x w inputs."""
    ci = w.shape[1] * attrs.get("group", 1)
    node = helper.make_node("Conv", ["x", "W"], ["y"], **attrs)
    graph = helper.make_graph([node], "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ci, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return _methods(ds.compile(ds.load_onnx(model), precision="bf16", **options))


def _methods(exe) -> list[str]:
    return [getattr(s, "method", "") for s in exe.generic.steps if getattr(s, "method", "")]


def _check_calls(tile_path, g, direct, gathered, exact, conv: tuple, calls: list, rng,
                 strides: tuple[int, int] = (1, 1)) -> None:
    """Each (n, h, w) call of `direct` (and of `gathered`, and of `direct` with its tiles off: the kernel's own
    fallback) against `exact` on the rounded input: `conv` is (ci, co, kernel, pads)."""
    ci, co, kernel, pads = conv
    for n, h, wd in calls:
        oh = (h + pads[0] + pads[2] - kernel[0]) // strides[0] + 1
        ow = (wd + pads[1] + pads[3] - kernel[1]) // strides[1] + 1
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
    # channels past 8 and not a multiple of 16 (a YOLOX stem's 12): the copy's pixels padded with zero channels to
    # 16, 32, 48, the weights packed with zero rows for them (the kernel's fallback takes the unpadded ones)
    (12, 24, (3, 3), [1, 1, 1, 1], "relu", [(1, 30, 41), (2, 9, 17), (1, 3, 3)]),
    (24, 40, (3, 3), [1, 0, 1, 2], "sum_relu", [(1, 20, 21), (2, 5, 40)]),
    (11, 16, (5, 5), [2, 2, 2, 2], "add", [(2, 19, 23), (1, 4, 4)]),
    (44, 48, (3, 3), [1, 1, 1, 1], "concat", [(1, 16, 31), (2, 11, 7)]),
]


@pytest.mark.parametrize("ci,co,kernel,pads,tail,calls", CASES)
def test_direct_convs_match_rounded_reference_and_the_gathered_tiles(tile_path, ci, co, kernel, pads, tail,
                                                                     calls) -> None:
    """Each map (several images, odd widths whose virtual rows run past a row's end, asymmetric pads, 3x5 and 5x5
    windows, channels padded to 16s) against the rounded reference; the gathered tiles' build, and the same kernel
    at a call that finds no AMX tiles (its implicit GEMM on VDPBF16PS), against it too."""
    rng = np.random.default_rng(ci * co + len(tail))
    w = (rng.standard_normal((co, ci, *kernel)) * 0.2).astype(np.float32)
    g = ds.load_onnx(_model(ci, co, kernel, pads, w, tail))
    direct = ds.compile(g, precision="bf16")
    gathered = ds.compile(g, precision="bf16", amx_direct_conv=False)
    assert any(m.startswith(DIRECT) and m.startswith(PADDED) == (ci % 16 != 0) for m in _methods(direct)), \
        _methods(direct)
    assert not any(m.startswith(DIRECT) for m in _methods(gathered))
    exact = ds.compile(ds.load_onnx(_model(ci, co, kernel, pads, bf16.rounded(w), tail)), winograd=False)
    _check_calls(tile_path, g, direct, gathered, exact, (ci, co, kernel, pads), calls, rng)


def test_only_stride_one_convs_on_whole_tiles_of_channels_go_direct() -> None:
    """Stride 2, 1x1 (a block's gathered rows are its input rows: nothing to save) and a 3x1 window on 16 (a window
    row of 16 values, under a tile row) keep the gathered tiles; 40 input channels (not a multiple of 16: a window
    row's chunks would split a pixel's bf16 pairs) go direct only on a copy padded to 48 channels; the option turns
    the direct path off."""
    rng = np.random.default_rng(3)

    def methods(ci: int, k: int | tuple[int, int], stride: int, **options) -> list[str]:
        kh, kw = (k, k) if isinstance(k, int) else k
        w = (rng.standard_normal((64, ci, kh, kw)) * 0.2).astype(np.float32)
        return _one_conv_methods(w, dict(kernel_shape=[kh, kw], strides=[stride] * 2, pads=[kh // 2, kw // 2] * 2),
                                 **options)

    assert any(m.startswith(DIRECT) for m in methods(64, 3, 1))
    assert any(m.startswith(DIRECT) for m in methods(16, (1, 3), 1))
    assert any(m.startswith(PADDED) for m in methods(40, 3, 1))
    for ci, k, stride, options in ((64, 3, 2, {}), (64, 1, 1, {}), (16, (3, 1), 1, {}),
                                   (64, 3, 1, {"amx_direct_conv": False}), (40, 3, 1, {"amx_direct_conv": False})):
        got = methods(ci, k, stride, **options)
        assert got and not any(m.startswith(DIRECT) for m in got), (ci, k, stride, options, got)


def _direct_16_to_32(rng, tail: str) -> tuple:
    """A 16 -> 32 3x3 conv (random weights) then `tail`: its bf16 build on direct tiles, and the float32 build of its
    rounded weights (the reference, fed the rounded input)."""
    w = (rng.standard_normal((32, 16, 3, 3)) * 0.2).astype(np.float32)
    direct = ds.compile(ds.load_onnx(_model(16, 32, (3, 3), [1, 1, 1, 1], w, tail)), precision="bf16")
    assert any(m.startswith(DIRECT) for m in _methods(direct)), _methods(direct)
    exact = ds.compile(ds.load_onnx(_model(16, 32, (3, 3), [1, 1, 1, 1], bf16.rounded(w), tail)), winograd=False)
    return direct, exact


def test_a_half_chunk_reads_nothing_outside_its_window() -> None:
    """A 16-channel 3x3 conv's window row ends in a half chunk, read as the row's last 32 values: an infinity in
    the input reaches only the outputs whose windows hold it (read one pixel further instead, and the outputs to
    its left would turn NaN). Finite outputs equal the rounded reference's."""
    rng = np.random.default_rng(5)
    direct, exact = _direct_16_to_32(rng, "add")
    x = rng.standard_normal((1, 16, 9, 12)).astype(np.float32)
    x[0, :, 4, 7] = np.inf
    feed = {"x": x, "r": np.zeros((1, 32, 9, 12), np.float32)}
    want = exact.run({**feed, "x": bf16.rounded(x)})["y"]
    got = direct.run(feed)["y"]
    finite = np.isfinite(want)
    assert finite.sum() == finite.size - 32 * 9  # the 3x3 outputs around the infinity, every channel
    assert (np.isfinite(got) == finite).all()
    assert np.abs(got[finite] - want[finite]).max() <= 1e-5 * np.abs(want[finite]).max()


NARROW = "narrow window rows read from a padded bf16 copy"
NARROW_CASES = [  # (ci, co, kernel, strides, pads, tail, (n, h, w) calls)
    # a ResNet stem (3 -> 64 7x7 stride 2): 3 channels in pixels of 4; maps whose output rows are not whole tiles
    # of 16, two images, one under a tile
    (3, 64, (7, 7), (2, 2), [3, 3, 3, 3], "relu", [(1, 64, 64), (2, 33, 47), (1, 7, 9)]),
    (3, 40, (3, 3), (1, 1), [1, 0, 1, 2], "sum_relu", [(1, 20, 21), (2, 5, 40)]),
    (8, 48, (3, 4), (2, 1), [1, 1, 1, 1], "add", [(2, 19, 23), (1, 4, 4)]),
    (1, 96, (5, 5), (3, 2), [2, 2, 2, 2], "concat", [(1, 16, 31), (2, 11, 7)]),
    (5, 20, (2, 3), (1, 3), [0, 1, 1, 0], "relu", [(1, 9, 50)]),
]


@pytest.mark.parametrize("ci,co,kernel,strides,pads,tail,calls", NARROW_CASES)
def test_narrow_convs_match_rounded_reference_and_the_gathered_tiles(tile_path, ci, co, kernel, strides, pads, tail,
                                                                     calls) -> None:
    """At most 8 input channels, any stride: whole window rows (KW x Cp values) read from a padded copy of Cp-channel
    pixels, against the rounded reference; the gathered build and the kernel's own fallback against it too."""
    rng = np.random.default_rng(ci * co + kernel[1])
    w = (rng.standard_normal((co, ci, *kernel)) * 0.2).astype(np.float32)
    g = ds.load_onnx(_model(ci, co, kernel, pads, w, tail, strides))
    direct = ds.compile(g, precision="bf16", bf16_min_conv_macs=0)
    gathered = ds.compile(g, precision="bf16", bf16_min_conv_macs=0, amx_direct_conv=False)
    assert any(m.startswith(NARROW) for m in _methods(direct)), _methods(direct)
    assert not any(m.startswith(NARROW) for m in _methods(gathered))
    exact = ds.compile(ds.load_onnx(_model(ci, co, kernel, pads, bf16.rounded(w), tail, strides)), winograd=False)
    _check_calls(tile_path, g, direct, gathered, exact, (ci, co, kernel, pads), calls, rng, strides)


@pytest.mark.parametrize("ci,co,k,stride,pad", [(1, 64, 10, 5, 0), (4, 32, 3, 1, 1), (2, 40, 7, 2, 3)])
def test_narrow_one_dimensional_convs_match_the_rounded_reference(ci, co, k, stride, pad) -> None:
    """A 1-D conv (an audio front end's first layer: 1 -> 512, kernel 10, stride 5) is a 2-D one with one tap row:
    its (Co, C, KW) weights go narrow like a stem's (packing them once failed the compile of every wav2vec2-style
    model under bf16), against the float32 conv of the rounded input and weights."""
    rng = np.random.default_rng(ci * co + k)
    w = (rng.standard_normal((co, ci, k)) * 0.2).astype(np.float32)

    def model(weights: np.ndarray) -> onnx.ModelProto:
        node = helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[k], strides=[stride], pads=[pad, pad])
        graph = helper.make_graph([node], "c1", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", ci, "t"])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(weights, "W")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    direct = ds.compile(ds.load_onnx(model(w)), precision="bf16", bf16_min_conv_macs=0)
    assert any(m.startswith(NARROW) for m in _methods(direct)), _methods(direct)
    exact = ds.compile(ds.load_onnx(model(bf16.rounded(w))))
    for n, t in ((1, 400), (2, 97), (1, k)):
        x = rng.standard_normal((n, ci, t)).astype(np.float32)
        want = exact.run({"x": bf16.rounded(x)})["y"]
        got = direct.run({"x": x})["y"]
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_only_few_padded_channels_are_padded() -> None:
    """20 channels would be padded to 32 (1.6x the products): they keep the gathered tiles, as do 16 (direct
    without padding) and a strided conv."""
    rng = np.random.default_rng(5)

    def methods(ci: int, stride: int = 1) -> list[str]:
        w = (rng.standard_normal((32, ci, 3, 3)) * 0.2).astype(np.float32)
        return _one_conv_methods(w, dict(kernel_shape=[3, 3], strides=[stride] * 2, pads=[1] * 4),
                                 bf16_min_conv_macs=0)

    assert any(m.startswith(PADDED) for m in methods(12))
    for ci, stride in ((20, 1), (16, 1), (12, 2)):
        got = methods(ci, stride)
        assert got and not any(m.startswith(PADDED) for m in got), (ci, stride, got)


def test_narrow_windows_read_nothing_outside_them() -> None:
    """A stem's window row is 7 pixels of 4 channels (28 values), its tiles configured that wide: an infinity in
    the input reaches only the outputs whose windows hold it (a row read as 32 values, the last 4 weighted zero,
    would turn the outputs whose windows end just before it NaN)."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((32, 3, 7, 7)) * 0.2).astype(np.float32)
    pads = [3, 3, 3, 3]
    g = ds.load_onnx(_model(3, 32, (7, 7), pads, w, "add", (2, 2)))
    direct = ds.compile(g, precision="bf16", bf16_min_conv_macs=0)
    assert any(m.startswith(NARROW) for m in _methods(direct)), _methods(direct)
    exact = ds.compile(ds.load_onnx(_model(3, 32, (7, 7), pads, bf16.rounded(w), "add", (2, 2))), winograd=False)
    x = rng.standard_normal((1, 3, 30, 40)).astype(np.float32)
    x[0, 1, 13, 20] = np.inf  # padded column 23: the eighth pixel of output column 8's window row
    feed = {"x": x, "r": np.zeros((1, 32, 15, 20), np.float32)}
    want = exact.run({**feed, "x": bf16.rounded(x)})["y"]
    got = direct.run(feed)["y"]
    finite = np.isfinite(want)
    assert finite.sum() == finite.size - 32 * 4 * 3  # the 4 x 3 outputs whose windows hold it, every channel
    assert (np.isfinite(got) == finite).all()
    assert np.abs(got[finite] - want[finite]).max() <= 1e-5 * np.abs(want[finite]).max()


def test_only_few_channels_in_short_window_rows_go_narrow() -> None:
    """9 input channels, 8 channels under a 5-wide window (40 values a row), a dilated and a grouped conv keep the
    gathered tiles; a stem goes narrow. Under bf16_min_conv_macs a conv stays float32 unless it goes narrow (which
    gathers nothing): 3 -> 16 3x3 goes narrow, 9 -> 16 1x1 and, without direct convs, 3 -> 16 3x3 stay float32."""
    rng = np.random.default_rng(4)

    def methods(ci: int, k: int, co: int = 64, dilation: int = 1, group: int = 1, **options) -> list[str]:
        w = (rng.standard_normal((co, ci // group, k, k)) * 0.2).astype(np.float32)
        return _one_conv_methods(w, dict(kernel_shape=[k, k], strides=[2, 2], pads=[k // 2] * 4,
                                         dilations=[dilation] * 2, group=group), **options)

    assert any(m.startswith(NARROW) for m in methods(3, 7))
    assert any(m.startswith(NARROW) for m in methods(8, 3, bf16_min_conv_macs=0))
    for ci, k, extra in ((9, 3, {}), (8, 5, {}), (3, 7, {"dilation": 2}), (4, 3, {"group": 2}),
                         (3, 7, {"amx_direct_conv": False})):
        got = methods(ci, k, bf16_min_conv_macs=0, **extra)
        assert got and not any(m.startswith(NARROW) for m in got), (ci, k, extra, got)
    assert any(m.startswith(NARROW) for m in methods(3, 3, co=16))  # 432 multiply-adds a pixel: under 2048
    for ci, k, extra in ((9, 1, {}), (3, 3, {"amx_direct_conv": False})):
        got = methods(ci, k, co=16, **extra)
        assert got and not any("bf16" in m or m.startswith(NARROW) for m in got), (ci, k, extra, got)


def test_a_narrow_conv_whose_epilogue_the_tiles_leave_stays_float32() -> None:
    """A stem (3 -> 16, 432 multiply-adds a pixel: under bf16_min_conv_macs) takes bf16 only for the narrow tiles;
    with an epilogue they do not finish (a Sigmoid) it would have taken the gathered bf16 tiles, slower than float32
    (PP-OCR's stem: 1.35 ms against 0.67 in float32): it stays float32, and answers as the float32 build does.
    With a Relu the tiles finish it goes narrow."""
    rng = np.random.default_rng(8)
    w = (rng.standard_normal((16, 3, 3, 3)) * 0.2).astype(np.float32)

    def build(act: str, precision: str):
        nodes = [helper.make_node("Conv", ["x", "W"], ["c"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
                 helper.make_node(act, ["c"], ["y"])]
        graph = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(w, "W")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        return ds.compile(ds.load_onnx(model), precision=precision)

    low, plain = build("Sigmoid", "bf16"), build("Sigmoid", "fp32")
    assert _methods(low) and not any("bf16" in m or m.startswith(NARROW) for m in _methods(low)), _methods(low)
    x = rng.standard_normal((1, 3, 30, 41)).astype(np.float32)
    np.testing.assert_array_equal(low.run({"x": x})["y"], plain.run({"x": x})["y"])
    assert any(m.startswith(NARROW) for m in _methods(build("Relu", "bf16")))


def test_products_after_a_narrow_conv_take_their_own_tile_configuration() -> None:
    """The narrow tiles leave the thread's tiles configured to their window row's width: the direct conv and the 1x1
    conv after the stem (in the same call, on the same thread) must load the common configuration back. Against
    float32 on rounded weights: bf16 rounding of the stem's output is the only difference (~1e-2 of the output),
    a product on a wrong configuration is off by the output's size."""
    rng = np.random.default_rng(11)
    ws = [(rng.standard_normal(shape) * 0.2).astype(np.float32)
          for shape in ((32, 3, 7, 7), (32, 32, 3, 3), (64, 32, 1, 1))]

    def model(weights: list[np.ndarray]) -> onnx.ModelProto:
        nodes = [helper.make_node("Conv", ["x", "W0"], ["a"], kernel_shape=[7, 7], strides=[2, 2], pads=[3] * 4),
                 helper.make_node("Relu", ["a"], ["b"]),
                 helper.make_node("Conv", ["b", "W1"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
                 helper.make_node("Relu", ["c"], ["d"]),
                 helper.make_node("Conv", ["d", "W2"], ["y"], kernel_shape=[1, 1])]
        graph = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             [1, 3, "h", "w"])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(w, f"W{i}") for i, w in enumerate(weights)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    exe = ds.compile(ds.load_onnx(model(ws)), precision="bf16", bf16_min_conv_macs=0)
    methods = _methods(exe)
    assert any(m.startswith(NARROW) for m in methods) and any(m.startswith(DIRECT) for m in methods), methods
    exact = ds.compile(ds.load_onnx(model([bf16.rounded(w) for w in ws])), winograd=False)
    x = rng.standard_normal((1, 3, 40, 36)).astype(np.float32)
    want = exact.run({"x": bf16.rounded(x)})["y"]
    got = exe.run({"x": x})["y"]
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()


def test_passes_past_an_image_s_last_row_are_skipped_not_its_rows() -> None:
    """Two or three images of few rows: a pass whose rows lie past an image's last output row is not computed, and
    one that holds 1..16 of its last rows is cut to 16: map sizes that put an image's last output row at
    every place in a pass against the rounded reference."""
    rng = np.random.default_rng(9)
    direct, exact = _direct_16_to_32(rng, "relu")
    sizes = [(2, h, wd) for h in range(1, 5) for wd in range(1, 35)] + [(3, h, wd) for h in (5, 6)
                                                                        for wd in range(1, 14)]
    for n, h, wd in sizes:
        x = rng.standard_normal((n, 16, h, wd)).astype(np.float32)
        want = exact.run({"x": bf16.rounded(x)})["y"]
        got = direct.run({"x": x})["y"]
        assert np.abs(got - want).max() <= 1e-5 * (np.abs(want).max() + 1), (n, h, wd)
