"""The compiled per-call binder: binds symbols, and rejects every bad feed with the precise message."""

import numpy as np
import pytest

import dynshape as ds
from dynshape.runtime.binder import InputSpec, make_binder


@pytest.fixture()
def bert_binder():
    b, s = ds.sym("batch", max=64), ds.sym("seq", max=512)
    ins = [InputSpec("ids", np.dtype("int64"), (b, s)), InputSpec("mask", np.dtype("int64"), (b, s))]
    return make_binder(ins, [])


def test_binds_symbols_in_order(bert_binder):
    x = np.zeros((3, 17), np.int64)
    arrays, key = bert_binder({"ids": x, "mask": x})
    assert key == (3, 17) and arrays[0] is x


@pytest.mark.parametrize(
    "feed, message",
    [
        ({"ids": np.zeros((2, 4), np.int64)}, "missing \\['mask'\\]"),
        ({"ids": np.zeros((2, 4), np.int64), "mask": np.zeros((3, 4), np.int64)}, "axis 0 .* is 3, but it must equal"),
        ({"ids": np.zeros((2, 4), np.int64), "mask": np.zeros((2, 4), np.int32)}, "'mask': dtype int32"),
        ({"ids": np.zeros((2, 600), np.int64), "mask": np.zeros((2, 600), np.int64)}, "seq = 600 is outside"),
        ({"ids": np.zeros((2, 4), np.int64), "mask": np.zeros((1, 2, 4), np.int64)}, "'mask': rank 3"),
        ({"ids": np.zeros((2, 4), np.int64), "mask": np.zeros((2, 4), np.int64), "x": 1}, "unexpected \\['x'\\]"),
    ],
)
def test_rejects_bad_feeds(bert_binder, feed, message):
    with pytest.raises(ds.ConstraintViolation, match=message):
        bert_binder(feed)


def test_linear_dims_and_residual_facts():
    m = ds.sym("m")
    bind = make_binder([InputSpec("x", np.dtype("float32"), (2 * m + 1, 64))], [(ds.divides(4, m), "Reshape_1")])
    assert bind({"x": np.zeros((9, 64), np.float32)})[1] == (4,)
    with pytest.raises(ds.ConstraintViolation, match="4 divides m .*Reshape_1.* m = 3"):
        bind({"x": np.zeros((7, 64), np.float32)})
    with pytest.raises(ds.ConstraintViolation, match="no integer solution"):
        bind({"x": np.zeros((8, 64), np.float32)})
    with pytest.raises(ds.ConstraintViolation):
        bind({"x": np.zeros((9, 65), np.float32)})


def test_non_contiguous_input_is_checked_on_its_shape_and_handed_on_uncopied():
    """The binder never copies: the planned path copies into its arena, the unplanned one copies after the
    memory check (tests/hardening/test_bad_feeds.py)."""
    n = ds.sym("n")
    bind = make_binder([InputSpec("x", np.dtype("float32"), (n, 3))])
    base = np.arange(18, dtype=np.float32).reshape(6, 3)
    (arr,), key = bind({"x": base[::2]})
    assert key == (3,) and np.shares_memory(arr, base) and np.array_equal(arr, base[::2])
