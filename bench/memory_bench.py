"""Resident memory over many calls of random admissible shapes: it must stay flat after warm-up.

    python bench/memory_bench.py [--model mlp] [--calls 100000] [--warmup 5000] [--strategy auto]

Shapes are drawn uniformly from the model's declared ranges (every key the signature admits); the inputs of
every shape are made before the first call, so what can grow is dynshape's own state: plans, arenas,
profiles, variants.
Prints resident memory (VmRSS) after warm-up and every tenth of the run; goal: growth < 1% after warm-up.
Linux only (reads /proc/self/status). bert_small at 100,000 calls takes about half an hour on one core:
use --calls 5000 there for a quick look.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import time

import numpy as np

import dynshape as ds
from benchutil import DIMS, common, limit_threads, rss_bytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=sorted(DIMS))
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--warmup", type=int, default=5_000)
    ap.add_argument("--strategy", default="auto")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    dims = DIMS[args.model]
    graph = ds.load_onnx(common.onnx_path(args.model), dims=dims)
    exe = ds.compile(graph, strategy=args.strategy)
    rng = np.random.default_rng(0)
    names = list(dims)
    ranges = [dims[n] for n in names]
    feeds: dict = {}

    def call() -> None:
        shape = tuple(int(rng.integers(lo, hi + 1)) for lo, hi in ranges)
        feed = feeds.get(shape)
        if feed is None:
            feed = feeds[shape] = common.make_inputs(args.model, shape, seed=1)
        exe.run(feed)

    # every admissible shape's inputs made up front, so the inputs' own memory is not counted as growth
    for shape in itertools.product(*[range(lo, hi + 1) for lo, hi in ranges]):
        feeds[shape] = common.make_inputs(args.model, shape, seed=1)
    exe.run(feeds[tuple(hi for _, hi in ranges)])  # the largest shape first: the arenas reach their full size
    limit_threads(args.threads)
    t = time.perf_counter()
    for _ in range(args.warmup):
        call()
    exe.wait_for_builds(600)
    gc.collect()
    base = rss_bytes()
    print(f"{args.model}: {len(feeds)} input shapes; after {args.warmup} warm-up calls "
          f"({time.perf_counter() - t:.1f} s): RSS {base / 2**20:.1f} MiB")
    peak = base
    step = max(1, args.calls // 10)
    t = time.perf_counter()
    for i in range(1, args.calls + 1):
        call()
        if i % step == 0:
            now = rss_bytes()
            peak = max(peak, now)
            n_plans = sum(len(a.plans) for a in exe.arenas)  # counted, not held: a list of them would
            held = sum(p.nbytes for a in exe.arenas for p in a.plans.values())  # keep evicted plans alive
            print(f"  {i:>7d} calls: RSS {now / 2**20:.1f} MiB ({100 * (now - base) / base:+.2f}%), "
                  f"{time.perf_counter() - t:.1f} s; {n_plans} cached plans holding {held / 2**20:.1f} MiB of "
                  "per-key values")
    gc.collect()
    end = rss_bytes()
    growth = 100 * (max(end, peak) - base) / base
    print(f"\nRSS growth after warm-up over {args.calls} calls: {growth:+.2f}% (peak {peak / 2**20:.1f} MiB); "
          f"goal < 1%: {'met' if growth < 1 else 'not met'}")
    st = exe.stats()
    print(f"stats: calls {st['calls']}, arena bytes {st.get('arena_bytes')}, variants {len(exe.variants)}")


if __name__ == "__main__":
    main()
