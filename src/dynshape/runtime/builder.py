"""The background builder: static variants of hot keys, built while the generic build serves them.

One daemon thread per executable drains a queue of keys, then exits (the next hot key starts a new one). It
yields to request threads: the lowest CPU priority (Linux: nice is per thread, and the compiler processes it
starts inherit it), so a build takes idle cycles and does not slow a multi-threaded BLAS call down; and short
GIL slices while requests come (a profile hook pauses it for GIL_PAUSE_S after every GIL_SLICE_S of Python work,
within REQUEST_GAP_S of a request's start or end; idle, it runs at full speed). Sleeping releases
the GIL, so a request thread waits at most about one slice for it, the build's tens of milliseconds of Python
are spread thin over many calls instead of doubling one, and a low-priority thread descheduled while it holds
the GIL stalls the others only within such a slice.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

GIL_SLICE_S, GIL_PAUSE_S = 0.0005, 0.01
THREAD_NAME = "dynshape-builder"
#: when a request last started or ended (time.perf_counter(); executable.run sets it): the builder pauses only
#: within REQUEST_GAP_S of one. Idle, it pausing 10 ms after every 0.5 ms of Python made a build's Python 20x
#: slower for nobody's benefit (tests/runtime/test_specialization's concurrent test waited 70-100 s for 5 variants).
LAST_REQUEST = [0.0]
REQUEST_GAP_S = 0.05


def in_builder() -> bool:
    """Whether the calling thread is a background builder (it compiles one library at a time)."""
    return threading.current_thread().name == THREAD_NAME


def _yield_to_requests() -> None:
    """Make the calling (builder) thread yield to request threads (see the module docstring)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    clock, pause = time.perf_counter, time.sleep
    since = clock()

    last = LAST_REQUEST

    def hook(frame: Any, event: str, arg: Any) -> None:
        nonlocal since
        now = clock()
        if now - since > GIL_SLICE_S:
            if now - last[0] < REQUEST_GAP_S:
                pause(GIL_PAUSE_S)
            since = clock()

    sys.setprofile(hook)


class BackgroundBuilder:
    """`submit(key, why, where)` queues a build; `build(key, why, where)` runs in the builder thread and installs
    the variant; a failure goes to `on_error(key, exc)` (the generic build keeps serving the key)."""

    def __init__(self, build: Callable[[tuple, str, str], None], on_error: Callable[[tuple, Exception], None]):
        self._build, self._on_error = build, on_error
        self._cond = threading.Condition()  # queue, pending keys, worker liveness
        self._queue: deque = deque()
        self.pending: set = set()
        self._worker: threading.Thread | None = None

    def submit(self, key: tuple, why: str, where: str, skip: Callable[[], bool] = lambda: False) -> None:
        """Queue `key` unless it is pending or `skip()` says it is already there; returns at once."""
        if key in self.pending:
            return
        with self._cond:
            if key in self.pending or skip():
                return
            self.pending.add(key)
            self._queue.append((key, why, where))
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name=THREAD_NAME, daemon=True)
                self._worker.start()

    def _work(self) -> None:
        _yield_to_requests()
        while True:
            with self._cond:
                if not self._queue:
                    self._worker = None
                    return
                key, why, where = self._queue.popleft()
            try:
                self._build(key, why, where)
            except Exception as e:  # noqa: BLE001 - a failed build leaves the generic build serving the key
                self._on_error(key, e)
            finally:
                with self._cond:
                    self.pending.discard(key)
                    self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no build is queued or running; False if `timeout` seconds passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self.pending, timeout)
