"""Tricky ONNX semantics of the reduction references, checked against brute-force python oracles."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dynshape.ops.reduce  # noqa: F401  (registers the ops)
from dynshape.ir.opdef import lookup as get


def ref(op: str, *inputs, **attrs):
    attrs.setdefault("_opset", 18)
    return get(op).reference(list(inputs), attrs)


def test_axes_attribute_and_input_agree() -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    old = ref("ReduceMean", x, axes=[0, -1], keepdims=0, _opset=13)[0]
    new = ref("ReduceMean", x, np.array([-1, 0], np.int64), keepdims=0)[0]
    np.testing.assert_array_equal(old, new)
    assert new.shape == (3,)
    assert new.tolist() == [float(np.mean([x[i, j, k] for i in range(2) for k in range(4)])) for j in range(3)]


def test_empty_axes_reduce_all_unless_noop() -> None:
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    (all_,) = ref("ReduceSum", x, np.array([], np.int64))
    assert all_.shape == (1, 1) and all_.item() == sum(range(6))
    (same,) = ref("ReduceSum", x, np.array([], np.int64), noop_with_empty_axes=1)
    np.testing.assert_array_equal(same, x)


@pytest.mark.parametrize(("op", "identity"), [
    ("ReduceSum", 0.0), ("ReduceProd", 1.0), ("ReduceMax", -np.inf), ("ReduceMin", np.inf),
    ("ReduceL1", 0.0), ("ReduceL2", 0.0), ("ReduceLogSum", -np.inf), ("ReduceLogSumExp", -np.inf),
    ("ReduceSumSquare", 0.0),
])
def test_empty_set_gives_the_identity(op: str, identity: float) -> None:
    x = np.zeros((2, 0, 4), np.float32)
    (y,) = ref(op, x, np.array([1], np.int64))
    assert y.shape == (2, 1, 4) and y.dtype == np.float32
    assert (y == identity).all()


def test_integer_sum_keeps_dtype_and_wraps() -> None:
    x = np.full((3,), 2**30, np.int32)
    (y,) = ref("ReduceSum", x, keepdims=0)
    assert y.dtype == np.int32
    assert int(y) == (3 * 2**30 + 2**31) % 2**32 - 2**31


def test_log_sum_exp_is_stable() -> None:
    x = np.array([[1000.0, 1000.0]], np.float32)
    (y,) = ref("ReduceLogSumExp", x, np.array([1], np.int64), keepdims=0)
    np.testing.assert_allclose(y, [1000 + np.log(2)], rtol=1e-6)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=8), st.booleans(), st.booleans())
def test_arg_reductions_pick_first_or_last(vals: list[int], last: bool, largest: bool) -> None:
    op = "ArgMax" if largest else "ArgMin"
    (i,) = ref(op, np.array(vals, np.int32), axis=0, keepdims=0, select_last_index=int(last))
    best = max(vals) if largest else min(vals)
    hits = [k for k, v in enumerate(vals) if v == best]
    assert i.dtype == np.int64 and int(i) == (hits[-1] if last else hits[0])


@settings(max_examples=50)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=9), st.booleans(), st.data())
def test_topk_orders_ties_by_index(vals: list[int], largest: bool, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(vals)))
    values, idx = ref("TopK", np.array(vals, np.float32), np.array([k], np.int64), largest=int(largest))
    key = (lambda i: (-vals[i], i)) if largest else (lambda i: (vals[i], i))
    expected = sorted(range(len(vals)), key=key)[:k]
    assert idx.tolist() == expected
    assert values.tolist() == [vals[i] for i in expected]


def test_topk_unsigned_largest() -> None:
    x = np.array([[0, 2**64 - 1, 5]], np.uint64)
    values, idx = ref("TopK", x, np.array([2], np.int64), axis=-1)
    assert idx.tolist() == [[1, 2]] and values.dtype == np.uint64


@pytest.mark.parametrize(("exclusive", "reverse"), list(itertools.product([0, 1], [0, 1])))
def test_cumsum_modes(exclusive: int, reverse: int) -> None:
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    (y,) = ref("CumSum", x, np.array(1, np.int32), exclusive=exclusive, reverse=reverse)
    assert y.dtype == np.int32
    for r in range(2):
        row = x[r].tolist()
        for j in range(3):
            span = range(j + 1, 3) if reverse else range(j)
            span = list(span) + ([] if exclusive else [j])
            assert y[r, j] == sum(row[t] for t in span)


def test_cumprod_exclusive_starts_at_one() -> None:
    (y,) = ref("CumProd", np.array([2.0, 3.0, 4.0], np.float32), np.array(0), exclusive=1)
    assert y.tolist() == [1.0, 2.0, 6.0]
