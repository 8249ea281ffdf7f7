"""Gather's native lowering (codegen/lower/movement.py, ds_gather_rows in csrc/ds_program.c): indices read at run
time (a token's embedding row, a causal mask's columns picked at the position ids), any axis, indices of any rank,
negative ones counted from the end as ONNX defines, int32 / int64 indices, data of 1, 2, 4, 8 bytes and wider rows;
exact against numpy's take. An index out of range is never read: the call raises numpy's IndexError, naming the
node, and a later call with good indices is right again."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen.lower import movement

RNG = np.random.default_rng(11)
_ONNX = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64, np.int32: TensorProto.INT32,
         np.uint8: TensorProto.UINT8, np.float16: TensorProto.FLOAT16, np.bool_: TensorProto.BOOL}


def _model(dtype, idx_dtype, axis: int, rank: int, idx_rank: int, table: np.ndarray | None = None):
    """Gather(x, i) with symbolic dims; `table`: x is that initializer (an embedding), not an input."""
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=axis, name="gather_rows")
    ins = [helper.make_tensor_value_info("i", _ONNX[idx_dtype], [f"i{k}" for k in range(idx_rank)])]
    inits = []
    if table is None:
        ins.insert(0, helper.make_tensor_value_info("x", _ONNX[dtype], [f"x{k}" for k in range(rank)]))
    else:
        inits.append(numpy_helper.from_array(table, "x"))
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", _ONNX[dtype], None)], inits)
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))


def _data(dtype, shape):
    return (RNG.standard_normal(shape) * 100).astype(dtype)


@pytest.fixture
def calls(spy_native) -> list:
    return spy_native(movement, "ds_gather_rows_st")


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.float16, np.bool_])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("axis,cases", [
    (0, [((10, 4), (1, 1)), ((7, 3), (2, 5)), ((1, 1), (3, 1))]),  # embeddings: rows of 4 and 3 elements
    (1, [((2, 9, 3), (4, 1)), ((3, 5, 1), (2, 2))]),  # a middle axis: outer 2-3, inner 3 or 1 element
    (-1, [((2, 3, 7), (5,)), ((4, 1, 6), (3,))]),  # the last: one element a row
])
def test_gather_native_and_exact(calls, dtype, idx_dtype, axis, cases):
    exe = ds.compile(_model(dtype, idx_dtype, axis, len(cases[0][0]), len(cases[0][1])))
    for xs, ids in cases:
        x = _data(dtype, xs)
        n = xs[axis]
        i = RNG.integers(-n, n, ids).astype(idx_dtype)  # negative ones too
        want = np.take(x, i, axis=axis)
        got = exe.run({"x": x, "i": i})["y"]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert calls


def test_an_embedding_table_gathered_at_token_ids(calls):
    table = _data(np.float32, (50, 16))
    exe = ds.compile(_model(np.float32, np.int64, 0, 2, 2, table))
    for shape in [(1, 1), (2, 7), (3, 1)]:
        i = RNG.integers(0, 50, shape)
        np.testing.assert_array_equal(exe.run({"i": i})["y"], table[i])
    assert calls


@pytest.mark.parametrize("bad", [10, -11, 2**40])
def test_an_index_out_of_range_raises_naming_the_node(calls, bad):
    exe = ds.compile(_model(np.float32, np.int64, 0, 2, 2))
    x = _data(np.float32, (10, 3))
    i = np.zeros((2, 4), np.int64)
    np.testing.assert_array_equal(exe.run({"x": x, "i": i})["y"], x[i])
    i[1, 2] = bad
    with pytest.raises(ds.ConstraintViolation, match=rf"gather_rows.*index {bad} is out of bounds"):
        exe.run({"x": x, "i": i})
    i[1, 2] = -1  # the plan serves the next call as before
    np.testing.assert_array_equal(exe.run({"x": x, "i": i})["y"], x[i])
    assert calls


def _known_indices_model(idx: np.ndarray | None):
    """Gather(x, i) where i is known per key: a constant (`idx`), or (None) the rows of x reversed, n - 1 -
    Range(0, n) with n x's first dim: computed from the shape alone."""
    n = helper.make_node
    inits = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in (("zero", 0), ("one", 1))]
    if idx is not None:
        inits.append(numpy_helper.from_array(idx, "i"))
        nodes = []
    else:
        nodes = [n("Shape", ["x"], ["shp"]), n("Gather", ["shp", "zero"], ["len"]),
                 n("Range", ["zero", "len", "one"], ["pos"]), n("Sub", ["len", "one"], ["last"]),
                 n("Sub", ["last", "pos"], ["i"])]
    nodes.append(n("Gather", ["x", "i"], ["y"], axis=0, name="gather_known"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))


def test_indices_known_per_key_join_the_program(calls):
    """Indices computed from the shapes (reversed rows) or constant: checked when the plan is bound, then one
    native call in the plan's program; exact at every shape, and a bucket plan moved between shapes agrees."""
    exe = ds.compile(_known_indices_model(None))
    for shape in [(5, 3), (1, 4), (9, 2), (6, 3), (5, 3)]:
        x = _data(np.float32, shape)
        np.testing.assert_array_equal(exe.run({"x": x})["y"], x[::-1])
    exe = ds.compile(_known_indices_model(np.array([[2, -1], [0, 0]], np.int64)))
    x = _data(np.float32, (4, 3))
    np.testing.assert_array_equal(exe.run({"x": x})["y"], x[[[2, -1], [0, 0]]])
    assert calls


def test_a_known_index_out_of_range_is_refused_naming_the_node(calls):
    exe = ds.compile(_known_indices_model(np.array([0, 3], np.int64)))
    np.testing.assert_array_equal(exe.run({"x": np.ones((4, 2), np.float32)})["y"], np.ones((2, 2), np.float32))
    with pytest.raises(ds.ConstraintViolation, match=r"gather_known.*index 3 is out of bounds"):
        exe.run({"x": np.ones((3, 2), np.float32)})
    np.testing.assert_array_equal(exe.run({"x": np.ones((5, 2), np.float32)})["y"], np.ones((2, 2), np.float32))
