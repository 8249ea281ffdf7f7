"""Dynamically quantized BERT: dynshape against onnxruntime on the same file, with the accuracy of the quantization.

The quantized files are what onnxruntime's own tool writes (`onnxruntime.quantization.quantize_dynamic`, weight_type
QInt8 and QUInt8, per tensor unless --per-channel), cached beside the float model, never committed. Every candidate
runs a file as shipped, nothing declared (`ds.load_onnx(path)` then `ds.compile`; onnxruntime's default session):
dynshape and onnxruntime on the float file and on each quantized one. Interleaved rounds, medians
(benchutil.time_interleaved), at 1 and 2 threads. Accuracy, per quantized file: the largest |int8 - fp32| over the
fp32 output's RMS (last_hidden_state), dynshape's int8 against dynshape's fp32 and onnxruntime's against its own.

    python bench/int8_bench.py [--threads 1,2] [--budget 2] [--per-channel] [--shapes 1x16,1x128,8x128] [--warm-calls 1]
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from benchutil import SHARED, common, cpu_model, limit_threads, rel_rms_error, steady, time_interleaved
from ort_util import ort_session

WEIGHT_TYPES = ("QInt8", "QUInt8")


def quantized(src: str, weight_type: str, per_channel: bool) -> str:
    """onnxruntime's dynamic quantization of `src`, written once beside it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = Path(src).with_name(f"{Path(src).stem}_dyn_{weight_type.lower()}{'_pc' if per_channel else ''}.onnx")
    if not out.exists():
        quantize_dynamic(src, str(out), weight_type=getattr(QuantType, weight_type), per_channel=per_channel)
    return str(out)


def candidates(files: dict[str, str], threads: int) -> dict[str, Any]:
    import dynshape as ds

    calls: dict[str, Any] = {}
    for tag, path in files.items():
        names = [v.name for v in ds.load_onnx(path).outputs]
        exe = ds.compile(ds.load_onnx(path))
        # one run per call, its outputs listed (a comprehension over e.run(feed)[n] would run it once per output)
        call = (lambda e, nm: lambda feed: (lambda out: [out[n] for n in nm])(e.run(feed)))(exe, names)
        call.exe = exe  # type: ignore[attr-defined]
        calls[f"ds_{tag}"] = call
        sess = ort_session(path, threads)
        calls[f"ort_{tag}"] = (lambda s, nm: lambda feed: s.run(nm, feed))(sess, names)
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bert_small")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per shape")
    ap.add_argument("--shapes", default="1x16,1x128,8x128")
    ap.add_argument("--weight-types", default=",".join(WEIGHT_TYPES))
    ap.add_argument("--per-channel", action="store_true")
    ap.add_argument("--warm-calls", type=int, default=0,
                    help="untimed calls opening each timed block (benchutil.time_interleaved): 0 times each call "
                         "right after another candidate, 1 a server's back-to-back steady state")
    args = ap.parse_args()
    print(f"CPU: {cpu_model()}; shared bench: {SHARED}; load: {os.getloadavg()[0]:.2f}")
    src = common.onnx_path(args.model)
    files = {"fp32": src}
    for wt in args.weight_types.split(","):
        files[wt.lower()] = quantized(src, wt, args.per_channel)
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    for threads in (int(t) for t in args.threads.split(",")):
        limit_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        calls = candidates(files, threads)
        q = [t for t in files if t != "fp32"]
        ratios: dict[str, list[float]] = {t: [] for t in q}
        print(f"\n{args.model}, {threads} thread(s): ms per call (median); err = max|int8 - fp32| / rms(fp32)")
        print(f"  {'shape':>10} " + " ".join(f"{k:>11}" for k in calls) +
              "".join(f" {'ort/ds ' + t:>13} {'err ds':>8} {'err ort':>8}" for t in q))
        for i, shape in enumerate(shapes):
            feed = common.make_inputs(args.model, shape, i)
            ds_ref, ort_ref = calls["ds_fp32"](feed)[0], calls["ort_fp32"](feed)[0]
            errs = {t: (rel_rms_error(calls[f"ds_{t}"](feed)[0], ds_ref),
                        rel_rms_error(calls[f"ort_{t}"](feed)[0], ort_ref)) for t in q}
            steady(calls, feed)
            limit_threads(threads)
            t_ = time_interleaved(calls, feed, args.budget, warm_calls=args.warm_calls)
            cells = ""
            for t in q:
                r = t_[f"ort_{t}"] / t_[f"ds_{t}"]
                ratios[t].append(r)
                cells += f" {r:13.2f} {errs[t][0]:8.3f} {errs[t][1]:8.3f}"
            print(f"  {str(shape):>10} " + " ".join(f"{t_[k] * 1e3:11.3f}" for k in calls) + cells)
        for t in q:
            print(f"  geomean onnxruntime / dynshape on the {t} file: {math.exp(np.mean(np.log(ratios[t]))):.2f}")


if __name__ == "__main__":
    main()
