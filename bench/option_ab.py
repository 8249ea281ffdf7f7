"""One compile option on and off, on the corpus's models loaded as a user would: is it faster, by how much?

    python bench/option_ab.py --option bf16_storage=false --precision bf16 --models light_resnet50,resnet18_nn
                              [--threads 1,2] [--budget 2] [--rounds 16]

Per model, two builds in this process (`ds.load_onnx(path)`, nothing declared; `ds.compile(graph,
precision=..., **option)` for side A, without the option for side B, the default), then per probe shape
interleaved rounds in balanced orders, medians (benchutil.time_interleaved), at each thread count. Prints the CPU
model, each probe's times and A / B (> 1: the default is faster than the value given), and the largest
difference between the two sides' outputs over the largest output magnitude (an option that changes rounding
shows it here). Both sides share the process, the machine and its drift, which the interleaving cancels: the
ratio, not the absolute times, is the figure.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchutil import cpu_model, limit_threads, option_value, time_interleaved
from zoo_models import BY_NAME


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--option", required=True, help="NAME=VALUE: side A's value (side B: the default)")
    ap.add_argument("--models", required=True, help="comma-separated names of the corpus (zoo_models)")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per probe and thread count")
    ap.add_argument("--rounds", type=int, default=16)
    args = ap.parse_args()
    name, _, text = args.option.partition("=")
    import dynshape as ds

    print(f"CPU: {cpu_model()}; A: {name}={option_value(text)}, B: default; precision {args.precision}")
    for model in args.models.split(","):
        m = BY_NAME[model]
        exes = {"A": ds.compile(ds.load_onnx(m.path()), precision=args.precision, **{name: option_value(text)}),
                "B": ds.compile(ds.load_onnx(m.path()), precision=args.precision)}
        for threads in (int(t) for t in args.threads.split(",")):
            limit_threads(threads)
            for probe in range(len(m.probes)):
                feed = m.make_feed(probe)
                outs = {k: e.run(feed) for k, e in exes.items()}
                diff = max(float(np.max(np.abs(np.asarray(outs["A"][o], np.float64) - outs["B"][o])))
                           / (float(np.max(np.abs(outs["B"][o]))) or 1.0)
                           for o in outs["B"] if np.asarray(outs["B"][o]).dtype.kind == "f" and outs["B"][o].size)
                t = time_interleaved({k: (lambda f, e=e: e.run(f)) for k, e in exes.items()}, feed, args.budget,
                                     args.rounds)
                print(f"  {model} {m.probe_label(probe)}, {threads} thread(s): A {t['A'] * 1e3:.3f} ms, "
                      f"B {t['B'] * 1e3:.3f} ms, A/B time {t['A'] / t['B']:.3f}; max |A - B| / max |B| {diff:.2e}",
                      flush=True)


if __name__ == "__main__":
    main()
