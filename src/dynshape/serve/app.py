"""The KServe v2 REST routes (Open Inference Protocol) and /metrics, as an ASGI app on FastAPI.

Why plain Starlette routes on a FastAPI app: the handlers need the raw body (the binary extension puts tensors
after the JSON), so FastAPI's per-request validation would only cost time; the FastAPI app is still what Ray
Serve's `@serve.ingress` takes. Every refusal is `{"error": "..."}` with its status (errors.InferError).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from dynshape.serve.errors import InferError, bad
from dynshape.serve.metrics import Metrics
from dynshape.serve.protocol import decode_http, encode_http
from dynshape.serve.repository import ModelRepository, ServedModel

SERVER_NAME = "dynshape"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "schedule_policy", "dynshape_symbols"]
access = logging.getLogger("dynshape.serve.access")


def _json(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def _error(e: InferError) -> Response:
    return _json({"error": e.message}, e.status)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed `limit` (Content-Length, or while streaming)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise InferError(413, f"request body of {declared} bytes exceeds --max-request-bytes {limit}")
    if request.headers.get("content-encoding", "identity") not in ("identity", ""):
        raise InferError(415, f"Content-Encoding {request.headers['content-encoding']!r} is not supported")
    chunks, n = [], 0
    try:
        async for chunk in request.stream():
            n += len(chunk)
            if n > limit:
                raise InferError(413, f"request body exceeds --max-request-bytes {limit}")
            chunks.append(chunk)
    except ClientDisconnect:
        raise InferError(400, "client disconnected while sending the body") from None
    return b"".join(chunks)


def build_app(repo: ModelRepository, metrics: Metrics, max_request_bytes: int = 64 << 20,
              lifespan: Any = None, version: str = "0.1.0") -> FastAPI:
    """The routes over a repository; `lifespan` starts the batchers (and the gRPC service) on the server's loop."""

    def model_of(request: Request) -> ServedModel:
        repo.ensure_started()
        p = request.path_params
        return repo.get(p["model"], p.get("version"))

    async def server_metadata(request: Request) -> Response:
        return _json({"name": SERVER_NAME, "version": version, "extensions": EXTENSIONS})

    async def live(request: Request) -> Response:
        return Response(status_code=200)

    async def ready(request: Request) -> Response:
        repo.ensure_started()
        return Response(status_code=200 if repo.ready else 503)

    async def model_metadata(request: Request) -> Response:
        try:
            m = model_of(request)
        except InferError as e:
            return _error(e)
        return _json(m.metadata(repo.versions(m.name)))

    async def model_ready(request: Request) -> Response:
        try:
            m = model_of(request)
        except InferError as e:
            return _error(e)
        return Response(status_code=200 if m.ready else 503)

    async def model_config(request: Request) -> Response:
        try:
            return _json(model_of(request).config())
        except InferError as e:
            return _error(e)

    async def infer(request: Request) -> Response:
        t0 = time.perf_counter()
        m: ServedModel | None = None
        try:
            m = model_of(request)
            body = await read_body(request, max_request_bytes)
            req = decode_http(body, request.headers.get("inference-header-content-length"))
            if req.outputs is not None:
                known = m.signature.output_names
                unknown = [o.name for o in req.outputs if o.name not in known]
                if unknown:
                    raise bad(f"unknown output(s) {unknown}; model {m.name!r} has {known}")
            outs = await m.batcher.infer(req.inputs, req.priority, req.timeout_us)
            payload, headers = encode_http(m.name, m.version, req, outs)
        except InferError as e:
            if m is not None:
                metrics.request(m.name, m.version, "failure", e.reason)
            _log(request, m, e.status, t0, e.message)
            return _error(e)
        metrics.request(m.name, m.version, "success")
        metrics.durations["request"].labels(m.name, m.version).observe(time.perf_counter() - t0)
        _log(request, m, 200, t0)
        return Response(payload, headers=headers)

    async def metrics_route(request: Request) -> Response:
        return Response(metrics.expose(), media_type="text/plain; version=0.0.4; charset=utf-8")

    routes = [
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
    ]
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [Route(base, model_metadata, methods=["GET"]),
                   Route(base + "/ready", model_ready, methods=["GET"]),
                   Route(base + "/config", model_config, methods=["GET"]),
                   Route(base + "/infer", infer, methods=["POST"])]
    app = FastAPI(title="dynshape serve", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.router.routes.extend(routes)

    async def http_error(request: Request, exc: Exception) -> Response:  # unknown route, wrong method: same shape
        status = getattr(exc, "status_code", 500)
        detail = getattr(exc, "detail", None) or "error"
        return _json({"error": f"{request.method} {request.url.path}: {detail}"}, status)

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.state.repo, app.state.metrics = repo, metrics
    return app


def _log(request: Request, m: ServedModel | None, status: int, t0: float, error: str | None = None) -> None:
    """One structured access-log record per inference (enable with --access-log, or the logger's level)."""
    if not access.isEnabledFor(logging.INFO):
        return
    rec = {"path": request.url.path, "model": m.name if m else None, "version": m.version if m else None,
           "status": status, "ms": round((time.perf_counter() - t0) * 1e3, 3),
           "client": request.client.host if request.client else None}
    if error:
        rec["error"] = error
    access.info(orjson.dumps(rec).decode())
