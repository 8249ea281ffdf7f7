"""The server's knobs as typed values: one `BatcherConfig` per model, one `ServerConfig` for the process.

Why dataclasses and not the CLI's arguments: the routes, the batcher, the gRPC service, the Ray deployment and
the tests all build a server from these, so the CLI is one way in among several. Triton's names and semantics
(docs/user_guide/batcher.md, model_config.proto's ModelQueuePolicy) so that its users' settings carry over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BatcherConfig:
    """Triton's dynamic batcher for one model.

    `max_batch_size`: rows (sum of the requests' batch dims) in one call; 0 or 1 turns joining off. Capped by the
    batch symbol's declared max. `max_queue_delay_us`: how long the oldest request of a batch that reached neither
    `max_batch_size` nor a `preferred_batch_size` may wait for more (0: send what is there). `max_queue_size`: pending
    requests beyond which a new one is refused at once with 429 (0: unbounded). `default_timeout_us`: a request still
    queued after this is answered 504 (0: none); a request's own `timeout` parameter may only lower it.
    `priority_levels`: requests carry `priority` 1 (highest) .. levels (0: `default_priority_level`); FIFO within a
    level. `pad`: {symbol: mask input}: sequences of different lengths padded to the longest of a batch and
    joined, where exact and predicted cheaper (padding.py); "auto": the mask input found in the graph, padding
    dropped (with a warning) if not exact. `inline_below_us`: a call whose shape last ran faster
    than this runs on the event loop's thread, not the pool's (0: always the pool).
    """

    max_batch_size: int = 64
    max_queue_delay_us: int = 0
    preferred_batch_size: list[int] = field(default_factory=list)
    max_queue_size: int = 0
    default_timeout_us: int = 0
    priority_levels: int = 0
    default_priority_level: int = 0
    pad: dict[str, str] | str = field(default_factory=dict)
    inline_below_us: int = 100

    def __post_init__(self) -> None:
        for k in ("max_batch_size", "max_queue_delay_us", "max_queue_size", "default_timeout_us", "priority_levels",
                  "default_priority_level", "inline_below_us"):
            if getattr(self, k) < 0:
                raise ValueError(f"{k} must be >= 0, got {getattr(self, k)}")
        if any(p < 1 for p in self.preferred_batch_size):
            raise ValueError(f"preferred_batch_size values must be >= 1, got {self.preferred_batch_size}")
        if not (self.pad == "auto" or isinstance(self.pad, dict)):
            raise ValueError(f"pad must be {{symbol: mask input}} or 'auto', got {self.pad!r}")
        if self.priority_levels and not 0 <= self.default_priority_level <= self.priority_levels:
            raise ValueError(f"default_priority_level {self.default_priority_level} is outside "
                             f"1..{self.priority_levels}")


@dataclass
class ModelSpec:
    """One model to serve: an ONNX file or artefact folder (or, in-process, a ModelProto, a Graph or an
    executable), its public name and version, and its dims.

    `reserve_memory`: when the declared dims bound every symbol the memory depends on, each instance reserves at
    load the arena of the largest call it can ever make (the worst case over those dims, `exe.worst_case_memory`)
    and no call grows it. Why: the batcher's joined batches are shapes no single request had, so an arena sized
    by the traffic grew mid-stream under load (bert_small under 5x overload: 34 -> 69 MB at ~30 s, the old
    buffer held by its plans until they were replaced; resident memory +16-26% after warm-up). Reserved, resident
    memory is known at start and flat while serving. Unbounded dims, a reserve the machine cannot give (a warning
    says so), or False: arenas grow with the largest call served (as `ds.compile`'s do)."""

    path: Any
    name: str | None = None
    version: str = "1"
    dims: dict | None = None
    instances: int = 1
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    reserve_memory: bool = True


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int | None = None
    max_request_bytes: int = 64 << 20
    access_log: bool = False
