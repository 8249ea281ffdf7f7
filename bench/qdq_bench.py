"""Statically quantized BERT (QDQ) and ds.quantize_dynamic: dynshape against onnxruntime, with the accuracy.

The QDQ file is what onnxruntime's own tool writes: `quantize_static(bert_small, QuantFormat.QDQ)`, int8 weights
(per tensor unless --per-channel), activations as --activation (QInt8 by default, the tool's default), calibrated on
random token ids from a seeded reader (8 batches of 1 x 32); cached beside the float model, never committed.
Candidates, each on its own file as shipped, nothing declared (`ds.load_onnx(path)` then `ds.compile`):
- ds_qdq: dynshape, `precision="int8"`, on the QDQ file;  ort_qdq: onnxruntime's default session on the same file;
- ds_qdyn: `ds.quantize_dynamic` of the float model (per-column int8 weights, per-token activations);
- ds_fp32: dynshape on the float model (the reference of the accuracy columns).
Interleaved rounds, medians (benchutil.time_interleaved) after `steady` (dynshape's hot-shape builds finished).
Accuracy: max |out - fp32| / rms(fp32) of last_hidden_state, against dynshape's fp32 build (for ort_qdq: against
onnxruntime's fp32 session, its own reference).

    python bench/qdq_bench.py [--threads 1] [--budget 2] [--shapes 1x16,1x128,8x128] [--per-channel]
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import numpy as np

from benchutil import SHARED, common, cpu_model, limit_threads, rel_rms_error, steady, time_interleaved
from ort_util import ort_session


def qdq_file(src: str, activation: str, per_channel: bool) -> str:
    """onnxruntime's static QDQ quantization of `src`, calibrated on seeded random token ids, written once."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    out = Path(src).with_name(f"{Path(src).stem}_qdq_{activation.lower()}{'_pc' if per_channel else ''}.onnx")
    if out.exists():
        return str(out)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.batches = iter([{"input_ids": rng.integers(0, 1000, (1, 32)).astype(np.int64),
                                  "attention_mask": np.ones((1, 32), np.int64)} for _ in range(8)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(src, str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    activation_type=getattr(QuantType, activation), weight_type=QuantType.QInt8)
    return str(out)


def _ds_call(exe, names):
    def call(feed):
        out = exe.run(feed)
        return [out[n] for n in names]
    call.exe = exe  # type: ignore[attr-defined]
    return call


def candidates(src: str, qdq: str, threads: int) -> dict:
    import dynshape as ds

    names = [v.name for v in ds.load_onnx(src).outputs]
    calls = {"ds_qdq": _ds_call(ds.compile(ds.load_onnx(qdq), precision="int8"), names)}
    for tag, path in (("qdq", qdq), ("fp32", src)):
        sess = ort_session(path, threads)
        calls[f"ort_{tag}"] = (lambda s: lambda feed: s.run(names, feed))(sess)
    calls["ds_qdyn"] = _ds_call(ds.compile(ds.quantize_dynamic(ds.load_onnx(src))), names)
    calls["ds_fp32"] = _ds_call(ds.compile(ds.load_onnx(src)), names)
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bert_small")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per shape")
    ap.add_argument("--shapes", default="1x16,1x128,8x128")
    ap.add_argument("--activation", default="QInt8", choices=("QInt8", "QUInt8"))
    ap.add_argument("--per-channel", action="store_true")
    args = ap.parse_args()
    print(f"CPU: {cpu_model()}; shared bench: {SHARED}; load: {os.getloadavg()[0]:.2f}")
    src = common.onnx_path(args.model)
    qdq = qdq_file(src, args.activation, args.per_channel)
    print(f"QDQ file: {qdq}")
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    for threads in (int(t) for t in args.threads.split(",")):
        limit_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        calls = candidates(src, qdq, threads)
        ratios = []
        print(f"\n{args.model}, {threads} thread(s): ms per call (median); err = max|out - fp32| / rms(fp32)")
        print(f"  {'shape':>10} " + " ".join(f"{k:>9}" for k in calls) +
              f" {'ort/ds qdq':>11} {'err ds_qdq':>10} {'err ort_qdq':>11} {'err ds_qdyn':>11}")
        for i, shape in enumerate(shapes):
            feed = common.make_inputs(args.model, shape, i)
            ref_ds, ref_ort = calls["ds_fp32"](feed)[0], calls["ort_fp32"](feed)[0]
            errs = (rel_rms_error(calls["ds_qdq"](feed)[0], ref_ds), rel_rms_error(calls["ort_qdq"](feed)[0], ref_ort),
                    rel_rms_error(calls["ds_qdyn"](feed)[0], ref_ds))
            steady(calls, feed)
            limit_threads(threads)
            t = time_interleaved(calls, feed, args.budget)
            r = t["ort_qdq"] / t["ds_qdq"]
            ratios.append(r)
            print(f"  {str(shape):>10} " + " ".join(f"{t[k] * 1e3:9.3f}" for k in calls) +
                  f" {r:11.2f} {errs[0]:10.4f} {errs[1]:11.4f} {errs[2]:11.4f}")
        print(f"  geomean onnxruntime / dynshape on the QDQ file: {math.exp(np.mean(np.log(ratios))):.2f}")


if __name__ == "__main__":
    main()
