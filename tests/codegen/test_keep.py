"""codegen/keep.py: a plan's small tables collected while it is bound and written into one buffer of their exact
size when it is sealed (each readable at its address for as long as the Keep lives), native calls given those
addresses, and views kept by their buffer."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynshape.codegen.keep import TABLE_ALIGN, Keep, TableRef, resolved
from dynshape.codegen.lowering import NativeCall


def _read(addr: int, n: int, dtype=np.int64) -> np.ndarray:
    """n values at a raw address (a copy)."""
    size = np.dtype(dtype).itemsize * n
    return np.frombuffer(ctypes.string_at(addr, size), dtype=dtype).copy()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-2**63, 2**63 - 1), min_size=0, max_size=200), min_size=1, max_size=40))
def test_every_table_reads_back_at_its_address_once_sealed(tables):
    # The collection below must find what this example made (the Keep, its buffer, the refs), not rescan the
    # session's heap: a full pass cost ~0.2 s an example late in the suite. Frozen objects are skipped; everything
    # made after the freeze is scanned and freed as before.
    gc.freeze()
    try:
        keep = Keep()
        refs = [keep.table(t) for t in tables]
        keep.seal()
        gc.collect()
        for t, r in zip(tables, refs):
            assert r.addr % TABLE_ALIGN == 0 and r.data is None
            # inside a buffer the Keep holds (freed memory can still read back right)
            assert any(a.ctypes.data <= r.addr and r.addr + len(t) * 8 <= a.ctypes.data + a.nbytes for a in keep)
            np.testing.assert_array_equal(_read(r.addr, len(t)), np.array(t, dtype=np.int64))
    finally:
        gc.unfreeze()


def test_one_buffer_of_the_exact_size_per_seal():
    keep = Keep()
    for _ in range(100):
        keep.table(range(11))  # 88 bytes each
    keep.table([1, 2, 3], np.int32)  # 12 bytes, rounded to 16
    keep.seal()
    assert [a.nbytes for a in keep] == [100 * 88 + 16]
    later = keep.table([7])  # a second seal adds a second buffer
    keep.seal()
    assert len(keep) == 2 and keep[1].nbytes == 8 and _read(later.addr, 1)[0] == 7


def test_other_dtypes_and_the_caller_reusing_its_list():
    keep = Keep()
    vals = [1.5, -2.25]
    ref = keep.table(vals, np.float32)
    vals[0] = 9.0
    keep.seal()
    np.testing.assert_array_equal(_read(ref.addr, 2, np.float32), np.array([1.5, -2.25], np.float32))


def test_native_calls_get_the_addresses_and_refuse_unsealed_tables():
    keep = Keep()
    ref = keep.table([5, 6])
    call = NativeCall(print, (ref, 3))
    with pytest.raises(RuntimeError, match="not sealed"):
        resolved(call)
    keep.seal()
    done = resolved(call)
    assert done.args == (ref.addr, 3) and all(type(a) is int for a in done.args)
    assert resolved(done) is done and not isinstance(done.args[0], TableRef)
    other = lambda: None  # noqa: E731 - any other call is left as it is
    assert resolved(other) is other


def test_hold_keeps_the_buffer_under_a_view():
    base = np.arange(24.0).reshape(4, 6)
    view = base.T[1:, ::2]
    keep = Keep()
    keep.hold(view)
    assert len(keep) == 1 and keep[0].base is None and np.shares_memory(keep[0], view)
