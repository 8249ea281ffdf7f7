"""The batcher end to end: joins concurrent requests (seen in the metrics), groups by non-batch shape, 429 past
max_queue_size, 504 past a timeout, priority levels, and a failing batch re-run so only the culprit fails."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from serve_util import SlowExe, close, metric
from tritonclient.utils import InferenceServerException

from dynshape.serve import BatcherConfig, ModelSpec, ServerConfig
from dynshape.serve.server import Server


async def _send(url: str, model: str, feeds: list[dict], **kw) -> list:
    """All requests at once; each result is a dict of outputs or the exception it raised."""
    c = aioclient.InferenceServerClient(url)
    try:
        async def one(feed, extra):
            inputs = []
            for n, a in feed.items():
                i = aioclient.InferInput(n, list(a.shape), "FP32" if a.dtype == np.float32 else "INT64")
                i.set_data_from_numpy(a)
                inputs.append(i)
            try:
                r = await c.infer(model, inputs, **extra)
            except InferenceServerException as e:
                return e
            return {o["name"]: r.as_numpy(o["name"]) for o in r.get_response()["outputs"]}
        extras = kw.pop("per_request", None) or [{} for _ in feeds]
        return await asyncio.gather(*(one(f, e) for f, e in zip(feeds, extras)))
    finally:
        await c.close()


def send(url, model, feeds, **kw):
    return asyncio.run(_send(url, model, feeds, **kw))


@contextlib.contextmanager
def slow_server(exe, **batcher):
    srv = Server([ModelSpec(exe, name="slow", batcher=BatcherConfig(**batcher))], ServerConfig(port=0)).start()
    try:
        yield srv
    finally:
        srv.stop()


def test_concurrent_requests_are_joined(server, mlp_ref):
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((2, 64)).astype(np.float32)} for _ in range(8)]
    execs0, reqs0 = metric(server, "nv_inference_exec_count_total", model="mlp"), \
        metric(server, "dynshape_batch_size_requests_count", model="mlp")
    joined0 = metric(server, "dynshape_batch_size_requests_sum", model="mlp")
    outs = send(server.url, "mlp", feeds)
    for f, o in zip(feeds, outs):
        close(o["y"], mlp_ref.run(f)["y"])
    execs = metric(server, "nv_inference_exec_count_total", model="mlp") - execs0
    calls = metric(server, "dynshape_batch_size_requests_count", model="mlp") - reqs0
    joined = metric(server, "dynshape_batch_size_requests_sum", model="mlp") - joined0
    assert joined == 8 and execs == calls < 8, (execs, joined)  # 8 requests in fewer calls: some were joined
    assert metric(server, "dynshape_batch_size_rows_bucket", model="mlp", le="1.0") < \
        metric(server, "dynshape_batch_size_rows_count", model="mlp")


def test_groups_by_sequence_length_never_padded(server, enc_graph):
    import dynshape as ds

    ref = ds.compile(enc_graph)
    rng = np.random.default_rng(4)
    feeds = [{"input_ids": rng.integers(0, 50, (1, s)).astype(np.int64), "attention_mask": np.ones((1, s), np.int64)}
             for s in (5, 7, 5, 7, 5, 7)]
    execs0 = metric(server, "nv_inference_exec_count_total", model="enc")
    outs = send(server.url, "enc", feeds)
    for f, o in zip(feeds, outs):
        assert o["last_hidden_state"].shape == (1, f["input_ids"].shape[1], 32)
        close(o["last_hidden_state"], ref.run(f)["last_hidden_state"])
    assert metric(server, "nv_inference_exec_count_total", model="enc") - execs0 < 6
    assert metric(server, "dynshape_padding_waste_ratio_sum", model="enc") == 0


def test_queue_full_is_429_at_once(mlp_ref):
    slow = SlowExe(mlp_ref, 0.3)
    with slow_server(slow, max_batch_size=1, max_queue_size=2) as srv:
        x = np.ones((1, 64), np.float32)
        outs = send(srv.url, "slow", [{"x": x}] * 6)
        refused = [o for o in outs if isinstance(o, Exception)]
        assert refused and all("queue full" in str(e) and e.status() == "429" for e in refused)
        assert len(outs) - len(refused) >= 3
        assert metric(srv, "nv_inference_request_total", reason="rejected") == len(refused)
        assert metric(srv, "nv_inference_pending_request_count") == 0


def test_timeout_is_504(mlp_ref):
    slow = SlowExe(mlp_ref, 0.3)
    x = np.ones((1, 64), np.float32)
    with slow_server(slow, max_batch_size=1, default_timeout_us=100_000) as srv:
        outs = send(srv.url, "slow", [{"x": x}] * 3)
        timed_out = [o for o in outs if isinstance(o, Exception)]
        assert len(timed_out) == 2 and all(e.status() == "504" and "timed out" in str(e) for e in timed_out)
        assert metric(srv, "nv_inference_request_total", reason="timeout") == 2
    with slow_server(slow, max_batch_size=1) as srv:  # no default: a request's own `timeout` (us) applies
        outs = send(srv.url, "slow", [{"x": x}] * 2, per_request=[{}, {"timeout": 50_000}])
        assert not isinstance(outs[0], Exception) and outs[1].status() == "504"


def test_priority_levels_serve_level_1_first(mlp_ref):
    slow = SlowExe(mlp_ref, 0.2)
    with slow_server(slow, max_batch_size=1, priority_levels=2, default_priority_level=2) as srv:
        async def main():
            first = asyncio.ensure_future(_send(srv.url, "slow", [{"x": np.ones((1, 64), np.float32)}]))
            await asyncio.sleep(0.08)  # the first occupies the instance; then a low and a high one queue
            low = asyncio.ensure_future(_send(srv.url, "slow", [{"x": np.ones((3, 64), np.float32)}]))
            await asyncio.sleep(0.03)
            high = _send(srv.url, "slow", [{"x": np.ones((5, 64), np.float32)}], per_request=[{"priority": 1}])
            return await asyncio.gather(first, low, high)
        outs = asyncio.run(main())
        assert all(not isinstance(o[0], Exception) for o in outs)
        assert slow.calls == [1, 5, 3]
        with pytest.raises(InferenceServerException, match=r"priority 3 is outside 1..2"):
            c = httpclient.InferenceServerClient(srv.url)
            i = httpclient.InferInput("x", [1, 64], "FP32")
            i.set_data_from_numpy(np.ones((1, 64), np.float32))
            c.infer("slow", [i], priority=3)


def test_failing_batch_is_rerun_so_only_the_culprit_fails(mlp_ref):
    slow = SlowExe(mlp_ref, 0.05, fail_on=999.0)
    with slow_server(slow, max_batch_size=16, max_queue_delay_us=50_000) as srv:
        rng = np.random.default_rng(5)
        feeds = [{"x": rng.standard_normal((2, 64)).astype(np.float32)} for _ in range(4)]
        feeds[2]["x"][1, 3] = 999.0
        outs = send(srv.url, "slow", feeds)
        assert isinstance(outs[2], Exception) and "poisoned row" in str(outs[2])
        for i in (0, 1, 3):
            close(outs[i]["y"], mlp_ref.run(feeds[i])["y"])
        assert max(slow.calls) > 2  # they were joined first
        assert metric(srv, "nv_inference_request_total", outcome="success") == 3


def _cnn():
    """images (batch, 3, H, W) -> Conv 3x3 (pads 1) -> Relu -> GlobalAveragePool -> (batch, 8, 1, 1)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 1, 1])
    nodes = [helper.make_node("Conv", ["images", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "cnn", [x], [y], [w, b]),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_images_grouped_by_resolution_never_padded():
    import dynshape as ds

    g = ds.load_onnx(_cnn(), dims={"batch": (1, 8), "H": (4, 64), "W": (4, 64)})
    ref = ds.compile(g)
    spec = ModelSpec(g, name="cnn", batcher=BatcherConfig(max_batch_size=8, max_queue_delay_us=50_000))
    with Server([spec], ServerConfig(port=0)) as srv:
        rng = np.random.default_rng(11)
        sizes = [(16, 24), (32, 32), (16, 24), (32, 32), (16, 24), (32, 32)]
        feeds = [{"images": rng.standard_normal((1, 3, h, w)).astype(np.float32)} for h, w in sizes]
        outs = send(srv.url, "cnn", feeds)
        for f, o in zip(feeds, outs):
            close(o["y"], ref.run(f)["y"])
        calls = metric(srv, "nv_inference_exec_count_total", model="cnn")
        assert 2 <= calls < len(feeds)  # joined within a resolution, never across (no pad plan for images)
        assert metric(srv, "dynshape_padding_waste_ratio_count", model="cnn") == 0
