"""Bucket plans (runtime/rekey.py): a key seen for the first time is served by its bucket's plan, moved to the key
in place. Every answer must be the one the key's own plan gives, bit for bit (the same kernels on the same
shapes; only the arena layout differs), whatever order the keys come in."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.frontends.onnx import load_onnx
from dynshape.runtime.rekey import bucket_of
from step_models import step_model

D, HEADS, VOCAB, POSITIONS = 32, 2, 50, 320


def _gpt_step_model():
    """A GPT-2-style decoder step: token and position embeddings (a Gather of the fed ids, and one of the position
    read from the past's length: a per-key value), Q/K/V, the KV cache concatenated (present outputs), a padding
    mask fed as int64 and cast, softmax attention, an output projection. What a decode loop calls per token."""
    rng = np.random.default_rng(0)
    hd = D // HEADS
    inits = {**{f"w{n}": (rng.standard_normal((D, D)) * 0.2).astype(np.float32) for n in "qkvo"},
             "wte": rng.standard_normal((VOCAB, D)).astype(np.float32),
             "wpe": rng.standard_normal((POSITIONS, D)).astype(np.float32),
             "shape4": np.array([0, 1, HEADS, hd], np.int64), "shape2": np.array([0, 1, D], np.int64),
             "two": np.array(2, np.int64), "one": np.array(1, np.int64), "axes12": np.array([1, 2], np.int64),
             "big": np.array(-1e4, np.float32), "onef": np.array(1.0, np.float32)}
    n = helper.make_node
    nodes = [n("Gather", ["wte", "ids"], ["tok"]),
             n("Shape", ["past_k"], ["pshape"]), n("Gather", ["pshape", "two"], ["past"]),
             n("Add", ["past", "one"], ["past1"]), n("Range", ["past", "past1", "one"], ["pos"]),
             n("Gather", ["wpe", "pos"], ["pemb"]), n("Add", ["tok", "pemb"], ["x"])]
    for w in "qkv":
        nodes += [n("MatMul", ["x", f"w{w}"], [f"{w}p"]), n("Reshape", [f"{w}p", "shape4"], [f"{w}r"]),
                  n("Transpose", [f"{w}r"], [f"{w}t"], perm=[0, 2, 1, 3])]
    nodes += [n("Concat", ["past_k", "kt"], ["present_k"], axis=2),
              n("Concat", ["past_v", "vt"], ["present_v"], axis=2),
              n("Transpose", ["present_k"], ["kT"], perm=[0, 1, 3, 2]),
              n("MatMul", ["qt", "kT"], ["s"]),
              n("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
              n("Unsqueeze", ["maskf", "axes12"], ["mask4"]),
              n("Sub", ["onef", "mask4"], ["hole"]), n("Mul", ["hole", "big"], ["bias"]),
              n("Add", ["s", "bias"], ["sb"]),
              n("Softmax", ["sb"], ["p"], axis=-1),
              n("MatMul", ["p", "present_v"], ["o"]),
              n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              n("Reshape", ["ot", "shape2"], ["o2"]),
              n("MatMul", ["o2", "wo"], ["y"])]
    return step_model(nodes, inits, HEADS, hd, "past_plus_1")


GRAPH = load_onnx(_gpt_step_model())


def _feed(rng, batch: int, past: int) -> dict:
    mask = np.ones((batch, past + 1), np.int64)
    mask[:, : rng.integers(0, past + 1)] = 0  # left padding, as a batched prompt has
    mask[:, -1] = 1
    return {"ids": rng.integers(0, VOCAB, (batch, 1)), "mask": mask,
            **{k: rng.standard_normal((batch, HEADS, past, D // HEADS)).astype(np.float32)
               for k in ("past_k", "past_v")}}


def fresh_pair() -> tuple:
    """The same graph twice: bucket plans on (the default), and every key on its own plan."""
    return ds.compile(GRAPH, strategy="generic"), ds.compile(GRAPH, strategy="generic", bucket_plans=False)


@pytest.fixture(scope="module")
def pair():
    return fresh_pair()


def test_buckets_are_quarter_octaves_within_declared_bounds():
    assert [bucket_of((v,))[0] for v in (0, 1, 7, 8, 9, 15, 16, 63, 64, 79, 80, 127, 128)] == \
        [0, 1, 7, 9, 9, 15, 19, 63, 79, 79, 95, 127, 159]
    assert bucket_of((64, 3), (70, None)) == (70, 3) and bucket_of((75,), (70,)) == (75,)
    assert [bucket_of((v,), fine=0)[0] for v in (0, 1, 2, 3, 4, 64, 127, 128)] == [0, 1, 3, 3, 7, 127, 127, 255]
    # a growing symbol (ahead 1) takes its next value's octave and `span` more; the others keep their own
    assert bucket_of((16, 5), fine=0, ahead=(1, 0)) == (31, 7)
    assert bucket_of((16, 5), fine=0, ahead=(1, 0), span=2) == (127, 7)
    assert bucket_of((31, 5), fine=0, ahead=(1, 0), span=3) == (511, 7)
    assert bucket_of((16, 5), (100, None), fine=0, ahead=(1, 0), span=3) == (100, 7)
    for v in range(0, 5000):  # each key in its bucket, its bucket at most 25% larger
        (top,) = bucket_of((v,))
        assert v <= top <= max(v, 1.25 * v + 1) and bucket_of((top,)) == (top,)


def test_a_decode_loop_on_bucket_plans_answers_as_its_own_plans(pair):
    """A 40-token loop feeding each present back as the next past, through out= buffers the loop owns: the
    first pass is served by bucket plans moved per token (no key's own plan is bound), the next two by the states
    the moves left, put back per token (runtime/key_states.py: still no own plan), each pass through new buffers
    (the earlier ones kept alive, so the addresses differ: the words the states remembered point at the last
    pass's arrays and must be pointed at this one's); every output equals the own-plan build's bit for bit."""
    fast, own = fresh_pair()
    rng = np.random.default_rng(3)
    start = _feed(rng, 2, 3)
    held = []
    for rnd in range(3):
        outs = {}
        for exe in (fast, own):
            feed, got = dict(start), []
            bufs = [{k: np.empty((2, HEADS, 60, D // HEADS), np.float32) for k in ("present_k", "present_v")}
                    for _ in range(2)]
            held.append(bufs)
            for i in range(40):
                past = feed["past_k"].shape[2]
                out = {k: np.ndarray((2, HEADS, past + 1, D // HEADS), np.float32, buffer=v)
                       for k, v in bufs[i % 2].items()}
                r = exe.run(feed, out=out)
                got.append({k: v.copy() for k, v in r.items()})
                feed = {"ids": rng.integers(0, VOCAB, (2, 1)) * 0 + i % VOCAB,
                        "mask": np.ones((2, past + 2), np.int64), "past_k": r["present_k"],
                        "past_v": r["present_v"]}
            outs[exe is fast] = got
        for a, b in zip(outs[True], outs[False]):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
        (arena,) = [a for a in fast.arenas if a.buckets]
        assert not arena.plans and len(arena.buckets) >= 2  # keys 3..42: buckets 3, then 4..63 (it grows)
        assert fast.stats()["plans"]["own"] == 0
        assert len({k for p in arena.buckets.values() for k in (*p.bucket.remembered, p.bucket.key)}) == 40
        if rnd == 0:
            # both KV Concats' words come from the traced function of the key (no retable per token)
            assert all(sum(r.form is not None for r in p.bucket.steps if "(Concat)" in r.step.label) == 2
                       for p in arena.buckets.values())
    ref = GRAPH.run(start)
    got = fast.run(start)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-4, atol=1e-4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 70)), min_size=1, max_size=12), st.integers(0, 2**32 - 1))
def test_any_order_of_keys_answers_as_their_own_plans(pair, keys, seed):
    """Keys in any order, repeated or not, batch and past both moving (a bucket plan moved back and forth, across
    its symbols, its state at a key seen before put back): the same bits as each key's own plan."""
    fast, own = pair
    rng = np.random.default_rng(seed)
    for batch, past in keys:
        feed = _feed(rng, batch, past)
        a, b = fast.run(feed), own.run(feed)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])


def test_a_refused_key_leaves_the_bucket_plan_serving_the_next():
    """A mask whose length disagrees with the past is refused by name; the bucket plan still serves the next
    keys right."""
    exe = ds.compile(GRAPH, strategy="generic")
    own = ds.compile(GRAPH, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(5)
    exe.run(_feed(rng, 1, 65))
    bad = _feed(rng, 1, 66)
    bad["mask"] = bad["mask"][:, :-1]
    with pytest.raises(ds.ConstraintViolation):
        exe.run(bad)
    for past in (67, 70, 66):
        feed = _feed(rng, 1, past)
        a, b = exe.run(feed), own.run(feed)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])


def test_a_step_that_cannot_move_in_place_starts_a_new_bucket_plan(monkeypatch):
    """A native step whose binding at the new key has another shape of calls than the bucket plan's (a product
    taking another kernel from some size on): the bucket plan is dropped, a new one is bound at the key, and the
    answer is still right."""
    exe = ds.compile(GRAPH, strategy="generic")
    own = ds.compile(GRAPH, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(6)
    exe.run(_feed(rng, 1, 64))
    (arena,) = [a for a in exe.arenas if a.buckets]
    pl = exe.generic.bucket_planner  # (the planner bucket plans take: runtime/per_key.py)
    real = pl.bind_step

    def twice(s, *a):  # every native step now binds two calls (the second does nothing)
        made = real(s, *a)
        return [*made, lambda: None]

    monkeypatch.setattr(pl, "bind_step", twice)
    feed = _feed(rng, 1, 65)
    before = set(arena.buckets)
    a = exe.run(feed)
    assert not arena.plans and len(arena.buckets) == 1 and set(arena.buckets) != before  # given up: a new bucket
    (plan,) = arena.buckets.values()
    assert plan.bucket.key == tuple(exe.binder(feed)[1])
    monkeypatch.setattr(pl, "bind_step", real)
    for k, v in own.run(feed).items():
        np.testing.assert_array_equal(a[k], v)


def test_bucket_plans_stay_within_a_bounded_arena():
    """With preallocate the arenas hold the worst case and never grow, bucket plans or not."""
    exe = ds.compile(load_onnx(_gpt_step_model(), dims={"past": (0, 100), "past_plus_1": (1, 101), "b": (1, 2)}),
                     strategy="generic", preallocate=True, arenas=1)
    size = exe.stats()["arena_bytes"]
    rng = np.random.default_rng(7)
    for past in (3, 90, 17, 99, 64, 65):
        exe.run(_feed(rng, 2, past))
    assert exe.stats()["arena_bytes"] == size


def test_a_decode_loop_binds_a_bucket_plan_every_few_octaves():
    """past and past_plus_1 grow together and straddle each octave's end (past 31, past_plus_1 32): a new bucket
    takes the next value's bucket of each symbol that grew since the last key (the bucket of past 31 alone held
    that one key), and GROWTH_SPAN octaves more while the layout stays within the slack. The keys' Transpose
    takes another kernel from 64 rows on, so the move to past 64 gives up and a new bucket starts there: past
    16..319 binds 3 bucket plans (16..30; 31..63, laid out to 511; 64..1023), where one per octave bound 5 (31,
    63, 127, 255, 511) and a give-up bound the key's own plan besides. The answers stay those of each key's own
    plan; batch, which did not grow, keeps its own bucket (1, not 1..3)."""
    exe = ds.compile(GRAPH, strategy="generic")
    own = ds.compile(GRAPH, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(9)
    binds = []
    pl = exe.generic.bucket_planner  # (the planner bucket plans take: runtime/per_key.py)
    real = pl.bind
    pl.bind = lambda *a, **k: binds.append(k.get("bucket")) or real(*a, **k)
    for past in range(16, POSITIONS):
        feed = _feed(rng, 1, past)
        a, b = exe.run(feed), own.run(feed)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])
    assert all(b is not None for b in binds)
    tops = [dict(zip(exe.generic.planner.symbol_names, b.top)) for b in binds]
    assert [(t["b"], t["past_plus_1"], t["past"]) for t in tops] == [(1, 31, 31), (1, 511, 511), (1, 1023, 1023)]


def test_a_full_plan_cache_leaves_repeated_keys_on_the_bucket_plan():
    """A stream cycling over more keys than the states remembered (STATES_PER_PLAN x plan_cache) and the plan
    cache hold: a key whose state was dropped binds its own plan while the cache has room, then stays on the
    bucket plan, moved to it (binding its own would evict another key's: a plan bound per call)."""
    from dynshape.runtime.key_states import STATES_PER_PLAN

    exe = ds.compile(GRAPH, strategy="generic", plan_cache=3, arenas=1)
    own = ds.compile(GRAPH, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(8)
    binds = []
    real = exe.generic.planner.bind
    exe.generic.planner.bind = lambda *a, **k: binds.append(k.get("bucket") is None) or real(*a, **k)
    for _ in range(3):
        for past in range(40, 48 + 3 * STATES_PER_PLAN):
            feed = _feed(rng, 1, past)
            a, b = exe.run(feed), own.run(feed)
            for k in b:
                np.testing.assert_array_equal(a[k], b[k])
    (arena,) = exe.arenas
    assert len(arena.plans) == 3 and sum(binds) == 3  # three keys got their own plans, the rest stayed


def test_a_python_call_reading_a_table_is_bound_again_with_its_table_sealed():
    """GatherElements binds a Python call that reads its table's address when it runs: moved to a new key, the
    new call's table must be sealed (an unsealed one is address 0: the first version of rekey crashed here)."""
    n = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)
    graph = helper.make_graph([n], "ge", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b"]),
                                          helper.make_tensor_value_info("i", TensorProto.INT64, ["a", "c"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    g = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    exe, own = ds.compile(g, strategy="generic"), ds.compile(g, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(9)
    for a, b, c in ((3, 40, 41), (3, 44, 42), (2, 45, 60), (3, 40, 41)):
        feed = {"x": rng.standard_normal((a, b)).astype(np.float32), "i": rng.integers(-b, b, (a, c))}
        np.testing.assert_array_equal(exe.run(feed)["y"], own.run(feed)["y"])
    assert exe.stats()["plans"]["bucket"] >= 1
    bad = {"x": np.ones((3, 41), np.float32), "i": np.full((3, 43), 41)}  # out of range: refused by name
    with pytest.raises(ds.DynshapeError, match="GatherElements.*out of range"):
        exe.run(bad)


def test_a_retable_that_branches_on_a_dim_is_not_traced(monkeypatch):
    """A retable testing a dim (here `== 0`) cannot be one function of the key: tracing refuses it, the words are
    made per key as before, and the answers stay those of each key's own plan."""
    from dynshape.codegen.lower import movement

    real = movement._concat_desc

    def branching(axis, out_shape, *rest):
        if out_shape[axis] == 0:  # a Traced dim refuses the comparison
            raise AssertionError("no key here has an empty Concat")
        return real(axis, out_shape, *rest)

    monkeypatch.setattr(movement, "_concat_desc", branching)
    exe = ds.compile(GRAPH, strategy="generic")
    own = ds.compile(GRAPH, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(10)
    for past in (64, 65, 70, 66, 80):
        feed = _feed(rng, 2, past)
        a, b = exe.run(feed), own.run(feed)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])
    (arena,) = [a for a in exe.arenas if a.buckets]
    plans = list(arena.buckets.values())
    assert plans and all(r.form is None for p in plans for r in p.bucket.steps if "(Concat)" in r.step.label)


def test_steps_bound_again_beside_traced_words_read_the_callers_arrays():
    """The past read where it lies by two steps: the Concat (its words traced, written per key without touching
    the past's address) and a Transpose bound again per key (its table rewritten whole). Each call passes a new
    past: both must read it, not the arena's slot nor the last call's array (the in-place words are put back on
    their slots before a step's words are rewritten whole, then searched again)."""
    n = helper.make_node
    graph = helper.make_graph(
        [n("Concat", ["past", "new"], ["present"], axis=2), n("Transpose", ["past"], ["pt"], perm=[0, 1, 3, 2]),
         n("Transpose", ["present"], ["qt"], perm=[0, 2, 1, 3])], "g",
        [helper.make_tensor_value_info("past", TensorProto.FLOAT, ["b", 2, "p", 16]),
         helper.make_tensor_value_info("new", TensorProto.FLOAT, ["b", 2, 1, 16])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("present", "pt", "qt")])
    g = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    exe, own = ds.compile(g, strategy="generic"), ds.compile(g, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(11)
    bufs = [np.empty(2 * 700 * 16, np.float32) for _ in range(2)]
    keep = []  # every past stays alive (a stale address would read an old one, not freed memory)
    for i, p in enumerate([600, 601, 602, 603, 610, 605, 620, 621]):
        feed = {"past": rng.standard_normal((1, 2, p, 16)).astype(np.float32),
                "new": rng.standard_normal((1, 2, 1, 16)).astype(np.float32)}
        keep.append(feed)
        out = {"present": np.ndarray((1, 2, p + 1, 16), np.float32, buffer=bufs[i % 2])}
        a, b = exe.run(feed, out=out), own.run(feed)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])
    assert exe.stats()["plans"]["bucket"] >= 1


def test_a_key_recalled_often_gets_its_own_plan(monkeypatch):
    """After OWN_PLAN_AFTER recalls of its state a key binds its own plan (cheaper from then on) and its state is
    dropped; the other keys stay on their remembered states; the answers stay each key's own plan's."""
    from dynshape.runtime import key_states

    monkeypatch.setattr(key_states, "OWN_PLAN_AFTER", 2)
    exe = ds.compile(GRAPH, strategy="generic", arenas=1)
    own = ds.compile(GRAPH, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(12)
    counts = {}
    for past in (40, 41, 40, 41, 40, 42, 40, 41, 40):
        counts[past] = counts.get(past, 0) + 1
        feed = _feed(rng, 1, past)
        a, b = exe.run(feed), own.run(feed)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])
    (arena,) = exe.arenas
    # 40: made at, recalled twice, then its own plan (its 4th call on); 41 recalled twice; 42 moved to once
    assert [k[1] for k in arena.plans] == [(1, 41, 40)]  # keys are (b, past_plus_1, past)
    (plan,) = arena.buckets.values()
    assert sorted(k[2] for k in plan.bucket.remembered) == [41, 42] and plan.bucket.key[2] == 41
    assert [plan.bucket.remembered[k].hits for k in sorted(plan.bucket.remembered)] == [2, 0]


def test_remembered_states_are_bounded_by_the_plan_cache():
    """A stream over more keys than STATES_PER_PLAN x plan_cache: at most that many states remembered in the arena,
    and every answer still each key's own plan's."""
    from dynshape.runtime.key_states import STATES_PER_PLAN

    exe = ds.compile(GRAPH, strategy="generic", plan_cache=2, arenas=1)
    own = ds.compile(GRAPH, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(13)
    keys = range(30, 34 + 2 * STATES_PER_PLAN)
    for past in [*keys, *reversed(keys), 31, 44, 37]:
        feed = _feed(rng, 1, past)
        a, b = exe.run(feed), own.run(feed)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])
        assert exe.stats()["plans"]["remembered"] <= 2 * STATES_PER_PLAN
    assert exe.stats()["plans"]["remembered"] == 2 * STATES_PER_PLAN


def _recalls(exe) -> dict:
    """past -> how often its remembered state was put back."""
    (arena,) = exe.arenas
    return {k[2]: s.hits for p in arena.buckets.values() for k, s in p.bucket.remembered.items()}


def test_a_cycle_of_keys_longer_than_the_states_keeps_its_first_ones():
    """A decode loop whose past lengths outnumber the states an arena holds, generation after generation: the
    states of the first lengths stay and are put back on every later generation (dropping the least recently used
    one for each new length would drop each just before its next use: no state ever recalled)."""
    from dynshape.runtime.key_states import STATES_PER_PLAN

    exe = ds.compile(GRAPH, strategy="generic", plan_cache=1, arenas=1)
    own = ds.compile(GRAPH, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(15)
    keys = list(range(40, 40 + 2 * STATES_PER_PLAN))
    for _ in range(3):
        for past in keys:
            feed = _feed(rng, 1, past)
            a, b = exe.run(feed), own.run(feed)
            for k in b:
                np.testing.assert_array_equal(a[k], b[k])
    hits = _recalls(exe)
    assert len(hits) == STATES_PER_PLAN
    assert sorted(hits) == keys[:STATES_PER_PLAN] and all(h == 2 for h in hits.values())


def test_states_left_unused_long_enough_make_room_for_new_keys():
    """The states of a stream that moved to other shapes stay only until they have gone unused for STALE_FACTOR x
    the states held calls; the new shapes' states then replace them, the least recently used first (a rule that
    never replaced a state would leave a server that moved to other shapes moving a bucket plan per call)."""
    from dynshape.runtime.key_states import STALE_FACTOR, STATES_PER_PLAN

    exe = ds.compile(GRAPH, strategy="generic", plan_cache=1, arenas=1)
    own = ds.compile(GRAPH, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(16)
    old, new = list(range(40, 40 + STATES_PER_PLAN)), list(range(70, 70 + STATES_PER_PLAN))
    stream = [*old, old[0], *new * (STALE_FACTOR + 1)]
    for i, past in enumerate(stream):
        feed = _feed(rng, 1, past)
        a, b = exe.run(feed), own.run(feed)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])
        if i == STATES_PER_PLAN + 2:  # the new keys' first: the old states are in use, none replaced
            assert sorted(_recalls(exe)) == old
    # (the first new key, met again with no state while every state was in use, binds its own plan: the cache's
    # room; the old state recalled last stays while no new key needs its room)
    held = set(_recalls(exe))
    assert set(new[1:]) <= held and not held & set(old[1:])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 2), st.integers(0, 40), st.integers(0, 2), st.booleans()), min_size=2,
                max_size=16), st.integers(0, 2**32 - 1))
def test_recalled_states_read_and_write_the_callers_arrays(pair, calls, seed):
    """Keys in any order, each call writing its presents into one of three out= buffers (or fresh arrays) and
    reading its pasts from another, so the addresses the remembered in-place words hold are rarely this call's:
    every answer is still the own-plan build's, bit for bit, and lands in the out= arrays given."""
    fast, own = pair
    rng = np.random.default_rng(seed)
    pool = [{k: np.empty(2 * HEADS * 41 * (D // HEADS), np.float32) for k in ("present_k", "present_v")}
            for _ in range(3)]
    for batch, past, which, use_out in calls:
        feed = _feed(rng, batch, past)
        src = pool[(which + 1) % 3]
        for k in ("past_k", "past_v"):  # the pasts inside another buffer of the pool, as a decode loop keeps them
            a = np.ndarray((batch, HEADS, past, D // HEADS), np.float32, buffer=src[k.replace("past", "present")])
            a[...] = feed[k]
            feed[k] = a
        out = {k: np.ndarray((batch, HEADS, past + 1, D // HEADS), np.float32, buffer=v)
               for k, v in pool[which].items()} if use_out else None
        want = own.run({k: np.array(v) for k, v in feed.items()})
        got = fast.run(feed, out=out)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
        if out:
            assert all(got[k] is out[k] for k in out)
        for arena in fast.arenas:  # each bucket plan's address map agrees with the per-key values it is at
            for plan in arena.buckets.values():
                st_ = plan.bucket
                assert all(st_.at[x] == v.ctypes.data for x, v in st_.fixed.items()), st_.key


def test_a_full_memory_of_states_never_drops_the_state_about_to_be_recalled():
    """With the states' cap reached, leaving a key to recall the oldest remembered one must not evict that very
    state to make room (found by bench/memory_bench.py: the plan then served the next key at the last one's
    shapes, refused as an input that does not fit its slot)."""
    from dynshape.runtime.key_states import STATES_PER_PLAN

    exe = ds.compile(GRAPH, strategy="generic", plan_cache=1, arenas=1)
    own = ds.compile(GRAPH, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(14)
    keys = list(range(40, 41 + STATES_PER_PLAN))  # one more than the cap: leaving the last evicts the oldest
    for past in [*keys, keys[0], *keys[1:], keys[0]]:
        feed = _feed(rng, 1, past)
        a, b = exe.run(feed), own.run(feed)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])


def _same(a, b) -> bool:
    """The same objects (containers compared item by item: a recall may put back a copy of a list)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (int, float, str, bytes, type(None))):
        return a == b
    return False


def test_a_recall_puts_back_every_field_and_word_a_move_changed():
    """Every slot of the plan, its bucket state and its step records, and every word of its programs and tables,
    after a recall to a key are what they were when the plan left that key (after its call there). A field a later
    change to rekey.py's `_move` assigns without key_states.py putting it back fails here."""
    import ctypes

    from dynshape.runtime.key_states import recall
    from dynshape.runtime.plan import BoundPlan
    from dynshape.runtime.rekey import BucketState, StepRecord

    exe = ds.compile(GRAPH, strategy="generic", arenas=1)
    rng = np.random.default_rng(15)
    out = {k: np.empty((2, HEADS, 42, D // HEADS), np.float32) for k in ("present_k", "present_v")}
    feeds = {p: _feed(rng, 2, p) for p in (40, 41, 42)}
    exe.run(feeds[40])
    exe.run(feeds[41], out=out)  # moved to 41, the out= arrays written in place
    (arena,) = exe.arenas
    (plan,) = arena.buckets.values()
    st = plan.bucket
    own = ("remembered", "remembered_bytes", "in_a_row", "last_call")  # (the memory itself, and the call counts)
    made_again = ("shapes", "arrays", "movable_snap")  # (caches, not kept by a state: made again, checked below)

    def state() -> tuple:
        spans = st.mutable.tolist()
        return ({f: getattr(plan, f) for f in BoundPlan.__slots__},
                {f: dict(st.at) if f == "at" else getattr(st, f)  # (one map, written in place: its contents)
                 for f in BucketState.__slots__ if f not in own + made_again},
                [{f: getattr(r, f) for f in StepRecord.__slots__} for r in st.steps],
                b"".join(ctypes.string_at(a, n) for a, n in zip(spans[::2], spans[1::2])))

    at41 = state()
    key41 = st.key
    exe.run(feeds[42])  # leaves 41 (remembered) for 42
    assert st.key != key41 and key41 in st.remembered
    assert recall(plan, key41)
    now = state()
    pairs = [(at41[0], now[0]), (at41[1], now[1]), *zip(at41[2], now[2])]
    for before, after in pairs:
        for f in before:
            assert _same(before[f], after[f]), f
    assert at41[3] == now[3]
    assert st.shapes is None and st.arrays == {}
    snap = st.movable_snap  # (the movable steps' fields as put back, which the next state remembered shares)
    assert snap is None or all(_same(a, b) for a, b in zip(snap, [x for k in st.movable for x in (
        st.steps[k].calls, st.steps[k].held, st.steps[k].shapes)], strict=True))


def test_cached_plans_and_remembered_states_share_one_byte_budget(monkeypatch):
    """An arena's own plans and its bucket plans' remembered states hold at most the plan cache's bytes between
    them (memory.plan_bytes): with a cached plan holding most of it, the states keep to the rest; every answer
    still each key's own plan's."""
    from types import SimpleNamespace

    exe = ds.compile(GRAPH, strategy="generic", arenas=1)
    own = ds.compile(GRAPH, strategy="generic", bucket_plans=False)
    budget = 150_000
    monkeypatch.setattr(exe.memory, "plan_bytes", lambda: budget)
    rng = np.random.default_rng(17)
    exe.run(_feed(rng, 1, 29))
    (arena,) = exe.arenas
    arena.plans[("another variant", (0,))] = SimpleNamespace(nbytes=120_000, arena=arena.buf)  # a plan's per-key values
    for past in [*range(30, 50), *range(30, 50), *range(45, 25, -1), 33, 33, 47]:
        feed = _feed(rng, 1, past)
        a, b = exe.run(feed), own.run(feed)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])
        assert arena.plans.held + sum(p.bucket.remembered_bytes for p in arena.buckets.values()) <= budget
    assert exe.stats()["plans"]["remembered"]  # the rest still held some


def test_a_key_called_in_a_row_gets_its_own_plan():
    """A single shape called OWN_PLAN_IN_A_ROW times in a row binds its own plan (laid out for it, not for its
    bucket's largest key); keys alternating never do; the answers stay each key's own plan's."""
    from dynshape.runtime.key_states import OWN_PLAN_IN_A_ROW

    exe = ds.compile(GRAPH, strategy="generic", arenas=1)
    own = ds.compile(GRAPH, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(18)
    for past in [40, 41] * 6 + [42] * (OWN_PLAN_IN_A_ROW - 1):
        feed = _feed(rng, 1, past)
        a, b = exe.run(feed), own.run(feed)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])
    (arena,) = exe.arenas
    assert not arena.plans  # alternating keys recall their states; 42 called OWN_PLAN_IN_A_ROW - 1 times so far
    feed = _feed(rng, 1, 42)
    np.testing.assert_array_equal(exe.run(feed)["y"], own.run(feed)["y"])
    assert [k[1][2] for k in arena.plans] == [42]


def test_a_key_whose_own_plan_would_not_be_kept_stays_on_its_bucket_plan(monkeypatch):
    """A key called in a row, or seen again after its state was dropped, whose per-key values exceed the plan
    cache's cap: its own plan would serve one call and be dropped, bound again on the next (BEiT at 224x224, ~70 MB
    of relative-position tables a key: 840 ms a call instead of 18), so the bucket plan goes on serving it; the
    answers stay each key's own plan's."""
    from dynshape.runtime.key_states import OWN_PLAN_IN_A_ROW

    # (its per-key values held per key, as BEiT's tables are: too large to compute per call, runtime/per_key.py)
    exe = ds.compile(GRAPH, strategy="generic", arenas=1, per_key_in_arena=False)
    own = ds.compile(GRAPH, strategy="generic", bucket_plans=False)
    rng = np.random.default_rng(19)
    exe.run(_feed(rng, 1, 42))
    (arena,) = exe.arenas
    (bucket,) = arena.buckets.values()
    assert bucket.nbytes > 0  # the key's per-key values (a causal mask's rows, positions)
    monkeypatch.setattr(exe.memory, "plan_bytes", lambda: bucket.nbytes - 1)
    pl = exe.generic.planner
    binds: list = []
    bind = pl.bind
    monkeypatch.setattr(pl, "bind", lambda key, *a, **k: binds.append(key) or bind(key, *a, **k))
    for past in [42] * (2 * OWN_PLAN_IN_A_ROW) + [43, 42, 43, 42, 42, 42, 42]:
        feed = _feed(rng, 1, past)
        a, b = exe.run(feed), own.run(feed)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])
    assert not binds and not arena.plans  # moved between the two keys, never a plan bound per call


@settings(max_examples=40, deadline=None)
@given(a=st.tuples(st.integers(1, 3), st.integers(1, 300)), b=st.tuples(st.integers(1, 3), st.integers(1, 300)))
def test_a_move_computes_the_symbolic_values_its_changed_symbols_touch(a, b):
    """SymbolicValues.only at the new key, for the symbols that differ from the last: the values reading them, as
    the whole function gives them; every other value is the same at both keys (the move keeps the last key's).
    And BucketState.fits' compiled bytes per growing buffer are the products over the shapes at the key."""
    exe = ds.compile(GRAPH, strategy="generic")
    variant = exe.generic
    pl, symbolic = variant.planner, variant.build.symbolic
    keys = []
    for batch, past in (a, b):
        env = {"b": batch, "past": past, "past_plus_1": past + 1}
        keys.append(tuple(env[n] for n in pl.symbol_names))
    old, new = (symbolic(k) for k in keys)
    changed = {n for n, x, y in zip(pl.symbol_names, *keys) if x != y}
    moved = symbolic.only(keys[1], changed)
    assert old.keys() == new.keys()
    assert moved.keys() == {x for x in new if not symbolic.deps[x].isdisjoint(changed)}
    for name, v in new.items():
        if name in moved:
            np.testing.assert_array_equal(moved[name], v)
            assert moved[name].dtype == v.dtype
        else:
            assert symbolic.deps[name].isdisjoint(changed), name
            np.testing.assert_array_equal(old[name], v)
    assert any(symbolic.deps[x] for x in new)  # (the graph has values that read the key)
    shapes = dict(zip(pl.values, pl.shapes(keys[1])))
    assert pl.grow_bytes(keys[1]) == [int(np.prod(shapes[x])) * pl.dtypes[x].itemsize for x in pl.grows]
    assert pl.grows



def test_a_bucket_plans_shapes_at_another_key_are_the_whole_functions():
    """BucketState.shapes_at, which computes only the shapes that read a symbol changed since the plan's key (and
    the bytes of those buffers): over 80 random pairs of keys, every value's shape as the planner's whole function
    gives it at the second key, or None exactly where a buffer outgrows its slot in the plan's layout (`fits`,
    over every buffer)."""
    exe = ds.compile(GRAPH, strategy="generic", arenas=1)
    pl = exe.generic.bucket_planner
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(80):
        a, b = [(int(rng.integers(1, 4)), int(rng.integers(1, 300))) for _ in range(2)]
        exe.run(_feed(rng, *a))
        (arena,) = exe.arenas
        keys = [tuple({"b": batch, "past": past, "past_plus_1": past + 1}[n] for n in pl.symbol_names)
                for batch, past in (a, b)]
        for state in [p.bucket for p in arena.buckets.values() if p.bucket.key == keys[0]]:
            if state.sizes is None or not state.covers(keys[1]):
                continue
            got = state.shapes_at(pl, keys[1])
            if state.fits(pl, keys[1]):
                assert got == dict(zip(pl.values, pl.shapes(keys[1])))
            else:
                assert got is None
            checked += 1
    assert checked >= 20, checked
