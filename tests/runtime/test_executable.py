"""ds.compile: one build for every shape, checked against the reference executor and onnxruntime."""

import numpy as np
import pytest

import dynshape as ds
from dynshape.frontends.onnx import load_onnx
from dynshape.models.encoder import build_encoder
from dynshape.models.mlp import build_mlp
from dynshape.runtime.executable import compile as ds_compile
from tolerance import assert_f32_close


@pytest.fixture(scope="module")
def encoder():
    model = build_encoder()
    graph = load_onnx(model, dims={"batch": (1, 8), "seq": (1, 128)})
    return model, graph, ds_compile(graph, specialize=[{"batch": 1, "seq": 16}])


def _feed(b, s, seed=0):
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, 1000, (b, s)).astype(np.int64),
            "attention_mask": (rng.random((b, s)) > 0.2).astype(np.int64)}


@pytest.mark.parametrize("b,s", [(1, 16), (2, 37), (3, 1), (8, 128)])
def test_encoder_matches_reference_and_onnxruntime(encoder, b, s):
    model, graph, exe = encoder
    feed = _feed(b, s)
    out = exe.run(feed)
    ref = graph.run(feed)
    for name in ref:
        assert_f32_close(out[name], ref[name], rtol=1e-4, scale=1e-4)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, o in zip([o.name for o in sess.get_outputs()], sess.run(None, feed)):
        assert_f32_close(out[name], o, rtol=1e-4, scale=1e-4)


def test_one_build_serves_every_shape_and_variants_dispatch(encoder):
    _, _, exe = encoder
    before = exe.stats()
    for b, s in [(1, 16), (1, 17), (4, 5), (1, 16)]:
        exe.run(_feed(b, s))
    st = exe.stats()
    assert st["builds"] == before["builds"] == 2  # generic + the declared static variant, nothing rebuilt
    assert st["calls"] - before["calls"] == 4
    assert st["hits"]["{'batch': 1, 'seq': 16}"] - before["hits"]["{'batch': 1, 'seq': 16}"] == 2
    # shape arithmetic was compiled away: fewer steps than nodes
    assert st["steps"] < st["nodes"]


@pytest.mark.parametrize("feed, message", [
    ({"input_ids": np.zeros((2, 4), np.int64)}, "missing"),
    ({"input_ids": np.zeros((2, 200), np.int64), "attention_mask": np.zeros((2, 200), np.int64)}, "seq = 200"),
    ({"input_ids": np.zeros((2, 4), np.int64), "attention_mask": np.zeros((3, 4), np.int64)}, "must equal"),
    ({"input_ids": np.zeros((2, 4), np.float32), "attention_mask": np.zeros((2, 4), np.int64)}, "dtype float32"),
])
def test_bad_inputs_rejected_before_running(encoder, feed, message):
    _, _, exe = encoder
    calls = exe.stats()["calls"]
    with pytest.raises(ds.ConstraintViolation, match=message):
        exe.run(feed)
    assert exe.stats()["calls"] == calls


def test_mlp_every_batch_and_call_form():
    graph = load_onnx(build_mlp(), dims={"batch": (1, 256)})
    exe = ds_compile(graph)
    for b in (1, 7, 64, 256):
        x = np.random.default_rng(b).standard_normal((b, 64)).astype(np.float32)
        (y,) = exe(x=x)
        assert_f32_close(y, graph.run({"x": x})["y"], rtol=1e-4, scale=1e-6)


def test_specialize_rejects_inadmissible_values():
    graph = load_onnx(build_mlp(), dims={"batch": (1, 256)})
    with pytest.raises(ds.ConstraintViolation, match="batch = 300"):
        ds_compile(graph, specialize=[{"batch": 300}])
    with pytest.raises(ds.DynshapeError, match="no value"):
        ds_compile(graph, specialize=[{"seq": 3}])


def test_planned_execution_matches_allocating_path_and_outputs_are_owned(encoder):
    model, graph, exe = encoder
    plain = ds_compile(graph, planned=False)
    assert exe.stats()["planned"]
    first = exe.run(_feed(2, 9, seed=1))
    kept = {k: v.copy() for k, v in first.items()}
    for b, s, seed in [(8, 128, 2), (1, 3, 3), (2, 9, 1), (4, 64, 4)]:  # grow, shrink, repeat a key
        got = exe.run(_feed(b, s, seed))
        want = plain.run(_feed(b, s, seed))
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    for name in kept:  # later calls reuse the arena; what a caller already holds is never overwritten
        np.testing.assert_array_equal(first[name], kept[name])
    assert exe.stats()["arena_bytes"] > 0


def test_concurrent_calls_give_serial_results(encoder):
    import threading

    _, _, exe = encoder
    shapes = [(1, 16), (2, 9), (3, 30), (1, 100), (2, 2)] * 4
    serial = [exe.run(_feed(b, s, i)) for i, (b, s) in enumerate(shapes)]
    results: dict = {}

    def worker(i, b, s):
        results[i] = exe.run(_feed(b, s, i))

    threads = [threading.Thread(target=worker, args=(i, b, s)) for i, (b, s) in enumerate(shapes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, want in enumerate(serial):
        for name in want:
            np.testing.assert_array_equal(results[i][name], want[name])


def test_index_out_of_range_is_a_clear_error_naming_the_node(encoder):
    _, _, exe = encoder
    feed = _feed(1, 4)
    feed["input_ids"][0, 2] = 10_000_000  # the embedding table has 1,000 rows
    with pytest.raises(ds.DynshapeError, match="Gather"):
        exe.run(feed)
    np.testing.assert_array_equal(exe.run(_feed(1, 4))["last_hidden_state"],
                                  ds_compile(exe.graph, planned=False).run(_feed(1, 4))["last_hidden_state"])


def test_a_compile_ends_with_a_full_collection(encoder, monkeypatch):
    """A compile leaves tens of thousands of long-lived objects; the full collection CPython runs once enough of
    them pile up is run at its end (`settled`), not left to land inside the first calls (15 ms in a GPT-2 step's
    first generation): the last collection a first compile runs is a full one. A compile that grows the heap by
    less than a quarter since then runs none (each pass costs time in proportion to all the process holds)."""
    import gc

    from dynshape.runtime import memory

    runs: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "stop":
            runs.append(info["generation"])

    monkeypatch.setattr(memory, "_SETTLED_AT", [0])  # (as in a process that has compiled nothing yet)
    gc.callbacks.append(seen)
    try:
        ds_compile(encoder[1])
    finally:
        gc.callbacks.remove(seen)
    assert runs and runs[-1] == 2
    collects: list[int] = []
    monkeypatch.setattr(memory.gc, "collect", lambda *a: collects.append(1) or 0)
    ds_compile(encoder[1])
    assert not collects
    monkeypatch.setattr(memory, "_SETTLED_AT", [memory._SETTLED_AT[0] // 2])  # the heap doubled since: collected
    ds_compile(encoder[1])
    assert collects == [1]
