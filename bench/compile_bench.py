"""dynshape's compiled executables beside onnxruntime and torch eager, on ../shared/bench's models and stream.

    python bench/compile_bench.py --model bert_small [--threads 1] [--peers ort,eager] [--stream] [--quick]

Prints, in one run (medians over interleaved rounds, same process, same inputs):
- compile time from a cold build cache and from the warm disk cache;
- per fixed shape: the generic build, the fully static variant of that shape, eta = T(static) / T(generic)
  (the two builds timed alone, interleaved), and each peer with its ratio to dynshape's generic build (the
  generic build and the peers interleaved);
- the per-call tax: binder alone (bind + check + dispatch key), and a whole mlp call at batch 1;
- --stream: the whole request stream, compile included, from a cold cache (onnxruntime: session included).
Needs `python ../shared/bench/export_models.py` first (models go to ~/.cache/dynshape-bench/models).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import timeit

import dynshape as ds
from benchutil import DIMS, common, limit_threads, peers
from dynshape.codegen import gemm


def build(model: str, specialize=None):
    t = time.perf_counter()
    g = ds.load_onnx(common.onnx_path(model), dims=DIMS[model])
    # strategy "generic": no automatic variants, so what is timed is the build asked for (declared variants only)
    exe = ds.compile(g, specialize=specialize, strategy="generic")
    return exe, time.perf_counter() - t


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


def time_interleaved(calls: dict, inputs: dict, budget_s: float, rounds: int = 16, settle_s: float = 0.05) -> dict:
    """Seconds per call of each candidate: `rounds` rounds, each timing every candidate on a block of calls
    (about budget_s / rounds / len(calls) long, at least one call), in balanced orders; the median block.
    Microsecond calls are timed in blocks (a single perf_counter pair is noise there), and interleaving puts
    the machine's drift on every candidate alike."""
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
            t = time.perf_counter()
            for _ in range(n):
                f(inputs)
            samples[k].append((time.perf_counter() - t) / n)
    return {k: statistics.median(v) for k, v in samples.items()}


def shape_dict(model: str, shape: tuple) -> dict:
    return dict(zip(["batch", "seq"], shape))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert_small", choices=sorted(DIMS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--peers", default="ort,eager")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    args = ap.parse_args()
    limit_threads(args.threads)
    budget = 0.5 if args.quick else 3.0
    model = args.model
    shapes = common.fixed_shapes(model)

    with tempfile.TemporaryDirectory() as cold:
        os.environ["DYNSHAPE_CACHE_DIR"] = cold
        _, t_cold = build(model)
        _, t_warm_proc = build(model)  # same process: libraries already loaded
        os.environ.pop("DYNSHAPE_CACHE_DIR")
    print(f"compile {model}: cold cache {t_cold:.2f} s; again in-process {t_warm_proc:.2f} s")

    exe, _ = build(model, specialize=[shape_dict(model, s) for s in shapes])
    generic = ds.compile(exe.graph, strategy="generic")  # no variants: always the generic build
    generic.run(common.make_inputs(model, shapes[0], seed=1))  # loads the BLAS: now its threads can be limited
    limit_threads(args.threads)
    calls = {"dynshape": lambda x: generic.run(x), "static": lambda x: exe.run(x)}
    for p in [p for p in args.peers.split(",") if p]:
        try:
            calls[p], _ = peers.PEERS[p](model, args.threads)
        except Exception as e:  # noqa: BLE001 - a missing peer is a note, not a failure
            print(f"peer {p} skipped: {type(e).__name__}: {e}")
    limit_threads(args.threads)  # torch may have loaded another BLAS
    print(f"BLAS: {gemm.blas_name()}, threads limited to {args.threads}")
    print(f"\n| shape | {' | '.join(f'{k} ms' for k in calls)} | eta | " +
          " | ".join(f"{k}/dynshape" for k in calls if k not in ("dynshape", "static")) + " |")
    etas, ratios = [], {k: [] for k in calls if k not in ("dynshape", "static")}
    print("|" + "---|" * (2 + len(calls) + len(ratios)))
    for s in shapes:
        x = common.make_inputs(model, s, seed=1)
        # eta from our two builds alone: with the peers in the same rounds their thread pools and caches
        # moved it by up to 10% either way at 2 threads (0.89..1.07 in successive runs, 1.00 +- 0.04 without)
        ours = time_interleaved({k: calls[k] for k in ("dynshape", "static")}, x, budget)
        t = time_interleaved({k: f for k, f in calls.items() if k != "static"}, x, budget)
        t = {"dynshape": t["dynshape"], "static": ours["static"],
             **{k: v for k, v in t.items() if k != "dynshape"}}
        eta = ours["static"] / ours["dynshape"]
        etas.append(eta)
        for k in ratios:
            ratios[k].append(t[k] / t["dynshape"])
        print(f"| {s} | " + " | ".join(f"{1e3 * v:.3f}" for v in t.values()) + f" | {eta:.3f} | " +
              " | ".join(f"{t[k] / t['dynshape']:.2f}" for k in ratios) + " |")
    gm = statistics.geometric_mean
    print(f"\neta geomean {gm(etas):.3f}, min {min(etas):.3f}; " +
          "; ".join(f"{k}/dynshape geomean {gm(v):.2f}, min {min(v):.2f}" for k, v in ratios.items()))

    feed = common.make_inputs(model, shapes[0], seed=1)
    n = 20000
    bind = generic.binder
    t_bind = min(timeit.repeat(lambda: bind(feed), number=n, repeat=5)) / n
    t_call = min(timeit.repeat(lambda: generic.run(feed), number=n // 10, repeat=5)) / (n // 10)
    print(f"call tax at {shapes[0]}: binder {1e6 * t_bind:.2f} us; whole call {1e6 * t_call:.1f} us")

    if args.stream:
        with tempfile.TemporaryDirectory() as cold:
            os.environ["DYNSHAPE_CACHE_DIR"] = cold
            t0 = time.perf_counter()
            exe_s, _ = build(model)
            res = peers.time_stream(lambda x: exe_s.run(x), model, setup_s=time.perf_counter() - t0)
            os.environ.pop("DYNSHAPE_CACHE_DIR")
        print(f"stream dynshape: total {res['total_s']:.2f} s (compile included), p50 {res['p50_ms']:.2f} ms, "
              f"p99 {res['p99_ms']:.2f} ms")
        for p in [p for p in args.peers.split(",") if p]:
            if p in calls:
                call, setup = peers.PEERS[p](model, args.threads)
                r = peers.time_stream(call, model, setup_s=setup)
                print(f"stream {p}: total {r['total_s']:.2f} s, p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms")


if __name__ == "__main__":
    main()
