"""`dynshape serve`: a KServe v2 (Open Inference Protocol) server with a shape-aware dynamic batcher.

A layer above `dynshape.runtime` that uses only the public API (`ds.load_onnx`, `ds.compile`, `ds.load`,
`exe.run`, the graph's typed inputs and outputs). One module per job: `protocol` (the REST codec with the binary
extension), `signature` (what a model accepts, per-request validation), `batcher`, `metrics`, `repository`,
`app` (routes), `grpc_service` (the gRPC transport, stubs generated from the vendored .proto at first use),
`server` (uvicorn + lifespan), `config`, `ray` (Ray Serve scale-out).
"""

from dynshape.serve.config import BatcherConfig, ModelSpec, ServerConfig

__all__ = ["BatcherConfig", "ModelSpec", "Server", "ServerConfig"]


def __getattr__(name: str):
    if name == "Server":  # uvicorn and the compiler load on first use
        from dynshape.serve.server import Server

        return Server
    raise AttributeError(f"module 'dynshape.serve' has no attribute {name!r}")
