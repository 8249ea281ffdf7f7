"""Winograd F(2x2, 3x3) convolutions (csrc/ds_conv.c's ds_wino_f2, lowered by codegen/lower/conv.py) against the
numpy reference: odd and even output sizes (half tiles), every padding a 3x3 stride-1 conv can have, batches,
tile rows wider than one chunk, blocks of several tile rows, epilogues, Concat slices; which convolutions take
it, and the option that turns it off."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen.lower.conv import WINO_TILES
from dynshape.codegen.packed_gemm import pack_winograd
from dynshape.runtime.build import KernelStep

F = TensorProto.FLOAT
RNG = np.random.default_rng(7)
DIMS = {"n": (1, 4), "h": (1, 300), "w": (1, 300)}


def _model(nodes, ci, inits):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["n", ci, "h", "w"])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def _wino_steps(exe) -> int:
    return sum("ds_wino_f2" in s.source for s in exe.generic.steps if isinstance(s, KernelStep))


def _check(model, shapes, winograd_steps, **options):
    g = ds.load_onnx(model, dims=DIMS)
    exe = ds.compile(g, **options)
    assert _wino_steps(exe) == winograd_steps
    for shape in shapes:
        x = RNG.standard_normal(shape).astype(np.float32)
        got, want = exe.run({"x": x})["y"], g.run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * max(1.0, float(np.abs(want).max())))
    return exe


def _conv(ci, co, attrs, act="Relu", bias=True):
    w = (RNG.standard_normal((co, ci, 3, 3)) / np.sqrt(9 * ci)).astype(np.float32)
    inits = {"w": w}
    ins = ["x", "w"]
    if bias:
        inits["b"] = RNG.standard_normal(co).astype(np.float32)
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["c" if act else "y"], **attrs)]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    return _model(nodes, ci, inits)


PADS = [{"pads": [1, 1, 1, 1]}, {"pads": [0, 0, 0, 0]}, {"pads": [0, 1, 1, 0]}, {"pads": [2, 0, 1, 2]},
        {"auto_pad": "SAME_UPPER"}, {"auto_pad": "VALID"}]


@pytest.mark.parametrize("attrs", PADS, ids=[str(i) for i in range(len(PADS))])
def test_every_padding_and_odd_and_even_sizes(attrs):
    _check(_conv(16, 32, attrs), [(1, 16, 7, 9), (2, 16, 8, 8), (1, 16, 3, 3), (3, 16, 5, 12)], 1)


@pytest.mark.parametrize("ci,co", [(16, 16), (32, 48), (64, 256), (256, 64)])
def test_channel_counts(ci, co):
    _check(_conv(ci, co, {"pads": [1, 1, 1, 1]}, act="HardSwish"), [(1, ci, 6, 10), (2, ci, 13, 5)], 1)


def test_tile_rows_wider_than_a_chunk_and_blocks_of_many_rows():
    """A row of 130 tiles (over WINO_TILES: two chunks in one call); 4 x 4 tiles a map (blocks of many tile rows,
    crossing images); one pixel (a single half tile)."""
    assert 130 > WINO_TILES
    _check(_conv(16, 32, {"pads": [1, 1, 1, 1]}), [(1, 16, 3, 260), (4, 16, 7, 7), (1, 16, 1, 1)], 1)


def test_a_residual_epilogue_and_no_bias():
    w = (RNG.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    _check(_model(nodes, 32, {"w": w}), [(2, 32, 9, 6), (1, 32, 2, 17)], 1)
    _check(_conv(16, 16, {"pads": [1, 1, 1, 1]}, act=None, bias=False), [(1, 16, 5, 5)], 1)


def test_written_into_a_concat_slice():
    w3 = (RNG.standard_normal((32, 16, 3, 3)) / 12).astype(np.float32)
    w1 = (RNG.standard_normal((8, 16, 1, 1)) / 4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w3"], ["a0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a0"], ["a"]),
             helper.make_node("Conv", ["x", "w1"], ["b"]), helper.make_node("Concat", ["b", "a"], ["c"], axis=1),
             helper.make_node("Sigmoid", ["c"], ["y"])]
    exe = _check(_model(nodes, 16, {"w3": w3, "w1": w1}), [(1, 16, 5, 7), (2, 16, 8, 3)], 1)
    assert exe.explain_build()["concat_slices"]


@pytest.mark.parametrize("ci,co,attrs", [(8, 16, {"pads": [1, 1, 1, 1]}), (16, 24, {"pads": [1, 1, 1, 1]}),
                                         (16, 16, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
                                         (16, 16, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
                                         (32, 32, {"group": 2, "pads": [1, 1, 1, 1]})])
def test_convolutions_it_does_not_take_run_on_implicit_gemm(ci, co, attrs):
    groups = attrs.get("group", 1)
    w = (RNG.standard_normal((co, ci // groups, 3, 3)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], **attrs)]
    _check(_model(nodes, ci, {"w": w}), [(1, ci, 7, 8)], 0)


def test_the_option_turns_it_off_and_both_agree():
    model = _conv(32, 32, {"pads": [1, 1, 1, 1]})
    x = RNG.standard_normal((2, 32, 11, 10)).astype(np.float32)
    on = _check(model, [], 1)
    off = _check(model, [], 0, winograd=False)
    np.testing.assert_allclose(on.run({"x": x})["y"], off.run({"x": x})["y"], rtol=1e-4, atol=1e-5)
    assert on.options.build_key() != off.options.build_key()


def test_weight_transform_is_g_w_gt_per_position():
    """pack_winograd's position (a, b) of output channel o, input channel c is (G w[o, c] G^T)[a, b]."""
    w = RNG.standard_normal((40, 16, 3, 3)).astype(np.float32)
    packed = pack_winograd(w)
    assert packed.shape == (16, 2, 16, 32) and packed.ctypes.data % 64 == 0
    g = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
    for o, c in [(0, 0), (39, 15), (33, 7)]:
        u = g @ w[o, c].astype(np.float64) @ g.T
        for a in range(4):
            for b in range(4):
                assert packed[a * 4 + b, o // 32, c, o % 32] == np.float32(u[a, b])
    assert not packed[:, 1, :, 8:].any()  # panel padding past 40 output channels
