"""A hypothesis fuzz of request bodies (JSON documents near the protocol's shape, and raw bytes with a binary
header): the server answers every one with 200 or a 4xx, never a 500 or a dropped connection."""

from __future__ import annotations

import http.client
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=5))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                      max_leaves=12)
dims = st.lists(st.one_of(st.integers(-1, 70), st.just(64), st.sampled_from(["2", None, 1.5])), max_size=4)
tensor = st.fixed_dictionaries(
    {"name": st.sampled_from(["x", "y", "input_ids", "attention_mask", ""])},
    optional={"shape": dims, "datatype": st.sampled_from(["FP32", "INT64", "FP16", "BOOL", "BYTES", "UINT8", "X"]),
              "data": values, "parameters": st.dictionaries(st.sampled_from(["binary_data_size", "binary_data"]),
                                                            scalars, max_size=2)})
document = st.fixed_dictionaries(
    {"inputs": st.one_of(st.lists(tensor, max_size=3), values)},
    optional={"outputs": st.one_of(st.lists(st.fixed_dictionaries({"name": st.sampled_from(["y", "z"])},
                                                                  optional={"parameters": values}), max_size=2),
                                   values),
              "parameters": st.one_of(st.dictionaries(st.sampled_from(["priority", "timeout", "binary_data_output"]),
                                                      scalars, max_size=3), values),
              "id": scalars})


def _post(url: str, path: str, body: bytes, headers: dict) -> int:
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers)
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=document, model=st.sampled_from(["mlp", "enc"]), tail=st.binary(max_size=64),
       header=st.one_of(st.none(), st.integers(-5, 400).map(str),
                        st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=4)))
def test_fuzzed_bodies_never_500(server, doc, model, tail, header):
    head = json.dumps(doc).encode()  # (Python's json: ints past 64 bits, NaN: the server must refuse both)
    headers = {}
    if header is not None:
        headers["Inference-Header-Content-Length"] = header
    status = _post(server.url, f"/v2/models/{model}/infer", head + tail, headers)
    assert status < 500, (doc, tail, header)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.binary(max_size=200))
def test_random_bytes_never_500(server, body):
    assert _post(server.url, "/v2/models/mlp/infer", body, {}) < 500
