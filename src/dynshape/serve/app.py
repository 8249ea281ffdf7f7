"""The KServe v2 REST routes (Open Inference Protocol) and /metrics, as an ASGI app on FastAPI.

Why plain Starlette routes on a FastAPI app: the handlers need the raw body (the binary extension puts tensors
after the JSON), so FastAPI's per-request validation would only cost time; the FastAPI app is still what Ray
Serve's `@serve.ingress` takes. Every refusal is `{"error": "..."}` with its status (errors.InferError).

Why `fast_infer` in front of it for `dynshape serve`: FastAPI's middleware stack (error and exception
middleware, its body limit, telemetry reading the environment, the exit stack, route matching over every route)
cost about as much per inference as the rest of the request together for a small tensor. The infer route is
the one that carries load, so the raw ASGI wrapper answers it with the same handler (`InferHandler`) and hands
every other route to the FastAPI app.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
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


class InferHandler:
    """One inference, whatever carries it (the Starlette route or `fast_infer`): the model looked up (404 before
    the body is read), the body read under the size limit, decoded, batched, encoded; metrics and the access log.
    Returns (status, body, headers); a refusal is `{"error": ...}` with its status."""

    def __init__(self, repo: ModelRepository, metrics: Metrics, max_request_bytes: int):
        self.repo, self.metrics, self.limit = repo, metrics, max_request_bytes

    async def __call__(self, model: str, version: str | None, read: Callable[[int], Awaitable[bytes]],
                       header_length: str | None, path: str, client: str | None,
                       parts: bool = False) -> tuple[int, bytes | list, dict]:
        t0 = time.perf_counter()
        m: ServedModel | None = None
        metrics = self.metrics
        try:
            self.repo.ensure_started()
            m = self.repo.get(model, version)
            req = decode_http(await read(self.limit), header_length)
            if req.outputs is not None:
                known = m.signature.output_names
                unknown = [o.name for o in req.outputs if o.name not in known]
                if unknown:
                    raise bad(f"unknown output(s) {unknown}; model {m.name!r} has {known}")
            outs = await m.batcher.infer(req.inputs, req.priority, req.timeout_us)
            payload, headers = encode_http(m.name, m.version, req, outs, parts)
        except InferError as e:
            if m is not None:
                metrics.request(m.name, m.version, "failure", e.reason)
            _log(path, client, m, e.status, t0, e.message)
            return e.status, orjson.dumps({"error": e.message}), {"content-type": "application/json"}
        metrics.request(m.name, m.version, "success")
        metrics.duration("request", m.name, m.version).observe(time.perf_counter() - t0)
        _log(path, client, m, 200, t0)
        return 200, payload, headers


def build_app(repo: ModelRepository, metrics: Metrics, max_request_bytes: int = 64 << 20,
              lifespan: Any = None, version: str = "0.1.0") -> FastAPI:
    """The routes over a repository; `lifespan` starts the batchers (and the gRPC service) on the server's loop.
    The app's `state.infer` is the infer handler, for `fast_infer`."""
    handler = InferHandler(repo, metrics, max_request_bytes)

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
        p = request.path_params
        status, payload, headers = await handler(
            p["model"], p.get("version"), lambda limit: read_body(request, limit),
            request.headers.get("inference-header-content-length"), request.url.path,
            request.client.host if request.client else None)
        return Response(payload, status_code=status, headers=headers)

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
    app.state.repo, app.state.metrics, app.state.infer = repo, metrics, handler
    return app


def fast_infer(app: FastAPI) -> Callable:
    """An ASGI app that answers `POST /v2/models/{m}[/versions/{v}]/infer` itself, with the app's InferHandler
    (same checks, same answers, same metrics), and passes every other request to `app` (see the module's
    docstring for why). A failure the handler does not expect is a 500 `{"error": ...}`, as the app's would be."""
    handler: InferHandler = app.state.infer

    async def asgi(scope: dict, receive: Callable, send: Callable) -> None:
        target = _infer_target(scope) if scope["type"] == "http" else None
        if target is None:
            await app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for k, v in scope["headers"]:
            headers.setdefault(k, v)  # the first of repeated headers, as Starlette's `headers.get`

        async def read(limit: int) -> bytes:
            return await _read_asgi_body(headers, receive, limit)

        hl = headers.get(b"inference-header-content-length")
        client = scope.get("client")
        try:
            status, payload, out = await handler(target[0], target[1], read,
                                                 None if hl is None else hl.decode("latin-1"), scope["path"],
                                                 client[0] if client else None, parts=True)
        except Exception as e:  # noqa: BLE001 (a bug here is this request's 500, never a dropped connection)
            logging.getLogger("dynshape.serve").exception("infer failed")
            status, payload, out = 500, orjson.dumps({"error": f"{type(e).__name__}: {e}"}), \
                {"content-type": "application/json"}
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out.items()]
        pieces = payload if isinstance(payload, list) else [payload]  # binary outputs: sent as they lie, no join
        raw.append((b"content-length", str(sum(len(p) for p in pieces)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        for i, piece in enumerate(pieces):
            await send({"type": "http.response.body", "body": piece, "more_body": i < len(pieces) - 1})

    return asgi


def _infer_target(scope: dict) -> tuple[str, str | None] | None:
    """(model, version) of an infer POST, matched as the routes match it (`{model}` is one path segment)."""
    path = scope["path"]
    if scope["method"] != "POST" or not path.startswith("/v2/models/") or not path.endswith("/infer") \
            or scope.get("root_path"):
        return None
    parts = path[11:-6].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


async def _read_asgi_body(headers: dict[bytes, bytes], receive: Callable, limit: int) -> bytes:
    """`read_body` on raw ASGI messages: 413 past `limit`, 415 for an encoded body, 400 on a disconnect."""
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise InferError(413, f"request body of {declared.decode()} bytes exceeds --max-request-bytes {limit}")
    encoding = headers.get(b"content-encoding", b"identity").decode("latin-1")
    if encoding not in ("identity", ""):
        raise InferError(415, f"Content-Encoding {encoding!r} is not supported")
    chunks, n = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # http.disconnect
            raise InferError(400, "client disconnected while sending the body")
        chunk = message.get("body", b"")
        n += len(chunk)
        if n > limit:
            raise InferError(413, f"request body exceeds --max-request-bytes {limit}")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _log(path: str, client: str | None, m: ServedModel | None, status: int, t0: float,
         error: str | None = None) -> None:
    """One structured access-log record per inference (enable with --access-log, or the logger's level)."""
    if not access.isEnabledFor(logging.INFO):
        return
    rec = {"path": path, "model": m.name if m else None, "version": m.version if m else None,
           "status": status, "ms": round((time.perf_counter() - t0) * 1e3, 3), "client": client}
    if error:
        rec["error"] = error
    access.info(orjson.dumps(rec).decode())
