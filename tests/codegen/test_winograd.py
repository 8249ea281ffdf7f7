"""Winograd F(2x2, 3x3) and F(4x4, 3x3) convolutions (csrc/ds_conv_dw_wino.c's ds_wino_f2 / ds_wino_f4, lowered by
codegen/lower/conv.py) against the numpy reference: output sizes that are no multiple of the tile (part tiles),
every padding a 3x3 stride-1 conv can have, batches, tile rows wider than one chunk, blocks of several tile
rows, epilogues, Concat slices; which convolutions take it and which tile, and the options."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen.lower.conv import (
    WINO4_MAX_WEIGHTS,
    WINO_BOTH_BYTES,
    WINO_TILES,
    direct_beside,
    wino4_pays,
    wino_pays,
    winograd_tiles,
)
from dynshape.codegen.packed_gemm import WINOGRAD_G, pack_winograd
from dynshape.errors import DynshapeError
from dynshape.options import Options
from dynshape.runtime.build import KernelStep
from dynshape.sym import sym
from tolerance import assert_f32_close

F = TensorProto.FLOAT
RNG = np.random.default_rng(7)
DIMS = {"n": (1, 4), "h": (1, 600), "w": (1, 600)}


def _model(nodes, ci, inits):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["n", ci, "h", "w"])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def _wino_steps(exe, tile: int) -> int:
    return sum(f"ds_wino_f{tile}(" in s.source for s in exe.generic.steps if isinstance(s, KernelStep))


def _check(model, shapes, winograd_steps, tile=4, **options):
    """Winograd's steps counted and its results checked on every map, small ones too (winograd_min_tiles=0: the
    tests of the choice of the implicit GEMM on few tiles are below)."""
    options.setdefault("winograd_min_tiles", 0)
    options.setdefault("winograd_min_channels", 16)  # Winograd on few channels too (the CPU's default aside)
    g = ds.load_onnx(model, dims=DIMS)
    exe = ds.compile(g, winograd_tile=tile, **options)
    assert _wino_steps(exe, tile) == winograd_steps
    if tile == 2:
        assert _wino_steps(exe, 4) == 0
    for shape in shapes:
        x = RNG.standard_normal(shape).astype(np.float32)
        got, want = exe.run({"x": x})["y"], g.run({"x": x})["y"]
        assert_f32_close(got, want, rtol=1e-4, scale=2e-5)
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


TILES = [2, 4]


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("attrs", PADS, ids=[str(i) for i in range(len(PADS))])
def test_every_padding_and_part_tiles(attrs, tile):
    """The small maps run F(2x2) whatever the option (too few 4x4 tiles to pay), 23x26 F(4x4) where allowed."""
    _check(_conv(16, 32, attrs), [(1, 16, 7, 9), (2, 16, 8, 8), (1, 16, 3, 3), (3, 16, 5, 12), (1, 16, 10, 6),
                                  (1, 16, 23, 26)], 1, tile)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("ci,co", [(16, 16), (32, 48), (64, 256), (256, 64), (96, 24), (40, 56), (17, 33)])
def test_channel_counts(ci, co, tile):
    _check(_conv(ci, co, {"pads": [1, 1, 1, 1]}, act="HardSwish"), [(1, ci, 6, 10), (2, ci, 13, 5), (1, ci, 16, 20)], 1,
           tile)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("ci,co", [(16, 32), (40, 20)])
def test_a_silu_epilogue(ci, co, tile):
    """Mul(c, Sigmoid(c)) finished by the output transform (without AVX-512: a pass over each tile's stored
    pixels, its edge tiles' too)."""
    w = (RNG.standard_normal((co, ci, 3, 3)) / np.sqrt(9 * ci)).astype(np.float32)
    b = RNG.standard_normal(co).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    _check(_model(nodes, ci, {"w": w, "b": b}), [(1, ci, 7, 9), (2, ci, 13, 6), (1, ci, 16, 20)], 1, tile)


@pytest.mark.parametrize("tile", TILES)
def test_tile_rows_wider_than_a_chunk_and_blocks_of_many_rows(tile):
    """A row of 130 tiles of 2 or 4 (over WINO_TILES: several chunks in one call); small maps (blocks of many
    tile rows, crossing images); one pixel (a single part tile)."""
    assert 130 > max(WINO_TILES.values())
    _check(_conv(16, 32, {"pads": [1, 1, 1, 1]}), [(1, 16, 3, 130 * tile), (4, 16, 7, 7), (1, 16, 1, 1)], 1, tile)


@pytest.mark.parametrize("tile", TILES)
def test_a_residual_epilogue_and_no_bias(tile):
    w = (RNG.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    _check(_model(nodes, 32, {"w": w}), [(2, 32, 9, 6), (1, 32, 2, 17), (1, 32, 16, 16)], 1, tile)
    _check(_conv(16, 16, {"pads": [1, 1, 1, 1]}, act=None, bias=False), [(1, 16, 5, 5)], 1, tile)


def test_which_tile_a_layer_takes():
    """F(2x2) for weights of 512 x 512 channels or more, or a static map F(4x4) does not pay on (too few 4x4
    tiles, or 4-wide edge tiles wasting too much: 6 rows compute 8); a runtime map: both packed where F(4x4)'s
    weights are small (the call chooses), else F(4x4) only where the map is large at a typical side (h // 8, not
    h // 16)."""
    geo = {"N": sym("n"), "C": 64, "OC": 64, "OH": sym("h"), "OW": sym("w")}
    assert winograd_tiles(geo, 4) == (4, 2) and winograd_tiles(geo, 2) == (2,)
    big = {**geo, "C": 256, "OC": 256}
    assert 36 * 4 * 256 * 256 > WINO_BOTH_BYTES >= 36 * 4 * 64 * 64
    assert winograd_tiles({**big, "OH": sym("h") // 8}, 4) == (4,)
    assert winograd_tiles({**big, "OW": sym("w") // 16}, 4) == (2,)
    static = {**geo, "N": 1}
    assert winograd_tiles({**static, "OH": 6, "OW": 40}, 4) == (2,)
    assert winograd_tiles({**static, "OH": 16, "OW": 16}, 4) == (4,)
    assert winograd_tiles({**static, "OH": 7, "OW": 7}, 4) == (2,)  # 4 tiles
    assert winograd_tiles({**static, "N": 4, "OH": 7, "OW": 7}, 4) == (4,)  # 16 tiles in all
    assert winograd_tiles({**static, "OH": 13, "OW": 13}, 4) == (2,)  # 16 tiles, but 3/16 of each row wasted
    assert winograd_tiles({**static, "OH": 19, "OW": 19}, 4) == (4,)
    assert winograd_tiles({**static, "C": 512, "OC": 512}, 4) == (2,) and 512 * 512 == WINO4_MAX_WEIGHTS
    assert winograd_tiles({**static, "C": 256, "OC": 512, "OH": 28, "OW": 28}, 4) == (4,)
    with pytest.raises(DynshapeError, match="winograd_tile"):
        Options(winograd_tile=3)


@pytest.mark.parametrize("shape", [(1, 32, 19, 19), (1, 32, 13, 13), (4, 32, 7, 7), (1, 32, 7, 7), (2, 32, 6, 40)])
def test_a_generic_build_takes_the_static_builds_tile_per_call(shape):
    """Both packings in one kernel, the call choosing by `wino4_pays`: the generic build's output equals the static
    build's bit for bit (the same C on the same numbers), where F(2x2) and F(4x4) round differently."""
    model = _conv(32, 32, {"pads": [1, 1, 1, 1]})
    generic = _check(model, [], 1, 4)
    assert _wino_steps(generic, 2) == 1  # one kernel holds both
    n, _, h, w = shape
    static = ds.compile(ds.load_onnx(model, dims={"n": n, "h": h, "w": w}), winograd_tile=4, winograd_min_channels=16)
    pays = all(wino4_pays(n, h, w))
    assert _wino_steps(static, 4) == int(pays) and _wino_steps(static, 2) == int(not pays)
    # explain says how each kernel computes
    [method] = [k["method"] for k in generic.explain_build()["kernels"]]
    assert "F(4x4)" in method and "F(2x2)" in method and "call's map" in method
    assert [k["method"] for k in static.explain_build()["kernels"]] == [f"Winograd F({4 if pays else 2}x"
                                                                       f"{4 if pays else 2})"]
    other = ds.compile(ds.load_onnx(model, dims={"n": n, "h": h, "w": w}), winograd_tile=2, winograd_min_channels=16)
    x = RNG.standard_normal(shape).astype(np.float32)
    got = generic.run({"x": x})["y"]
    assert np.array_equal(got, static.run({"x": x})["y"])
    if pays:  # and not the other tile's
        assert not np.array_equal(got, other.run({"x": x})["y"])


def test_where_few_tiles_take_the_implicit_gemm():
    """Under winograd_min_tiles F(2x2) tiles (all images) the implicit GEMM: a static map decides at compile time
    (Winograd's weights alone, or the GEMM's alone), a runtime map packs both and the call decides; 0 turns the
    choice off."""
    assert not wino_pays(1, 3, 3, 16) and not wino_pays(1, 6, 6, 16) and not wino_pays(3, 3, 3, 16)
    assert wino_pays(1, 7, 7, 16) and wino_pays(1, 8, 8, 16) and wino_pays(4, 3, 3, 16) and wino_pays(1, 1, 1, 0)
    geo = {"N": sym("n"), "C": 64, "OC": 64, "OH": sym("h"), "OW": sym("w")}
    assert direct_beside(geo, 16) is True and direct_beside(geo, 0) is False
    static = {**geo, "N": 1, "OH": 6, "OW": 6}
    assert direct_beside(static, 16) is None and direct_beside({**static, "OH": 8, "OW": 8}, 16) is False
    assert direct_beside(static, 9) is False  # 3 x 3 tiles
    for bad in (-1, 1.5, True):
        with pytest.raises(DynshapeError, match="winograd_min_tiles"):
            Options(winograd_min_tiles=bad)


@pytest.mark.parametrize("shape", [(1, 64, 3, 3), (3, 64, 3, 3), (1, 64, 6, 6), (1, 64, 5, 9), (1, 64, 7, 7),
                                   (4, 64, 3, 3), (2, 64, 13, 11)])
def test_a_generic_build_takes_the_implicit_gemm_on_few_tiles_per_call(shape):
    """The generic build's output equals, bit for bit, the static build's, which made the same choice at compile
    time, and differs from the other method's rounding; both agree with the reference."""
    model = _conv(64, 64, {"pads": [1, 1, 1, 1]})
    generic = ds.compile(ds.load_onnx(model, dims=DIMS))
    [method] = [k["method"] for k in generic.explain_build()["kernels"]]
    assert "implicit GEMM where the call's map has under 16 F(2x2) tiles" in method and "F(4x4)" in method
    n, _, h, w = shape
    g = ds.load_onnx(model, dims={"n": n, "h": h, "w": w})
    static = ds.compile(g)
    pays = wino_pays(n, h, w, 16)
    assert _wino_steps(static, 4) + _wino_steps(static, 2) == int(pays)
    other = ds.compile(g, winograd=False) if pays else ds.compile(g, winograd_min_tiles=0)
    assert _wino_steps(other, 4) + _wino_steps(other, 2) == int(not pays)
    x = RNG.standard_normal(shape).astype(np.float32)
    got = generic.run({"x": x})["y"]
    assert np.array_equal(got, static.run({"x": x})["y"])
    assert not np.array_equal(got, other.run({"x": x})["y"])
    assert_f32_close(got, g.run({"x": x})["y"], rtol=1e-4, scale=2e-5)


def test_written_into_a_concat_slice():
    w3 = (RNG.standard_normal((32, 16, 3, 3)) / 12).astype(np.float32)
    w1 = (RNG.standard_normal((8, 16, 1, 1)) / 4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w3"], ["a0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a0"], ["a"]),
             helper.make_node("Conv", ["x", "w1"], ["b"]), helper.make_node("Concat", ["b", "a"], ["c"], axis=1),
             helper.make_node("Sigmoid", ["c"], ["y"])]
    exe = _check(_model(nodes, 16, {"w3": w3, "w1": w1}), [(1, 16, 5, 7), (2, 16, 8, 3)], 1)
    assert exe.explain_build()["concat_slices"]


@pytest.mark.parametrize("ci,co,attrs", [(8, 16, {"pads": [1, 1, 1, 1]}), (16, 8, {"pads": [1, 1, 1, 1]}),
                                         (16, 16, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
                                         (16, 16, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
                                         (32, 32, {"group": 2, "pads": [1, 1, 1, 1]})])
def test_convolutions_it_does_not_take_run_on_implicit_gemm(ci, co, attrs):
    groups = attrs.get("group", 1)
    w = (RNG.standard_normal((co, ci // groups, 3, 3)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], **attrs)]
    _check(_model(nodes, ci, {"w": w}), [(1, ci, 7, 8)], 0)


def test_the_options_turn_it_off_or_pick_the_tile_and_all_agree():
    model = _conv(32, 32, {"pads": [1, 1, 1, 1]})
    x = RNG.standard_normal((2, 32, 11, 10)).astype(np.float32)
    f4, f2 = _check(model, [], 1, 4), _check(model, [], 1, 2)
    off = _check(model, [], 0, winograd=False)
    for exe in (f4, f2):
        assert_f32_close(exe.run({"x": x})["y"], off.run({"x": x})["y"], rtol=1e-4, scale=1e-5)
    assert len({e.options.build_key() for e in (f4, f2, off)}) == 3


@pytest.mark.parametrize("tile", TILES)
def test_weight_transform_is_g_w_gt_per_position(tile):
    """pack_winograd's position (a, b) of output channel o, input channel c is (G w[o, c] G^T)[a, b]; G is the
    one whose transforms compute a 3-tap correlation exactly (checked here in float64 on one 1-D tile)."""
    g = WINOGRAD_G[tile]
    n = tile + 2
    w = RNG.standard_normal((40, 16, 3, 3)).astype(np.float32)
    packed = pack_winograd(w, tile)
    assert packed.shape == (n * n, 2, 16, 32) and packed.ctypes.data % 64 == 0
    for o, c in [(0, 0), (39, 15), (33, 7)]:
        u = g @ w[o, c].astype(np.float64) @ g.T
        got = np.array([[packed[a * n + b, o // 32, c, o % 32] for b in range(n)] for a in range(n)])
        np.testing.assert_allclose(got, u, rtol=2e-7, atol=1e-8)  # the float64 value, rounded once
    assert not packed[:, 1, :, 8:].any()  # panel padding past 40 output channels


@pytest.mark.parametrize("tile", TILES)
def test_the_parallel_paths(tile):
    """Work over the parallel threshold: a 40x40 map in many blocks (whole blocks per thread, each its own
    scratch) and a short wide one in few blocks (the team sharing each chunk), both against the reference."""
    _check(_conv(32, 48, {"pads": [1, 1, 1, 1]}), [(2, 32, 40, 40), (1, 32, 4, 300), (3, 32, 23, 17)], 1, tile)


def test_its_scratch_is_reported_beside_the_arena():
    exe = _check(_conv(32, 48, {"pads": [1, 1, 1, 1]}), [(1, 32, 9, 9)], 1, 4)
    scratch = exe.explain_strategy()["memory"]["kernel_scratch"]
    assert scratch["bytes_per_thread"] == 4 * 36 * WINO_TILES[4] * (32 + 48)
    assert "outside the arena" in scratch["text"]
    off = _check(_conv(32, 48, {"pads": [1, 1, 1, 1]}), [], 0, winograd=False)
    assert off.explain_strategy()["memory"]["kernel_scratch"] is None


def test_winograd_min_channels_default_follows_the_vector_width():
    """None: 16 input channels where the kernels run on AVX-512, 32 without (the transforms cost relatively more on
    8-float vectors); a value given is taken as is, and below it a Winograd-shaped conv is an implicit GEMM."""
    from dynshape.codegen import bf16
    from dynshape.codegen.lower.conv import winograd_min_channels

    want = 16 if "avx512f" in bf16.cpu_flags() else 32
    assert winograd_min_channels(Options()) == want and winograd_min_channels(Options(winograd_min_channels=8)) == 8
    model = _conv(32, 32, {"pads": [1, 1, 1, 1]})
    few = ds.compile(ds.load_onnx(model, dims=DIMS), winograd_min_channels=33, winograd_min_tiles=0)
    many = ds.compile(ds.load_onnx(model, dims=DIMS), winograd_min_channels=32, winograd_min_tiles=0)
    assert _wino_steps(few, 4) + _wino_steps(few, 2) == 0 and _wino_steps(many, 4) == 1
    with pytest.raises(DynshapeError, match="winograd_min_channels"):
        Options(winograd_min_channels=-1)
