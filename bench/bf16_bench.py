"""bf16 against OpenVINO's default (bf16 on CPUs with AVX512-BF16 or AMX) and the fp32 runtimes, with accuracy.

Every candidate runs the file as shipped, nothing declared (`ds.load_onnx(path)`, then `ds.compile` with only
`precision` set): dynshape fp32 and bf16, OpenVINO default (its INFERENCE_PRECISION_HINT left as it comes) and f32,
onnxruntime. Interleaved rounds, medians (benchutil.time_interleaved), at 1 and 2 threads. Accuracy, per output:
the largest |bf16 - fp32| over the fp32 output's RMS, for dynshape's bf16 and OpenVINO's default, both against
dynshape's fp32 build.

    python bench/bf16_bench.py [--models bert_small,mlp] [--threads 1,2] [--budget 2]

Models: the bench's BERT and MLP (../shared/bench/export_models.py writes them).
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

import numpy as np

from benchutil import SHARED, common, cpu_model, limit_threads, rel_rms_error, steady, time_interleaved
from ort_util import ort_session

SHAPES = {"bert_small": [(1, 16), (1, 128), (8, 128), (1, 512)], "mlp": [(1,), (7,), (64,), (256,)]}


def candidates(path: str, threads: int) -> tuple[dict[str, Any], list[str]]:
    import openvino as ov

    import dynshape as ds

    calls: dict[str, Any] = {}
    g = ds.load_onnx(path)
    names = [v.name for v in g.outputs]
    for prec in ("fp32", "bf16"):
        exe = ds.compile(ds.load_onnx(path), precision=prec)
        call = (lambda e: lambda feed: (lambda out: [out[n] for n in names])(e.run(feed)))(exe)  # one run
        call.exe = exe  # type: ignore[attr-defined]
        calls[f"ds_{prec}"] = call
    core = ov.Core()
    for label, cfg in (("ov_default", {}), ("ov_f32", {"INFERENCE_PRECISION_HINT": "f32"})):
        compiled = core.compile_model(core.read_model(path), "CPU",
                                      {**cfg, "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"})
        if label == "ov_default":
            hint = compiled.get_property("INFERENCE_PRECISION_HINT")
            print(f"  OpenVINO default INFERENCE_PRECISION_HINT: {hint}")
        req, outs = compiled.create_infer_request(), list(compiled.outputs)
        calls[label] = (lambda r, o: lambda feed: (lambda res: [res[x] for x in o])(r.infer(feed)))(req, outs)
    sess = ort_session(path, threads)
    calls["ort"] = lambda feed: sess.run(names, feed)
    return calls, names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bert_small,mlp")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per shape")
    args = ap.parse_args()
    print(f"CPU: {cpu_model()}; shared bench: {SHARED}")
    for threads in (int(t) for t in args.threads.split(",")):
        limit_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        for name in args.models.split(","):
            path = common.onnx_path(name)
            calls, _ = candidates(path, threads)
            ratios = []
            print(f"\n{name}, {threads} thread(s): ms per call (median), bf16 error = max|x - fp32| / rms(fp32)")
            print(f"  {'shape':>10} " + " ".join(f"{k:>10}" for k in calls) +
                  f" {'ov/ds_bf16':>10} {'err ds':>9} {'err ov':>9}")
            for i, shape in enumerate(SHAPES[name]):
                feed = common.make_inputs(name, shape, i)
                ref = calls["ds_fp32"](feed)
                err_ds = max(rel_rms_error(a, b) for a, b in zip(calls["ds_bf16"](feed), ref))
                err_ov = max(rel_rms_error(a, b) for a, b in zip(calls["ov_default"](feed), ref))
                steady(calls, feed)
                limit_threads(threads)
                # warm calls open each block: every runtime timed in its steady state (OpenVINO's threads, parked
                # by the settle pause between blocks, otherwise made its first calls of a block up to 2x slower)
                t = time_interleaved(calls, feed, args.budget, warm_calls=2)
                ratio = t["ov_default"] / t["ds_bf16"]
                ratios.append(ratio)
                print(f"  {str(shape):>10} " + " ".join(f"{t[k] * 1e3:10.3f}" for k in calls) +
                      f" {ratio:10.2f} {err_ds:9.2e} {err_ov:9.2e}")
            print(f"  geomean OpenVINO default / dynshape bf16: {math.exp(np.mean(np.log(ratios))):.2f}")


if __name__ == "__main__":
    main()
