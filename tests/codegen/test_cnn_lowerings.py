"""The channels-last CNN kernels against the numpy references: every conv form (groups, depthwise, strides,
dilations, explicit and SAME pads, 1-D, bias, epilogues), pools, global reductions, Resize and Concat, at
several shapes of one build."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.runtime.build import KernelStep
from tolerance import assert_f32_close, f32_atol

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _model(nodes, x_shape, inits, opset=19):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, x_shape)],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, dims, shapes, kinds=None, **options):
    g = ds.load_onnx(model, dims=dims)
    exe = ds.compile(g, **options)
    if kinds is not None:
        assert sorted({s.kind for s in exe.generic.steps if isinstance(s, KernelStep)}) == sorted(kinds), \
            [(s.name, getattr(s, "kind", s.op)) for s in exe.generic.steps]
    for shape in shapes:
        x = RNG.standard_normal(shape).astype(np.float32)
        assert_f32_close(exe.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-4, scale=1e-5)
    return exe


CONVS = [  # (ci, co, k, attrs)
    (8, 16, (3, 3), {"pads": [1, 1, 1, 1]}), (3, 40, (7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    (16, 16, (3, 3), {"group": 16, "pads": [1, 1, 1, 1]}), (24, 24, (5, 5), {"group": 24, "strides": [2, 2],
                                                                               "pads": [2, 2, 2, 2]}),
    (12, 12, (3, 3), {"group": 4, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    (8, 36, (3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}), (8, 8, (3, 3), {"auto_pad": "SAME_LOWER"}),
    (16, 48, (1, 1), {}), (16, 48, (1, 1), {"strides": [2, 2]}), (9, 70, (2, 3), {"pads": [0, 1, 1, 0]}),
    # the per-tap path (a patch over ds_conv.c's DS_CONV_PATCH_MAX floats), wide and narrow (<= 16 columns)
    (64, 20, (3, 3), {"pads": [1, 1, 1, 1]}), (64, 8, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]}),
    # runs with row dilation (rows apart, columns adjacent); 3 -> 8 stem (narrow runs)
    (4, 6, (3, 3), {"dilations": [2, 1], "pads": [2, 1, 2, 1]}),
    (3, 8, (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    # pairs of panels (ds_conv_tile2's 6 x 64 micro-tiles): whole, with a 24-column second panel, with an odd
    # last panel, grouped with a <= 16-column tail panel per group
    (64, 64, (1, 1), {}), (64, 56, (3, 3), {"pads": [1, 1, 1, 1]}), (16, 96, (1, 1), {"strides": [2, 2]}),
    (64, 160, (3, 3), {"group": 2, "pads": [0, 1, 1, 0]}), (3, 64, (7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    (16, 64, (3, 3), {"pads": [1, 1, 1, 1]}),
    # weights over 256 KB: tiles in panel-major order (smaller ones run block-major)
    (256, 96, (3, 3), {"pads": [1, 1, 1, 1]}),
    # depthwise in C: a masked channel tail (40 = 16 + 16 + 8), chunks of 128 channels, stride and dilation
    (40, 40, (3, 3), {"group": 40, "pads": [1, 1, 1, 1]}), (200, 200, (5, 5), {"group": 200, "pads": [2, 2, 2, 2]}),
    (32, 32, (3, 3), {"group": 32, "strides": [2, 2], "dilations": [2, 2], "pads": [2, 1, 2, 1]}),
    # stride 1 and 3, 5 or 7 columns: the sliding blocks (ds_dw_slide; the 75-column probe gives them interiors)
    (24, 24, (7, 7), {"group": 24, "pads": [3, 3, 3, 3]}),
    # stride 2, 3 or 5 columns: without AVX-512 the sliding blocks too (ds_dw_slide_2_3 / _2_5), masked tails
    # there (20 = 8 + 8 + 4; 40 = 8 * 5: none; AVX-512's 16-lane blocks: 4 and 8)
    (40, 40, (3, 3), {"group": 40, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    (20, 20, (5, 5), {"group": 20, "strides": [2, 2], "pads": [2, 2, 2, 2]}),
    # depthwise of 1, 2, 4 or 8 channels at stride 1 as flat runs of pixels (ds_dw_flat), and at stride 2 the loops
    (8, 8, (3, 3), {"group": 8, "pads": [1, 1, 1, 1]}), (4, 4, (5, 5), {"group": 4, "pads": [2, 4, 2, 4],
                                                                          "dilations": [1, 2]}),
    (2, 2, (3, 3), {"group": 2}), (1, 1, (3, 3), {"pads": [1, 0, 1, 2]}),
    (8, 8, (3, 3), {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("ci,co,k,attrs", CONVS, ids=[str(i) for i in range(len(CONVS))])
def test_conv2d_with_bias_and_activation(ci, co, k, attrs):
    """The direct kernels (implicit GEMM, depthwise): Winograd, which would take some of these, has its own tests
    (test_winograd.py)."""
    groups = attrs.get("group", 1)
    w = (RNG.standard_normal((co, ci // groups, *k)) * 0.3).astype(np.float32)
    b = RNG.standard_normal(co).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("HardSwish", ["c"], ["y"])]
    exe = _check(_model(nodes, ["n", ci, "h", "w"], {"w": w, "b": b}), {"n": (1, 3), "h": (1, 40), "w": (1, 80)},
                 [(1, ci, 9, 11), (2, ci, 16, 5), (1, ci, 3, 3),
                  *([(1, ci, 4, 75)] if ci <= 8 or groups == ci else [])],
                 winograd=False)  # 75 columns: whole 64-float runs of the few-channel depthwise, sliding blocks
    assert not any("ds_wino_f2" in s.source for s in exe.generic.steps if isinstance(s, KernelStep))
    assert not exe.explain_build()["uncompiled"]


FINISHED = [(16, 48, (1, 1), {}), (3, 64, (7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
            (64, 56, (3, 3), {"pads": [1, 1, 1, 1]}), (64, 160, (3, 3), {"group": 2, "pads": [0, 1, 1, 0]}),
            (3, 8, (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}), (40, 20, (3, 3), {"pads": [1, 1, 1, 1]}),
            (40, 40, (3, 3), {"group": 40, "pads": [1, 1, 1, 1]}),
            (24, 24, (5, 5), {"group": 24, "strides": [2, 2], "pads": [2, 2, 2, 2]}),
            (8, 8, (3, 3), {"group": 8, "pads": [1, 1, 1, 1]})]


def _act_nodes(act: str, x: str, y: str) -> list:
    """One activation node, or SiLU as exporters write it: Mul(x, Sigmoid(x)), or HardSwish written out
    (HardSwish_*: the constants `_act_inits` gives; "near" ones with a constant that is not HardSwish's)."""
    mk = helper.make_node
    if act == "SiLU":
        return [mk("Sigmoid", [x], [f"{y}_sig"]), mk("Mul", [x, f"{y}_sig"], [y])]
    if act in ("HardSwish_AddClipMulDiv", "HardSwish_near_clip", "HardSwish_near_add"):  # Paddle's: x * clip / 6
        hi = "five" if act == "HardSwish_near_clip" else "six"
        add = "two" if act == "HardSwish_near_add" else "three"
        return [mk("Add", [x, add], [f"{y}_a"]), mk("Clip", [f"{y}_a", "zero", hi], [f"{y}_c"]),
                mk("Mul", [x, f"{y}_c"], [f"{y}_m"]), mk("Div", [f"{y}_m", "six"], [y])]
    if act == "HardSwish_AddClipDivMul":  # x * (clip / 6), the operands the other way round
        return [mk("Add", ["three", x], [f"{y}_a"]), mk("Clip", [f"{y}_a", "zero", "six"], [f"{y}_c"]),
                mk("Div", [f"{y}_c", "six"], [f"{y}_d"]), mk("Mul", [f"{y}_d", x], [y])]
    if act == "Relu6":  # MobileNetV2's Clip(x, 0, 6)
        return [mk("Clip", [x, "zero", "six"], [y])]
    if act == "HardSwish_HardSigmoidMul":
        return [mk("HardSigmoid", [x], [f"{y}_h"], alpha=1 / 6, beta=0.5), mk("Mul", [x, f"{y}_h"], [y])]
    return [mk(act, [x], [y])]


def _act_inits(act: str) -> dict:
    return {k: np.float32(v) for k, v in (("zero", 0), ("two", 2), ("three", 3), ("five", 5), ("six", 6))} \
        if act.startswith("HardSwish_") or act == "Relu6" else {}


# SiLU on the paths that apply it: implicit-GEMM tiles (1x1, 3x3), Winograd, depthwise rows (16-channel blocks,
# a masked tail, stride 2) and the few-channel flat runs
SILU_CASES = [FINISHED[i] for i in (0, 2, 6, 7, 8)]


@pytest.mark.parametrize("ci,co,k,attrs", FINISHED, ids=[str(i) for i in range(len(FINISHED))])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("winograd", [True, False])
@pytest.mark.parametrize("act", ["Relu", "HardSwish"])
def test_conv_tiles_add_the_bias_and_apply_the_activation_in_registers(ci, co, k, attrs, bias, winograd, act):
    """Conv (+ bias) + Relu or HardSwish: the tiles (Winograd's output transform, the depthwise rows) finish the
    values before storing them, no epilogue pass (conv_bias_in_tiles); the same values as the reference and as
    the option off, masked column tails included, and a NaN input stays NaN through the activation."""
    _finish_in_tiles_case(ci, co, k, attrs, bias, winograd, act)


@pytest.mark.parametrize("ci,co,k,attrs", SILU_CASES, ids=[str(i) for i in range(len(SILU_CASES))])
@pytest.mark.parametrize("winograd", [True, False])
def test_conv_tiles_apply_silu_in_registers(ci, co, k, attrs, winograd):
    """Conv + bias + Mul(c, Sigmoid(c)): finished by the conv's C (the vector logistic of csrc/ds_vmath.h),
    within float32's reach of the reference, NaN kept."""
    _finish_in_tiles_case(ci, co, k, attrs, True, winograd, "SiLU")


@pytest.mark.parametrize("ci,co,k,attrs", FINISHED, ids=[str(i) for i in range(len(FINISHED))])
@pytest.mark.parametrize("winograd", [True, False])
def test_conv_tiles_apply_relu6_in_registers(ci, co, k, attrs, winograd):
    """Conv + bias + Clip(c, 0, 6) (MobileNetV2's ReLU6): finished by the conv's C on every path (implicit GEMM,
    Winograd, depthwise rows, the few-channel runs), so a 1x1 conv into a depthwise one chains; NaN kept."""
    _finish_in_tiles_case(ci, co, k, attrs, True, winograd, "Relu6")


@pytest.mark.parametrize("ci,co,k,attrs", [FINISHED[i] for i in (0, 2, 4)], ids=["1x1", "3x3", "stem"])
@pytest.mark.parametrize("act", ["HardSwish_AddClipMulDiv", "HardSwish_AddClipDivMul", "HardSwish_HardSigmoidMul"])
def test_conv_tiles_apply_a_hardswish_written_out(ci, co, k, attrs, act):
    """HardSwish as exporters write it out (Paddle's x * Clip(x + 3, 0, 6) / 6, its operands either way round, or
    x * HardSigmoid(x) at 1/6, 1/2: PP-OCR's MobileNetV3) is finished by the conv's tiles like the HardSwish op
    (under bf16 that also lets a stem take the narrow AMX tiles), within float32's reach of the graph's formula."""
    _finish_in_tiles_case(ci, co, k, attrs, True, False, act)


@pytest.mark.parametrize("act", ["HardSwish_near_clip", "HardSwish_near_add"])
def test_a_near_hardswish_stays_in_the_epilogue(act):
    """Clip(x + 3, 0, 5) or Clip(x + 2, 0, 6), then the rest of HardSwish's spelling, is not HardSwish: the
    generated epilogue computes it, and the values are the graph's."""
    ci, co, k, attrs = FINISHED[0]
    w = (RNG.standard_normal((co, ci, *k)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], **attrs), *_act_nodes(act, "c", "y")]
    g = ds.load_onnx(_model(nodes, ["n", ci, "h", "w"], {"w": w, **_act_inits(act)}, opset=19))
    exe = ds.compile(g)
    src = next(s.source for s in exe.generic.steps if isinstance(s, KernelStep))
    assert "acc" in src
    x = (RNG.standard_normal((2, ci, 7, 9)) * 4).astype(np.float32)
    assert_f32_close(exe.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-4, scale=2e-5)


def _finish_in_tiles_case(ci, co, k, attrs, bias, winograd, act):
    groups = attrs.get("group", 1)
    w = (RNG.standard_normal((co, ci // groups, *k)) * 0.3).astype(np.float32)
    inits = {"w": w, **({"b": RNG.standard_normal(co).astype(np.float32)} if bias else {}), **_act_inits(act)}
    nodes = [helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["c"], **attrs),
             *_act_nodes(act, "c", "y")]
    model, dims = _model(nodes, ["n", ci, "h", "w"], inits, opset=19), {"n": (1, 3), "h": (1, 40), "w": (1, 40)}
    g = ds.load_onnx(model, dims=dims)
    # the conv's own values: the activation may clip them (ReLU6 to 6), but Winograd's rounding scales with them
    conv_only = ds.load_onnx(_model([helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["y"], **attrs)],
                                    ["n", ci, "h", "w"], {k: v for k, v in inits.items() if k in ("w", "b")}),
                             dims=dims)
    on, off = ds.compile(g, winograd=winograd), ds.compile(g, winograd=winograd, conv_bias_in_tiles=False)
    src_on, src_off = (next(s.source for s in e.generic.steps if isinstance(s, KernelStep)) for e in (on, off))
    assert [s.kind for s in on.generic.steps if isinstance(s, KernelStep)] == ["conv"]
    assert "acc" not in src_on and "acc" in src_off  # the generated epilogue's accumulator: gone
    for shape in [(1, ci, 9, 11), (2, ci, 16, 5), (1, ci, 3, 3), (2, ci, 12, 13)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        if shape[0] == 2:
            x[1, :, 2, 3] = np.nan
        got, ref = on.run({"x": x})["y"], g.run({"x": x})["y"]
        assert np.isnan(got)[np.isnan(ref)].all() and np.isnan(got).any() == (shape[0] == 2)
        if "ds_wino" not in src_on:  # (Winograd's transforms spread a NaN over its whole tile, with or without)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        ok = ~np.isnan(got)  # Winograd's transforms round differently: the tolerance scales with the conv's values
        np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-4, atol=f32_atol(conv_only.run({"x": x})["y"], 2e-5))
        assert_f32_close(got, off.run({"x": x})["y"], rtol=1e-5, scale=1e-6)


@pytest.mark.parametrize("ci,co,k,attrs", [(16, 48, (1, 1), {}), (64, 56, (3, 3), {"pads": [1, 1, 1, 1]}),
                                           (64, 160, (1, 1), {"group": 2}), (3, 64, (3, 3), {"pads": [1, 1, 1, 1]}),
                                           (256, 56, (3, 3), {"pads": [1, 1, 1, 1]})],
                         ids=["1x1", "3x3", "grouped", "rgb", "chunked"])  # chunked: a pair over 512 KB
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("swap", [True, False])
def test_conv_tiles_add_a_residual_in_registers(ci, co, k, attrs, bias, relu, swap):
    """Conv (+ bias) + residual Add (+ Relu), ResNet's and MobileNet's block ends: the implicit-GEMM tiles add the
    residual map as they store (no epilogue pass); the reference's values, either Add operand order, masked
    column tails and the pair micro-tiles' second panel included."""
    groups = attrs.get("group", 1)
    w = (RNG.standard_normal((co, ci // groups, *k)) * 0.3).astype(np.float32)
    inits = {"w": w, "wr": (RNG.standard_normal((co, ci, 1, 1)) * 0.3).astype(np.float32),
             **({"b": RNG.standard_normal(co).astype(np.float32)} if bias else {})}
    nodes = [helper.make_node("Conv", ["x", "wr"], ["r"]),  # the residual: a map like the conv's output
             helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["c"], **attrs),
             helper.make_node("Add", ["r", "c"] if swap else ["c", "r"], ["a" if relu else "y"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["a"], ["y"]))
    model, dims = _model(nodes, ["n", ci, "h", "w"], inits), {"n": (1, 3), "h": (1, 40), "w": (1, 40)}
    g = ds.load_onnx(model, dims=dims)
    on = ds.compile(g, winograd=False)
    off = ds.compile(g, winograd=False, conv_bias_in_tiles=False)
    (src_on, src_off) = ([s.source for s in e.generic.steps if isinstance(s, KernelStep) and "Add" in s.name]
                         for e in (on, off))
    assert len(src_on) == 1 and "acc" not in src_on[0] and "acc" in src_off[0]
    for shape in [(1, ci, 9, 11), (2, ci, 16, 5), (1, ci, 1, 1), (1, ci, 5, 7)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        got, ref = on.run({"x": x})["y"], g.run({"x": x})["y"]
        # a residual nearly cancelling a 576-term sum keeps ~1e-5 of the sum's size: the tolerance scales with it
        assert_f32_close(got, ref, rtol=1e-4, scale=1e-5)
        assert_f32_close(got, off.run({"x": x})["y"], rtol=1e-5, scale=1e-6)


def test_a_pooled_classifier_conv_streams_its_weights_on_every_thread():
    """A 1x1 conv of 1024 -> 1000 channels on a 1x1 map (DenseNet's head): a million multiply-adds, under
    a par_min_flops of 2 M, but 4 MB of weights, which the threads share from par_min_weights on."""
    w = (RNG.standard_normal((1000, 1024, 1, 1)) * 0.05).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"])]
    model, dims = _model(nodes, ["n", 1024, 1, 1], {"w": w}), {"n": (1, 4)}
    g = ds.load_onnx(model, dims=dims)

    def omp_ifs(exe) -> list[str]:  # the printer's branch around each parallel loop: its condition
        (step,) = [s for s in exe.generic.steps if isinstance(s, KernelStep)]
        head = "if (omp_get_max_threads() > 1 && "
        return [ln.strip()[len(head):-3] for ln in step.source.splitlines() if ln.strip().startswith(head)]

    shared = ds.compile(g, par_min_flops=1 << 21)
    by_flops = ds.compile(g, par_min_flops=1 << 21, par_min_weights=1 << 40)
    assert omp_ifs(shared) == ["1"] and omp_ifs(by_flops) not in ([], ["1"])
    x = RNG.standard_normal((3, 1024, 1, 1)).astype(np.float32)
    for exe in (shared, by_flops):
        assert_f32_close(exe.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-4, scale=1e-5)


def test_a_small_maps_pointwise_conv_splits_over_the_threads():
    """MobileNetV2's 96 -> 576 expansion on a 4x4 map (64x64 input): 0.9 M multiply-adds, ~18 us on one thread,
    which ran on one thread of two under the old par_min_flops (1 M): the threads now share it."""
    w = (RNG.standard_normal((576, 96, 1, 1)) * 0.1).astype(np.float32)
    g = ds.load_onnx(_model([helper.make_node("Conv", ["x", "w"], ["y"])], [1, 96, 4, 4], {"w": w}))

    def omp_ifs(exe) -> list[str]:  # the printer's branch around each parallel loop: its condition
        (step,) = [s for s in exe.generic.steps if isinstance(s, KernelStep)]
        head = "if (omp_get_max_threads() > 1 && "
        return [ln.strip()[len(head):-3] for ln in step.source.splitlines() if ln.strip().startswith(head)]

    exe = ds.compile(g)
    (cond,) = omp_ifs(exe)  # (the pixels' product by the weights', against the threshold)
    assert int(re.search(r">= (\d+)\)$", cond).group(1)) <= 4 * 4 * 576 * 96, cond
    x = RNG.standard_normal((1, 96, 4, 4)).astype(np.float32)
    assert_f32_close(exe.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-4, scale=1e-5)


@pytest.mark.parametrize("threads", [2, 3])
def test_conv_pixel_blocks_split_among_threads_cover_every_pixel_once(threads):
    """The implicit-GEMM conv cuts the pixels into blocks of equal size, as many as a multiple of the threads
    (conv.py's NBLK and `bound`): every pixel in exactly one block whatever the count, from one pixel (fewer
    pixels than blocks would want) to a 14x14 map (196: blocks of 48 / 48 / 48 / 52), with an odd panel."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    w = (RNG.standard_normal((200, 16, 3, 3)) * 0.1).astype(np.float32)
    for k in (1, 3):
        nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[k // 2] * 4)]
        model = _model(nodes, ["n", 16, "h", "w"], {"w": w[:, :, :k, :k]})
        g = ds.load_onnx(model, dims={"n": (1, 3), "h": (1, 64), "w": (1, 64)})
        exe = ds.compile(g, par_min_flops=1)
        with threadpoolctl.threadpool_limits(threads, user_api="openmp"):
            for shape in ((1, 16, 1, 1), (1, 16, 1, 5), (1, 16, 3, 7), (1, 16, 14, 14), (3, 16, 13, 15)):
                x = RNG.standard_normal(shape).astype(np.float32)
                assert_f32_close(exe.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-4, scale=1e-5)


@pytest.mark.parametrize("k, winograd", [(1, False), (3, False), (3, True)])
def test_the_geometry_array_fills_every_slot_the_c_reads(k, winograd):
    """The generated kernel's `geo` array has one entry per DS_CONV_* slot the C reads (ds_shared.h, generated from
    codegen/cshared.py), each stored (the C reads NPIX and WREST past the activation: a shorter array would be read
    past its end, silently)."""
    import re

    from dynshape.codegen import cshared

    header = cshared.header()
    body = header[header.index("enum { DS_CONV_"):header.index("DS_CONV_GEO")]
    slots = len(re.findall(r"\bDS_CONV_[A-Z]+\b", body))
    w = (RNG.standard_normal((64, 32, k, k)) * 0.1).astype(np.float32)
    pads = [k // 2] * 4
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=pads)], ["n", 32, "h", "h"], {"w": w})
    g = ds.load_onnx(model, dims={"n": (1, 2), "h": (4, 16)})
    exe = ds.compile(g, winograd=winograd)
    for shape in [(1, 32, 7, 7), (2, 32, 9, 9)]:  # Winograd's F(4x4) keeps ~1e-5 of the sum's size
        x = RNG.standard_normal(shape).astype(np.float32)
        assert_f32_close(exe.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-4, scale=2e-5)
    (step,) = [s for s in exe.generic.steps if isinstance(s, KernelStep)]
    # (a Winograd kernel on a runtime map has two: its own and its implicit GEMM's, for calls with few tiles)
    arrays = re.findall(r"int64_t (geo\w*)\[(\d+)\];", step.source)
    assert len(arrays) == (2 if winograd else 1), arrays
    for name, size in arrays:
        stored = set(re.findall(rf"\b{name}\[(\d+)\] = ", step.source))
        assert int(size) == slots and stored == {str(i) for i in range(slots)}, (name, size, slots, sorted(stored))


def test_conv1d_few_channels_runs():
    w = (RNG.standard_normal((5, 3, 7)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[3, 2])]
    _check(_model(nodes, ["n", 3, "l"], {"w": w}), {"n": (1, 4), "l": (2, 300)}, [(1, 3, 2), (3, 3, 77)], ["conv"])


def test_conv1d_and_a_residual_epilogue():
    w = (RNG.standard_normal((8, 8, 5)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[4, 4], dilations=[2]),
             helper.make_node("Add", ["c", "x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    _check(_model(nodes, ["n", 8, "l"], {"w": w}), {"n": (1, 4), "l": (1, 300)}, [(1, 8, 1), (3, 8, 77)], ["conv"])


POOLS = [("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
         ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
         ("AveragePool", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
         ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
         ("AveragePool", {"kernel_shape": [3, 1], "strides": [3, 1], "count_include_pad": 1, "ceil_mode": 1}),
         ("MaxPool", {"kernel_shape": [3, 2], "strides": [1, 2], "dilations": [2, 1], "pads": [2, 0, 2, 1]}),
         ("AveragePool", {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 1, 0, 2], "ceil_mode": 1}),
         ("GlobalAveragePool", {}), ("GlobalMaxPool", {})]


@pytest.mark.parametrize("op,attrs", POOLS, ids=[f"{p[0]}-{i}" for i, p in enumerate(POOLS)])
def test_pools(op, attrs):
    nodes = [helper.make_node(op, ["x"], ["y"], **attrs)]
    exe = _check(_model(nodes, ["n", 70, "h", "w"], {}), {"n": (1, 2), "h": (3, 40), "w": (3, 40)},
                 [(1, 70, 7, 9), (2, 70, 16, 3)], ["pool"])
    assert not exe.explain_build()["uncompiled"]


@pytest.mark.parametrize("channels", [16, 130])
def test_max_pool_keeps_a_nan_wherever_it_falls_in_the_window(channels):
    """ds_pool_row's vector max keeps a NaN whether it comes first in a window or after larger values, as
    numpy's reference does; every block of 64 channels and the masked tail."""
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])]
    model = _model(nodes, ["n", channels, "h", "w"], {})
    g = ds.load_onnx(model, dims={"n": (1, 2), "h": (3, 40), "w": (3, 40)})
    exe = ds.compile(g)
    x = RNG.standard_normal((2, channels, 9, 9)).astype(np.float32)
    x[0, -1, 0, 0] = np.nan  # the first valid tap of output (0, 0)'s window
    x[1, 3, 4, 4] = np.nan  # the centre of output (2, 2)'s window (rows and columns 3..5)
    x[1, 3, 3, 3] = 100.0  # a larger value before it in that window
    got, ref = exe.run({"x": x})["y"], g.run({"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    assert np.isnan(got).sum() == 2 and np.isnan(got[1, 3, 2, 2]) and np.isnan(got[0, -1, 0, 0])
    np.testing.assert_array_equal(got[~np.isnan(got)], ref[~np.isnan(ref)])


def test_pools_are_one_c_call_per_output_row():
    nodes = [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    exe = ds.compile(ds.load_onnx(_model(nodes, ["n", 8, "h", "w"], {}), dims={"n": (1, 2), "h": (3, 9),
                                                                               "w": (3, 9)}))
    (step,) = [s for s in exe.generic.steps if isinstance(s, KernelStep)]
    assert "ds_pool_row(" in step.source


def test_the_se_blocks_mean_is_a_global_pool_in_channels_last():
    dw = (RNG.standard_normal((6, 1, 3, 3)) * 0.3).astype(np.float32)
    w = (RNG.standard_normal((6, 6, 1, 1)) * 0.3).astype(np.float32)
    axes = np.array([2, 3], np.int64)
    nodes = [helper.make_node("Conv", ["x", "dw"], ["d"], group=6, pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["d", "axes"], ["m"], keepdims=1),
             helper.make_node("Conv", ["m", "w"], ["s"]), helper.make_node("HardSigmoid", ["s"], ["h"]),
             helper.make_node("Mul", ["d", "h"], ["y"])]
    exe = _check(_model(nodes, ["n", 6, "h", "w"], {"dw": dw, "w": w, "axes": axes}),
                 {"n": (1, 2), "h": (1, 20), "w": (1, 20)}, [(1, 6, 5, 5), (2, 6, 3, 8)],
                 ["conv", "pool", "elementwise"])
    assert [s.op for s in exe.generic.steps].count("Transpose") == 2  # into channels last once, and back


@pytest.mark.parametrize("mode,ctm", list(itertools.product(["nearest", "linear"], ["asymmetric", "half_pixel",
                                                                                       "align_corners"])))
def test_resize_reads_the_pixels_the_reference_reads(mode, ctm):
    scales = np.array([1, 1, 2.0, 1.5], np.float32)
    nodes = [helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode, coordinate_transformation_mode=ctm,
                              nearest_mode="floor")]
    exe = _check(_model(nodes, ["n", 5, "h", "w"], {"s": scales}), {"n": (1, 2), "h": (1, 30), "w": (1, 30)},
                 [(1, 5, 6, 7), (2, 5, 13, 4)])
    assert [s.how for s in exe.generic.steps if s.op == "ChannelsLast"] == ["native"]


def test_concat_of_channels_last_maps_is_one_copy_call():
    w = (RNG.standard_normal((4, 3, 1, 1)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"]), helper.make_node("Relu", ["x"], ["b"]),
             helper.make_node("Concat", ["a", "b", "a"], ["y"], axis=1)]
    exe = _check(_model(nodes, ["n", 3, "h", "w"], {"w": w}), {"n": (1, 2), "h": (1, 9), "w": (1, 9)},
                 [(1, 3, 4, 5), (2, 3, 9, 1)])
    assert [s.how for s in exe.generic.steps if s.op == "Concat"] == ["native"]


def _joined(exe):
    """value -> (the Concat output it is written into, its first column, that output's row width)."""
    plan, types = exe.generic.planner, exe.generic.build.graph.types
    return {x: (j.into, j.col, types[j.into].shape[-1]) for x, j in plan.joins.items()}


def test_concat_branches_are_written_into_their_slice():
    """A fire module (squeeze 1x1 -> expand 1x1 | expand 3x3 -> Concat): both expands write their columns of the
    Concat's pixels (stride = its width), the Concat runs no step, values as the reference at every shape."""
    ws = (RNG.standard_normal((6, 5, 1, 1)) * 0.3).astype(np.float32)
    w1 = (RNG.standard_normal((20, 6, 1, 1)) * 0.3).astype(np.float32)
    w3 = (RNG.standard_normal((12, 6, 3, 3)) * 0.3).astype(np.float32)
    b3 = RNG.standard_normal(12).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "ws"], ["s0"]), helper.make_node("Relu", ["s0"], ["s"]),
             helper.make_node("Conv", ["s", "w1"], ["e1"]),
             helper.make_node("Conv", ["s", "w3", "b3"], ["e3c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["e3c"], ["e3"]),
             helper.make_node("Concat", ["e1", "e3"], ["c"], axis=1), helper.make_node("Sigmoid", ["c"], ["y"])]
    exe = _check(_model(nodes, ["n", 5, "h", "w"], {"ws": ws, "w1": w1, "w3": w3, "b3": b3}),
                 {"n": (1, 3), "h": (1, 20), "w": (1, 20)}, [(1, 5, 7, 9), (3, 5, 1, 13), (2, 5, 20, 2)])
    joined = _joined(exe)
    assert len(joined) == 2 and sorted(v[1:] for v in joined.values()) == [(0, 32), (20, 32)]
    assert len({v[0] for v in joined.values()}) == 1
    slices = exe.explain_build()["concat_slices"]
    assert sorted(c["columns"] for c in slices) == [[0, 20], [20, 32]]


def test_a_branch_read_elsewhere_is_copied_and_the_other_written_in_place():
    """c = Concat(a, b) where a is also read by a second Concat: b's conv writes its columns of c, the Concat copies
    a only (ds_concat skips an input at its own columns); d = Concat(a, a) keeps its copies."""
    w1 = (RNG.standard_normal((4, 3, 1, 1)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("Concat", ["a", "a"], ["d"], axis=1), helper.make_node("Add", ["c", "d"], ["y"])]
    exe = _check(_model(nodes, ["n", 3, "h", "w"], {"w1": w1, "w2": w2}), {"n": (1, 2), "h": (1, 9), "w": (1, 9)},
                 [(1, 3, 4, 5), (2, 3, 9, 1)])
    assert [v[1:] for v in _joined(exe).values()] == [(4, 8)]  # b (channels last: a new name) at columns 4..8
    assert [s.op for s in exe.generic.steps].count("Concat") == 2  # both still run a step


def test_a_unet_skip_is_copied_beside_the_upsampled_map_written_in_place():
    """A UNet level: the skip map is read by the pool below and by the Concat; the map coming back up (a 1x1 conv
    then Resize x2, native, at the Concat's pixel stride) writes its columns; the Concat copies the skip only.
    Values as the reference at every shape, each a new plan (bucket and own plans re-address the Concat). The
    dims declared without their evenness, the skip map's rows are spelled h, the Concat's 2*(h//2) (equal by the
    model's guards): the Concat's own spelling is what a joined input must have, not a copied one."""
    w0 = (RNG.standard_normal((6, 3, 3, 3)) * 0.3).astype(np.float32)
    w1 = (RNG.standard_normal((5, 6, 3, 3)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((4, 5, 1, 1)) * 0.3).astype(np.float32)
    w3 = (RNG.standard_normal((3, 10, 3, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["s0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["s0"], ["s"]),
             helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w1"], ["d0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["d0"], ["d"]),
             helper.make_node("Resize", ["d", "", "sc"], ["u0"], mode="linear"),
             helper.make_node("Conv", ["u0", "w2"], ["u"]),
             helper.make_node("Concat", ["u", "s"], ["c"], axis=1),
             helper.make_node("Conv", ["c", "w3"], ["y"], pads=[1, 1, 1, 1])]
    sc = np.array([1, 1, 2, 2], np.float32)
    exe = _check(_model(nodes, ["n", 3, "h", "w"], {"w0": w0, "w1": w1, "w2": w2, "w3": w3, "sc": sc}),
                 {"n": (1, 2), "h": (2, 24), "w": (2, 24)},
                 [(1, 3, 8, 10), (2, 3, 2, 24), (1, 3, 24, 4), (1, 3, 8, 10), (1, 3, 8, 10), (1, 3, 8, 10),
                  (1, 3, 8, 10), (2, 3, 6, 6)])
    joined = _joined(exe)
    assert [v[1:] for v in joined.values()] == [(0, 10)] and [s.op for s in exe.generic.steps].count("Concat") == 1


@pytest.mark.parametrize("co, k, scale", [(5, 2, False), (1, 2, False), (3, 3, True), (1, 3, True)])
def test_conv_transpose_with_kernel_equal_to_stride_writes_its_blocks(co, k, scale):
    """Each input pixel's k x k block of outputs, the epilogue run over each kernel row's contiguous run of the
    block's pixels: its per-channel operands (the bias, a channel scale) indexed by the run's position modulo Co
    (one channel: a detector's sigmoid head), over more pixels than one block of ROWS (70 columns)."""
    w = (RNG.standard_normal((12, co, k, k)) * 0.3).astype(np.float32)
    b = RNG.standard_normal(co).astype(np.float32)
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["c"], strides=[k, k]),
             helper.make_node("Sigmoid", ["c"], ["s"])]
    inits = {"w": w, "b": b}
    if scale:
        inits["m"] = RNG.standard_normal((1, co, 1, 1)).astype(np.float32)
        nodes.append(helper.make_node("Mul", ["s", "m"], ["y"]))
    else:
        nodes[-1].output[0] = "y"
    exe = _check(_model(nodes, ["n", 12, "h", "w"], inits), {"n": (1, 2), "h": (1, 30), "w": (1, 80)},
                 [(1, 12, 3, 4), (2, 12, 7, 1), (1, 12, 2, 70)], ["conv"])
    assert not exe.explain_build()["uncompiled"]


@pytest.mark.parametrize("size,beta", [(5, 0.75), (4, 0.6), (1, 1.0)])
def test_lrn_runs_channels_last_in_c(size, beta):
    w = (RNG.standard_normal((12, 5, 3, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("LRN", ["c"], ["y"], size=size, alpha=2e-3, beta=beta, bias=1.5)]
    exe = _check(_model(nodes, ["n", 5, "h", "w"], {"w": w}), {"n": (1, 2), "h": (1, 20), "w": (1, 20)},
                 [(1, 5, 7, 9), (2, 5, 4, 4)])
    assert not exe.explain_build()["uncompiled"]


def _fallbacks(exe, x) -> list[str]:
    """Labels of the plan's calls that run a step's numpy path (a native bind that declined this key)."""
    exe.run({"x": x})
    out = []
    for plan in exe.arenas[0].plans.values():
        out += [label for c, label in zip(plan.calls, plan.labels) if getattr(c, "__name__", "") == "call"]
    return out


def test_slice_select_and_constant_pad_are_copies_bound_per_key():
    i64 = np.int64
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "two"], ["w"]),
             helper.make_node("Sub", ["w", "one"], ["end"]),  # the end follows W: known per key, not a constant
             helper.make_node("Slice", ["x", "start", "end", "axis2", "step"], ["s"]),
             helper.make_node("Gather", ["s", "minus1"], ["g"], axis=1),  # one index: torch's select
             helper.make_node("Pad", ["g", "pads", "val"], ["y"], mode="constant")]
    inits = {"two": np.array([3], i64), "one": np.array([1], i64), "start": np.array([1], i64),
             "axis2": np.array([3], i64), "step": np.array([2], i64), "minus1": np.array(-1, i64),
             "pads": np.array([0, 2, -1, 0, 1, 0], i64), "val": np.array(0.5, np.float32)}
    exe = _check(_model(nodes, ["n", 3, "h", "w"], inits), {"n": (1, 3), "h": (2, 20), "w": (3, 20)},
                 [(1, 3, 4, 9), (2, 3, 7, 3), (3, 3, 2, 10)])
    assert not exe.explain_build()["uncompiled"]
    assert _fallbacks(exe, RNG.standard_normal((2, 3, 5, 8)).astype(np.float32)) == []


def test_gather_of_one_index_fed_at_run_time_picks_and_checks_it():
    """A scalar index fed per call (a Loop body's xs[i]) is bound as a pick of that row, read when the call runs:
    every admissible index (negative ones count from the end) gives numpy's rows; one out of range is refused
    naming the node."""
    from dynshape.errors import ConstraintViolation

    g = helper.make_graph([helper.make_node("Gather", ["x", "i"], ["y"], name="pick", axis=1)], "pick",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", 3]),
                           helper.make_tensor_value_info("i", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    exe = ds.compile(ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])))
    assert not exe.explain_build()["uncompiled"]
    x = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    for i in (0, 3, 4, -1, -5):
        np.testing.assert_array_equal(exe.run({"x": x, "i": np.array(i, np.int64)})["y"], x[:, i])
    for i in (5, -6):
        with pytest.raises(ConstraintViolation, match="pick"):
            exe.run({"x": x, "i": np.array(i, np.int64)})


def test_global_average_pool_of_a_large_constant_map_is_that_constant():
    """The mean sums in double: float32 one element after another drifted 1.9% low over 2**19 * 6 values (found
    by `python bench/fuzz_models.py --seed 3 --case 2535`)."""
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["y"])]
    exe = ds.compile(ds.load_onnx(_model(nodes, [1, 4, "H", "W"], {}, opset=18)))
    v = np.float32(0.16521853)
    out = exe.run({"x": np.full((1, 4, 2**19, 6), v, np.float32)})["y"]
    np.testing.assert_allclose(out, v, rtol=1e-6)


def test_row_stride_kernels_run_dense_on_the_unplanned_path():
    """An If on computed values run by the interpreter (compile_bodies=False; compiled, its branches are planned
    calls: runtime/if_branches.py) makes the graph unplannable: the same row-stride kernels then write dense
    outputs of their own (stride = their width) and the Concat copies, with the reference's values. (An If on an
    input's value compiles a build per value instead, runtime/branch_variants.py.)"""
    w1 = (RNG.standard_normal((4, 3, 1, 1)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    then = helper.make_graph([helper.make_node("Identity", ["c"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F, None)])
    other = helper.make_graph([helper.make_node("Neg", ["c"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, None)])
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["n", 3, "h", "w"])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
                           numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    graph = ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]),
                         dims={"n": (1, 2), "h": (1, 9), "w": (1, 9)})
    exe = ds.compile(graph, compile_bodies=False)
    assert exe.generic.planner is None
    # the two convolutions (the condition's Greater is a kernel of its own since comparisons compile)
    assert [s.row_stride for s in exe.generic.steps if isinstance(s, KernelStep) and s.kind == "conv"] == [True, True]
    for shape in [(1, 3, 4, 5), (2, 3, 9, 1)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        for sign in (1.0, -1.0):  # both branches (the sum of x changes sign)
            feed = {"x": (sign * x).astype(np.float32)}
            assert_f32_close(exe.run(feed)["y"], graph.run(feed)["y"], rtol=1e-4, scale=1e-5)


@pytest.mark.parametrize("axis", [None, 1, 2, 3, -1])
def test_old_opset_softmax_of_a_channels_last_map(axis):
    """Below opset 13 a Softmax normalises the flattened axes from `axis` on: over C, H, W (axis 1) it may move
    into channels last (the same set of values), over H, W (axis 2) it must not (NHWC's H, W are not a
    suffix); either way the values are the reference's."""
    w = (RNG.standard_normal((4, 3, 1, 1)) * 0.5).astype(np.float32)
    attrs = {} if axis is None else {"axis": axis}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Softmax", ["c"], ["y"], **attrs)]
    _check(_model(nodes, ["n", 3, "h", "w"], {"w": w}, opset=11), {"n": (1, 2), "h": (1, 9), "w": (1, 9)},
           [(1, 3, 3, 5), (2, 3, 1, 4), (1, 3, 6, 1)])


def test_old_opset_classifier_softmax_after_a_global_pool_is_a_kernel():
    w = (RNG.standard_normal((10, 3, 1, 1)) * 0.5).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("GlobalAveragePool", ["c"], ["p"]),
             helper.make_node("Softmax", ["p"], ["y"])]
    exe = _check(_model(nodes, ["n", 3, "h", "w"], {"w": w}, opset=9), {"n": (1, 2), "h": (1, 9), "w": (1, 9)},
                 [(1, 3, 3, 5), (2, 3, 7, 2)])
    assert "softmax" in {s.kind for s in exe.generic.steps if isinstance(s, KernelStep)}


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_an_fpn_upsampling_writes_its_slice_of_the_concat(mode):
    """A detector's neck: a map upsampled 2x (Resize, native) beside a conv at the larger scale, concatenated:
    both write their columns of the Concat's pixels (the Resize at the Concat's pixel stride), the Concat runs no
    step, values as the reference at every shape."""
    w1 = (RNG.standard_normal((6, 3, 1, 1)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((5, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["x", "w2"], ["b0"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Resize", ["b0", "", "sc"], ["b"], mode=mode),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1), helper.make_node("Relu", ["c"], ["y"])]
    sc = np.array([1, 1, 2, 2], np.float32)
    exe = _check(_model(nodes, ["n", 3, "h", "w"], {"w1": w1, "w2": w2, "sc": sc}),
                 {"n": (1, 2), "h": {"min": 2, "max": 24, "multiple_of": 2}, "w": {"min": 2, "max": 24,
                                                                                  "multiple_of": 2}},
                 [(1, 3, 8, 10), (2, 3, 2, 24), (1, 3, 24, 4)])
    joined = _joined(exe)
    assert len(joined) == 2 and sorted(v[1:] for v in joined.values()) == [(0, 11), (6, 11)]


def _pw_dw(cin, cexp, k, s, act1, act2, dil=1):
    w1 = (RNG.standard_normal((cexp, cin, 1, 1)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((cexp, 1, k, k)) * 0.3).astype(np.float32)
    inits = {"w1": w1, "b1": RNG.standard_normal(cexp).astype(np.float32), "w2": w2,
             "b2": RNG.standard_normal(cexp).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]), *_act_nodes(act1, "c1", "a1"),
             helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], group=cexp, strides=[s, s],
                              pads=[k // 2 * dil] * 4, dilations=[dil, dil]),
             *_act_nodes(act2, "c2", "y")]
    return _model(nodes, ["n", cin, "h", "w"], inits)


@pytest.mark.parametrize("cin,cexp,k,s,act1,act2,dil", [
    (8, 32, 3, 2, "Relu", "Relu", 1), (16, 40, 3, 1, "HardSwish", "Relu", 1), (16, 40, 5, 2, "Relu", "HardSwish", 1),
    (8, 8, 3, 1, "Relu", "Relu", 1), (24, 72, 3, 1, "Relu", "Sigmoid", 2), (16, 100, 5, 1, "Relu", "Relu", 1),
    (16, 40, 3, 1, "SiLU", "SiLU", 1)])
def test_a_1x1_conv_into_a_depthwise_one_runs_as_one_kernel(cin, cexp, k, s, act1, act2, dil):
    """A MobileNet block's expansion and depthwise conv: one kernel (the expanded rows computed a chunk at a time
    into scratch), over maps of one row to more rows than a chunk holds, the depthwise's epilogue (a sigmoid:
    not applied by its C) included."""
    _check(_pw_dw(cin, cexp, k, s, act1, act2, dil), {"n": (1, 3), "h": (1, 200), "w": (1, 200)},
           [(1, cin, 9, 11), (2, cin, 30, 17), (1, cin, 3, 3), (1, cin, 1, 5), (1, cin, 120, 160)], ["conv_chain"])


@pytest.mark.parametrize("k,s", [(3, 1), (5, 2)])
def test_a_chains_chunks_split_the_rows_evenly_over_the_threads(k, s):
    """The chain's chunks of an image's rows are as many as fit the scratch rounded up to a multiple of the threads,
    each an equal share to one row (a 120-row map of 100 expanded channels: 15 chunks of 8 rows at 1 and 3 threads,
    16 of 7 or 8 at 2; after stride 2, 60 rows in 15 chunks of 4 at 1 and 3 threads, 16 of 3 or 4 at 2): at 1, 2 and
    3 threads the same bits as on one thread and the reference's values, with two images."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    model = _pw_dw(16, 100, k, s, "Relu", "Relu")
    g = ds.load_onnx(model, dims={"n": (1, 3), "h": (1, 200), "w": (1, 200)})
    exe = ds.compile(g)
    assert [st.kind for st in exe.generic.steps if isinstance(st, KernelStep)] == ["conv_chain"]
    x = RNG.standard_normal((2, 16, 120, 160)).astype(np.float32)
    want = g.run({"x": x})["y"]
    outs = []
    for threads in (1, 2, 3):
        with threadpoolctl.threadpool_limits(threads, user_api="openmp"):
            outs.append(exe.run({"x": x})["y"])
    assert_f32_close(outs[0], want, rtol=1e-4, scale=1e-5)
    for got in outs[1:]:
        np.testing.assert_array_equal(got, outs[0])


def test_a_small_expanded_map_runs_as_two_conv_kernels():
    """Where the chain does not pay (an expanded map of 2 channels: under PWDW_MIN_MAP_BYTES at the typical
    side) or is switched off, its lowering declines and its two convs run as kernels of their own, not node by
    node."""
    exe = _check(_pw_dw(1, 2, 3, 1, "Relu", "Relu"), {"n": (1, 3), "h": (1, 40), "w": (1, 40)},
                 [(1, 1, 9, 11), (2, 1, 6, 5)], ["conv"])
    assert len([s for s in exe.generic.steps if isinstance(s, KernelStep)]) == 2
    assert not exe.explain_build()["uncompiled"]
    _check(_pw_dw(8, 32, 3, 1, "Relu", "Relu"), {"n": (1, 3), "h": (1, 40), "w": (1, 40)}, [(1, 8, 9, 11)], ["conv"],
           fused_pw_dw=False)
