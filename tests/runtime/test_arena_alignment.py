"""Arenas start on a cache line, so every planned buffer (offsets are multiples of 64) does too."""

from __future__ import annotations

import numpy as np
import pytest

from dynshape.runtime.arenas import ARENA_ALIGN, Arena, grow


@pytest.mark.parametrize("nbytes", [1, 1000, 1 << 20, (1 << 24) + 3])
def test_arena_buffers_start_on_a_cache_line(nbytes):
    a = Arena(nbytes)
    assert a.buf.ctypes.data % ARENA_ALIGN == 0 and a.buf.nbytes == nbytes and a.buf.dtype == np.uint8
    grow(a, nbytes * 2 + 5)
    assert a.buf.ctypes.data % ARENA_ALIGN == 0 and a.buf.nbytes >= nbytes * 2 + 5


def test_planned_activations_are_aligned():
    import dynshape as ds
    from dynshape.models.mlp import build_mlp

    exe = ds.compile(ds.load_onnx(build_mlp()))
    exe.run({"x": np.ones((3, 64), np.float32)})
    plans = [p for arena in exe.arenas for p in (*arena.plans.values(), *arena.buckets.values())]
    assert plans
    for p in plans:
        for view in p.inputs:
            if view is not None:
                assert view.ctypes.data % ARENA_ALIGN == 0
