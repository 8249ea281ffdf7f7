"""KServe v2 gRPC through the unchanged tritonclient.grpc client (sync and asyncio)."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_util import close, metric
from tritonclient.utils import InferenceServerException


def _inputs(mod, feed):
    out = []
    for n, a in feed.items():
        i = mod.InferInput(n, list(a.shape), "FP32" if a.dtype == np.float32 else "INT64")
        i.set_data_from_numpy(a)
        out.append(i)
    return out


def test_health_metadata_and_infer(server, mlp_ref, enc_graph):
    import dynshape as ds

    c = grpcclient.InferenceServerClient(server.grpc_url)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("mlp")
    assert c.get_server_metadata().name == "dynshape"
    meta = c.get_model_metadata("enc", as_json=True)
    assert meta["inputs"][0]["shape"] == ["-1", "-1"]  # (the client's JSON view prints int64 as strings)
    rng = np.random.default_rng(6)
    for b in (1, 5):
        x = rng.standard_normal((b, 64)).astype(np.float32)
        close(c.infer("mlp", _inputs(grpcclient, {"x": x})).as_numpy("y"), mlp_ref.run({"x": x})["y"])
    feed = {"input_ids": rng.integers(0, 50, (2, 9)).astype(np.int64), "attention_mask": np.ones((2, 9), np.int64)}
    r = c.infer("enc", _inputs(grpcclient, feed), outputs=[grpcclient.InferRequestedOutput("last_hidden_state")])
    close(r.as_numpy("last_hidden_state"), ds.compile(enc_graph).run(feed)["last_hidden_state"])
    assert metric(server, "nv_inference_request_total", model="enc", outcome="success") >= 1


def test_errors_map_to_grpc_codes(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="unknown model 'nope'") as e:
        c.infer("nope", _inputs(grpcclient, {"x": np.zeros((1, 64), np.float32)}))
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException, match=r"input 'x' axis 1 is 3, but it must equal 64") as e:
        c.infer("mlp", _inputs(grpcclient, {"x": np.zeros((1, 3), np.float32)}))
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match=r"unknown output\(s\) \['z'\]"):
        c.infer("mlp", _inputs(grpcclient, {"x": np.zeros((1, 64), np.float32)}),
                outputs=[grpcclient.InferRequestedOutput("z")])


def test_aio_client_and_joining_with_http(server, mlp_ref):
    async def main():
        c = aiogrpcclient.InferenceServerClient(server.grpc_url)
        try:
            assert await c.is_server_live()
            rng = np.random.default_rng(7)
            xs = [rng.standard_normal((3, 64)).astype(np.float32) for _ in range(8)]
            rs = await asyncio.gather(*(c.infer("mlp", _inputs(aiogrpcclient, {"x": x})) for x in xs))
        finally:
            await c.close()
        return xs, rs

    execs0 = metric(server, "nv_inference_exec_count_total", model="mlp")
    xs, rs = asyncio.run(main())
    for x, r in zip(xs, rs):
        close(r.as_numpy("y"), mlp_ref.run({"x": x})["y"])
    assert metric(server, "nv_inference_exec_count_total", model="mlp") - execs0 < 8


def test_malformed_raw_contents_are_invalid_argument(server):
    """A raw message the client library would never build: the bytes disagree with the shape."""
    from dynshape.serve.grpc_proto import protocol

    p = protocol()
    req = p.msg("ModelInferRequest")(model_name="mlp")
    req.inputs.add(name="x", datatype="FP32", shape=[2, 64])
    req.raw_input_contents.append(b"\0" * 12)
    with grpc.insecure_channel(server.grpc_url) as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                              request_serializer=type(req).SerializeToString,
                              response_deserializer=p.msg("ModelInferResponse").FromString)
        with pytest.raises(grpc.RpcError) as e:
            call(req, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "needs 512" in e.value.details()


names = st.sampled_from(["x", "input_ids", "attention_mask", "q", ""])
datatypes = st.sampled_from(["FP32", "INT64", "FP16", "BOOL", "BYTES", "INT8", "UINT64", "nope", ""])


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(["mlp", "enc", "zz"]), tensors=st.lists(st.tuples(
    names, datatypes, st.lists(st.integers(0, 70), max_size=4), st.one_of(st.none(), st.binary(max_size=64)),
    st.lists(st.floats(allow_nan=True, width=32), max_size=8)), min_size=0, max_size=3),
    params=st.dictionaries(st.sampled_from(["priority", "timeout", "other"]), st.integers(-3, 2**40), max_size=2))
def test_fuzzed_messages_never_internal(server, model, tensors, params):
    from dynshape.serve.grpc_proto import protocol

    p = protocol()
    req = p.msg("ModelInferRequest")(model_name=model)
    for name, dt, shape, raw, values in tensors:
        t = req.inputs.add(name=name, datatype=dt, shape=shape)
        if raw is not None:
            req.raw_input_contents.append(raw)
        else:
            t.contents.fp32_contents.extend(values)
    for k, v in params.items():
        req.parameters[k].int64_param = v
    with grpc.insecure_channel(server.grpc_url) as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                              request_serializer=type(req).SerializeToString,
                              response_deserializer=p.msg("ModelInferResponse").FromString)
        try:
            call(req, timeout=30)
        except grpc.RpcError as e:
            assert e.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), e.details()


def test_stubs_are_generated_from_the_proto_at_first_use(tmp_path):
    import os
    import subprocess
    import sys

    code = "from dynshape.serve.grpc_proto import protocol; print(sorted(protocol().method_types()))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "DYNSHAPE_CACHE_DIR": str(tmp_path)},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "ModelInfer" in out and "ServerLive" in out
    assert list(tmp_path.glob("serve-grpc/*/open_inference_grpc.desc"))
