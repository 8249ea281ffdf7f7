"""Prometheus metrics, one registry per server (so several servers in one process, as in the tests, never
clash), with Triton's names where Triton has one so its dashboards' queries carry over (notes/serving.md).

Counts per model and version: requests by outcome (`success`/`failure`) and reason (`invalid`, `rejected`
(429: queue full), `timeout` (504), `backend`, ...), inferences (rows) and executions (calls; their ratio is the
mean batch size), pending requests; histograms of the request, queue, compute-input (join), compute (exe.run) and
compute-output (split) durations, the batch size in requests and rows, and the padding waste (padded elements /
all elements of a padded batch).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512)
_RATIO = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


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

    def request(self, model: str, version: str, outcome: str, reason: str = "") -> None:
        self.requests.labels(model, version, outcome, reason).inc()

    def expose(self) -> bytes:
        return generate_latest(self.registry)
