"""The one error type the server raises on purpose: an HTTP status and a message for `{"error": ...}`.

Why one type: every layer of the server (codec, validation, batcher, routes, gRPC) refuses a request the same way,
and the transports map the status once (HTTP: the status itself; gRPC: `grpc_code`). A `reason` label is what
the metrics count the refusal under (Triton's `REJECTED` / `BACKEND` / `OTHER`, plus our own).
"""

from __future__ import annotations


class InferError(Exception):
    """A request refused or failed: `status` (400, 404, 413, 429, 503, 504, 500) and a one-line message."""

    def __init__(self, status: int, message: str, reason: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason or {400: "invalid", 404: "not_found", 413: "too_large", 429: "rejected",
                                 503: "unavailable", 504: "timeout"}.get(status, "backend")


def bad(message: str) -> InferError:
    return InferError(400, message)
