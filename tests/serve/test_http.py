"""KServe v2 REST through the unchanged tritonclient.http client (sync and asyncio), JSON and binary."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from serve_util import close
from tritonclient.utils import InferenceServerException


def _infer(client, model, arrays, binary, outputs=None):
    inputs = []
    for name, a in arrays.items():
        i = httpclient.InferInput(name, list(a.shape), "FP32" if a.dtype == np.float32 else "INT64")
        i.set_data_from_numpy(a, binary_data=binary)
        inputs.append(i)
    outs = [httpclient.InferRequestedOutput(o, binary_data=binary) for o in outputs] if outputs else None
    return client.infer(model, inputs, outputs=outs)


def test_health_and_metadata(server):
    c = httpclient.InferenceServerClient(server.url)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("mlp") and c.is_model_ready("enc", "1")
    assert not c.is_model_ready("nope")
    meta = c.get_server_metadata()
    assert meta["name"] == "dynshape" and "binary_tensor_data" in meta["extensions"]
    m = c.get_model_metadata("enc", "1")
    assert m["inputs"][0] == {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]}
    assert m["outputs"][0]["shape"] == [-1, -1, 32]
    syms = {s["name"]: s for s in m["dynshape"]["symbols"]}
    assert syms["seq"] == {"name": "seq", "min": 1, "max": 32, "multiple_of": 1}
    assert m["dynshape"]["batch_symbol"] == "batch" and m["dynshape"]["dims"]["input_ids"] == ["batch", "seq"]
    assert c.get_model_config("mlp")["max_batch_size"] == 64
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        c.get_model_metadata("nope")
    with pytest.raises(InferenceServerException, match="no version '7'"):
        c.get_model_metadata("mlp", "7")


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_mlp_responses_equal_exe_run_and_onnxruntime(server, mlp_ref, binary):
    import onnxruntime as ort

    from dynshape.models.mlp import build_mlp

    sess = ort.InferenceSession(build_mlp().SerializeToString(), providers=["CPUExecutionProvider"])
    c = httpclient.InferenceServerClient(server.url)
    rng = np.random.default_rng(1)
    for b in (1, 3, 64):
        x = rng.standard_normal((b, 64)).astype(np.float32)
        r = _infer(c, "mlp", {"x": x}, binary)
        y = r.as_numpy("y")
        close(y, mlp_ref.run({"x": x})["y"])
        close(y, sess.run(None, {"x": x})[0])
        assert r.get_response()["model_name"] == "mlp"


def test_encoder_requested_outputs_and_versions(server, enc_graph):
    import dynshape as ds

    ref = ds.compile(enc_graph)
    c = httpclient.InferenceServerClient(server.url)
    ids = np.arange(2 * 5, dtype=np.int64).reshape(2, 5) % 50
    mask = np.ones((2, 5), np.int64)
    r = _infer(c, "enc", {"input_ids": ids, "attention_mask": mask}, True, outputs=["last_hidden_state"])
    close(r.as_numpy("last_hidden_state"), ref.run({"input_ids": ids, "attention_mask": mask})["last_hidden_state"])
    with pytest.raises(InferenceServerException, match=r"unknown output\(s\) \['nope'\]"):
        _infer(c, "enc", {"input_ids": ids, "attention_mask": mask}, False, outputs=["nope"])


def test_validation_names_input_axis_symbol_and_fact(server):
    c = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match=r"input 'x' axis 0 \(batch\) is 65: .*batch in \[1, 64\]"):
        _infer(c, "mlp", {"x": np.zeros((65, 64), np.float32)}, True)
    with pytest.raises(InferenceServerException, match=r"input 'x' axis 1 is 63, but it must equal 64"):
        _infer(c, "mlp", {"x": np.zeros((2, 63), np.float32)}, False)
    ids = np.zeros((2, 5), np.int64)
    with pytest.raises(InferenceServerException, match=r"axis 1 \(seq\) is 4, but input 'input_ids' axis 1 bound "
                                                       r"seq = 5"):
        _infer(c, "enc", {"input_ids": ids, "attention_mask": np.ones((2, 4), np.int64)}, True)
    with pytest.raises(InferenceServerException, match="datatype INT64 but the model takes FP32"):
        _infer(c, "mlp", {"x": np.zeros((2, 64), np.int64)}, True)


def test_aio_client_concurrent_requests(server, mlp_ref):
    async def main():
        c = aiohttpclient.InferenceServerClient(server.url)
        try:
            assert await c.is_server_live()
            rng = np.random.default_rng(2)
            xs = [rng.standard_normal((int(b), 64)).astype(np.float32) for b in rng.integers(1, 9, size=12)]

            async def one(i, x):
                inp = aiohttpclient.InferInput("x", list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=bool(i % 2))
                r = await c.infer("mlp", [inp])
                return r.as_numpy("y")

            ys = await asyncio.gather(*(one(i, x) for i, x in enumerate(xs)))
        finally:
            await c.close()
        for x, y in zip(xs, ys):
            close(y, mlp_ref.run({"x": x})["y"])

    asyncio.run(main())
