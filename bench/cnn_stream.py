"""dynshape, onnxruntime and OpenVINO on a stream of random admissible shapes: what a dynamic-shape server sees.

cnn_bench times fixed probe shapes, where every dynshape call after the first runs a cached plan. Here each model
gets one seeded stream of --calls shapes drawn uniformly from its declared ranges (each range cut to its lowest
--frac part, as cnn_bench --memory does: the full ranges reach minutes a call); each runtime runs the whole
stream once per round, the runtimes in a new order every round, and the table gives the median over rounds of
the mean ms per call. dynshape runs twice: undeclared (`ds.load_onnx(path)`, the file as shipped: what a user
runs, printed first) and over the spec's declared ranges; the peer ratios are against the undeclared one. The
streams hold more distinct shapes than dynshape's plan cache (256 plans an arena), so
most of its calls make a new plan (the time to make one is in the figure); onnxruntime and OpenVINO, both with
dynamic dims, pay what they pay per new shape. Outputs are checked against onnxruntime on the stream's first
shapes (rtol 1e-3, atol 1e-4).

    python bench/cnn_stream.py [--models text_det,text_rec] [--threads 1] [--peers ort,ov] [--calls 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from benchutil import limit_threads
from cnn_bench import RandomShapes, compare, installed_peers, make_dynshape, make_ort, make_ov, short_error
from cnn_models import Spec
from export_cnn_models import ALL_SPECS, onnx_path

DEFAULT_MODELS = "text_det,text_rec,text_rec_svtr,vad,byte_cls"


def stream_of(spec: Spec, calls: int, frac: float, seed: int = 3) -> list[dict[str, np.ndarray]]:
    """`calls` feeds at random admissible shapes (each symbol in the lowest `frac` of its range, its step kept),
    each its own copy."""
    shapes, rng = RandomShapes(spec, frac), np.random.default_rng(seed)
    return [{n: a.copy() for n, a in shapes.feed(shapes.draw(rng)).items()} for _ in range(calls)]


def run_model(spec: Spec, args: argparse.Namespace, peers: list[str]) -> dict:
    path = onnx_path(spec.name)
    feeds = stream_of(spec, args.calls, args.frac)
    keys = {tuple(tuple(a.shape) for a in f.values()) for f in feeds}
    # undeclared first (the file as shipped, ds.load_onnx(path) with nothing declared: what a user runs), then the
    # build over the spec's declared ranges
    makers = {"undeclared": lambda: make_dynshape(path, spec, "generic", undeclared=True),
              "dynshape": lambda: make_dynshape(path, spec, "generic"),
              "ort": lambda: make_ort(path, spec, args.threads), "ov": lambda: make_ov(path, spec, args.threads)}
    calls, errors = {}, {}
    for k in ["undeclared", "dynshape", *peers]:
        try:
            calls[k] = makers[k]()
            calls[k](feeds[0])
        except Exception as e:  # noqa: BLE001 - a runtime that cannot run the model is reported, not a crash
            errors[k] = short_error(e)
            calls.pop(k, None)
    limit_threads(args.threads)  # the first call loaded dynshape's OpenMP: limit it now
    bad = []
    if "ort" in calls:
        for f in feeds[: args.check]:
            want = [np.asarray(o) for o in calls["ort"](f)]
            for k in calls:
                if k != "ort" and not compare([np.array(o) for o in calls[k](f)], want)[1]:
                    bad.append(k)
    per_round: dict[str, list[float]] = {k: [] for k in calls}
    names = list(calls)
    for r in range(args.rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            t = time.perf_counter()
            for f in feeds:
                calls[k](f)
            per_round[k].append(1e3 * (time.perf_counter() - t) / len(feeds))
    ms = {k: statistics.median(v) for k, v in per_round.items()}
    print(f"  {spec.name}: {len(feeds)} calls over {len(keys)} distinct shapes: "
          + ", ".join(f"{k} {v:.2f} ms/call" for k, v in ms.items())
          + "".join(f"; {k} FAILED: {e}" for k, e in errors.items())
          + (f"; OUTPUTS DIFFER: {sorted(set(bad))}" if bad else ""), flush=True)
    return {"model": spec.name, "keys": len(keys), "ms": ms, "errors": errors, "bad": sorted(set(bad))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated, of: {', '.join(ALL_SPECS)}")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--peers", default="ort,ov")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frac", type=float, default=0.25)
    ap.add_argument("--check", type=int, default=5, help="stream shapes whose outputs are checked against ort")
    args = ap.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in ALL_SPECS]
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; known: {', '.join(ALL_SPECS)}")
    peers = installed_peers(args.peers)
    limit_threads(args.threads)
    print(f"threads {args.threads}; peers {peers}; {args.calls} random shapes a model, {args.rounds} rounds")
    recs = [run_model(ALL_SPECS[n], args, peers) for n in names]
    print("\n| model | shapes | undeclared ms/call | declared ms/call | decl/undecl | "
          + " | ".join(f"{p}/undecl" for p in peers) + " |")
    print("|---|---|---|---|---|" + "---|" * len(peers))
    for r in recs:
        u, d = r["ms"].get("undeclared"), r["ms"].get("dynshape")
        cells = [f"{u:.2f}" if u else "-", f"{d:.2f}" if d else "-", f"{d / u:.2f}" if u and d else "-"]
        cells += [f"{r['ms'][p] / u:.2f}" if u and p in r["ms"] else "-" for p in peers]
        print(f"| {r['model']} | {r['keys']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
