"""What the benchmark scripts share: ../shared/bench on the path, the models' dims, BLAS thread limits, the
interleaved timer (balanced orders, medians, settle pauses) and resident memory."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def _find_shared() -> Path:
    """../shared/bench beside the checkout; from a git worktree elsewhere (/work/wt/NAME), the first ancestor's."""
    here = Path(__file__).resolve()
    for root in here.parents[1:]:
        if (root / "shared" / "bench" / "common.py").is_file():
            return root / "shared" / "bench"
    return here.parents[2] / "shared" / "bench"


SHARED = _find_shared()
sys.path.insert(0, str(SHARED))

DIMS = {"bert_small": {"batch": (1, 8), "seq": (1, 512)}, "mlp": {"batch": (1, 256)}}


def limit_threads(n: int):
    """Limit every loaded BLAS/OpenMP pool to n threads (call again after a library loads lazily)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        os.environ["OMP_NUM_THREADS"] = str(n)
        return None
    return threadpool_limits(n)


def balanced_orders(n: int) -> list[list[int]]:
    """A Williams design: orders of range(n) in which each candidate comes right after each other one equally
    often. (Rotating one order does not: a candidate then always follows the same one, and if that one leaves
    its thread pool spinning, as torch's does, every block of the follower runs on a contended core.)"""
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + i) % n for x in first] for i in range(n)]
    return rows if n % 2 == 0 else rows + [r[::-1] for r in rows]


def time_interleaved(calls: dict, inputs: dict, budget_s: float, rounds: int = 16, settle_s: float = 0.05,
                     warm_calls: int = 0) -> dict:
    """Seconds per call of each candidate: `rounds` rounds, each timing every candidate on a block of calls
    (about budget_s / rounds / len(calls) long, at least one call), in balanced orders; the median block.
    Microsecond calls are timed in blocks (a single perf_counter pair is noise there), and interleaving puts
    the machine's drift on every candidate alike. `warm_calls` untimed calls open each block: 0 times a
    candidate as it runs right after another one and a settle pause (its weights and activations partly out
    of cache, its pages' translations out of the TLB); 1 or more, its steady state, a server's back-to-back
    requests."""
    per_call = {}
    for k, f in calls.items():  # warm-up (a tenth of the budget each: caches, pools, clocks), and an estimate
        f(inputs)
        t = time.perf_counter()
        n = 0
        while n < 2 or time.perf_counter() - t < budget_s / 10:
            f(inputs)
            n += 1
        per_call[k] = max((time.perf_counter() - t) / n, 1e-7)
    block_s = budget_s / rounds / len(calls)
    samples: dict = {k: [] for k in calls}
    names = list(calls)
    orders = balanced_orders(len(names))
    rounds = -(-rounds // len(orders)) * len(orders)  # whole designs only
    for r in range(rounds):
        # each candidate follows each other one as often: whoever runs right after a build that shares its
        # weights finds them in cache, and whoever runs right after torch finds its threads still spinning
        for k in [names[i] for i in orders[r % len(orders)]]:
            f = calls[k]
            n = max(1, int(block_s / per_call[k]))
            time.sleep(settle_s)  # the previous candidate's idle threads stop spinning before this one runs
            for _ in range(warm_calls):
                f(inputs)
            t = time.perf_counter()
            for _ in range(n):
                f(inputs)
            samples[k].append((time.perf_counter() - t) / n)
    return {k: statistics.median(v) for k, v in samples.items()}


def steady(calls: dict, feed: dict, n: int = 40) -> None:
    """dynshape's default strategy builds a static variant of a shape once it is hot, in the background: call each
    candidate that carries its executable (`call.exe`) past the threshold and wait for those builds, so the rounds
    time the steady state a server sees (not the build sharing the cores with the timed calls)."""
    for call in calls.values():
        exe = getattr(call, "exe", None)
        if exe is not None:
            for _ in range(n):
                call(feed)
            wait = getattr(exe, "wait_for_builds", None)
            if wait is not None:
                wait(120)


def option_value(text: str):
    """A command line's NAME=VALUE value as an Options field wants it: an int, a bool (true / false), else the
    string (step_profile.py's and option_ab.py's --option)."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def cpu_model() -> str:
    """The CPU's model name and the ISA flags that decide which kernels run (every figure names its CPU)."""
    name, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown CPU":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8") if f in flags]
    return f"{name} ({', '.join(isa) or 'no AVX2'})"


def rel_rms_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / rms(want): a low-precision output's error against its float32 reference, scaled by the
    output's size (1 where the reference is all zeros)."""
    rms = float(np.sqrt(np.mean(np.square(want.astype(np.float64))))) or 1.0
    return float(np.max(np.abs(got.astype(np.float64) - want))) / rms


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


import common  # noqa: E402  (from ../shared/bench, on the path above)
import peers  # noqa: E402

__all__ = ["DIMS", "SHARED", "balanced_orders", "common", "cpu_model", "limit_threads", "peers", "rss_bytes",
           "time_interleaved"]
