"""A shape-aware dynamic batcher per model, with Triton's knobs and semantics (config.BatcherConfig).

Why shape-aware: a compiled dynshape executable serves every admissible shape from one build, so requests whose
non-batch dims are equal (same sequence length, same image resolution) can be joined along the batch symbol into
one `exe.run` and split back, without recompiling and without padding. Requests of different non-batch shapes
form different groups and are never padded (padding would change a CNN's output); each group is batched on its
own, and the scheduler serves the group whose oldest request is ready first, so one group's delay does not block
another.

Scheduling (Triton's): a batch is formed only when an instance is free. It is sent at once when it reaches
`max_batch_size` rows or a `preferred_batch_size` (the largest that can be formed), or when its oldest request has
waited `max_queue_delay_us`; otherwise the scheduler waits for more. Priority levels: 1 is highest, FIFO within a
level. A request queued past its timeout is answered 504; one beyond `max_queue_size` pending gets 429 at once.

Execution runs in a thread pool with one worker and one executable (so one arena set) per instance: the kernels
release the GIL and the event loop keeps accepting. A call whose shape was last measured faster than
`inline_below_us` runs on the event loop's thread instead: two thread hand-offs cost more than such a call (on
this 2-core machine under load, a hand-off took hundreds of microseconds for an identity model's 17 us call).
A batch whose run fails is re-run request by request so only the culprit fails (Triton fails the whole batch).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynshape.errors import DynshapeError
from dynshape.serve.config import BatcherConfig
from dynshape.serve.errors import InferError, bad
from dynshape.serve.metrics import Metrics
from dynshape.serve.padding import CostModel, PadPlan, check_exact, find_pad, probe_shapes, random_feed, work_of
from dynshape.serve.signature import ModelSignature

log = logging.getLogger("dynshape.serve")
_seq = itertools.count()


@dataclass(eq=False)
class Pending:
    """One queued request."""

    feed: dict[str, np.ndarray]
    key: tuple
    rows: int
    level: int
    deadline: float | None
    arrived: float
    future: asyncio.Future
    length: int = 0  # the padded symbol's value (with --pad)
    values: dict = field(default_factory=dict)  # the symbols the request binds (with --pad: for the cost model)
    seq: int = field(default_factory=lambda: next(_seq))


class Batcher:
    """Queues a model's requests, forms batches, runs them on the model's instances and answers each request."""

    def __init__(self, name: str, version: str, executables: list[Any], signature: ModelSignature,
                 config: BatcherConfig, metrics: Metrics):
        self.name, self.version = name, version
        self.sig, self.cfg, self.metrics = signature, config, metrics
        cap = config.max_batch_size if signature.batch else 0
        if cap > 1 and signature.batch_max is not None:
            cap = min(cap, signature.batch_max)
        self.cap = cap  # rows per joined batch; <= 1: no joining
        self.auto_pad = config.pad == "auto"
        if self.auto_pad:
            pad = find_pad(signature) if cap > 1 else {}
        else:
            pad = config.pad
        if self.auto_pad and not pad:
            log.warning("model %s: --pad auto found no mask input of dims (batch, S); no padding", name)
        self.pad = PadPlan(signature, pad) if pad else None  # type: ignore[arg-type]
        if self.pad is not None and cap <= 1:
            raise ValueError(f"model {name!r}: --pad needs batching (a batch symbol and max_batch_size > 1)")
        self.cost = CostModel(work_of(executables[0], signature)) if self.pad is not None else None
        self.levels = max(config.priority_levels, 1)
        self._queues: list[collections.deque[Pending]] = [collections.deque() for _ in range(self.levels)]
        self.executables = tuple(executables)  # one per instance (their memory and stats, for reports and tests)
        self._free = list(executables)
        self.instances = len(executables)
        self._pool = ThreadPoolExecutor(max_workers=len(executables), thread_name_prefix=f"serve-{name}")
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()
        self.queued = 0
        self.m = {k: h.labels(name, version) for k, h in metrics.durations.items()}
        self.m_pending = metrics.pending.labels(name, version)
        self.m_exec, self.m_rows = metrics.executions.labels(name, version), metrics.inferences.labels(name, version)
        self.m_breq = metrics.batch_requests.labels(name, version)
        self.m_brows = metrics.batch_rows.labels(name, version)
        self.m_pad = metrics.padding.labels(name, version)
        self.m_pad_flops = metrics.padding_flops.labels(name, version)
        self.m_join = metrics.pad_decisions.labels(name, version, "join")
        self.m_apart = metrics.pad_decisions.labels(name, version, "apart")
        self._last: dict[tuple, float] = {}  # (group key, rows, length) -> last measured exe.run seconds

    # ---- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the scheduler on the running loop (the server's lifespan calls this)."""
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._schedule(), name=f"batcher-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for q in self._queues:
            while q:
                self._finish(q.popleft(), InferError(503, f"model {self.name!r} is shutting down"))
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        self._pool.shutdown(wait=False)

    def calibrate(self) -> None:
        """With --pad: refuse padding unless it is exact, then time probe calls to seed the cost model."""
        if self.pad is None or self.cost is None:
            return
        exe, info = self._free[0], self.sig.symbols[self.pad.symbol]
        lo, hi, k = max(info.min, 1), info.max if info.max is not None else 256, info.multiple_of

        def fit(n: int) -> int:
            n = min(max(n, lo), hi)
            return max(lo, n // k * k) if n % k else n

        try:
            check_exact(exe, self.sig, self.pad, (fit(lo), fit(lo + max(3 * k, 5))))
        except ValueError as e:
            if not self.auto_pad:
                raise
            log.warning("model %s: --pad auto: %s; serving without padding", self.name, e)
            self.pad = self.cost = None
            return
        log.warning("model %s: padding %s with %s (checked exact)", self.name, self.pad.symbol, self.pad.mask)
        rng = np.random.default_rng(1)
        for length in sorted({fit(8), fit(32), fit(96)}):
            for rows in sorted({1, min(4, self.cap)}):
                feed = random_feed(self.sig, probe_shapes(self.sig, self.pad, rows, length), rng)
                exe.run(feed)
                t0 = time.perf_counter()
                exe.run(feed)
                self.cost.record(self.sig.validate(feed)[2], time.perf_counter() - t0)

    @property
    def ready(self) -> bool:
        return self._task is not None and not self._task.done()

    # ---- requests -------------------------------------------------------------------------------------------
    async def infer(self, feed: dict[str, np.ndarray], priority: int = 0, timeout_us: int = 0) -> dict:
        """Validate, queue and await one request's outputs (all of them); InferError on refusal or failure."""
        if not self.ready:
            raise InferError(503, f"model {self.name!r} is not ready")
        key, rows, values = self.sig.validate(feed)
        level = self._level(priority)
        cfg = self.cfg
        if cfg.max_queue_size and self.queued >= cfg.max_queue_size:
            raise InferError(429, f"model {self.name!r}: queue full ({self.queued} requests pending, max_queue_size "
                                  f"{cfg.max_queue_size})")
        timeout = timeout_us if not cfg.default_timeout_us else \
            (min(timeout_us, cfg.default_timeout_us) if timeout_us else cfg.default_timeout_us)
        now = time.perf_counter()
        length = 0
        if self.pad is not None:
            key, length = self.pad.loose_key(key), self.pad.length(feed)
        p = Pending(feed, key, rows, level, now + timeout * 1e-6 if timeout else None, now,
                    asyncio.get_running_loop().create_future(), length, values)
        self.m_pending.inc()
        if not self.queued and self._free and self._leaves_alone(p):
            self._dispatch([p])  # a cheap call is answered before this returns: the await below does not wait
        else:
            self._queues[level].append(p)
            self.queued += 1
            assert self._wake is not None
            self._wake.set()
        try:
            return await p.future
        finally:
            if not p.future.done():  # the caller went away (client disconnect): drop it from the queue
                p.future.cancel()

    def _leaves_alone(self, p: Pending) -> bool:
        """Whether the scheduler, finding `p` alone in the queue and an instance free, would send it as it is:
        joining is off, `p` fills a batch, or no delay lets a batch wait for more (Triton's `max_queue_delay`
        0 sends what is there). Then `infer` sends it at once, sparing the scheduler's turns of the loop: the
        same batch, sooner. Preferred sizes leave it to the scheduler."""
        cfg = self.cfg
        return self.cap <= 1 or p.rows >= self.cap or (not cfg.max_queue_delay_us and not cfg.preferred_batch_size)

    def _level(self, priority: int) -> int:
        if self.cfg.priority_levels == 0:
            return 0
        p = priority or self.cfg.default_priority_level or self.cfg.priority_levels
        if not 1 <= p <= self.cfg.priority_levels:
            raise bad(f"priority {priority} is outside 1..{self.cfg.priority_levels} (1 is highest)")
        return p - 1

    def _finish(self, p: Pending, result: Any) -> None:
        self.m_pending.dec()
        if p.future.done():
            return
        if isinstance(result, BaseException):
            p.future.set_exception(result)
        else:
            p.future.set_result(result)

    # ---- scheduling -----------------------------------------------------------------------------------------
    async def _schedule(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            wait = self._expire()
            if self.queued and self._free:
                batch, ready_in = self._form()
                if batch:
                    self._dispatch(batch)
                    continue
                if ready_in is not None:
                    wait = ready_in if wait is None else min(wait, ready_in)
            wake.clear()
            if wait is None:
                await wake.wait()
            else:
                try:
                    await asyncio.wait_for(wake.wait(), max(wait, 0.0))
                except asyncio.TimeoutError:
                    pass

    def _expire(self) -> float | None:
        """Answer 504 to requests queued past their deadline, drop cancelled ones; the time to the next deadline."""
        now, nearest = time.perf_counter(), None
        for q in self._queues:
            if not q:
                continue
            keep = collections.deque()
            for p in q:
                if p.future.done():
                    self.queued -= 1
                    self.m_pending.dec()
                elif p.deadline is not None and p.deadline <= now:
                    self.queued -= 1
                    self._finish(p, InferError(504, f"model {self.name!r}: request timed out after "
                                                    f"{(now - p.arrived) * 1e3:.1f} ms in the queue"))
                else:
                    keep.append(p)
                    if p.deadline is not None:
                        nearest = p.deadline - now if nearest is None else min(nearest, p.deadline - now)
            if len(keep) != len(q):
                q.clear()
                q.extend(keep)
        return nearest

    def _form(self) -> tuple[list[Pending] | None, float | None]:
        """The next batch to send, or (None, seconds until one may be ready). Groups are tried oldest first."""
        order = [p for q in self._queues for p in q]  # priority order, FIFO within a level
        if self.cap <= 1:
            return self._take([order[0]]), None
        cfg, cap, now = self.cfg, self.cap, time.perf_counter()
        groups: dict[tuple, list[Pending]] = {}
        for p in order:
            groups.setdefault(p.key, []).append(p)
        soonest = None
        for members in groups.values():
            head = members[0]
            if head.rows >= cap:
                return self._take([head]), None
            batch, rows, apart = self._choose(members, cap)
            if rows >= cap:
                return self._take(batch, apart), None
            fits = [s for s in cfg.preferred_batch_size if s <= rows]
            if fits:
                target, chosen, n = max(fits), [], 0
                for p in batch:
                    if n + p.rows <= target:
                        chosen.append(p)
                        n += p.rows
                return self._take(chosen, apart), None
            waited = now - head.arrived
            delay = cfg.max_queue_delay_us * 1e-6
            if waited >= delay:
                return self._take(batch, apart), None
            soonest = delay - waited if soonest is None else min(soonest, delay - waited)
        return None, soonest

    def _choose(self, members: list[Pending], cap: int) -> tuple[list[Pending], int, int]:
        """Requests of one group, in order, up to `cap` rows: those of the head's exact shape, then (with --pad)
        those of other lengths whose joining the cost model predicts cheaper than running them apart (a very
        short request is not padded to a very long one when the padded work costs more than the call it saves).
        Also returns how many the cost model kept apart."""
        head, batch, rows = members[0], [], 0
        for p in members:
            if p.length == head.length and rows + p.rows <= cap:
                batch.append(p)
                rows += p.rows
        cost = self.cost
        if cost is None or not cost.calibrated or rows >= cap:
            return batch, rows, 0
        length, inside, apart = head.length, set(map(id, batch)), 0
        for p in members:
            if id(p) in inside or rows + p.rows > cap:
                continue
            longer = max(length, p.length)
            joined = cost.predict(self._at(head.values, rows + p.rows, longer))
            if joined < cost.predict(self._at(head.values, rows, length)) + cost.predict(p.values):
                batch.append(p)
                rows, length = rows + p.rows, longer
            else:
                apart += 1
        batch.sort(key=lambda p: p.seq)
        return batch, rows, apart

    def _at(self, values: dict[str, int], rows: int, length: int) -> dict[str, int]:
        """`values` (a request's symbols) with the batch symbol at `rows` and the padded one at `length`."""
        assert self.pad is not None
        out = dict(values)
        if self.sig.batch:
            out[self.sig.batch] = rows
        out[self.pad.symbol] = length
        return out

    def _take(self, batch: list[Pending], apart: int = 0) -> list[Pending]:
        """Remove `batch` from the queues; count the requests the cost model kept out of it (`apart`)."""
        if apart:
            self.m_apart.inc(apart)
        chosen = set(map(id, batch))
        for q in self._queues:
            if any(id(p) in chosen for p in q):
                keep = [p for p in q if id(p) not in chosen]
                q.clear()
                q.extend(keep)
        self.queued -= len(batch)
        return batch

    def _dispatch(self, batch: list[Pending]) -> None:
        """Run `batch` on a free instance: at once on this thread when its shape was last measured cheap (no
        task, no hand-off), else in a task that awaits the instance's worker thread."""
        exe = self._free.pop()
        live = self._started(batch)
        if live and self._cheap(live):
            try:
                results = self._execute(exe, live)
            except Exception as e:  # noqa: BLE001 (answer, never leave a request hanging)
                results = [InferError(500, f"model {self.name!r}: {type(e).__name__}: {e}")] * len(live)
            self._done(exe, live, results)
            return
        task = asyncio.get_running_loop().create_task(self._run(exe, live))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def _started(self, batch: list[Pending]) -> list[Pending]:
        """Observe the batch's queue times; the requests still waiting for an answer (a cancelled one is not)."""
        start = time.perf_counter()
        q = self.m["queue"]
        live = []
        for p in batch:
            q.observe(start - p.arrived)
            if p.future.done():
                self.m_pending.dec()
            else:
                live.append(p)
        return live

    async def _run(self, exe: Any, live: list[Pending]) -> None:
        results: list[Any] = []
        try:
            if live:
                results = await asyncio.get_running_loop().run_in_executor(self._pool, self._execute, exe, live)
        except BaseException as e:  # noqa: BLE001 (the pool is shut down: answer, never leave a request hanging)
            results = [InferError(503, f"model {self.name!r}: {e}")] * len(live)
        finally:
            self._done(exe, live, results)

    def _done(self, exe: Any, live: list[Pending], results: list[Any]) -> None:
        """The instance is free again (the scheduler is woken if anything waits for it); answer each request."""
        self._free.append(exe)
        if self.queued and self._wake is not None:
            self._wake.set()
        for p, r in zip(live, results):
            self._finish(p, r)

    def _shape(self, batch: list[Pending]) -> tuple:
        return batch[0].key, sum(p.rows for p in batch), max(p.length for p in batch)

    def _cheap(self, batch: list[Pending]) -> bool:
        limit = self.cfg.inline_below_us
        if not limit:
            return False
        last = self._last.get(self._shape(batch))
        return last is not None and last * 1e6 < limit

    def _measured(self, batch: list[Pending], seconds: float) -> None:
        if len(self._last) > 4096:  # a bounded memo: shapes seen long ago are measured again
            self._last.clear()
        self._last[self._shape(batch)] = seconds

    # ---- execution (in the pool's thread, or inline for cheap calls) -----------------------------------------
    def _execute(self, exe: Any, batch: list[Pending]) -> list[Any]:
        if len(batch) == 1:
            return [self._run_one(exe, batch[0])]
        m = self.m
        t0 = time.perf_counter()
        names = [t.name for t in self.sig.inputs]
        pad, longest = self.pad, max(p.length for p in batch)
        feeds = [pad.pad(p.feed, longest) if pad is not None and p.length != longest else p.feed for p in batch]
        feed = {n: np.concatenate([f[n] for f in feeds], axis=0) for n in names}
        t1 = time.perf_counter()
        try:
            out = exe.run(feed)
        except Exception as e:  # noqa: BLE001 (any failure: re-run alone so only the culprit fails)
            log.info("model %s: batch of %d failed (%s); re-running request by request", self.name, len(batch), e)
            return [self._run_one(exe, p) for p in batch]
        t2 = time.perf_counter()
        results, start = [], 0
        for p in batch:
            one = {k: v[start:start + p.rows] for k, v in out.items()}
            results.append(pad.unpad(one, p.length) if pad is not None and p.length != longest else one)
            start += p.rows
        t3 = time.perf_counter()
        self._measured(batch, t2 - t1)
        if pad is not None and self.cost is not None:
            cost, joined = self.cost, self._at(batch[0].values, start, longest)
            cost.record(joined, t2 - t1)
            useful = sum(p.rows * p.length for p in batch)
            self.m_pad.observe(1.0 - useful / (start * longest or 1))
            alone = sum(cost.counts(p.values)[0] for p in batch)
            self.m_pad_flops.observe(max(0.0, 1.0 - alone / (cost.counts(joined)[0] or 1.0)))
            padded = sum(p.length != longest for p in batch)
            if padded:
                self.m_join.inc(padded)
        m["compute_input"].observe(t1 - t0)
        m["compute_infer"].observe(t2 - t1)
        m["compute_output"].observe(t3 - t2)
        self._count(len(batch), start)
        return results

    def _run_one(self, exe: Any, p: Pending) -> Any:
        t1 = time.perf_counter()
        try:
            out = exe.run(p.feed)
        except DynshapeError as e:
            return bad(f"model {self.name!r}: {e}")
        except Exception as e:  # noqa: BLE001 (a model bug is this request's 500, not the server's crash)
            log.exception("model %s: run failed", self.name)
            return InferError(500, f"model {self.name!r}: run failed: {type(e).__name__}: {e}")
        dt = time.perf_counter() - t1
        self._measured([p], dt)
        if self.cost is not None:
            self.cost.record(p.values, dt)
        self.m["compute_input"].observe(0.0)
        self.m["compute_infer"].observe(dt)
        self.m["compute_output"].observe(0.0)
        self._count(1, p.rows)
        return out

    def _count(self, requests: int, rows: int) -> None:
        self.m_exec.inc()
        self.m_rows.inc(rows)
        self.m_breq.observe(requests)
        self.m_brows.observe(rows)
