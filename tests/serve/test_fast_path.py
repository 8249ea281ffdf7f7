"""`fast_infer` (the raw ASGI infer route `dynshape serve` runs) answers exactly as the FastAPI route Ray Serve
mounts: same status, body and content type for good and bad requests, and passes every other request through."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson

from dynshape.serve.app import build_app, fast_infer
from dynshape.serve.config import BatcherConfig, ModelSpec
from dynshape.serve.metrics import Metrics
from dynshape.serve.repository import ModelRepository, build_model


async def _call(app, method: str, path: str, body: bytes = b"", headers: tuple = ()) -> tuple[int, bytes, bytes]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"test"), (b"content-length", str(len(body)).encode()), *headers],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000), "state": {}}
    chunks = [body[:7], body[7:]]  # the body in two messages, as a socket may deliver it

    async def receive():
        if chunks:
            return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}
        return {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    head = dict(sent[0]["headers"])
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), head.get(b"content-type", b"")


def test_the_fast_path_answers_as_the_fastapi_route(mlp_graph):
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    good = orjson.dumps({"id": "r1", "inputs": [{"name": "x", "shape": [3, 64], "datatype": "FP32",
                                                  "data": x.ravel().tolist()}]})
    cases = [
        ("POST", "/v2/models/mlp/infer", good, ()),
        ("POST", "/v2/models/mlp/versions/1/infer", good, ()),
        ("POST", "/v2/models/mlp/versions/9/infer", good, ()),
        ("POST", "/v2/models/nope/infer", good, ()),
        ("POST", "/v2/models/mlp/infer", b"{not json", ()),
        ("POST", "/v2/models/mlp/infer", good[:-1] + b', "outputs": [{"name": "zz"}]}', ()),
        ("POST", "/v2/models/mlp/infer", good.replace(b"[3,64]", b"[3,65]"), ()),
        ("POST", "/v2/models/mlp/infer", b"x" * 5000, ()),  # over the 4 KiB limit below: 413
        ("POST", "/v2/models/mlp/infer", good, ((b"content-encoding", b"gzip"),)),
        ("POST", "/v2/models/mlp/infer", good[:5], ((b"inference-header-content-length", b"999"),)),
        ("GET", "/v2/models/mlp/infer", b"", ()),  # not the infer route: passed through (405)
        ("POST", "/v2/models/mlp/extra/infer", good, ()),  # no such route: passed through (404)
    ]

    async def main() -> list[tuple]:
        metrics = Metrics()
        repo = ModelRepository([build_model(ModelSpec(mlp_graph, name="mlp", batcher=BatcherConfig()), metrics)])
        app = build_app(repo, metrics, max_request_bytes=4096)
        fast = fast_infer(app)
        repo.start()
        try:
            return [(await _call(app, *c), await _call(fast, *c)) for c in cases]
        finally:
            await repo.stop()

    results = asyncio.run(main())
    statuses = [a[0] for a, _ in results]
    assert statuses == [200, 200, 404, 404, 400, 400, 400, 413, 415, 400, 405, 404], statuses
    for (slow, fast), case in zip(results, cases):
        assert slow == fast, (case[:2], slow, fast)
    out = orjson.loads(results[0][1][1])
    assert out["id"] == "r1" and out["outputs"][0]["shape"] == [3, 64]
