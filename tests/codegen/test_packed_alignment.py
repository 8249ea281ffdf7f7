"""Packed weights start on a cache line: a 64-byte vector load of a panel must not straddle two lines."""

import numpy as np
import pytest

from dynshape.codegen import packed_gemm as pg

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("make", [
    lambda: pg.pack_b(RNG.standard_normal((2304, 256)).astype(np.float32)),  # the C packer
    lambda: pg.pack_b(RNG.standard_normal((30, 20)).astype(np.float32)),  # numpy's, for small matrices
    lambda: pg.pack_b(RNG.standard_normal((300, 500)).astype(np.float32), trans=True),
    lambda: pg.pack_conv(RNG.standard_normal((64, 16, 3, 3)).astype(np.float32), 1),
    lambda: pg.pack_conv(RNG.standard_normal((96, 16, 3, 3)).astype(np.float32), 2),
    lambda: pg.pack_taps(RNG.standard_normal((40, 1, 3, 3)).astype(np.float32)),
    lambda: pg.pack_deconv(RNG.standard_normal((8, 12, 2, 2)).astype(np.float32)),
    lambda: pg.aligned((3, 5)),
])
def test_packed_forms_are_cache_line_aligned(make):
    for _ in range(4):  # whatever the allocator hands out
        a = make()
        assert a.ctypes.data % 64 == 0 and a.flags.c_contiguous


def test_packing_values_unchanged():
    b = RNG.standard_normal((70, 45)).astype(np.float32)
    p = pg.pack_b(b)
    assert p.shape == (2, 70, 32)
    np.testing.assert_array_equal(p[0], b[:, :32])
    np.testing.assert_array_equal(p[1][:, :13], b[:, 32:])
    assert not p[1][:, 13:].any()
    w = RNG.standard_normal((40, 1, 3, 3)).astype(np.float32)
    np.testing.assert_array_equal(pg.pack_taps(w), w.reshape(40, 9).T)
