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
from benchutil import DIMS, common, cpu_model, limit_threads, peers, time_interleaved
from dynshape.codegen import gemm


def build(model: str, specialize=None):
    t = time.perf_counter()
    g = ds.load_onnx(common.onnx_path(model), dims=DIMS[model])
    # strategy "generic": no automatic variants, so what is timed is the build asked for (declared variants only)
    exe = ds.compile(g, specialize=specialize, strategy="generic")
    return exe, time.perf_counter() - t


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
    # the default path first: the file as shipped, nothing declared (dims take their [0, inf] default)
    undeclared = ds.compile(ds.load_onnx(common.onnx_path(model)), strategy="generic")
    generic.run(common.make_inputs(model, shapes[0], seed=1))  # loads the BLAS: now its threads can be limited
    limit_threads(args.threads)
    calls = {"undeclared": lambda x: undeclared.run(x), "dynshape": lambda x: generic.run(x),
             "static": lambda x: exe.run(x)}
    ours_keys = ("undeclared", "dynshape", "static")
    for p in [p for p in args.peers.split(",") if p]:
        try:
            calls[p], _ = peers.PEERS[p](model, args.threads)
        except Exception as e:  # noqa: BLE001 - a missing peer is a note, not a failure
            print(f"peer {p} skipped: {type(e).__name__}: {e}")
    limit_threads(args.threads)  # torch may have loaded another BLAS
    print(f"BLAS: {gemm.blas_name()}, threads limited to {args.threads}; CPU: {cpu_model()}")
    print("undeclared: ds.load_onnx(path) as shipped; dynshape: dims declared; eta = static / declared; "
          "decl/undecl = declared / undeclared (>= 1: undeclared as fast)")
    print(f"\n| shape | {' | '.join(f'{k} ms' for k in calls)} | eta | decl/undecl | " +
          " | ".join(f"{k}/undeclared" for k in calls if k not in ours_keys) + " |")
    etas, same, ratios = [], [], {k: [] for k in calls if k not in ours_keys}
    print("|" + "---|" * (3 + len(calls) + len(ratios)))
    for s in shapes:
        x = common.make_inputs(model, s, seed=1)
        # eta from our builds alone: with the peers in the same rounds their thread pools and caches
        # moved it by up to 10% either way at 2 threads (0.89..1.07 in successive runs, 1.00 +- 0.04 without)
        ours = time_interleaved({k: calls[k] for k in ours_keys}, x, budget)
        t = time_interleaved({k: f for k, f in calls.items() if k != "static"}, x, budget)
        t = {"undeclared": t["undeclared"], "dynshape": t["dynshape"], "static": ours["static"],
             **{k: v for k, v in t.items() if k not in ours_keys}}
        eta = ours["static"] / ours["dynshape"]
        etas.append(eta)
        same.append(ours["dynshape"] / ours["undeclared"])
        for k in ratios:
            ratios[k].append(t[k] / t["undeclared"])
        print(f"| {s} | " + " | ".join(f"{1e3 * v:.3f}" for v in t.values()) + f" | {eta:.3f} | {same[-1]:.3f} | "
              + " | ".join(f"{t[k] / t['undeclared']:.2f}" for k in ratios) + " |")
    gm = statistics.geometric_mean
    print(f"\neta geomean {gm(etas):.3f}, min {min(etas):.3f}; decl/undecl geomean {gm(same):.3f}, min "
          f"{min(same):.3f}; " + "; ".join(f"{k}/undeclared geomean {gm(v):.2f}, min {min(v):.2f}"
                                        for k, v in ratios.items()))

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
