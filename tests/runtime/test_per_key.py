"""Values that depend only on the key (shape-built ids and masks) are computed once per key, never per call."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.frontends.onnx import load_onnx


def _positions_model(max_seq: int = 32, width: int = 4, rows: int = 32):
    """y = x + emb[Range(0, seq)]: the gather of position embeddings (a table of `rows`) depends on the key
    alone."""
    emb = np.arange(rows * width, dtype=np.float32).reshape(rows, width)
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], start=0, end=1),
        helper.make_node("Squeeze", ["shp"], ["seq"]),
        helper.make_node("Range", ["zero", "seq", "one"], ["pos"]),
        helper.make_node("Gather", ["emb", "pos"], ["pe"]),
        helper.make_node("Add", ["x", "pe"], ["y"]),
    ]
    consts = [numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(np.array(0, np.int64), "zero"),
              numpy_helper.from_array(np.array(1, np.int64), "one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), dims={"seq": (1, max_seq)})


def test_key_only_steps_leave_the_request_path_and_stay_right_across_keys():
    exe = ds.compile(_positions_model())
    planner = exe.generic.planner
    assert [exe.generic.steps[i].op for i in planner.per_key] == ["Range", "Gather"]
    emb = np.arange(32 * 4, dtype=np.float32).reshape(32, 4)
    for seq in (3, 17, 3, 32, 1):  # keys interleaved: each plan keeps its own per-key values
        x = np.full((seq, 4), 0.5, np.float32)
        np.testing.assert_array_equal(exe.run({"x": x})["y"], x + emb[:seq])


def _gather_nd_model(indices: np.ndarray):
    node = helper.make_node("GatherND", ["x", "idx"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(indices, "idx")])
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))


def test_gather_nd_with_fixed_indices_matches_the_reference_and_refuses_out_of_range():
    idx = np.array([[0, 1], [-1, 3], [2, -4]], np.int64)
    g = _gather_nd_model(idx)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(ds.compile(g).run({"x": x})["y"], g.run({"x": x})["y"])
    bad = ds.compile(_gather_nd_model(np.array([[0, 4]], np.int64)))
    with pytest.raises(ds.DynshapeError, match="GatherND"):
        bad.run({"x": x})


def test_arena_growth_keeps_earlier_plans_and_caps_stale_buffers():
    """A key planned before the arena grew is not re-planned afterwards (no latency spike after warm-up)."""
    from dynshape.runtime.arenas import Arena, grow
    from dynshape.runtime.plan_cache import PlanCache

    exe = ds.compile(_positions_model(), strategy="generic", bucket_plans=False)
    small, big = np.zeros((2, 4), np.float32), np.zeros((32, 4), np.float32)
    exe.run({"x": small})
    arena = exe.arenas[0]
    before = dict(arena.plans)
    exe.run({"x": big})  # grows the arena
    assert all(arena.plans.get(k) is p for k, p in before.items())
    np.testing.assert_array_equal(exe.run({"x": small})["y"], small + np.arange(8, dtype=np.float32).reshape(2, 4))

    class Plan:  # what grow() looks at: the buffer a plan is bound to (and the bytes the cache counts)
        nbytes = 0

        def __init__(self, n):
            self.arena = np.empty(n, np.uint8)

    a = Arena(0)
    a.plans = PlanCache({1: Plan(100), 2: Plan(400), 3: Plan(400)})
    a.plans[3].arena = a.plans[2].arena  # two plans on one buffer
    grow(a, 400)  # new buffer 500 bytes: stale 500 fits, nothing dropped
    assert set(a.plans) == {1, 2, 3}
    grow(a, 340)  # new buffer 425 bytes: stale 500 too much, the oldest (smallest) buffer's plans go first
    assert set(a.plans) == {2, 3}


def test_plan_cache_is_capped_by_the_bytes_its_per_key_values_hold(monkeypatch):
    from dynshape.runtime import memory

    monkeypatch.setattr(memory, "PLAN_BYTES", 3 * 32 * 24)  # per key: 8*seq (ids) + 16*seq (embeddings)
    exe = ds.compile(_positions_model(), strategy="generic", bucket_plans=False)
    for seq in (32, 31, 30, 29, 28):
        exe.run({"x": np.zeros((seq, 4), np.float32)})
    plans = exe.arenas[0].plans
    assert sum(p.nbytes for p in plans.values()) <= memory.PLAN_BYTES
    assert [k[1] for k in plans] == [(30,), (29,), (28,)]  # the oldest went first


def test_the_plan_cache_holds_at_most_plan_cache_plans_an_arena_oldest_first():
    for cap, kept in ((2, [(30,), (29,)]), (0, [])):
        exe = ds.compile(_positions_model(), strategy="generic", plan_cache=cap, arenas=1, bucket_plans=False)
        for seq in (32, 31, 30, 29):
            x = np.full((seq, 4), 1.0, np.float32)
            np.testing.assert_array_equal(exe.run({"x": x})["y"], 1 + np.arange(seq * 4, dtype=np.float32)
                                          .reshape(seq, 4))
        assert [k[1] for k in exe.arenas[0].plans] == kept
        assert any(o["name"] == "plan_cache" and o["value"] == cap for o in exe.options.explain())
    with pytest.raises(ds.DynshapeError, match="plan_cache"):
        ds.compile(_positions_model(), plan_cache=-1)


def test_a_per_key_step_that_fails_names_its_node_and_leaves_the_executable_usable():
    exe = ds.compile(_positions_model(max_seq=40), strategy="generic")  # the table has 32 rows
    with pytest.raises(ds.DynshapeError, match="Gather"):
        exe.run({"x": np.zeros((35, 4), np.float32)})
    x = np.zeros((3, 4), np.float32)
    np.testing.assert_array_equal(exe.run({"x": x})["y"], np.arange(12, dtype=np.float32).reshape(3, 4))


def test_a_memory_budget_also_bounds_the_per_key_values_plans_hold():
    """Per-key values live beside the arena: with a budget they get only what the arena leaves."""
    free = ds.compile(_positions_model(), strategy="generic", bucket_plans=False)
    arena = free.worst_case_memory().reserve
    exe = ds.compile(_positions_model(), strategy="generic", memory_budget=arena + 24 * 20, arenas=1,
                     bucket_plans=False)
    for seq, cached in [(8, [8]), (12, [8, 12]), (16, [16]), (4, [16, 4]), (32, [16, 4])]:  # 32: over it alone
        x = np.full((seq, 4), 2.0, np.float32)
        want = 2 + np.arange(seq * 4, dtype=np.float32).reshape(seq, 4)
        np.testing.assert_array_equal(exe.run({"x": x})["y"], want)
        plans = exe.arenas[0].plans
        assert [k[1][0] for k in plans] == cached  # 24 bytes a position, 480 beside the arena
        assert sum(p.nbytes for p in plans.values()) <= 24 * 20




def test_keys_that_agree_on_a_per_key_step_share_its_result():
    """Position embeddings depend on seq alone: the plans of (batch 1, seq 5) and (batch 3, seq 5) hold one array
    for them (the Planner's memo), a third key with another seq its own; values right for every key."""
    emb = np.arange(32 * 4, dtype=np.float32).reshape(32, 4)
    nodes = [helper.make_node("Shape", ["x"], ["shp"], start=1, end=2),
             helper.make_node("Squeeze", ["shp"], ["seq"]),
             helper.make_node("Range", ["zero", "seq", "one"], ["pos"]),
             helper.make_node("Gather", ["emb", "pos"], ["pe"]), helper.make_node("Add", ["x", "pe"], ["y"])]
    consts = [numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(np.array(0, np.int64), "zero"),
              numpy_helper.from_array(np.array(1, np.int64), "one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "seq", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    g = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                  dims={"b": (1, 4), "seq": (1, 32)})
    exe = ds.compile(g, strategy="generic", bucket_plans=False)
    for b, seq in ((1, 5), (3, 5), (2, 9), (1, 5)):
        x = np.full((b, seq, 4), 0.25, np.float32)
        np.testing.assert_array_equal(exe.run({"x": x})["y"], x + emb[:seq])
    plans = exe.arenas[0].plans
    held = {key[1]: {id(a) for a in p.keep
                     if isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape[-1:] == (4,)}
            for key, p in plans.items()}
    assert held[(1, 5)] and held[(1, 5)] == held[(3, 5)] and held[(1, 5)].isdisjoint(held[(2, 9)])


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_large_per_key_values_live_in_their_own_pages_and_leave_with_their_plan():
    """A per-key value of 64 KiB or more is copied into a mapping of its own (arenas.own_pages), so a plan the
    cache drops gives its pages back to the OS instead of leaving a hole in the heap; small ones stay in the
    heap. The positions model's gathered (seq, 64) table is 256 KiB at seq = 1024."""
    import mmap

    from dynshape.runtime.arenas import OWN_PAGES_MIN, own_pages

    small = np.ones(OWN_PAGES_MIN // 8 - 1)
    assert own_pages(small) is small
    big = np.arange(4 << 20, dtype=np.float32)  # 16 MiB
    mapped = own_pages(big)
    owner = _owner(mapped)
    assert isinstance(owner, mmap.mmap)
    assert mapped.shape == big.shape and mapped[::4099].tolist() == big[::4099].tolist()  # no heap temporaries
    held = _rss_bytes()
    del mapped, owner
    assert held - _rss_bytes() > 12 << 20  # its pages go back to the OS with the last reference

    exe = ds.compile(_positions_model(max_seq=1024, width=64, rows=1024), bucket_plans=False)
    exe.run({"x": np.zeros((1024, 64), np.float32)})
    (plan,) = [p for a in exe._pool.arenas for p in a.plans.values()]
    held = [v for v in plan.keep if isinstance(v, np.ndarray) and v.nbytes >= OWN_PAGES_MIN]
    assert held and all(isinstance(_owner(v), mmap.mmap) for v in held)


def _owner(a: np.ndarray) -> object:
    """What finally holds an array's memory (down its chain of bases)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def test_the_plan_cache_counts_its_bytes_as_plans_come_and_go():
    """PlanCache.held is kept as plans are added, replaced, popped and deleted (it replaced a sum over every
    cached plan per new plan), and the byte cap drops the oldest plans until the new one fits."""
    from dynshape.runtime.plan_cache import PlanCache

    class Plan:
        def __init__(self, n):
            self.nbytes = n

    c = PlanCache()
    for k, n in ((1, 10), (2, 20), (3, 30)):
        c.keep(k, Plan(n), cap_bytes=100)
    assert c.held == 60
    c[2] = Plan(5)
    assert c.held == 45
    c.pop(1)
    del c[3]
    assert c.held == 5 and list(c) == [2]
    c.keep(4, Plan(60), cap_bytes=100)
    c.keep(5, Plan(50), cap_bytes=100)  # 5 + 60 + 50 > 100: 2 then 4 go, oldest first
    assert list(c) == [5] and c.held == 50
    c.keep(6, Plan(1), cap_bytes=100, cap_plans=1)
    assert list(c) == [6] and c.held == 1
    c.clear()
    assert c.held == 0
