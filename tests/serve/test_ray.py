"""Ray Serve scale-out: two replicas on a local Ray instance (2 CPUs), the same KServe v2 routes, requests spread
over both and answered correctly through the unchanged tritonclient.http and plain HTTP."""

from __future__ import annotations

import json
import os
import socket
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from serve_util import close

ray = pytest.importorskip("ray")  # the `ray` extra; CI installs it
from ray import serve  # noqa: E402

from dynshape.serve import BatcherConfig, ModelSpec  # noqa: E402


def _is_start_up_timeout(e: BaseException) -> bool:
    """Ray's two start-up timeouts: the raylet not registered in 30 s, the GCS port file not written in time."""
    text = str(e)
    return "timed out during startup" in text or "Timed out waiting for file" in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_url(tmp_path_factory):
    from dynshape.models.mlp import build_mlp
    from dynshape.serve.ray import application

    path = tmp_path_factory.mktemp("ray") / "mlp.onnx"
    onnx.save(build_mlp(), str(path))
    # Ray's start-up waits are sized for an idle machine: 30 s for the GCS to write its port file (CI on 2 cores,
    # both busy with the other worker's gcc, once took longer: stop 63) and 30 s, fixed, for the raylet. The first
    # has a documented override, set here for the test's own start only; a second start covers the second. Neither
    # is a product retry: the server is tested below, on a Ray that started.
    with pytest.MonkeyPatch.context() as mp:  # (an operator's own value kept)
        mp.setenv("RAY_gcs_server_port_wait_time_s", os.environ.get("RAY_gcs_server_port_wait_time_s") or "120")
        for attempt in (1, 2):
            try:
                ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
                break
            except Exception as e:
                ray.shutdown()
                if attempt == 2 or not _is_start_up_timeout(e):
                    raise
    port = _free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        spec = ModelSpec(str(path), name="mlp", dims={"batch": (1, 64)},
                         batcher=BatcherConfig(max_queue_delay_us=2000))
        serve.run(application([spec], num_replicas=2, max_ongoing_requests=32,
                              ray_actor_options={"num_cpus": 1}), route_prefix="/", name="dynshape")
        yield f"127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _post(url: str, x: np.ndarray) -> tuple[str, np.ndarray]:
    body = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    req = urllib.request.Request(f"http://{url}/v2/models/mlp/infer", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        doc = json.loads(r.read())
        out = doc["outputs"][0]
        return r.headers["x-dynshape-replica"], np.array(out["data"], np.float32).reshape(out["shape"])


def test_two_replicas_share_requests_and_answer_correctly(ray_url, mlp_ref):
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal((int(b), 64)).astype(np.float32) for b in rng.integers(1, 9, size=40)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda x: _post(ray_url, x), xs))
    for x, (_, y) in zip(xs, results):
        close(y, mlp_ref.run({"x": x})["y"])
    assert len({replica for replica, _ in results}) == 2
    c = httpclient.InferenceServerClient(ray_url)
    assert c.is_server_ready() and c.get_model_metadata("mlp")["inputs"][0]["shape"] == [-1, 64]
    i = httpclient.InferInput("x", [3, 64], "FP32")
    i.set_data_from_numpy(xs[0][:3] if len(xs[0]) >= 3 else np.ones((3, 64), np.float32))
    r = c.infer("mlp", [i])
    assert r.as_numpy("y").shape == (3, 64)
