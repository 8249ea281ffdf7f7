"""Assemble and run a server: models -> repository -> ASGI app on uvicorn (+ the gRPC service on the same loop).

Why the batchers start in the app's lifespan: their asyncio queues and scheduler tasks must live on the loop
uvicorn runs, and the gRPC service (grpc.aio) shares that loop so both transports feed the same batchers.
`Server.start()` runs it in a background thread (tests, the bench); `Server.run()` blocks (the CLI).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import threading
import time
from typing import Any

import uvicorn

from dynshape.serve.app import build_app, fast_infer
from dynshape.serve.config import ModelSpec, ServerConfig
from dynshape.serve.metrics import Metrics
from dynshape.serve.repository import ModelRepository, build_model

log = logging.getLogger("dynshape.serve")


class Server:
    """A KServe v2 server over `specs`; `port=0` picks a free port (read `.port` after `start`)."""

    def __init__(self, specs: list[ModelSpec], config: ServerConfig | None = None,
                 compile_options: dict | None = None):
        self.config = cfg = config or ServerConfig()
        self.metrics = Metrics()
        self.repo = ModelRepository([build_model(s, self.metrics, compile_options) for s in specs])
        self.grpc_port: int | None = None
        self._grpc: Any = None
        self.app = build_app(self.repo, self.metrics, cfg.max_request_bytes, lifespan=self._lifespan)
        loop = "uvloop" if importlib.util.find_spec("uvloop") and cfg.grpc_port is None else "asyncio"
        http = "httptools" if importlib.util.find_spec("httptools") else "h11"
        self._uv = uvicorn.Server(uvicorn.Config(fast_infer(self.app), host=cfg.host, port=cfg.port, loop=loop,
                                                 http=http, log_level="warning", access_log=False, lifespan="on",
                                                 timeout_keep_alive=30))
        self._thread: threading.Thread | None = None

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Any):
        self.repo.start()
        if self.config.grpc_port is not None:
            from dynshape.serve.grpc_service import start_grpc

            self._grpc, self.grpc_port = await start_grpc(self.repo, self.metrics, self.config.host,
                                                          self.config.grpc_port, self.config.max_request_bytes)
        try:
            yield
        finally:
            if self._grpc is not None:
                await self._grpc.stop(grace=1.0)
            await self.repo.stop()

    @property
    def port(self) -> int:
        servers = getattr(self._uv, "servers", None) or []
        for s in servers:
            for sock in s.sockets:
                return sock.getsockname()[1]
        return self.config.port

    @property
    def url(self) -> str:
        return f"{self.config.host}:{self.port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.config.host}:{self.grpc_port}"

    def run(self) -> None:
        """Serve until interrupted (SIGINT / SIGTERM)."""
        self._uv.run()

    def start(self, timeout: float = 60.0) -> Server:
        """Serve from a background thread; return once the port is bound and the batchers run."""
        if self._thread is not None:
            return self  # already serving (`with Server(...).start()` must not start a second loop)
        self._thread = threading.Thread(target=self._uv.run, name="dynshape-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uv.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start (port in use? see the log)")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._uv.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_forever(specs: list[ModelSpec], config: ServerConfig, compile_options: dict | None = None) -> None:
    server = Server(specs, config, compile_options)
    log.warning("serving %s on http://%s:%d%s", ", ".join(f"{m.name}/{m.version}" for m in server.repo.all()),
                config.host, config.port, f" and grpc {config.host}:{config.grpc_port}" if config.grpc_port else "")
    server.run()
