"""Worst-case memory from the symbol ranges: budgets refused at compile and call time, preallocated arenas."""

import re
import threading
import tracemalloc

import numpy as np
import pytest

import dynshape as ds
from dynshape.models.encoder import build_encoder
from dynshape.models.mlp import build_mlp
from dynshape.runtime.budget import parse_bytes


def _x(b, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal((b, 64)).astype(np.float32)}


def _graph(hi=1024):
    return ds.load_onnx(build_mlp(), dims={"batch": (1, hi)})


def test_the_worst_case_bounds_every_shape():
    graph = ds.load_onnx(build_encoder(layers=1, hidden=32), dims={"batch": (1, 4), "seq": (1, 32)})
    exe = ds.compile(graph, strategy="generic")
    w = exe.worst_case_memory()
    assert w.at == {"batch": 4, "seq": 32} and w.monotone and w.layout <= w.sound
    assert w.sound == w.expr.evaluate(w.at) and {"batch", "seq"} <= w.expr.free_symbols
    planner = exe.generic.planner
    for key in [(1, 1), (4, 32), (3, 31), (2, 17), (4, 1), (1, 32)]:
        _, _, total = planner.layout(key)
        assert total <= w.reserve
    assert re.search(r"arena [\d.]+ KiB: layout at the upper bounds \(batch=4, seq=32\)", w.text())


def test_parse_bytes():
    assert [parse_bytes(x) for x in ("2GiB", "512 MiB", "1.5GB", "4096", 7)] == [2**31, 2**29, 1_500_000_000, 4096, 7]
    with pytest.raises(ds.DynshapeError, match="memory_budget='lots'"):
        parse_bytes("lots")


def test_a_budget_below_the_worst_case_is_refused_at_compile_time_with_the_range_that_fits():
    graph = _graph()
    reserve = ds.compile(graph, strategy="generic").worst_case_memory().reserve
    budget = reserve // 3
    with pytest.raises(ds.DynshapeError, match=r"it grows with batch") as e:
        ds.compile(graph, memory_budget=budget)
    m = int(re.search(r"batch <= (\d+) fits", str(e.value)).group(1))
    assert 1 <= m < 1024
    ds.compile(_graph(m), memory_budget=budget)  # the range it names fits ...
    with pytest.raises(ds.DynshapeError, match="worst-case arena"):  # ... and one more does not
        ds.compile(_graph(m + 1), memory_budget=budget)


def test_over_budget_calls_are_refused_before_allocating():
    exe = ds.compile(_graph(), memory_budget="96KiB", over_budget="refuse_calls", arenas=1)
    small = exe.run(_x(16))["y"]
    arena = exe.stats()["arena_bytes"]
    assert arena == 96 * 1024
    with pytest.raises(ds.ConstraintViolation, match=r"batch=1000 needs a [\d.]+ KiB arena; refused before allocating"
                                                     r" \(.*batch <= \d+ fits"):
        exe.run(_x(1000))
    assert exe.stats()["arena_bytes"] == arena
    np.testing.assert_array_equal(exe.run(_x(16))["y"], small)


@pytest.mark.parametrize("kw", [{"memory_budget": "1GiB"}, {"preallocate": True}])
def test_an_unbounded_symbol_cannot_be_budgeted(kw):
    graph = ds.load_onnx(build_mlp())
    with pytest.raises(ds.DynshapeError, match="batch is unbounded; declare a max"):
        ds.compile(graph, **kw)
    with pytest.raises(ds.DynshapeError, match="planned=False"):
        ds.compile(_graph(), planned=False, **kw)


def _traced_peak(exe, feeds) -> int:
    tracemalloc.start()
    try:
        for f in feeds:
            exe.run(f)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_preallocate_reserves_the_worst_case_once():
    graph = _graph()
    feeds = [_x(b) for b in (1, 1024, 7, 600, 1024, 3, 333)]  # new shapes, growing and shrinking
    pre = ds.compile(graph, strategy="generic", preallocate=True, arenas=1)
    arena = pre.stats()["arena_bytes"]
    assert arena == pre.worst_case_memory().reserve > 0
    peak = _traced_peak(pre, feeds)
    assert pre.stats()["arena_bytes"] == arena
    assert peak < arena // 2  # outputs and bound plans only: no arena was allocated on the request path
    plain = ds.compile(graph, strategy="generic", arenas=1)
    assert _traced_peak(plain, feeds) >= arena  # without it, the first large call allocates its arena
    for f in feeds:
        np.testing.assert_array_equal(pre.run(f)["y"], plain.run(f)["y"])


def test_concurrent_calls_each_take_a_preallocated_arena():
    exe = ds.compile(_graph(), strategy="generic", preallocate=True, arenas=3)
    arena = exe.stats()["arena_bytes"]
    want = {b: exe.run(_x(b, b))["y"] for b in (5, 300, 1024, 77)}
    errors: list = []

    def worker():
        for b in (5, 300, 1024, 77) * 5:
            if not np.array_equal(exe.run(_x(b, b))["y"], want[b]):
                errors.append(b)

    threads = [threading.Thread(target=worker) for _ in range(6)]  # more threads than arenas: they wait
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and exe.stats()["arena_bytes"] == arena and len(exe.arenas) == 3
