"""bench/pytriton_anchor.py's pure helpers, without PyTriton (its numpy < 2 pin keeps it out of the project's
environment): how a list of requests from Triton's batcher is grouped, joined, run and split back, and how an
onnxruntime input or output becomes a Triton tensor spec."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import pytriton_anchor as pa  # noqa: E402


def fake_model(calls: list):
    def run(feed):
        calls.append({n: a.shape for n, a in feed.items()})
        x, m = feed["ids"], feed["mask"]
        return {"h": (x * 2 + m)[..., None].astype(np.float32) * np.ones(3, np.float32),
                "pooled": x.sum(axis=1, dtype=np.float32)}
    return run


def test_groups_equal_shapes_and_splits_back():
    rng = np.random.default_rng(0)
    shapes = [(1, 5), (3, 7), (2, 5), (1, 7), (4, 2)]
    feeds = [{"ids": rng.integers(0, 9, s), "mask": rng.integers(0, 2, s)} for s in shapes]
    calls: list = []
    got = pa.run_grouped(fake_model(calls), feeds)
    alone = [fake_model([])(f) for f in feeds]
    for g, a in zip(got, alone):
        assert g.keys() == a.keys()
        for n in a:
            np.testing.assert_array_equal(g[n], a[n])
    assert sorted(c["ids"] for c in calls) == [(3, 5), (4, 2), (4, 7)]  # seq 5 joined, seq 7 joined, seq 2 alone


def test_dtype_splits_groups_and_no_batching_runs_each():
    feeds = [{"ids": np.ones((1, 4), np.int64), "mask": np.ones((1, 4), np.int64)},
             {"ids": np.ones((2, 4), np.int32), "mask": np.ones((2, 4), np.int64)}]
    calls: list = []
    pa.run_grouped(fake_model(calls), feeds)
    assert len(calls) == 2
    calls.clear()
    pa.run_grouped(fake_model(calls), feeds[:1] * 3, batching=False)
    assert calls == [{"ids": (1, 4), "mask": (1, 4)}] * 3


def test_io_spec():
    args = [SimpleNamespace(name="input_ids", type="tensor(int64)", shape=["batch", "seq"]),
            SimpleNamespace(name="x", type="tensor(float)", shape=[None, 64])]
    assert pa.io_spec(args, True) == [("input_ids", np.int64, (-1,)), ("x", np.float32, (64,))]
    assert pa.io_spec(args, False) == [("input_ids", np.int64, (-1, -1)), ("x", np.float32, (-1, 64))]
    with pytest.raises(ValueError, match="dynamic first dim"):
        pa.io_spec([SimpleNamespace(name="y", type="tensor(float)", shape=[1, 64])], True)
    with pytest.raises(ValueError, match="unsupported"):
        pa.io_spec([SimpleNamespace(name="s", type="tensor(string)", shape=["b"])], True)


def test_make_infer_counts():
    class Sess:
        def get_outputs(self):
            return [SimpleNamespace(name="y")]

        def run(self, names, feed):
            return [feed["x"] * 2]

    stats = {"batches": 0, "requests": 0, "ort_calls": 0}
    infer = pa.make_infer(Sess(), True, stats)
    reqs = [SimpleNamespace(data={"x": np.ones((n, k), np.float32)}) for n, k in ((1, 3), (2, 3), (1, 4))]
    out = infer(reqs)
    assert [o["y"].shape for o in out] == [(1, 3), (2, 3), (1, 4)]
    assert stats == {"batches": 1, "requests": 3, "ort_calls": 2}


def test_serve_bench_reads_triton_counters():
    """serve_bench's /metrics deltas from Triton's own counter names (no _total suffix, microseconds)."""
    # ../shared/bench beside the checkout or an ancestor (as bench/benchutil.py looks): data, not a package, so
    # its absence is a skip also under CI (a clone elsewhere has no ../shared)
    if not any((root / "shared" / "bench" / "common.py").is_file() for root in Path(__file__).resolve().parents[2:]):
        pytest.skip("../shared/bench/common.py is absent (the request stream's module serve_bench reads)")
    sb = pytest.importorskip("serve_bench")
    before = {"nv_inference_exec_count": 10, "nv_inference_count": 30, "nv_inference_request_success": 12,
              "nv_inference_queue_duration_us": 1000, "nv_inference_compute_infer_duration_us": 5000}
    after = {"nv_inference_exec_count": 20, "nv_inference_count": 90, "nv_inference_request_success": 32,
             "nv_inference_queue_duration_us": 41000, "nv_inference_compute_infer_duration_us": 65000}
    assert sb.server_deltas(before, after) == {"mean_batch_rows": 6.0, "mean_batch_requests": 2.0,
                                               "queue_ms": 2.0, "compute_ms_per_request": 3.0}
