"""The corpus benchmark (issue 29, item 8): dynshape's default path on models nobody here tuned for.

    python bench/zoo_models.py                          # build the corpus first (bench/zoo_models.py)
    python bench/zoo_bench.py --threads 1 --quick       # every model and probe; --threads 2
    python bench/zoo_bench.py --models bert,yolov8_nn --json out.json

Per model, in one process: dynshape as a new user calls it, `ds.load_onnx(path)` with nothing declared and
`ds.compile(graph)` (the default options); onnxruntime (ORT_ENABLE_ALL, intra_op_num_threads = --threads, inter
1, sequential); OpenVINO CPU fp32 (INFERENCE_PRECISION_HINT f32, INFERENCE_NUM_THREADS = --threads,
PERFORMANCE_HINT LATENCY; the file's own dynamic dims, nothing reshaped). Per probe: every output checked against
onnxruntime first (max |diff| / max |onnxruntime|, the error relative to the output's magnitude;
integer outputs exactly), then the three timed in interleaved rounds in balanced orders with settle pauses,
medians (benchutil.time_interleaved). Prints the CPU, ms per runtime, ort/dyn and ov/dyn (> 1: dynshape
faster), and the nodes dynshape runs outside compiled kernels on every call (the generic build's `uncompiled`
entries whose `how` is neither "native" nor "compiled body" (a Loop / Scan body or an If's branches compiled,
called per call) and that `explain` says run every call, by op: not views, not steps run once per shape; for
an executable without `.generic`, one build per rank-fixing length or per branch value, the build that served
the probe; and, where it differs, the same count in the hot variant the timing ran); then geometric means. A
model that fails in one runtime prints the error and goes on with the others. Timings on the shared 2-core
machine are noisy: compare ratios from one run.

First figures (dynshape at 1a90b08, AMD EPYC Zen 4, family 25 model 17, --quick): 1 thread, ort/dyn geomean 1.02
over 103 rows (1.23 without the three silero files that branch on `sr`; light_*: 1.51), ov/dyn 1.46 over 94;
dynshape slower than onnxruntime on 25 rows (silero_vad* with If 0.06-0.42, mobilevit_hf 0.17-0.50, gpt2_step at
past 512 / 2048 0.78 / 0.29, yolov8_nn 0.60-0.93, w2v_frontend_nn 0.70-0.87, t5_encoder 1x16 0.81, wav2vec2,
effnet); ddddocr_common and ddddocr_old_int8 do not load. 2 threads, machine load 1.2-2.8: ort/dyn 0.64 (another
run: 0.40), dynshape's times swinging 10x between runs (bert 1x16: 44 ms, 5 ms; onnxruntime 0.3-0.8 ms): not a
figure until measured on a quiet machine.

At 894523d (non-empty builds, folding, If per value and per shape, native Instance/GroupNormalization, I/O in
place, decode-time attention), same CPU, --quick, load 0.9: 1 thread, ort/dyn geomean 1.30 over 103 rows (min
0.15, mobilevit_hf), ov/dyn 1.50 over 94; 18 rows slower than onnxruntime (mobilevit_hf, gpt2_step at past
512 / 2048 0.75 / 0.29, yolov8_nn 0.60-0.89, t5_encoder 0.72-0.96, effnet 0.80-0.88, light_shufflenet 0.92 and
five rows at 0.95-0.98); the silero files 1.40-3.20.

At 39271f7 (dynshape's hot-shape variant now built before the rounds: the default strategy's steady state), same
CPU, --quick, load 0.2-0.9: 1 thread, ort/dyn 1.32 over 103 rows (min 0.17, mobilevit_hf), ov/dyn 1.39 over 94; 19
rows slower than onnxruntime (mobilevit_hf 0.17-0.54, yolov8_nn 0.74-1.00, t5_encoder 0.81-0.96, effnet 0.76-0.96,
gpt2_step at past 2048 0.83, gpt2 / roberta / light_shufflenet 0.96-0.99). With --precision bf16 (OpenVINO at its
default, bf16): ov/dyn 1.35 over 94 rows, ort/dyn 1.80 over 103.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchutil import cpu_model, limit_threads, steady, time_interleaved
from zoo_models import BY_NAME, CORPUS, ZooModel, ort_session, zoo_dir

Feed = dict[str, np.ndarray]
TOL = 1e-3  # max |diff| / max(max |reference|, 1) above which a row's outputs are marked wrong
TOL_LOW = 5e-2  # the same under --precision bf16 (products rounded to bf16: ~1e-2 is expected)


def short_error(e: BaseException) -> str:
    """The type and the first line that says something (OpenVINO's first line is only where it was raised)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("Exception from", "Check '"))] or lines
    return f"{type(e).__name__}: {lines[0][:240] if lines else ''}"


# ---- the runtimes ------------------------------------------------------------------------------------------
def make_dynshape(path: str, precision: str = "fp32", strategy: str | None = None
                  ) -> tuple[Callable[[Feed], list[np.ndarray]], Any, dict[str, float]]:
    import dynshape as ds

    t = time.perf_counter()
    try:
        g = ds.load_onnx(path)
    except Exception as e:  # noqa: BLE001 - the stage is part of the message
        raise RuntimeError(f"load_onnx: {short_error(e)}") from e
    t_load = time.perf_counter() - t
    try:
        exe = ds.compile(g, precision=precision, **({"strategy": strategy} if strategy else {}))
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"compile: {short_error(e)}") from e
    names = [v.name for v in g.outputs]

    def call(feed: Feed) -> list[np.ndarray]:
        out = exe.run(feed)
        return [out[n] for n in names] if isinstance(out, dict) else list(out)

    call.exe = exe  # type: ignore[attr-defined]
    return call, exe, {"load_s": t_load, "compile_s": time.perf_counter() - t - t_load}


def make_ort(path: str, threads: int) -> Callable[[Feed], list[np.ndarray]]:
    sess = ort_session(path, threads)
    return lambda feed: sess.run(None, feed)


def ov_config(threads: int, precision: str = "fp32") -> dict[str, Any]:
    """fp32 runs pin OpenVINO to f32; low-precision runs leave its default (bf16 on AVX512-BF16 / AMX CPUs)."""
    hint = {"INFERENCE_PRECISION_HINT": "f32"} if precision == "fp32" else {}
    return {**hint, "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}


def make_ov(path: str, threads: int, precision: str = "fp32") -> Callable[[Feed], list[np.ndarray]]:
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", ov_config(threads, precision))
    req = compiled.create_infer_request()
    outs = list(compiled.outputs)

    def call(feed: Feed) -> list[np.ndarray]:
        res = req.infer(feed)
        return [res[o] for o in outs]

    return call


# ---- what runs outside kernels -----------------------------------------------------------------------------
def _serving_executable(exe: Any, feed: Feed) -> Any:
    """The executable with a `.generic` build that serves `feed`: exe itself, or for RankVariants /
    BranchVariants the build for this feed's rank-fixing lengths or branch values (the first build when it
    cannot tell)."""
    seen = 0
    while not hasattr(exe, "generic") and seen < 4:
        seen += 1
        if hasattr(exe, "executable_for"):
            try:
                exe = exe.executable_for(feed)[0]
                continue
            except Exception:  # noqa: BLE001 - fall back to the first build
                pass
        variants = getattr(exe, "variants", None)
        if not variants:
            return None
        exe = next(iter(variants.values()))
    return exe if hasattr(exe, "generic") else None


def outside_kernels(exe: Any, feed: Feed, hot: bool = False) -> dict[str, int] | None:
    """Nodes run outside compiled kernels on every call, by op (None: the executable does not say), in the generic
    build, or (`hot`) in the build serving this feed's shape (its hot variant, once made: what the timing measures).
    Nodes that run once per shape (they read only constants and the shape) or never (views of their input's
    buffer) cost nothing per call and are not counted: `explain_build` says which is which."""
    e = _serving_executable(exe, feed)
    if e is None or not hasattr(e, "explain_build"):
        return None
    key = None
    if hot:
        try:
            key = tuple(e.binder(feed)[1])
        except Exception:  # noqa: BLE001 - a branch's build binds fewer inputs (the branch value is its key)
            return None
    unc = e.explain_build(key)["uncompiled"]
    return dict(collections.Counter(u["op"] for u in unc if u["runs"] not in ("native", "compiled body")
                                    and u["when"] == "every call").most_common())


def fmt_ops(ops: dict[str, int] | None) -> str:
    if ops is None:
        return "n/a"
    if not ops:
        return "0"
    return f"{sum(ops.values())}: " + " ".join(f"{k} {v}" for k, v in ops.items())


def fmt_outside(row: dict) -> str:
    """The generic build's count, and the hot variant's (the build the timing ran) where it differs: DPT's
    generic build runs 115 nodes on numpy, its variants none."""
    out = fmt_ops(row.get("outside"))
    if row.get("outside_hot") is not None and row["outside_hot"] != row.get("outside"):
        out += f" (hot variant: {fmt_ops(row['outside_hot'])})"
    return out


# ---- correctness ------------------------------------------------------------------------------------------
def rel_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """max over outputs of max |got - want| / max |want| (1 where want is all zeros), as tests/tolerance.py scales
    its atol; inf on a shape, count or non-finite-pattern mismatch."""
    if len(got) != len(want):
        return float("inf")
    worst = 0.0
    for a, b in zip(got, want):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return float("inf")
        if not b.size:
            continue
        if b.dtype.kind in "iub":
            worst = max(worst, 0.0 if np.array_equal(a, b) else float("inf"))
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        fin = np.isfinite(b64)
        if not np.array_equal(fin, np.isfinite(a64)):
            return float("inf")
        if fin.any():
            mag = float(np.abs(b64[fin]).max()) or 1.0
            worst = max(worst, float(np.abs(a64[fin] - b64[fin]).max()) / mag)
    return worst


def reference_errors(m: ZooModel, feed: Feed, outs: dict[str, list[np.ndarray]]) -> dict[str, float]:
    """Each runtime's rel_error against dynshape's numpy reference interpreter (`Graph.run`: every op in float32 as
    numpy computes it, no kernels): where dynshape and onnxruntime part, which one the reference sides with."""
    import dynshape as ds

    g = ds.load_onnx(m.path())
    ref = g.run(feed)
    want = [ref[v.name] for v in g.outputs]
    return {k: rel_error(o, want) for k, o in outs.items()}


# ---- one model ------------------------------------------------------------------------------------------
def bench_model(m: ZooModel, args: argparse.Namespace, peers: list[str]) -> dict[str, Any]:
    rec: dict[str, Any] = {"model": m.name, "source": m.source, "exporter": m.exporter, "rows": [], "errors": {},
                           "tol": m.tol,
                           "setup_s": {}}
    path = m.path()
    if not os.path.exists(path):
        rec["errors"]["model"] = f"{path} missing: python bench/zoo_models.py --only {m.name}"
        print(f"{m.name}: {rec['errors']['model']}", flush=True)
        return rec
    calls: dict[str, Callable[[Feed], list[np.ndarray]]] = {}
    exe = None
    for k in ["dynshape", *peers]:
        t = time.perf_counter()
        try:
            if k == "dynshape":
                calls[k], exe, rec["dynshape_times"] = make_dynshape(path, args.precision, args.strategy)
            elif k == "ort":
                calls[k] = make_ort(path, args.threads)
            else:
                calls[k] = make_ov(path, args.threads, args.precision)
            rec["setup_s"][k] = time.perf_counter() - t
        except Exception as e:  # noqa: BLE001 - a model one runtime cannot load is a row, not a crash
            rec["errors"][k] = str(e) if k == "dynshape" and isinstance(e, RuntimeError) else short_error(e)
            print(f"{m.name}: {k} FAILED {rec['errors'][k]}", flush=True)
    for i in range(len(m.probes)):
        rec["rows"].append(bench_probe(m, i, calls, exe, args))
    return rec


def bench_probe(m: ZooModel, i: int, calls: dict, exe: Any, args: argparse.Namespace) -> dict[str, Any]:
    feed = m.make_feed(i, seed=1)
    row: dict[str, Any] = {"probe": m.probe_label(i), "ms": {}, "errors": {}, "err": {}}
    outs: dict[str, list[np.ndarray]] = {}
    ok: dict[str, Callable] = {}
    for k, f in calls.items():
        try:
            outs[k] = [np.array(o) for o in f(feed)]  # a copy: OpenVINO's outputs alias its request's buffers
            ok[k] = f
        except Exception as e:  # noqa: BLE001 - e.g. a shape one runtime refuses
            row["errors"][k] = short_error(e)
    limit_threads(args.threads)  # the first calls loaded dynshape's OpenMP / BLAS: limit them now
    if "ort" in outs:
        for k in ("dynshape", "ov"):
            if k in outs:
                row["err"][k] = rel_error(outs[k], outs["ort"])
    if exe is not None and "dynshape" in ok:
        row["outside"] = outside_kernels(exe, feed)
    if ok:
        if exe is not None and "dynshape" in ok:  # the default strategy's steady state: this shape's hot variant
            steady({"dynshape": ok["dynshape"]}, feed, 25)  # built in the background before the rounds
            limit_threads(args.threads)
            row["outside_hot"] = outside_kernels(exe, feed, hot=True)
        t = time_interleaved(ok, feed, args.budget, rounds=args.rounds)
        row["ms"] = {k: 1e3 * v for k, v in t.items()}
    d = row["ms"].get("dynshape")
    ratios = "".join(f", {k}/dyn {row['ms'][k] / d:.2f}" for k in ("ort", "ov") if d and k in row["ms"])
    tol = max(TOL if args.precision == "fp32" else TOL_LOW, m.tol)
    errs = "".join(f"; {k} err {v:.1e}{'' if v <= tol else ' WRONG'}" for k, v in row["err"].items())
    if "ort" in outs and any(v > tol for v in row["err"].values()):
        # who is off: each runtime against dynshape's numpy reference interpreter (independent of all three)
        row["ref_err"] = reference_errors(m, feed, outs)
        errs += "; against the numpy reference: " + ", ".join(f"{k} {v:.1e}" for k, v in row["ref_err"].items())
    print(f"  {m.name} {row['probe']}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in row["ms"].items()) + ratios +
          errs + (f"; outside kernels {fmt_outside(row)}" if "outside" in row else "") +
          "".join(f"; {k} FAILED: {e}" for k, e in row["errors"].items()), flush=True)
    return row


# ---- the table ------------------------------------------------------------------------------------------
def _cell(row: dict, rec: dict, k: str) -> str:
    if k in row["ms"]:
        return f"{row['ms'][k]:.3f}"
    e = row["errors"].get(k) or rec["errors"].get(k)
    return f"error: {e[:80]}" if e else "-"


def print_table(recs: list[dict], peers: list[str], args: argparse.Namespace) -> dict[str, Any]:
    print(f"\n## zoo, {args.threads} thread(s): ms per call, median of interleaved rounds; ratios > 1: dynshape "
          f"faster; err: max |diff| / max |ort|\n")
    cols = ["dynshape", *peers]
    print("| model | probe | " + " | ".join(f"{k} ms" for k in cols) + " | " +
          " | ".join(f"{k}/dyn" for k in peers) + " | dyn err | ov err | outside kernels per call |")
    print("|" + "---|" * (2 + len(cols) + len(peers) + 3))
    ratios: dict[str, list[float]] = {k: [] for k in peers}
    slower, wrong = [], []
    tol = TOL if args.precision == "fp32" else TOL_LOW
    for rec in recs:
        if "model" in rec["errors"]:
            print(f"| {rec['model']} | - | error: {rec['errors']['model']} |")
            continue
        for row in rec["rows"]:
            rs = []
            d = row["ms"].get("dynshape")
            for k in peers:
                if d and k in row["ms"]:
                    r = row["ms"][k] / d
                    ratios[k].append(r)
                    rs.append(f"{r:.2f}")
                    if k == "ort" and r < 1:
                        slower.append((rec["model"], row["probe"], r, fmt_outside(row)))
                else:
                    rs.append("-")
            es = []
            for k in ("dynshape", "ov"):
                v = row["err"].get(k)
                rtol = max(tol, rec.get("tol", 0.0))
                es.append("-" if v is None else f"{v:.1e}" + ("" if v <= rtol else " **WRONG**"))
                if v is not None and v > rtol:
                    ref = row.get("ref_err", {})
                    against = f"; numpy reference: {k} {ref[k]:.1e}, ort {ref['ort']:.1e}" if k in ref else ""
                    wrong.append(f"{rec['model']} {row['probe']} {k} ({v:.1e}{against})")
            print(f"| {rec['model']} | {row['probe']} | " + " | ".join(_cell(row, rec, k) for k in cols) + " | " +
                  " | ".join(rs) + " | " + " | ".join(es) + f" | {fmt_outside(row)} |")
    gm = statistics.geometric_mean
    summary = {k: {"geomean": gm(v), "min": min(v), "rows": len(v)} for k, v in ratios.items() if v}
    print("\ngeometric means: " + "; ".join(f"{k}/dyn {s['geomean']:.2f} over {s['rows']} rows (min {s['min']:.2f})"
                                             for k, s in summary.items()))
    n_rows = sum(len(r["rows"]) for r in recs)
    print(f"dynshape timed on {len(ratios.get('ort', []))} of {n_rows} model-probe rows")
    if slower:
        print(f"\ndynshape slower than onnxruntime ({len(slower)} rows): ort/dyn, outside-kernel nodes per call")
        for model, probe, r, o in slower:
            print(f"  {model} {probe}: {r:.2f}; {o}")
    fails = [(rec["model"], k, e) for rec in recs for k, e in rec["errors"].items() if k in ("dynshape", "model")]
    fails += [(rec["model"] + " " + row["probe"], "dynshape run", row["errors"]["dynshape"])
              for rec in recs for row in rec["rows"] if "dynshape" in row["errors"]]
    if fails:
        print(f"\ndynshape failures ({len(fails)}):")
        for model, k, e in fails:
            print(f"  {model}: {k}: {e}")
    peer_fails = [(rec["model"], k, e) for rec in recs for k, e in rec["errors"].items() if k in peers]
    if peer_fails:
        print("\npeer failures:")
        for model, k, e in peer_fails:
            print(f"  {model}: {k}: {e}")
    if wrong:
        print(f"\n!!! OUTPUTS DIFFER FROM ONNXRUNTIME beyond {tol:g} of their magnitude: {', '.join(wrong)} !!!")
    return summary


def dynshape_version() -> str:
    import dynshape

    src = os.path.dirname(dynshape.__file__)
    try:
        rev = subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", src, "status", "--porcelain", "--", "."], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return f"{src} at {rev or '?'}{' + uncommitted changes' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        return src


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="", help="comma-separated names (default: the whole corpus)")
    ap.add_argument("--peers", default="ort,ov")
    ap.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    ap.add_argument("--budget", type=float, default=None, help="seconds of timing per probe (default 2, quick 0.5)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 16, quick 8)")
    ap.add_argument("--json", default="", help="write every row here")
    ap.add_argument("--strategy", default="", help="ds.compile's strategy (default: its default, hot-shape variants "
                                                   "made in the background; generic: the one build every new shape "
                                                   "meets first, timed alone)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="dynshape's precision; bf16 runs OpenVINO at its default precision (bf16 where the CPU has "
                         "it) instead of f32, and marks outputs wrong from 5e-2")
    args = ap.parse_args()
    args.budget = args.budget or (0.5 if args.quick else 2.0)
    args.rounds = args.rounds or (8 if args.quick else 16)
    limit_threads(args.threads)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        sys.exit(f"unknown models: {unknown}; python bench/zoo_models.py --list")
    models = [BY_NAME[n] for n in names] if names else CORPUS
    peers = [p for p in args.peers.split(",") if p]
    if "ov" in peers:
        try:
            import openvino  # noqa: F401
        except ImportError:
            print("OpenVINO not installed (pip install openvino): its column is skipped")
            peers.remove("ov")
    import onnxruntime

    versions = f"onnxruntime {onnxruntime.__version__}"
    if "ov" in peers:
        import openvino

        versions += f", OpenVINO {openvino.__version__}"
    print(f"CPU: {cpu_model()}; precision {args.precision}; strategy {args.strategy or 'default'}; threads "
          f"{args.threads}; dynshape {dynshape_version()}; "
          f"{versions}; corpus "
          f"{zoo_dir()}; budget {args.budget} s x {args.rounds} rounds per probe; load average "
          f"{os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)", flush=True)
    recs = []
    for m in models:
        recs.append(bench_model(m, args, peers))
    summary = print_table(recs, peers, args)
    # other processes on the machine move every figure (at 2 threads on a shared 2-core machine, by 10x): say so
    print(f"load average at the end {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "threads": args.threads, "dynshape": dynshape_version(),
                       "summary": summary, "models": recs}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
