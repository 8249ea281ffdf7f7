"""KServe v2 over gRPC (`inference.GRPCInferenceService`), on grpc.aio in the HTTP server's event loop.

Why the same loop: requests from both transports go to the same batchers (asyncio queues), so gRPC and REST
requests of one shape join the same batches. Methods are bound from the .proto's service descriptor
(grpc_proto.py) with grpc's generic handlers. Outputs are always sent as `raw_output_contents` (what Triton does
and tritonclient reads); inputs may be raw or typed `contents`.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
import numpy as np

from dynshape.serve.app import EXTENSIONS, SERVER_NAME
from dynshape.serve.errors import InferError, bad
from dynshape.serve.metrics import Metrics
from dynshape.serve.protocol import (
    InferRequest,
    RequestedOutput,
    array_from_bytes,
    bytes_of,
    check_shape,
    datatype_of,
    dtype_of,
)
from dynshape.serve.repository import ModelRepository

CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
         413: grpc.StatusCode.RESOURCE_EXHAUSTED, 415: grpc.StatusCode.INVALID_ARGUMENT,
         429: grpc.StatusCode.UNAVAILABLE, 503: grpc.StatusCode.UNAVAILABLE,
         504: grpc.StatusCode.DEADLINE_EXCEEDED}
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def _param(p: Any) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def decode_grpc(msg: Any) -> InferRequest:
    """A ModelInferRequest as an InferRequest; every inconsistency is a 400 naming the tensor."""
    raw = list(msg.raw_input_contents)
    if raw and len(raw) != len(msg.inputs):
        raise bad(f"{len(raw)} raw_input_contents for {len(msg.inputs)} inputs")
    if not msg.inputs:
        raise bad("'inputs' must be a non-empty list of tensors")
    feed: dict[str, np.ndarray] = {}
    for k, t in enumerate(msg.inputs):
        name = t.name
        if name in feed:
            raise bad(f"input {name!r} is given twice")
        dt, shape = dtype_of(name, t.datatype), check_shape(name, list(t.shape))
        if raw:
            if t.HasField("contents"):
                raise bad(f"input {name!r}: both contents and raw_input_contents given")
            feed[name] = array_from_bytes(name, dt, shape, raw[k])
            continue
        field = CONTENTS.get(t.datatype)
        if field is None:
            raise bad(f"input {name!r}: {t.datatype} must be sent as raw_input_contents")
        values = list(getattr(t.contents, field))
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if len(values) != n:
            raise bad(f"input {name!r}: contents has {len(values)} elements but shape {list(shape)} needs {n}")
        if t.datatype == "BYTES":
            arr = np.empty(n, dtype=object)
            arr[:] = values
        else:
            with np.errstate(all="ignore"):
                arr = np.asarray(values).astype(dt, casting="unsafe")
        feed[name] = arr.reshape(shape)
    params = {k: _param(v) for k, v in msg.parameters.items()}
    outs = [RequestedOutput(o.name) for o in msg.outputs] if len(msg.outputs) else None
    req = InferRequest(feed, outs, msg.id or None, params)
    req.priority, req.timeout_us  # noqa: B018 (validated now: a bad value is this request's error)
    return req


class GrpcService:
    """The six RPCs of the proto over a repository."""

    def __init__(self, repo: ModelRepository, metrics: Metrics, proto: Any):
        self.repo, self.metrics, self.p = repo, metrics, proto

    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 (the proto's names)
        return self.p.msg("ServerLiveResponse")(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self.p.msg("ServerReadyResponse")(ready=self.repo.ready)

    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            ready = self.repo.get(request.name, request.version or None).ready
        except InferError as e:
            await context.abort(CODES[e.status], e.message)
        return self.p.msg("ModelReadyResponse")(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        from dynshape import __version__

        return self.p.msg("ServerMetadataResponse")(name=SERVER_NAME, version=__version__, extensions=EXTENSIONS)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            m = self.repo.get(request.name, request.version or None)
        except InferError as e:
            await context.abort(CODES[e.status], e.message)
        meta = m.metadata(self.repo.versions(m.name))
        resp = self.p.msg("ModelMetadataResponse")(name=meta["name"], versions=meta["versions"],
                                                    platform=meta["platform"])
        for t in meta["inputs"]:
            resp.inputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        for t in meta["outputs"]:
            resp.outputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        return resp

    async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        t0 = time.perf_counter()
        m = None
        try:
            m = self.repo.get(request.model_name, request.model_version or None)
            req = decode_grpc(request)
            if req.outputs is not None:
                unknown = [o.name for o in req.outputs if o.name not in m.signature.output_names]
                if unknown:
                    raise bad(f"unknown output(s) {unknown}; model {m.name!r} has {m.signature.output_names}")
            outs = await m.batcher.infer(req.inputs, req.priority, req.timeout_us)
            resp = self.p.msg("ModelInferResponse")(model_name=m.name, model_version=m.version,
                                                     id=request.id)
            for name in [o.name for o in req.outputs] if req.outputs is not None else list(outs):
                arr = outs[name]
                resp.outputs.add(name=name, datatype=datatype_of(arr.dtype), shape=list(arr.shape))
                resp.raw_output_contents.append(bytes(bytes_of(arr)))
        except InferError as e:
            if m is not None:
                self.metrics.request(m.name, m.version, "failure", e.reason)
            await context.abort(CODES.get(e.status, grpc.StatusCode.INTERNAL), e.message)
        self.metrics.request(m.name, m.version, "success")
        self.metrics.duration("request", m.name, m.version).observe(time.perf_counter() - t0)
        return resp


async def start_grpc(repo: ModelRepository, metrics: Metrics, host: str, port: int,
                     max_message_bytes: int = 64 << 20) -> tuple[Any, int]:
    """Start the service on the running loop; returns the server and its bound port (`port=0`: a free one)."""
    from dynshape.serve.grpc_proto import SERVICE, protocol

    proto = protocol()
    svc = GrpcService(repo, metrics, proto)
    handlers = {name: grpc.unary_unary_rpc_method_handler(getattr(svc, name), request_deserializer=req.FromString,
                                                          response_serializer=resp.SerializeToString)
                for name, (req, resp) in proto.method_types().items()}
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_message_bytes),
                                      ("grpc.max_send_message_length", max_message_bytes),
                                      ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise RuntimeError(f"gRPC: cannot bind {host}:{port}")
    await server.start()
    return server, bound
