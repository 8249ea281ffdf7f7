"""Native data movement (codegen/lower/movement.py): the strided views a Transpose or Expand binds, merged and
copied in C (`ds_copy_strided`, or `ds_permute_rows` for a small inner block moved per row), against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen.lower.movement import ROW_TABLE_MAX, _is_shuffle, _merged, _row_table

RNG = np.random.default_rng(3)


def test_merged_dims_address_the_same_elements():
    base = np.arange(2 * 5 * 6 * 112, dtype=np.float32).reshape(2, 5, 6, 4, 28)
    for view in (base.transpose(0, 1, 2, 4, 3), base, base[:, :, :3], base.transpose(3, 0, 1, 2, 4),
                 np.broadcast_to(base[:, :1], (2, 7, 6, 4, 28)), base[:, 2:3]):
        shape, strides = _merged(view.shape, view.strides)
        again = np.lib.stride_tricks.as_strided(view, shape, strides)
        np.testing.assert_array_equal(again.reshape(view.shape), view)
        assert len(shape) <= view.ndim


def test_row_table_only_for_small_non_contiguous_inner_blocks():
    x = np.zeros((10, 4, 28), np.float32)
    t = _row_table(*_merged(x.transpose(0, 2, 1).shape, x.transpose(0, 2, 1).strides), 4)
    assert t is not None and t.dtype == np.int32 and list(t[:5]) == [0, 28, 56, 84, 1]
    assert _row_table(*_merged(x.shape, x.strides), 4) is None  # contiguous: one memcpy
    big = np.zeros((3, 40, 40), np.float32).transpose(0, 2, 1)
    assert 40 * 40 > ROW_TABLE_MAX and _row_table(*_merged(big.shape, big.strides), 4) is None
    assert _row_table([10, 4, 28], [448, 4, 112], 8) is None  # 8-byte elements take the strided copy


def test_channel_shuffles_are_told_apart_from_other_transposes():
    x = np.zeros((6, 7, 4, 34), np.float32)
    assert _is_shuffle(*_merged(x.transpose(0, 1, 3, 2).shape, x.transpose(0, 1, 3, 2).strides), 4)
    assert not _is_shuffle(*_merged(x.shape, x.strides), 4)  # contiguous
    y = np.zeros((6, 7, 3, 34), np.float32)  # 3 groups: the row table
    assert not _is_shuffle(*_merged(y.transpose(0, 1, 3, 2).shape, y.transpose(0, 1, 3, 2).strides), 4)
    z = np.zeros((6, 4, 5, 34), np.float32)  # not the last two dims
    assert not _is_shuffle(*_merged(z.transpose(0, 3, 2, 1).shape, z.transpose(0, 3, 2, 1).strides), 4)


def _run_transpose(shape, perm, dtype=TensorProto.FLOAT):
    names = [f"d{i}" for i in range(len(shape))]
    node = helper.make_node("Transpose", ["x"], ["y"], perm=list(perm))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", dtype, names)],
                          [helper.make_tensor_value_info("y", dtype, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    exe = ds.compile(ds.load_onnx(m.SerializeToString(), dims={n: (0, 64) for n in names}))
    assert [s.how for s in exe.generic.steps] == ["native"]
    return exe


@pytest.mark.parametrize("shape,perm", [((2, 5, 6, 4, 28), (0, 1, 2, 4, 3)), ((3, 7, 3, 5), (0, 1, 3, 2)),
                                        ((4, 2, 3, 17), (0, 3, 2, 1)), ((1, 9, 1, 4, 2), (4, 0, 1, 3, 2)),
                                        ((6, 64, 40), (0, 2, 1)), ((0, 4, 3), (0, 2, 1)), ((5, 1, 3), (0, 2, 1)),
                                        ((2, 3, 9, 7), (0, 2, 3, 1)), ((1, 4, 33, 40), (0, 2, 3, 1)),
                                        ((3, 3, 1, 5), (0, 2, 3, 1)),
                                        # the 8 x 8 register blocks (AVX): both loop orders, 16- and 8-column
                                        # passes, and the rows and columns past the last whole block
                                        ((1, 23, 19, 40), (0, 3, 1, 2)), ((1, 20, 9, 9), (0, 2, 3, 1)),
                                        ((3, 40, 24), (0, 2, 1)), ((2, 13, 45), (0, 2, 1)), ((2, 64, 13), (0, 2, 1)),
                                        # channel shuffles of 2, 4 and 8 groups (ds_shuffle_rows), n % 8 != 0
                                        ((3, 7, 2, 13), (0, 1, 3, 2)), ((4, 9, 4, 34), (0, 1, 3, 2)),
                                        ((2, 3, 8, 20), (0, 1, 3, 2)), ((5, 3, 17), (0, 2, 1)),
                                        # short contiguous runs by the row table (MobileViT's unfold and fold)
                                        ((7, 2, 12, 2), (0, 2, 1, 3)), ((3, 4, 5, 6, 3), (0, 3, 2, 1, 4))])
def test_transposes_match_numpy(shape, perm):
    exe = _run_transpose(shape, perm)
    for dt in (np.float32,):
        x = RNG.standard_normal(shape).astype(dt)
        np.testing.assert_array_equal(exe.run({"x": x})["y"], x.transpose(perm))


def test_a_large_channel_shuffle_shared_by_the_threads_matches_numpy():
    """From 256 KB the rows of ds_permute_rows are split between the threads (OpenMP's default: every core):
    every row still lands once, in its place."""
    exe = _run_transpose((1, 56, 57, 3, 40), (0, 1, 2, 4, 3))  # 1.5 MB, an odd row count
    x = RNG.standard_normal((1, 56, 57, 3, 40)).astype(np.float32)
    np.testing.assert_array_equal(exe.run({"x": x})["y"], x.transpose(0, 1, 2, 4, 3))


@pytest.mark.parametrize("shape,perm", [((9, 60, 3, 41), (1, 0, 3, 2)), ((19, 61, 62), (0, 2, 1)),
                                        ((5, 4, 63, 64), (3, 1, 0, 2))])
def test_large_strided_copies_shared_by_the_threads_match_numpy(shape, perm):
    """From 256 KB ds_copy_strided splits the outermost dim between the threads (odd counts, each thread's share
    a sub-view of its own): every element still lands once, in its place."""
    exe = _run_transpose(shape, perm)
    x = RNG.standard_normal(shape).astype(np.float32)
    assert x.nbytes >= 1 << 18
    np.testing.assert_array_equal(exe.run({"x": x})["y"], x.transpose(perm))


def test_int64_transpose_takes_the_strided_copy():
    exe = _run_transpose((3, 4, 5), (0, 2, 1), TensorProto.INT64)
    x = RNG.integers(-100, 100, (3, 4, 5)).astype(np.int64)
    np.testing.assert_array_equal(exe.run({"x": x})["y"], x.transpose(0, 2, 1))


def _pad_model(mode, pads, axes=None):
    ins = ["x", "pads"] + (["", "axes"] if axes is not None else [])
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads")]
    if axes is not None:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
    node = helper.make_node("Pad", ins, ["y"], mode=mode)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", "c"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    return ds.load_onnx(m.SerializeToString(), dims={"a": (1, 8), "b": (1, 64), "c": (1, 64)})


@pytest.mark.parametrize("mode", ["edge", "reflect", "wrap"])
@pytest.mark.parametrize("pads,axes", [([0, 0, 3, 0, 0, 2], None), ([0, 2, 1, 1, 0, 4], None),
                                        ([1, 3, 2, 2], [1, 2]), ([0, -1, 2, 0, 1, -2], None), ([2, 5], [-1])])
def test_edge_reflect_and_wrap_pads_are_native_and_match_the_reference(mode, pads, axes):
    g = _pad_model(mode, pads, axes)
    exe = ds.compile(g)
    assert [s.how for s in exe.generic.steps] == ["native"]
    for shape in [(1, 6, 9), (2, 7, 5), (3, 4, 7)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(exe.run({"x": x})["y"], g.run({"x": x})["y"])


def test_a_large_concat_shared_by_the_threads_matches_numpy():
    """Over DS_CONCAT_PAR_BYTES (1 MiB) the rows are copied on every thread; under it on one."""
    node = helper.make_node("Concat", ["x", "x2"], ["y"], axis=2)
    sq = helper.make_node("Mul", ["x", "x"], ["x2"])
    g = helper.make_graph([sq, node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", "c"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    exe = ds.compile(ds.load_onnx(m.SerializeToString(), dims={"a": (1, 4), "b": (1, 2048), "c": (1, 512)}))
    for shape in [(2, 1500, 300), (1, 7, 5), (3, 2048, 1)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(exe.run({"x": x})["y"], np.concatenate([x, x * x], axis=2))
