"""Prometheus metrics, one registry per server (so several servers in one process, as in the tests, never
clash), with Triton's names where Triton has one so its dashboards' queries carry over (notes/serving.md).

Counts per model and version: requests by outcome (`success`/`failure`) and reason (`invalid`, `rejected`
(429: queue full), `timeout` (504), `backend`, ...), inferences (rows) and executions (calls; their ratio is the
mean batch size), pending requests; histograms of the request, queue, compute-input (join), compute (exe.run) and
compute-output (split) durations, the batch size in requests and rows, the padding waste (padded elements /
all elements of a padded batch, and the share of its FLOPs spent on padding) and the cost model's decisions
(requests of another length joined to a padded batch or kept apart).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

_LATENCY = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512)
_RATIO = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class HistogramChild:
    """One label set's buckets: an observation is a bisect and two additions under one lock."""

    __slots__ = ("_bounds", "_counts", "_lock", "sum")

    def __init__(self, bounds: list[float]):
        self._bounds, self._counts, self.sum = bounds, [0] * len(bounds), 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self._bounds, value)  # the first bucket whose upper bound is >= value
        with self._lock:
            self._counts[i] += 1
            self.sum += value

    def snapshot(self) -> tuple[list[int], float]:
        with self._lock:
            return list(self._counts), self.sum


class Histogram:
    """A labelled histogram exposed as prometheus_client's is (`NAME_bucket{le=...}`, `_count`, `_sum`), kept
    by a collector of its own. Why not prometheus_client's: its child takes a lock per bucket increment and per
    sum and checks observability each time; a request observes seven histograms, which cost about as much as
    decoding the request."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: CollectorRegistry):
        self.name, self.documentation, self.labelnames = name, documentation, list(labelnames)
        self._bounds = sorted(float(b) for b in buckets if not math.isinf(b)) + [math.inf]
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        key = tuple(str(v) for v in values)
        with self._lock:
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = HistogramChild(self._bounds)
        return child

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            children = list(self._children.items())
        for key, child in children:
            counts, total = child.snapshot()
            cumulative, buckets = 0, []
            for bound, n in zip(self._bounds, counts):
                cumulative += n
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric(list(key), buckets, total)
        yield family


class Metrics:
    """The server's metrics; `labels(model, version)` gives one model's children once, for cheap updates."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        mv = ["model", "version"]
        self.requests = Counter("nv_inference_request", "Inference requests by outcome and reason",
                                [*mv, "outcome", "reason"], registry=r)
        self.inferences = Counter("nv_inference_count", "Rows inferred (sum of batch dims)", mv, registry=r)
        self.executions = Counter("nv_inference_exec_count", "Model executions (exe.run calls)", mv, registry=r)
        self.pending = Gauge("nv_inference_pending_request_count", "Requests queued or running", mv, registry=r)
        h = {}
        for key, what in (("request", "whole request, arrival to response encoded"),
                          ("queue", "waiting in the batcher's queue"),
                          ("compute_input", "joining a batch's inputs"),
                          ("compute_infer", "exe.run of a batch"),
                          ("compute_output", "splitting a batch's outputs")):
            h[key] = Histogram(f"dynshape_{key}_duration_seconds", f"Time {what}", mv, buckets=_LATENCY, registry=r)
        self.durations = h
        self.batch_requests = Histogram("dynshape_batch_size_requests", "Requests joined per execution", mv,
                                        buckets=_SIZES, registry=r)
        self.batch_rows = Histogram("dynshape_batch_size_rows", "Rows (batch dim) per execution", mv,
                                    buckets=_SIZES, registry=r)
        self.padding = Histogram("dynshape_padding_waste_ratio", "Padded elements / all elements per execution", mv,
                                 buckets=_RATIO, registry=r)
        self.padding_flops = Histogram("dynshape_padding_flops_waste_ratio",
                                       "FLOPs spent on padding / all FLOPs of a padded execution (the graph's "
                                       "symbolic work at the joined and the separate shapes)", mv, buckets=_RATIO,
                                       registry=r)
        self.pad_decisions = Counter("dynshape_pad_decisions", "Requests of another length the cost model joined "
                                     "to a padded batch (join) or kept apart (apart)", [*mv, "decision"], registry=r)

        self._children: dict[tuple, object] = {}

    def request(self, model: str, version: str, outcome: str, reason: str = "") -> None:
        key = ("requests", model, version, outcome, reason)
        child = self._children.get(key)
        if child is None:  # `labels` takes a lock and builds a key per call: cached, it is a dict lookup
            child = self._children[key] = self.requests.labels(model, version, outcome, reason)
        child.inc()  # type: ignore[attr-defined]

    def duration(self, what: str, model: str, version: str) -> Histogram:
        """The `what` duration histogram's child for one model and version (cached)."""
        key = (what, model, version)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.durations[what].labels(model, version)
        return child  # type: ignore[return-value]

    def expose(self) -> bytes:
        return generate_latest(self.registry)
