"""The data address of a numpy array in about 0.1 us, where `a.ctypes.data` costs about 1 us.

Why: a planned call points its programs at the caller's arrays (inputs read where they lie, `out=` arrays written
where they lie) and needs each one's address on every call. `a.ctypes.data` builds a helper object per read and
`a.__array_interface__` a dict (both ~1 us): five of them were ~5 us of a decoder step's ~45 us (three inputs
and two KV outputs), and one was 1 us of a 7 us MLP call.

How: CPython's `id(a)` is the object's address (a documented implementation detail), and the data pointer is the
first field after the object header in numpy's array struct (`PyArrayObject_fields.data`: numpy keeps it there
for binary compatibility, since extensions built against numpy 1.x read it inline through `PyArray_DATA`).
The offset is checked at import against `a.ctypes.data` on arrays of several kinds (owning, views at offsets,
reshaped, 0-d, of a foreign buffer); where it does not hold (another interpreter or numpy), every read takes the
documented `a.ctypes.data` instead, so a wrong offset can cost speed, never a wrong address.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

import numpy as np


def slow_address(a: np.ndarray) -> int:
    """The documented way (numpy's ctypes helper)."""
    return a.ctypes.data


def _fast_reader() -> Callable[[np.ndarray], int] | None:
    """The struct read, or None where the layout assumed above does not hold on this interpreter."""
    if sys.implementation.name != "cpython":
        return None
    header = object.__basicsize__  # the PyObject header (16 bytes; larger on free-threaded builds)
    read = ctypes.c_void_p.from_address

    def fast(a: np.ndarray) -> int:
        return read(id(a) + header).value

    base = np.arange(64, dtype=np.float32)
    probes = [base, base[5:], base[3:].reshape(1, 61)[:, 7:], base.reshape(8, 8)[2:, 1:], np.array(1.5),
              np.frombuffer(bytearray(40), np.int64)[1:], np.empty((3, 0)), base.view(np.uint8)[1:]]
    try:
        if all(fast(p) == p.ctypes.data for p in probes):
            return fast
    except Exception:  # noqa: BLE001 - any surprise: the documented way
        pass
    return None


address: Callable[[np.ndarray], int] = _fast_reader() or slow_address
"""`address(a)`: the data address of `a`, a numpy array (an ndarray or a subclass: callers check the type)."""
