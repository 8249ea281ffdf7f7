"""--instances: one executable (own arenas) per instance, batches run concurrently; the access log's JSON lines."""

from __future__ import annotations

import json
import logging

import numpy as np
from serve_util import close, metric
from test_batching import send

from dynshape.serve import BatcherConfig, ModelSpec, ServerConfig
from dynshape.serve.server import Server


def test_two_instances_serve_concurrent_requests(mlp_graph, mlp_ref, caplog):
    spec = ModelSpec(mlp_graph, name="mlp2", instances=2, batcher=BatcherConfig(max_batch_size=1))
    with Server([spec], ServerConfig(port=0)) as srv:
        m = srv.repo.get("mlp2")
        assert m.batcher.instances == 2 and m.config()["instance_group"][0]["count"] == 2
        rng = np.random.default_rng(10)
        feeds = [{"x": rng.standard_normal((4, 64)).astype(np.float32)} for _ in range(10)]
        with caplog.at_level(logging.INFO, logger="dynshape.serve.access"):
            outs = send(srv.url, "mlp2", feeds)
        for f, o in zip(feeds, outs):
            close(o["y"], mlp_ref.run(f)["y"])
        assert metric(srv, "nv_inference_exec_count_total", model="mlp2") == 10  # max_batch_size 1: one call each
        records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dynshape.serve.access"]
        assert len(records) == 10 and all(r["status"] == 200 and r["model"] == "mlp2" for r in records)
        assert all(r["path"] == "/v2/models/mlp2/infer" and r["ms"] >= 0 for r in records)
