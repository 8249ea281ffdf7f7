"""Convolutions whose 32-column weight panels end in a short tail: a group's 34 output channels (32 + 2: ShuffleNet's
grouped 1x1 convs), 5 or 8 outputs, 24 or 40 outputs (a panel of 24 columns: 16 + 8) and the RGB stems with 20 or 24
outputs (the runs path over KW * C; its panels of 25..32 columns, without AVX-512, in one 3-row x 4-vector pass).
Without AVX-512 the tiles run such tails on one 8-float vector a row instead of
a 16-column half (csrc/ds_conv.c's DS_CONV_QUARTER / DS_RQUARTER); with AVX-512 the same cases take the masked
16-column tiles. Pointwise convs (1x1, unpadded) with panels of 25..32 columns take AVX2's flat 3-row x 4-vector
tile (ds_conv_fmicro_3: pixel p's input row at p * C, whatever its image; SiLU as a pass over the stored rows), and
their panels of 17..24 columns AVX2's flat 4-row x 3-vector tile (ds_conv_fmicro3_4, the third vector masked
below 24) and of 9..16 columns its one half (ds_conv_fnmicro_6), at stride 1 or 2 (ds_pw_offsets); with AVX-512
the same pointwise cases take its flat tiles (DS_CONV_FWIDE: 12 rows x 32 columns, 24 x 16, 6 x 64 over a pair of
panels; a panel's first block of more than 128 input channels keeps the prefetching per-tap tile), and its RGB
stems at stride 2 the one-row runs tiles where a micro-tile's pixels lie in one output row.
Against onnx's ReferenceEvaluator, with a bias, a residual, Relu and SiLU, outputs written into a Concat's columns
(rows wider than the outputs), and pixel counts that end in partial micro-tiles."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import dynshape as ds

# (input channels, output channels, group, kernel, stride, spatial side, tail)
CASES = [(136, 136, 4, 1, 1, 28, "add_relu"), (16, 5, 1, 3, 1, 13, "none"), (24, 8, 1, 1, 1, 9, "silu"),
         (12, 40, 1, 3, 1, 7, "relu"), (8, 2, 1, 1, 1, 31, "none"), (64, 24, 1, 1, 1, 10, "add"),
         (3, 24, 1, 3, 2, 29, "relu"), (3, 20, 1, 3, 1, 17, "add"), (3, 40, 1, 3, 1, 9, "silu"),
         (10, 24, 1, 1, 1, 11, "concat"),
         # pointwise convs with panels of more than 24 columns: AVX2's flat 6-row tile (rows C apart across images)
         (16, 64, 1, 1, 1, 13, "silu"), (24, 56, 1, 1, 1, 10, "add_relu"), (64, 128, 2, 1, 1, 7, "silu"),
         (40, 72, 1, 1, 1, 9, "concat"),
         # pointwise panels of 17..24 columns: AVX2's flat 4 x 24 tile (pixels 100 and 300: partial tiles after it)
         (48, 20, 1, 1, 1, 10, "silu"), (32, 88, 1, 1, 1, 10, "add_relu"), (144, 24, 1, 1, 1, 10, "relu"),
         # pointwise at stride 2 (a shortcut): the same flat tiles, rows from the strided positions (odd and even
         # sides: the last input row and column read or not)
         (16, 32, 1, 1, 2, 13, "add_relu"), (24, 56, 1, 1, 2, 12, "silu"), (40, 24, 1, 1, 2, 9, "relu"),
         # pointwise panels of 9..16 columns: AVX2's flat 6-row half (ds_conv_fnmicro_6), at stride 1 and 2
         (32, 16, 1, 1, 1, 11, "add_relu"), (24, 12, 1, 1, 2, 13, "silu"), (16, 48, 1, 1, 1, 9, "concat"),
         # pointwise panels of 25..32 columns: AVX2's flat 3-row x 4-vector tile (the fourth vector masked below 32;
         # 121 / 100 / 25 pixels: a partial tile after it), at stride 1 and 2
         (16, 60, 1, 1, 1, 11, "concat_last"), (24, 29, 1, 1, 1, 10, "add_relu"), (40, 62, 1, 1, 2, 9, "silu"),
         (16, 96, 1, 1, 1, 10, "relu"),
         # RGB stems with panels of 25..32 columns: AVX2's 3-row x 4-vector tile on the runs (ds_conv_rmicro4_3)
         (3, 28, 1, 3, 2, 29, "add_relu"), (3, 32, 1, 3, 1, 17, "concat_last"), (3, 61, 1, 3, 2, 23, "silu"),
         # RGB stems at stride 2 with output rows wider than a micro-tile: AVX-512's one-row runs tiles
         # (ds_conv_rsmicro: rows 6 floats apart) beside the padded border's and the row-crossing tiles
         (3, 12, 1, 3, 2, 70, "add_relu"), (3, 30, 1, 3, 2, 58, "silu"), (3, 16, 1, 3, 2, 61, "relu")]


def _model(ci: int, co: int, g: int, k: int, s: int, tail: str, rng: np.random.Generator) -> onnx.ModelProto:
    w = (rng.standard_normal((co, ci // g, k, k)) * 0.3).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[k // 2] * 4, group=g, strides=[s, s])]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", ci, "h", "w"])]
    out = "c"
    if tail in ("add", "add_relu"):
        nodes.append(helper.make_node("Add", ["c", "r"], ["a"]))
        ins.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["n", co, *(("h", "w") if s == 1 else
                                                                                   ("oh", "ow"))]))
        out = "a"
    if tail in ("relu", "add_relu"):
        nodes.append(helper.make_node("Relu", [out], ["y"]))
        out = "y"
    elif tail == "silu":
        nodes += [helper.make_node("Sigmoid", [out], ["sg"]), helper.make_node("Mul", [out, "sg"], ["y"])]
        out = "y"
    elif tail in ("concat", "concat_last"):  # both convs write into the Concat's columns: rows co + 8 floats apart
        # (concat_last: the 8-column conv first, then this one into the last columns, each row's end just before
        # the next row's first columns, already written: a store past the panel's columns overwrites them)
        inits.append(numpy_helper.from_array((rng.standard_normal((8, ci, 1, 1)) * 0.3).astype(np.float32), "w8"))
        first = helper.make_node("Conv", ["x", "w8"], ["e"])
        parts = ["c", "e"] if tail == "concat" else ["e", "c"]
        nodes = ([first] + nodes if tail == "concat_last" else nodes + [first])
        nodes += [helper.make_node("Concat", parts, ["j"], axis=1), helper.make_node("Relu", ["j"], ["y"])]
        out = "y"
    graph = helper.make_graph(nodes, "tails", ins, [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("ci,co,g,k,s,side,tail", CASES)
def test_short_panel_tails_match_the_reference(ci: int, co: int, g: int, k: int, s: int, side: int,
                                               tail: str) -> None:
    rng = np.random.default_rng(ci * 100 + co)
    model = _model(ci, co, g, k, s, tail, rng)
    exe = ds.compile(ds.load_onnx(model))
    ref = ReferenceEvaluator(model)
    for n in (1, 3):
        feed = {"x": rng.standard_normal((n, ci, side, side)).astype(np.float32)}
        if "add" in tail:
            oh = (side + 2 * (k // 2) - k) // s + 1
            feed["r"] = rng.standard_normal((n, co, oh, oh)).astype(np.float32)
        (want,) = ref.run(None, feed)
        got = next(iter(exe.run(feed).values()))
        assert got.shape == want.shape
        # float32 sums of up to ci * k * k products, in another order than the reference's
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("co", [96, 128])
def test_an_odd_panel_count_deals_the_tiles_round_robin_over_the_threads(co: int) -> None:
    """A 1x1 conv whose weights are run panel-major (over BLOCK_MAJOR_BYTES) with an odd number of 32-column panels
    (96 output channels: pairs of 64 and 32) deals its tiles round-robin, so each thread takes its share of both
    pairs' blocks (in equal runs, one of two threads got the 64-column pair's tiles, the other the 32-column pair's);
    an even count keeps the runs. At 1, 2 and 3 threads the same bits, and the reference's values."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    rng = np.random.default_rng(co)
    model = _model(576, co, 1, 1, 1, "relu", rng)
    exe = ds.compile(ds.load_onnx(model))
    (src,) = [s.source for s in exe.generic.steps if getattr(s, "kind", "") == "conv"]
    assert ("schedule(static, 1)" in src) == (co == 96)
    feed = {"x": rng.standard_normal((2, 576, 14, 14)).astype(np.float32)}
    (want,) = ReferenceEvaluator(model).run(None, feed)
    outs = []
    for threads in (1, 2, 3):
        with threadpoolctl.threadpool_limits(threads, user_api="openmp"):
            outs.append(next(iter(exe.run(feed).values())))
    np.testing.assert_allclose(outs[0], want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))
    for got in outs[1:]:
        np.testing.assert_array_equal(got, outs[0])
