"""Hybrid specialisation: guards, hot keys built in the background, eviction, profiles, strategies, threads."""

import json
import threading

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import dynshape as ds
from dynshape.cli.main import app
from dynshape.models.encoder import build_encoder
from dynshape.models.mlp import build_mlp
from tolerance import assert_f32_close


def _graph(lo=1, hi=256):
    return ds.load_onnx(build_mlp(), dims={"batch": (lo, hi)})


def _x(b, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal((b, 64)).astype(np.float32)}


def _variant_batches(exe) -> set:
    return {v["values"]["batch"] for v in exe.explain_strategy()["variants"]}


def test_a_key_becomes_a_variant_once_hot_and_a_frequent_but_rare_one_does_not():
    graph = _graph()
    exe = ds.compile(graph, fuse=False, hot_calls=5, hot_share=0.2, hot_window=20)
    for _ in range(4):
        exe.run(_x(3))
    assert exe.wait_for_builds(10) and _variant_batches(exe) == set()
    exe.run(_x(3))  # the 5th call: hot
    assert exe.wait_for_builds(30)
    (v,) = exe.explain_strategy()["variants"]
    assert (v["values"], v["kind"], v["guard"], v["evictable"]) == ({"batch": 3}, "exact", "batch == 3", True)
    assert v["why"].startswith("hot: 5 calls") and "background" in v["where"]
    out = exe.run(_x(3, seed=1))
    assert exe.stats()["hits"]["{'batch': 3}"] == 1
    assert_f32_close(out["y"], graph.run(_x(3, seed=1))["y"], rtol=1e-5, scale=1e-6)
    for i in range(60):  # batch 7: 6 calls in all, but one call in ten is below the 20% share
        exe.run(_x(7 if i % 10 == 0 else 100 + i))
    assert exe.wait_for_builds(30)
    assert 7 not in _variant_batches(exe) and exe.profile_.counts[(7,)] == 6


def test_the_request_path_never_waits_for_a_build():
    exe = ds.compile(_graph(), fuse=False, hot_calls=2, hot_share=0.0)
    started, release, events = threading.Event(), threading.Event(), []
    real = exe._variant

    def slow_build(key, guard, narrow=None):
        events.append("build started")
        started.set()
        assert release.wait(30), "the build was never released"
        variant = real(key, guard, narrow)
        events.append("build finished")
        return variant

    exe._variant = slow_build
    exe.run(_x(5))
    exe.run(_x(5))  # hot: queued, and this call goes on with the generic build
    assert started.wait(10)
    exe.run(_x(5))  # while the build is blocked
    events.append("call returned")
    assert exe.pending == [{"batch": 5}] and exe.stats()["hits"]["generic"] == 3
    release.set()
    assert exe.wait_for_builds(30) and not exe.build_errors
    assert events == ["build started", "call returned", "build finished"]
    exe.run(_x(5))
    assert exe.stats()["hits"]["{'batch': 5}"] == 1


def test_the_least_recently_hot_variant_is_evicted_and_declared_ones_never_are():
    exe = ds.compile(_graph(), specialize=[{"batch": 9}], fuse=False, hot_calls=3, hot_share=0.0, hot_window=12,
                     max_variants=2)
    for b in (1, 2):
        for _ in range(3):
            exe.run(_x(b))
        assert exe.wait_for_builds(30)
    assert _variant_batches(exe) == {1, 2, 9}
    for _ in range(12):  # the window now holds only batch 2: batch 1 is no longer hot
        exe.run(_x(2))
    for _ in range(3):
        exe.run(_x(3))
    assert exe.wait_for_builds(30)
    info = exe.explain_strategy()
    assert _variant_batches(exe) == {2, 3, 9}
    assert [e["values"] for e in info["evicted"]] == [{"batch": 1}]
    assert "least recently hot" in info["evicted"][0]["why"]
    assert exe.run(_x(1))["y"].shape == (1, 64)  # an evicted key is served by the generic build again


def test_profile_round_trip_and_prebuilt_variants(tmp_path):
    graph = _graph()
    exe = ds.compile(graph, fuse=False, auto_specialize=False)
    calls = {4: 30, 5: 25, 6: 1}
    for b, n in calls.items():
        for _ in range(n):
            exe.run(_x(b))
    assert _variant_batches(exe) == set()  # auto_specialize=False: counted, never built
    path = tmp_path / "profile.json"
    exe.save_profile(path)
    data = json.loads(path.read_text())
    assert data["symbols"] == ["batch"] and data["calls"] == 56
    assert {k["batch"]: k["count"] for k in data["keys"]} == calls

    hot = ds.compile(graph, fuse=False, profile=path, strategy="multi_version")
    assert _variant_batches(hot) == {4, 5}  # built at compile time, before any call; batch 6 is cold
    assert all("profile" in v["why"] and v["evictable"] for v in hot.explain_strategy()["variants"])
    assert_f32_close(hot.run(_x(4))["y"], graph.run(_x(4))["y"], rtol=1e-5, scale=1e-6)
    assert hot.stats()["hits"]["{'batch': 4}"] == 1

    few = ds.compile(graph, fuse=False, profile=path)  # auto: 3 distinct shapes, one variant each, kept
    info = few.explain_strategy()
    assert _variant_batches(few) == {4, 5, 6} and not any(v["evictable"] for v in info["variants"])
    assert "profile saw only 3 distinct shapes" in info["reasons"][0]

    narrower = ds.compile(_graph(1, 4), fuse=False, profile=path, strategy="multi_version")
    assert _variant_batches(narrower) == {4} and any("batch=5 skipped" in n for n in narrower.notes)
    enc = ds.load_onnx(build_encoder(layers=1, hidden=32), dims={"batch": (1, 4), "seq": (1, 16)})
    with pytest.raises(ds.DynshapeError, match="symbols"):
        ds.compile(enc, profile=path)


def test_strategies_and_their_explanations():
    graph = _graph()
    generic = ds.compile(graph, fuse=False, strategy="generic", hot_calls=1)
    for _ in range(5):
        generic.run(_x(3))
    assert generic.wait_for_builds(10) and _variant_batches(generic) == set()
    assert generic.explain_strategy()["strategy"] == "generic"
    assert ds.Executable(graph).explain_strategy()["strategy"] == "generic"  # what ds.load builds: never compiles

    static = ds.compile(graph, fuse=False, strategy="static")
    static.run(_x(3))  # built synchronously, before this call ran
    assert static.stats()["hits"] == {"generic": 0, "{'batch': 3}": 1} and static.stats()["builds"] == 2
    assert "first sight" in static.explain_strategy()["reasons"][0]

    wide = ds.compile(graph, fuse=False)
    assert wide.explain_strategy()["strategy"] == "multi_version" and wide.explain_strategy()["auto_specialize"]["on"]
    assert "admit 256 shapes" in wide.explain_strategy()["reasons"][0]

    narrow = ds.compile(_graph(1, 4), fuse=False)
    assert "admit only 4 shapes" in narrow.explain_strategy()["reasons"][0]
    narrow.run(_x(2))  # first sight is enough: built in the background
    assert narrow.wait_for_builds(30) and _variant_batches(narrow) == {2}

    fixed = ds.compile(ds.load_onnx(build_mlp(), dims={"batch": 2}), fuse=False)
    info = fixed.explain_strategy()
    assert info["strategy"] == "generic" and "already static" in info["reasons"][0]
    with pytest.raises(ds.DynshapeError, match="strategy='fastest'"):
        ds.compile(graph, strategy="fastest")


def test_buckets_dispatch_after_exact_keys_with_implied_guards_dropped():
    graph = _graph()
    buckets = [{"batch": (1, 16)}, {"batch": {"min": 10, "max": 256, "multiple_of": 4}}, {"batch": (1, 16)}]
    exe = ds.compile(graph, specialize=[{"batch": 8}], fuse=False, strategy="bucketed", buckets=buckets)
    info = exe.explain_strategy()
    small, mult4 = info["buckets"]
    assert (small["kind"], small["guard"]) == ("bucket", "batch <= 16")
    assert small["dropped"] == ["batch >= 1: implied by the declaration batch in [1, 256]"]
    assert (mult4["kind"], mult4["guard"]) == ("predicate", "batch >= 12 and batch % 4 == 0")
    assert mult4["dropped"] == ["batch <= 256: implied by the declaration batch in [1, 256]"]
    assert any("dropped, it admits exactly the shapes of an earlier bucket" in n for n in info["notes"])
    for b in (8, 3, 16, 20, 21):
        assert_f32_close(exe.run(_x(b))["y"], graph.run(_x(b))["y"], rtol=1e-5, scale=1e-6)
    assert exe.stats()["hits"] == {"generic": 1, "{'batch': 8}": 1, "batch <= 16": 2,
                                   "batch >= 12 and batch % 4 == 0": 1}
    derived = ds.compile(graph, fuse=False, strategy="bucketed").explain_strategy()["buckets"]
    assert [b["guard"] for b in derived][:2] == ["batch <= 2", "batch >= 3 and batch <= 4"]
    assert derived[-1]["guard"] == "batch >= 129" and len(derived) == 8
    with pytest.raises(ds.DynshapeError, match="admits no value"):
        ds.compile(graph, strategy="bucketed", buckets=[{"batch": (300, 400)}])


def test_explain_shows_the_strategy_buckets_and_dropped_guards(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(), str(path))
    r = CliRunner().invoke(app, ["explain", str(path), "--dim", "batch=1:64", "--strategy", "bucketed"],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "specialisation: bucketed -> bucketed" in text
    assert "bucket guard: batch >= 33 (bucket (no padding" in text
    assert "bucket guard: batch <= 2 (bucket (no padding: the call runs at its exact shape); compile: strategy " \
           "bucketed) dropped batch >= 1: implied by the declaration batch in [1, 64]" in text
    assert "memory plan: arena" in text


def test_concurrent_calls_while_variants_are_installed_match_serial_calls():
    graph = ds.load_onnx(build_encoder(layers=1, hidden=32), dims={"batch": (1, 4), "seq": (1, 32)})
    reference = ds.compile(graph, strategy="generic")
    exe = ds.compile(graph, hot_calls=3, hot_share=0.0, arenas=2)
    shapes = [(1, 8), (2, 5), (3, 32), (1, 17), (4, 4)]
    jobs = [(b, s, seed) for seed in range(6) for b, s in shapes]

    def feed(b, s, seed):
        rng = np.random.default_rng(seed)
        return {"input_ids": rng.integers(0, 1000, (b, s)).astype(np.int64),
                "attention_mask": (rng.random((b, s)) > 0.2).astype(np.int64)}

    want = {j: reference.run(feed(*j)) for j in jobs}
    got: dict = {}
    during_build: list = []

    def worker(mine):
        for j in mine:
            got[j] = exe.run(feed(*j))
            if exe.pending:
                during_build.append(j)

    threads = [threading.Thread(target=worker, args=(jobs[i::6],)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert exe.wait_for_builds(120) and not exe.build_errors
    assert during_build and len(exe.explain_strategy()["variants"]) == len(shapes)
    for j in jobs:
        for name in want[j]:
            assert_f32_close(got[j][name], want[j][name], rtol=1e-5, scale=1e-5)
    assert len(exe.arenas) <= 2


def test_a_bucket_build_compiles_its_pinned_symbols_as_literals():
    graph = ds.load_onnx(build_encoder(layers=1, hidden=32), dims={"batch": (1, 4), "seq": (1, 32)})
    exe = ds.compile(graph, strategy="bucketed", buckets=[{"batch": 1, "seq": {"multiple_of": 8}}])
    (bucket,) = exe.buckets
    assert bucket.guard.text() == "batch == 1 and seq % 8 == 0" and bucket.guard.kind == "predicate"
    assert bucket.guard.dropped == ("seq >= 8: implied by seq % 8 == 0 and the declaration seq in [1, 32]",)
    hidden = bucket.build.graph.types[graph.outputs[0].name].shape
    assert hidden[0] == 1 and str(hidden[1]) == "seq" and hidden[1].atom().mult == 8
    rng = np.random.default_rng(0)
    for b, s in [(1, 16), (1, 7), (2, 16)]:
        feed = {"input_ids": rng.integers(0, 1000, (b, s)).astype(np.int64),
                "attention_mask": (rng.random((b, s)) > 0.2).astype(np.int64)}
        want = graph.run(feed)
        for name, got in exe.run(feed).items():
            assert_f32_close(got, want[name], rtol=1e-4, scale=1e-4)
    assert exe.stats()["hits"] == {"generic": 2, "batch == 1 and seq % 8 == 0": 1}


def _sqrt_reshape_model():
    """(n, c, s) -> a square map of side int(s ** 0.5) through float math on the shape (DPT's reassembly), then a
    Conv and a Relu: inference can only name the side as a data-dependent size."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(4).standard_normal((4, 8, 3, 3)).astype(np.float32)
    inits = {"w": w, "two": np.array([2], np.int64), "half": np.array(0.5, np.float32),
             "nc": np.array([0, 8], np.int64), "zero": np.array(0, np.int64)}
    nodes = [helper.make_node("Shape", ["x"], ["shp"]),
             helper.make_node("Gather", ["shp", "two"], ["s"], axis=0),
             helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
             helper.make_node("Pow", ["sf", "half"], ["rootf"]),
             helper.make_node("Cast", ["rootf"], ["root"], to=TensorProto.INT64),
             helper.make_node("Concat", ["nc", "root", "root"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["m"]),
             helper.make_node("Conv", ["m", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, "s"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_static_variant_compiles_sizes_the_generic_build_calls_data_dependent():
    """A static build re-infers the graph at its key: the side computed through float math is a number there, so
    the Conv and the Relu compile (in the generic build they run on numpy, their sizes unknown to inference)."""
    g = _sqrt_reshape_model()
    generic = ds.compile(g, strategy="generic")
    assert {u["op"] for u in generic.explain_build()["uncompiled"]} & {"ChannelsLast", "Conv", "Relu"}
    exe = ds.compile(g, strategy="static")
    for n, s in ((1, 36), (2, 49), (1, 36)):
        x = {"x": np.random.default_rng(s).standard_normal((n, 8, s)).astype(np.float32)}
        assert_f32_close(exe.run(x)["y"], g.run(x)["y"], rtol=1e-4, scale=1e-5)
    assert len(exe.variants) == 2
    for v in exe.variants.values():
        assert not {u.op for u in v.build.uncompiled} & {"ChannelsLast", "Conv", "Relu"}, v.build.uncompiled


def test_a_graph_with_sizes_only_a_key_fixes_specializes_a_shape_from_its_second_call():
    """Where the generic build runs steps on numpy because inference named a size data-dependent, a shape's static
    variant is the fast path: the default strategy builds it once the shape is called twice (not 20 times), and
    explain says so; other graphs keep the default threshold."""
    g = _sqrt_reshape_model()
    exe = ds.compile(g)
    x = {"x": np.random.default_rng(3).standard_normal((2, 8, 25)).astype(np.float32)}
    for _ in range(2):
        assert_f32_close(exe.run(x)["y"], g.run(x)["y"], rtol=1e-4, scale=1e-5)
    assert exe.wait_for_builds(60)
    assert [v["values"] for v in exe.explain_strategy()["variants"]] == [{"n": 2, "s": 25}]
    assert exe.explain_strategy()["auto_specialize"]["hot_calls"] == 2
    assert ds.compile(_graph()).explain_strategy()["auto_specialize"]["hot_calls"] == 20


def test_sizes_that_depend_on_the_data_itself_go_back_to_the_usual_threshold():
    """A NonZero's count is data-dependent in any build: after the first variant shows that, shapes earn variants
    at the usual rate again (no background build per shape for nothing)."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["t"], perm=[1, 0]),
             helper.make_node("Cast", ["t"], ["y"], to=TensorProto.FLOAT), helper.make_node("Relu", ["y"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "m"])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    exe = ds.compile(ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])))
    assert exe.explain_strategy()["auto_specialize"]["hot_calls"] == 2
    x = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    for _ in range(2):
        exe.run(x)
    assert exe.wait_for_builds(60)
    assert exe.explain_strategy()["auto_specialize"]["hot_calls"] == 20


def test_explain_build_of_a_key_describes_the_build_serving_it():
    """explain_build(key) lists the uncompiled nodes of the build that serves the key (its static variant once
    made, what a benchmark of that shape times), explain_build() the generic build's."""
    g = _sqrt_reshape_model()
    exe = ds.compile(g, strategy="static")
    x = {"x": np.random.default_rng(1).standard_normal((1, 8, 36)).astype(np.float32)}
    exe.run(x)
    key = tuple(exe.binder(x)[1])

    def ops(info: dict) -> set:
        return {u["op"] for u in info["uncompiled"]}

    assert ops(exe.explain_build()) & {"ChannelsLast", "Conv", "Relu"}
    assert not ops(exe.explain_build(key)) & {"ChannelsLast", "Conv", "Relu"}, exe.explain_build(key)
    assert exe.explain_build((2, 49)) == exe.explain_build()  # a key without a variant: the generic build
