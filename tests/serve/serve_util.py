"""Helpers the serve tests share (imported by name: tests/ has no packages)."""

from __future__ import annotations

import re
import threading
import time

import numpy as np

from dynshape.serve.server import Server
from tolerance import assert_f32_close


def close(got: np.ndarray, ref: np.ndarray) -> None:
    """Equal up to float rounding: atol scaled by the reference's magnitude (tests/tolerance.py)."""
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert_f32_close(got, ref, rtol=1e-5, scale=1e-5)


def metric(server: Server, name: str, **labels: str) -> float:
    """A sample's value from /metrics' text (0 when absent)."""
    text = server.metrics.expose().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


class SlowExe:
    """An executable that sleeps before each call (a slow model) and counts calls and the rows of each."""

    def __init__(self, exe, delay: float, fail_on: float | None = None):
        self.exe, self.graph, self.delay, self.fail_on = exe, exe.graph, delay, fail_on
        self.calls: list[int] = []
        self.lock = threading.Lock()

    def run(self, feed):
        time.sleep(self.delay)
        x = next(iter(feed.values()))
        with self.lock:
            self.calls.append(x.shape[0])
        if self.fail_on is not None and np.any(x == self.fail_on):
            raise RuntimeError("poisoned row")
        return self.exe.run(feed)
