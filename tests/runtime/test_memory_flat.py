"""Memory stays flat: after warm-up, calls of random admissible shapes allocate nothing that stays."""

from __future__ import annotations

import gc
import sys
import tracemalloc

import numpy as np
import pytest

import dynshape as ds
from dynshape.frontends.onnx import load_onnx
from dynshape.models.mlp import build_mlp


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_random_shapes_after_warm_up_grow_neither_traced_nor_resident_memory():
    exe = ds.compile(load_onnx(build_mlp(), dims={"batch": (1, 64)}))
    rng = np.random.default_rng(0)
    feeds = {b: {"x": rng.standard_normal((b, 64)).astype(np.float32)} for b in range(1, 65)}
    draws = rng.integers(1, 65, size=4000)
    for b in range(1, 65):  # warm-up: every key once, then a random stretch
        exe.run(feeds[b])
    for b in draws[:1000]:
        exe.run(feeds[int(b)])
    gc.collect()
    tracemalloc.start()
    try:
        traced0, rss0 = tracemalloc.get_traced_memory()[0], _rss()
        for b in draws[1000:]:
            exe.run(feeds[int(b)])
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - traced0
        rss = _rss() - rss0
    finally:
        tracemalloc.stop()
    assert traced < 64 * 1024, f"{traced} bytes still allocated after 3,000 calls"
    assert rss < 0.01 * rss0, f"resident memory grew by {rss} bytes ({100 * rss / rss0:.2f}%)"
