"""Every malformed request gets a 4xx with a clear message and never disturbs a concurrent good request."""

from __future__ import annotations

import http.client
import json
import threading

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from serve_util import close


def post(url: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return r.status, (json.loads(data) if data and r.getheader("content-type", "").startswith("application/json")
                          else {})
    finally:
        conn.close()


X = np.arange(2 * 64, dtype=np.float32).reshape(2, 64)
GOOD = {"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32", "data": X.ravel().tolist()}]}


def _binary(size_claimed: int, raw: bytes) -> tuple[bytes, dict]:
    head = orjson.dumps({"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32",
                                     "parameters": {"binary_data_size": size_claimed}}]})
    return head + raw, {"Inference-Header-Content-Length": str(len(head))}


CASES = {
    "malformed JSON": (b'{"inputs": [', {}, 400, "malformed JSON"),
    "not an object": (b"[1, 2]", {}, 400, "must be a JSON object"),
    "no inputs": (b'{"inputs": []}', {}, 400, "'inputs' must be a non-empty list"),
    "unknown datatype": (orjson.dumps({"inputs": [{**GOOD["inputs"][0], "datatype": "FP8"}]}), {}, 400,
                         "unknown datatype 'FP8'"),
    "wrong datatype": (orjson.dumps({"inputs": [{**GOOD["inputs"][0], "datatype": "FP64"}]}), {}, 400,
                       "datatype FP64 but the model takes FP32"),
    "strings for FP32": (orjson.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                                                   "data": ["a", "b"]}]}), {}, 400, "non-numeric"),
    "shape disagrees with data": (orjson.dumps({"inputs": [{**GOOD["inputs"][0], "shape": [3, 64]}]}), {}, 400,
                                  "'data' has 128 elements but shape [3, 64] needs 192"),
    "negative dim": (orjson.dumps({"inputs": [{**GOOD["inputs"][0], "shape": [-2, 64]}]}), {}, 400,
                     "non-negative integers"),
    "binary size disagrees with header": (*_binary(100, X.tobytes()), 400, "needs 512"),
    "binary bytes left over": (*_binary(512, X.tobytes() + b"\0" * 8), 400, "claimed by no input"),
    "binary overruns body": (*_binary(1024, X.tobytes()), 400, "overruns"),
    "header length past body": (orjson.dumps(GOOD), {"Inference-Header-Content-Length": "99999"}, 400,
                                "outside the body"),
    "unknown input": (orjson.dumps({"inputs": [{**GOOD["inputs"][0], "name": "z"}]}), {}, 400,
                      "missing ['x'], unexpected ['z']"),
    "unknown output": (orjson.dumps({**GOOD, "outputs": [{"name": "nope"}]}), {}, 400, "unknown output"),
    "bad priority": (orjson.dumps({**GOOD, "parameters": {"priority": "high"}}), {}, 400, "'priority'"),
    "oversized body": (b"{" + b" " * (1 << 20) + b"}", {}, 413, "exceeds --max-request-bytes"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_request_is_refused_alone(server, mlp_ref, case):
    body, headers, status, msg = CASES[case]
    good: list = []

    def good_loop():  # a concurrent good request, bounded
        c = httpclient.InferenceServerClient(server.url)
        for _ in range(3):
            i = httpclient.InferInput("x", [2, 64], "FP32")
            i.set_data_from_numpy(X)
            good.append(c.infer("mlp", [i]).as_numpy("y"))

    t = threading.Thread(target=good_loop)
    t.start()
    got, doc = post(server.url, "/v2/models/mlp/infer", body, headers)
    t.join(60)
    assert got == status, doc
    assert msg in doc["error"]
    assert len(good) == 3
    for y in good:
        close(y, mlp_ref.run({"x": X})["y"])


def test_unknown_model_and_route(server):
    status, doc = post(server.url, "/v2/models/nope/infer", orjson.dumps(GOOD))
    assert status == 404 and "unknown model 'nope'" in doc["error"]
    status, doc = post(server.url, "/v2/models/mlp/versions/3/infer", orjson.dumps(GOOD))
    assert status == 404 and "no version '3'" in doc["error"]
    status, doc = post(server.url, "/v2/nothing", b"{}")
    assert status == 404 and doc["error"] == "POST /v2/nothing: Not Found"
    status, doc = post(server.url, "/v2/health/live", b"{}")
    assert status == 405 and "Method Not Allowed" in doc["error"]
