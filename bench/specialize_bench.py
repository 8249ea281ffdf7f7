"""Hybrid specialisation on bert_small: hot-shape variants built in the background vs the generic build alone.

    python bench/specialize_bench.py [--calls 600] [--threads 1] [--static]

Measures, in one process, with a fresh C build cache (every variant build really runs the compiler):
1. a skewed stream (80% of calls in 3 shapes, the rest lognormal-spread): total time with `strategy="auto"`
   (variants for the hot shapes, built in the background) against `strategy="generic"`; goal >= 1.15x;
2. latency of a shape while its variant is being built in the background: the slowest call during the build
   against the generic build's median for that shape; goal <= 1.5x (needs a core the BLAS does not use: the
   run is limited to --threads BLAS threads, 1 by default);
3. tail latency over the shared random-shape request stream after a warm-up pass: each call's time over its
   shape's median (so shape size cancels), p99 / p50 of that ratio, for `auto` and `generic` alike, and the
   machine's noise floor (one shape called as many times); goal <= 1.2;
4. dispatch with 1,000 exact-key variants installed (dummies), the lookup alone; goal <= 1 us.
`--static` adds the recompile-per-shape baseline (`strategy="static"`) to 1 and 3: slow, it compiles every shape.
Needs `python ../shared/bench/export_models.py` first (models go to ~/.cache/dynshape-bench/models).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import timeit

import numpy as np

import dynshape as ds
from benchutil import DIMS, common, limit_threads

HOT = [(1, 64), (2, 128), (4, 32)]




def fresh_cache() -> None:
    """Point the C build cache at a new directory: every build from now on runs the compiler."""
    os.environ["DYNSHAPE_CACHE_DIR"] = tempfile.mkdtemp(prefix="ds-spec-bench-")


def skewed_stream(n: int, seed: int = 7) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.8:
            out.append(HOT[rng.integers(len(HOT))])
        else:
            seq = int(np.clip(np.rint(rng.lognormal(np.log(64), 0.9)), 8, 256))
            out.append((int(rng.choice([1, 2, 4, 8])), seq))
    return out


def time_stream(exe, shapes, feeds) -> tuple[float, list[float]]:
    lat = []
    t0 = time.perf_counter()
    for s in shapes:
        t = time.perf_counter()
        exe.run(feeds[s])
        lat.append(time.perf_counter() - t)
    return time.perf_counter() - t0, lat


def bench_skewed(graph, n: int, with_static: bool) -> dict:
    shapes = skewed_stream(n)
    feeds = {s: common.make_inputs("bert_small", s, 1) for s in set(shapes)}
    print(f"1. skewed stream: {n} calls, {len(set(shapes))} distinct shapes, 80% in {HOT}")
    totals: dict[str, list[float]] = {}
    systems = ["generic", "auto"] + (["static"] if with_static else [])
    for rep in range(2):  # alternate, each from a fresh compile, keep the better total of two
        for name in systems:
            fresh_cache()
            t = time.perf_counter()
            exe = ds.compile(graph, strategy=name)
            compile_s = time.perf_counter() - t
            total, _ = time_stream(exe, shapes, feeds)
            exe.wait_for_builds(120)
            totals.setdefault(name, []).append(total)
            variants = len(exe.explain_strategy()["variants"])
            print(f"   {name:8s} rep {rep}: stream {total:6.2f} s (compile {compile_s:.2f} s, {variants} variants)")
            if name == "auto":
                auto = exe
    generic = ds.compile(graph, strategy="generic")
    for s in HOT:  # why the totals are what they are: a hot shape's variant against the generic build
        feed = {s: feeds[s]}
        t_gen = statistics.median(time_stream(generic, [s] * 20, feed)[1])
        t_var = statistics.median(time_stream(auto, [s] * 20, feed)[1])
        print(f"   {s}: generic {t_gen * 1e3:.2f} ms, its static variant {t_var * 1e3:.2f} ms, "
              f"eta {t_var / t_gen:.3f}")
    best = {k: min(v) for k, v in totals.items()}
    return {"generic_s": best["generic"], "auto_s": best["auto"], "static_s": best.get("static"),
            "speedup": best["generic"] / best["auto"]}


def bench_during_build(graph, shape=(2, 96), reps: int = 30) -> dict:
    feed = common.make_inputs("bert_small", shape, 2)
    generic = ds.compile(graph, strategy="generic")
    for _ in range(5):
        generic.run(feed)
    base = [time_stream(generic, [shape] * reps, {shape: feed})[1] for _ in range(1)][0]
    p50 = statistics.median(base)
    fresh_cache()
    exe = ds.compile(graph, hot_calls=20)
    for _ in range(19):
        exe.run(feed)
    during, t_build = [], time.perf_counter()
    exe.run(feed)  # the 20th call: hot, its build starts in the background
    while exe.pending:
        t = time.perf_counter()
        exe.run(feed)
        during.append(time.perf_counter() - t)
    t_build = time.perf_counter() - t_build
    after = time_stream(exe, [shape] * reps, {shape: feed})[1]
    print(f"2. {shape} while its variant builds ({t_build:.2f} s, {len(during)} calls): generic p50 "
          f"{p50 * 1e3:.2f} ms, max during build {max(during, default=0) * 1e3:.2f} ms, "
          f"p50 during {statistics.median(during) * 1e3 if during else 0:.2f} ms, variant p50 after "
          f"{statistics.median(after) * 1e3:.2f} ms")
    return {"generic_p50_ms": p50 * 1e3, "max_during_ms": max(during, default=0) * 1e3, "calls_during": len(during),
            "ratio": max(during, default=0) / p50, "build_s": t_build}


def bench_tail(graph, with_static: bool, passes: int = 3) -> dict:
    stream = [common.req_shape("bert_small", r) for r in common.load_stream()["streams"]["bert_small"]]
    feeds = {s: common.make_inputs("bert_small", s, 3) for s in set(stream)}
    out = {}
    for name in ["generic", "auto"] + (["static"] if with_static else []):
        exe = ds.compile(graph, strategy=name)
        time_stream(exe, stream, feeds)  # warm-up: every shape seen once
        exe.wait_for_builds(600)
        per_shape: dict = {}
        calls = []
        for _ in range(passes):
            _, lat = time_stream(exe, stream, feeds)
            for s, t in zip(stream, lat):
                per_shape.setdefault(s, []).append(t)
                calls.append((s, t))
        med = {s: statistics.median(v) for s, v in per_shape.items()}
        ratios = np.array([t / med[s] for s, t in calls])
        p50, p99 = float(np.percentile(ratios, 50)), float(np.percentile(ratios, 99))
        raw = np.array([t for _, t in calls])
        print(f"3. {name}: random-shape stream, {len(stream)} calls x {passes} after warm-up, {len(set(stream))} "
              f"shapes: time/shape-median p50 {p50:.3f} p99 {p99:.3f} -> p99/p50 {p99 / p50:.3f} "
              f"(raw latency p50 {np.percentile(raw, 50) * 1e3:.1f} ms, p99 {np.percentile(raw, 99) * 1e3:.1f} ms)")
        out[name] = p99 / p50
    # the machine's own floor: one mid-size shape, the same call 600 times (no shape changes, no builds)
    shape = (2, 64)
    feed = {shape: feeds.get(shape) or common.make_inputs("bert_small", shape, 3)}
    exe = ds.compile(graph, strategy="generic")
    time_stream(exe, [shape] * 50, feed)
    _, lat = time_stream(exe, [shape] * len(stream) * passes, feed)
    floor = float(np.percentile(lat, 99) / np.percentile(lat, 50))
    print(f"   noise floor: {shape} alone, {len(lat)} calls: p99/p50 {floor:.3f}")
    out["floor"] = floor
    return out


def bench_dispatch(graph) -> dict:
    exe = ds.compile(graph, strategy="generic")
    table = exe.table
    table.exact = {(b, s): table.generic for b in range(1, 9) for s in range(1, 126)}  # 1,000 keys
    assert len(table.exact) == 1000
    hit, miss = (5, 77), (8, 500)
    n = 200_000
    lookup = table.lookup

    t_hit = min(timeit.repeat(lambda: lookup(hit), number=n, repeat=5)) / n
    t_miss = min(timeit.repeat(lambda: lookup(miss), number=n, repeat=5)) / n
    t_empty = min(timeit.repeat(lambda: None, number=n, repeat=5)) / n
    buckets = ds.compile(graph, fuse=False, strategy="bucketed")
    buckets.table.exact = table.exact
    t_bucket = min(timeit.repeat(lambda: buckets.table.lookup(miss), number=n, repeat=5)) / n
    print(f"4. dispatch with 1,000 exact-key variants: hit {(t_hit - t_empty) * 1e9:.0f} ns, miss -> generic "
          f"{(t_miss - t_empty) * 1e9:.0f} ns, miss -> 8 buckets {(t_bucket - t_empty) * 1e9:.0f} ns "
          f"(a bare lambda call, {t_empty * 1e9:.0f} ns, subtracted)")
    return {"hit_ns": (t_hit - t_empty) * 1e9, "miss_ns": (t_miss - t_empty) * 1e9,
            "bucket_ns": (t_bucket - t_empty) * 1e9}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=600)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--static", action="store_true", help="also the recompile-per-shape baseline (slow)")
    args = ap.parse_args()
    fresh_cache()
    graph = ds.load_onnx(common.onnx_path("bert_small"), dims=DIMS["bert_small"])
    ds.compile(graph, strategy="generic").run(common.make_inputs("bert_small", (1, 8)))  # loads BLAS and OpenMP
    _limits = limit_threads(args.threads)  # noqa: F841 - after the libraries load, else it misses them
    skew = bench_skewed(graph, args.calls, args.static)
    build = bench_during_build(graph)
    tail = bench_tail(graph, args.static)
    disp = bench_dispatch(graph)
    rows = [
        ("skewed stream: generic / auto total", f"{skew['generic_s']:.2f} s / {skew['auto_s']:.2f} s = "
                                                f"{skew['speedup']:.3f}x", ">= 1.15x", skew["speedup"] >= 1.15),
        ("max latency during a build / generic p50", f"{build['max_during_ms']:.2f} / {build['generic_p50_ms']:.2f} ms "
                                                     f"= {build['ratio']:.2f}x", "<= 1.5x", build["ratio"] <= 1.5),
        ("random stream p99/p50 (per-shape normalised)", f"{tail['auto']:.3f} (generic alone {tail['generic']:.3f}; "
                                                         f"one shape repeated {tail['floor']:.3f})",
         "<= 1.2", tail["auto"] <= 1.2),
        ("exact-key dispatch, 1,000 variants", f"{disp['hit_ns']:.0f} ns", "<= 1 us", disp["hit_ns"] <= 1000),
    ]
    if skew["static_s"] is not None:
        rows.append(("static (recompile per shape) total", f"{skew['static_s']:.2f} s", "baseline", True))
        rows.append(("static random stream p99/p50", f"{tail['static']:.3f}", "baseline", True))
    print("\n| measure | measured | goal | met |\n|---|---|---|---|")
    for name, got, goal, ok in rows:
        print(f"| {name} | {got} | {goal} | {'yes' if ok else 'no'} |")


if __name__ == "__main__":
    main()
