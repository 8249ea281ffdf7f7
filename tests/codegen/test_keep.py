"""codegen/keep.py: a plan's small tables packed into shared chunks (each readable at its address for as long as
the Keep lives, whatever is written after it), large ones in arrays of their own, and views kept by their
buffer."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dynshape.codegen.keep import FIRST_CHUNK_BYTES, MAX_CHUNK_BYTES, TABLE_ALIGN, Keep


def _read(addr: int, n: int, dtype=np.int64) -> np.ndarray:
    """n values at a raw address (a copy)."""
    size = np.dtype(dtype).itemsize * n
    return np.frombuffer(ctypes.string_at(addr, size), dtype=dtype).copy()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-2**63, 2**63 - 1), min_size=0, max_size=200), min_size=1, max_size=40))
def test_every_table_reads_back_after_later_ones(tables):
    keep = Keep()
    addrs = [keep.table(t) for t in tables]
    gc.collect()
    for t, a in zip(tables, addrs):
        assert a % TABLE_ALIGN == 0
        np.testing.assert_array_equal(_read(a, len(t)), np.array(t, dtype=np.int64))


def test_small_tables_share_chunks_that_grow_and_large_ones_do_not():
    keep = Keep()
    for _ in range(100):
        keep.table(range(11))  # 88 bytes each
    sizes = [a.nbytes for a in keep]
    assert sizes[0] == FIRST_CHUNK_BYTES and sizes[-1] == MAX_CHUNK_BYTES
    assert all(b == min(2 * a, MAX_CHUNK_BYTES) for a, b in zip(sizes, sizes[1:]))
    assert sum(s // 88 for s in sizes) >= 100 > sum(s // 88 for s in sizes[:-1])  # a new chunk only when full
    big = keep.table(range(MAX_CHUNK_BYTES // 16 + 1))
    assert keep[-1].nbytes == MAX_CHUNK_BYTES // 2 + 8 and keep[-1].ctypes.data == big  # its own array


def test_other_dtypes_and_the_caller_reusing_its_list():
    keep = Keep()
    vals = [1.5, -2.25]
    a = keep.table(vals, np.float32)
    vals[0] = 9.0
    np.testing.assert_array_equal(_read(a, 2, np.float32), np.array([1.5, -2.25], np.float32))


def test_hold_keeps_the_buffer_under_a_view():
    base = np.arange(24.0).reshape(4, 6)
    view = base.T[1:, ::2]
    keep = Keep()
    keep.hold(view)
    assert len(keep) == 1 and keep[0].base is None and np.shares_memory(keep[0], view)
