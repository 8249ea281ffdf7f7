"""The model repository: each served model loaded or compiled once per instance, by name and version.

Why through the public API only (`ds.load_onnx`, `ds.compile`, `ds.load`, the graph's typed inputs and outputs):
the server is a layer above the runtime and must keep working while the compiler below it changes. One
executable per instance gives each instance its own arena set, so instances never contend for memory plans.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dynshape as ds
from dynshape.errors import DynshapeError
from dynshape.serve.batcher import Batcher
from dynshape.serve.config import ModelSpec
from dynshape.serve.errors import InferError
from dynshape.serve.metrics import Metrics
from dynshape.serve.signature import ModelSignature

log = logging.getLogger("dynshape.serve")


@dataclass
class ServedModel:
    name: str
    version: str
    signature: ModelSignature
    batcher: Batcher
    source: str

    @property
    def ready(self) -> bool:
        return self.batcher.ready

    def metadata(self, versions: list[str]) -> dict:
        return self.signature.metadata(self.name, versions)

    def config(self) -> dict:
        """Triton's model-config view (GET .../config), for clients that read `max_batch_size` there."""
        b, c = self.batcher, self.batcher.cfg
        return {"name": self.name, "platform": "dynshape", "max_batch_size": b.cap if b.cap > 1 else 0,
                "input": [{"name": t.name, "data_type": "TYPE_" + t.datatype, "dims": t.public_shape()}
                          for t in self.signature.inputs],
                "output": [{"name": t.name, "data_type": "TYPE_" + t.datatype, "dims": t.public_shape()}
                           for t in self.signature.outputs],
                "dynamic_batching": {"max_queue_delay_microseconds": c.max_queue_delay_us,
                                     "preferred_batch_size": c.preferred_batch_size,
                                     "priority_levels": c.priority_levels,
                                     "default_queue_policy": {"max_queue_size": c.max_queue_size,
                                                              "default_timeout_microseconds": c.default_timeout_us}},
                "instance_group": [{"count": b.instances, "kind": "KIND_CPU"}]}


def build_model(spec: ModelSpec, metrics: Metrics, compile_options: dict | None = None) -> ServedModel:
    """Load (artefact folder) or compile (ONNX file, ModelProto or Graph) one executable per instance; an
    executable built in this process (anything with `.graph` and `.run`) is served as given, as one instance."""
    src = spec.path
    name = spec.name
    if hasattr(src, "run") and hasattr(src, "graph"):  # an executable compiled in this process: served as is
        exes, graph, default_name = [src], src.graph, getattr(src.graph, "name", "model")
    elif isinstance(src, (str, Path)) and Path(src).is_dir():
        default_name = Path(src).stem
        exes = _instances(ds.load, src, {}, spec.instances, spec.reserve_memory, name or default_name)
        graph = exes[0].graph
    else:
        if isinstance(src, (str, Path)):
            graph, default_name = ds.load_onnx(str(src), dims=spec.dims), Path(src).stem
        elif hasattr(src, "inputs") and hasattr(src, "signature"):
            graph, default_name = src, getattr(src, "name", "model")
        else:  # an onnx.ModelProto
            graph = ds.load_onnx(src, dims=spec.dims)
            default_name = graph.name or "model"
        bounded = all(s.max is not None for s in ModelSignature(graph).symbols.values())
        exes = _instances(ds.compile, graph, compile_options or {}, spec.instances, spec.reserve_memory and bounded,
                          name or default_name)
    name = name or default_name
    sig = ModelSignature(graph)
    batcher = Batcher(name, spec.version, exes, sig, spec.batcher, metrics)
    batcher.calibrate()  # with --pad: padding proven exact and the cost model seeded before the first request
    return ServedModel(name, spec.version, sig, batcher, str(src) if isinstance(src, (str, Path)) else "<in memory>")


def _instances(make: Any, src: Any, options: dict, count: int, reserve: bool, name: str) -> list:
    """`count` executables `make(src, **options)` (ds.compile or ds.load), each reserving its worst-case arena
    when `reserve` (see ModelSpec.reserve_memory): `preallocate` with one arena, as an instance runs one call at
    a time (the batcher hands it to one batch at a time). A refusal (a symbol the memory depends on is unbounded,
    no memory plan) or a reserve the machine cannot give: made again without one, with a warning, so a model the
    server could serve before is still served (and the other instances are not tried)."""
    if "preallocate" in options or "memory_budget" in options:  # the caller's memory policy wins
        reserve = False
    exes = []
    for _ in range(count):
        if reserve:
            try:
                exes.append(make(src, **{"preallocate": True, "arenas": 1, **options}))
                continue
            except (DynshapeError, MemoryError) as e:
                log.warning("model %s: no arena reserved at load (%s: %s); memory grows with the largest call "
                            "served", name, type(e).__name__, str(e)[:300])
                reserve = False
        exes.append(make(src, **options))
    w = exes[0].worst_case_memory() if reserve and hasattr(exes[0], "worst_case_memory") else None
    if w is not None:
        log.info("model %s: reserved the worst-case arena per instance, %.1f MiB (%s)", name, (w.reserve or 0) / 2**20,
                 w.text())
    return exes


class ModelRepository:
    """Served models by name, then version (`get` raises a 404 naming what is served)."""

    def __init__(self, models: list[ServedModel]):
        self.models: dict[str, dict[str, ServedModel]] = {}
        self._started = False
        for m in models:
            versions = self.models.setdefault(m.name, {})
            if m.version in versions:
                raise ValueError(f"model {m.name!r} version {m.version!r} is given twice (use --name)")
            versions[m.version] = m

    def get(self, name: str, version: str | None = None) -> ServedModel:
        versions = self.models.get(name)
        if not versions:
            raise InferError(404, f"unknown model {name!r}; served: {sorted(self.models)}")
        if not version:
            return versions[max(versions, key=_version_order)]
        m = versions.get(version)
        if m is None:
            raise InferError(404, f"model {name!r} has no version {version!r}; versions: {sorted(versions)}")
        return m

    def versions(self, name: str) -> list[str]:
        return sorted(self.models.get(name, {}), key=_version_order)

    def all(self) -> list[ServedModel]:
        return [m for vs in self.models.values() for m in vs.values()]

    @property
    def ready(self) -> bool:
        return all(m.ready for m in self.all())

    def start(self) -> None:
        self._started = True
        for m in self.all():
            m.batcher.start()

    def ensure_started(self) -> None:
        """Start the batchers on the running loop if nothing did (Ray Serve runs no lifespan for an ingress app)."""
        if not self._started:
            self._started = True
            self.start()

    async def stop(self) -> None:
        for m in self.all():
            await m.batcher.stop()


def _version_order(v: str) -> tuple:
    return (0, int(v), "") if v.isdigit() else (1, 0, v)
