"""Scale-out on Ray Serve: the same KServe v2 routes and batcher in every replica (`pip install dynshape[ray]`).

    from ray import serve
    from dynshape.serve import ModelSpec
    from dynshape.serve.ray import application
    serve.run(application([ModelSpec("bert.onnx", dims={"batch": (1, 64), "seq": (1, 512)})], num_replicas=2))

Why a module-level ingress app over proxies: `@serve.ingress` takes the FastAPI app when the class is defined and
ships it to each replica; the models are loaded inside the replica (`__init__`), so the routes reach the replica's
repository and metrics through `_Replica` proxies that read this module's globals in the replica's process.
Ray runs no lifespan for an ingress app, so the batchers start on the first request's loop
(`ModelRepository.ensure_started`). Each response carries `x-dynshape-replica` (the replica's pid).
`num_replicas`, `autoscaling_config`, `max_ongoing_requests` and `ray_actor_options` pass through to Ray.
Ray sets OMP_NUM_THREADS to the replica's `num_cpus` (1 unless `ray_actor_options` says otherwise).
"""

from __future__ import annotations

import os
from typing import Any

from ray import serve

from dynshape.serve.app import build_app
from dynshape.serve.config import ModelSpec
from dynshape.serve.metrics import Metrics
from dynshape.serve.repository import ModelRepository, build_model

_STATE: dict[str, Any] = {}


class _Replica:
    """Stands for this replica's repository or metrics (set by the deployment's `__init__`)."""

    def __init__(self, what: str):
        self._what = what

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # (copy and pickle probe dunders on an instance without `_what`)
            raise AttributeError(name)
        target = _STATE.get(self._what)
        if target is None:
            raise RuntimeError("dynshape.serve.ray: the replica has not loaded its models")
        return getattr(target, name)


def install(repo: ModelRepository, metrics: Metrics) -> None:
    _STATE["repo"], _STATE["metrics"] = repo, metrics


_APP = build_app(_Replica("repo"), _Replica("metrics"))  # type: ignore[arg-type]


@_APP.middleware("http")
async def _replica_header(request: Any, call_next: Any) -> Any:
    response = await call_next(request)
    response.headers["x-dynshape-replica"] = str(os.getpid())
    return response


@serve.deployment(name="dynshape")
@serve.ingress(_APP)
class DynshapeDeployment:
    """One replica: every model loaded (or compiled) here, one batcher each."""

    def __init__(self, specs: list[ModelSpec], compile_options: dict | None = None):
        metrics = Metrics()
        install(ModelRepository([build_model(s, metrics, compile_options) for s in specs]), metrics)


def application(specs: list[ModelSpec], *, num_replicas: int | str | None = None,
                autoscaling_config: dict | None = None, max_ongoing_requests: int | None = None,
                ray_actor_options: dict | None = None, compile_options: dict | None = None) -> Any:
    """A Ray Serve application serving `specs` (pass it to `serve.run`)."""
    opts: dict[str, Any] = {}
    if num_replicas is not None:
        opts["num_replicas"] = num_replicas
    if autoscaling_config is not None:
        opts["autoscaling_config"] = autoscaling_config
    if max_ongoing_requests is not None:
        opts["max_ongoing_requests"] = max_ongoing_requests
    if ray_actor_options is not None:
        opts["ray_actor_options"] = ray_actor_options
    dep = DynshapeDeployment.options(**opts) if opts else DynshapeDeployment
    return dep.bind(specs, compile_options)
