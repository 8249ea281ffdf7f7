"""Shared fixtures: real servers on free loopback ports over small built-in models, and a reference executable."""

from __future__ import annotations

import pytest

import dynshape as ds
from dynshape.models.encoder import build_encoder
from dynshape.models.mlp import build_mlp
from dynshape.serve import BatcherConfig, ModelSpec, ServerConfig
from dynshape.serve.server import Server

MLP_DIMS = {"batch": (1, 64)}
ENC_DIMS = {"batch": (1, 8), "seq": (1, 32)}


@pytest.fixture(scope="session")
def mlp_graph():
    return ds.load_onnx(build_mlp(), dims=MLP_DIMS)


@pytest.fixture(scope="session")
def mlp_ref(mlp_graph):
    """The executable a response must equal (the request run alone)."""
    return ds.compile(mlp_graph)


@pytest.fixture(scope="session")
def enc_graph():
    return ds.load_onnx(build_encoder(layers=1, hidden=32, heads=2, ffn=64, vocab=50), dims=ENC_DIMS)


@pytest.fixture(scope="session")
def server(mlp_graph, enc_graph):
    """mlp (joins concurrent requests: 20 ms queue delay) and enc (batch, seq) on one server, HTTP and gRPC."""
    specs = [ModelSpec(mlp_graph, name="mlp", batcher=BatcherConfig(max_batch_size=64, max_queue_delay_us=20_000)),
             ModelSpec(enc_graph, name="enc", batcher=BatcherConfig(max_batch_size=8, max_queue_delay_us=20_000))]
    srv = Server(specs, ServerConfig(port=0, grpc_port=0, max_request_bytes=1 << 20)).start()
    yield srv
    srv.stop()
