"""The plan's program runner: strided copies in C and many pre-bound calls in one foreign call."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from dynshape.codegen import program
from dynshape.codegen.keep import Keep, resolved
from dynshape.codegen.lowering import NativeCall
from dynshape.runtime.programs import pack_programs


@pytest.fixture(scope="module")
def lib():
    lib = program.LIBRARY.try_load()
    if lib is None:
        pytest.skip("no C compiler")
    return lib


def _copy(lib, src: np.ndarray) -> np.ndarray:
    out = np.empty(src.shape, src.dtype)
    desc = np.array([src.ndim, src.itemsize, out.ctypes.data, src.ctypes.data, *src.shape, *src.strides], np.int64)
    lib.ds_copy_strided(desc.ctypes.data)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint8, np.float16, np.int32])
def test_strided_copy_matches_numpy(lib, dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 5, 4, 7)) * 10).astype(dtype)
    views = [x.transpose(0, 2, 1, 3), x.transpose(3, 1, 0, 2), x[:, ::2, 1:, ::-1],
             np.broadcast_to(x[:, :1], (3, 6, 4, 7)),
             np.broadcast_to(x[0, 0, 0, 0], (2, 3)), x[:0], x[0, 0, 0, 0, ...], x.reshape(-1)[::3],
             x.transpose(0, 1, 3, 2), x[:, 1].transpose(0, 2, 1), np.ascontiguousarray(x[0, 0]).T,
             np.tile(x, (1, 1, 6, 5)).transpose(1, 0, 3, 2)]  # matrix transposes, some beyond one 16 x 16 tile
    for v in views:
        np.testing.assert_array_equal(_copy(lib, v), v)


def test_consecutive_native_calls_run_as_one_program(lib):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b, c = np.empty((4, 3), np.float32), np.empty((3, 4), np.float32)
    keep = Keep()

    def copy_call(src, out):
        d = keep.table([src.ndim, src.itemsize, out.ctypes.data, src.ctypes.data, *src.shape, *src.strides])
        return NativeCall(lib.ds_copy_strided, (d,))

    seen = []
    calls = [copy_call(a.T, b), copy_call(b.T, c), lambda: seen.append(c.copy()), copy_call(a.T, b)]
    keep.seal()
    out, labels = pack_programs([resolved(call) for call in calls], ["t1", "t2", "py", "t3"], keep)
    assert len(out) == 3 and labels[0] == "t1 .. t2 (2 native steps)" and labels[1:] == ["py", "t3"]
    for call in out:
        call()
    np.testing.assert_array_equal(seen[0], a)
    np.testing.assert_array_equal(b, a.T)
    assert isinstance(out[0].fn, ctypes._CFuncPtr)
