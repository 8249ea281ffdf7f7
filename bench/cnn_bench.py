"""Issue 12's CNN / RNN models: dynshape beside onnxruntime and OpenVINO, same process, same inputs.

    python bench/cnn_bench.py [--threads 1|2] [--models text_det,vad,...] [--quick] [--peers ort,ov]
                              [--ov-static] [--eta] [--strategy generic] [--precision fp32|bf16] [--json out.json]
    python bench/cnn_bench.py --memory [--models text_det] [--calls 1000] [--warmup 100] [--mem-frac 0.25]

Needs `python bench/export_cnn_models.py` first (models in $DYNSHAPE_BENCH_MODELS or
~/.cache/dynshape-bench/models). Per model and probe shape, interleaved rounds in balanced orders with settle
pauses, medians (benchutil.time_interleaved):
- dynshape: `ds.load_onnx(path, dims=<the model's declared dims>)`, `ds.compile(graph, strategy=...)` (default
  "generic": the one build that serves every shape, no background variants mid-measurement), `exe.run(feed)`;
- onnxruntime: ORT_ENABLE_ALL, intra_op_num_threads = --threads, inter 1, sequential;
- --precision bf16: dynshape's builds take precision="bf16" and OpenVINO its default precision (bf16 on AVX512-BF16
  and AMX CPUs, what the issue compares with); outputs are then checked against onnxruntime's float32 ones to 5e-2
  of their largest magnitude (bf16 operands: ~1e-2 is expected), not rtol 1e-3;
- OpenVINO (optional, skipped when not installed): CPU plugin, INFERENCE_PRECISION_HINT f32, PERFORMANCE_HINT
  LATENCY, INFERENCE_NUM_THREADS = --threads, compiled once for dynamic shapes (every symbol reshaped to its
  declared range), so it too is one build serving all shapes; --ov-static adds a column of OpenVINO compiled for
  each probe's exact shape (not the target: a per-shape build).
Prints the time table (ratios > 1: dynshape faster), geometric means, compile times per model (cold: a fresh
DYNSHAPE_CACHE_DIR; warm: the same build cache, median of three; each in a fresh process, so nothing loaded
earlier counts; timed from after `import dynshape` and the modules load_onnx and compile import, whose time,
the same for every model, is its own column), and dynshape's outputs against onnxruntime's at every probe (rtol
1e-3, atol 1e-4). A model dynshape cannot load or run is a row with its error; the peers are still timed (they
are the targets).

--memory: dynshape's resident memory (VmRSS) over --calls calls at random admissible shapes after --warmup calls
and then as many as fill the plan cache (bounded: 256 plans an arena, reported on a line of its own), growth
in %. Shapes are drawn uniformly from the declared ranges, each symbol's range cut to its lowest --mem-frac
part (1.0: the whole range; text_det's full range reaches 8x3x1536x1536, minutes a call today); inputs are
views of one buffer of the largest shape, so only dynshape's own state can grow; each model runs in its own
process (a model measured after another would reuse the heap that one freed).
Timings on a shared 2-core machine are noisy: compare ratios from one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchutil import limit_threads, rss_bytes, time_interleaved
from cnn_models import Spec
from export_cnn_models import ALL_SPECS, ATOL, RTOL, onnx_path, ort_session

Feed = dict[str, np.ndarray]
Call = Callable[[Feed], list[np.ndarray]]
BF16_TOL = 5e-2  # --precision bf16: max |diff| against onnxruntime's float32 over the output's largest magnitude

_COMPILE_SNIPPET = """
import json, sys, time
t = time.perf_counter()
import dynshape as ds
import dynshape.frontends.onnx, dynshape.runtime.executable  # what load_onnx and compile import on first use
t_import = time.perf_counter() - t
path, dims, strategy, precision = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
dims = {k: tuple(v) if isinstance(v, list) else v for k, v in dims.items()}
try:
    t = time.perf_counter()
    g = ds.load_onnx(path, dims=dims)
    t_load = time.perf_counter() - t
    exe = ds.compile(g, strategy=strategy, precision=precision)
    print(json.dumps({"import_s": t_import, "load_s": t_load, "compile_s": time.perf_counter() - t}))
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}))
"""


def short_error(e: BaseException) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {msg[:200]}"


def compile_in_fresh_process(path: str, spec: Spec, cache: str, strategy: str, precision: str = "fp32"
                             ) -> dict[str, Any]:
    """load_onnx + compile timed inside a new Python process whose DYNSHAPE_CACHE_DIR is `cache`.

    Bytecode caching stays on in it (PYTHONDONTWRITEBYTECODE dropped) as in any installed package: with it set,
    as these sandboxes do, every dynshape module changed since its last .pyc compiled from source on each import,
    0.05 s of a warm compile that no user pays."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["DYNSHAPE_CACHE_DIR"] = cache
    r = subprocess.run([sys.executable, "-c", _COMPILE_SNIPPET, path, json.dumps(spec.dims), strategy, precision],
                       capture_output=True, text=True, env=env, timeout=1800)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": f"compile process failed (rc {r.returncode}): {r.stderr.strip().splitlines()[-1:]}"}
    return json.loads(lines[-1])


WARM_RUNS = 3


def warm_compiles(path: str, spec: Spec, cache: str, strategy: str, precision: str = "fp32") -> dict[str, Any]:
    """WARM_RUNS fresh processes on the build cache the cold one filled: the median, and the slowest. Why not one:
    in this sandbox the first process after the cold one runs its first touch of fresh pages (VGG-19's 170 MB of
    Winograd weights) up to 2x slower than the next (VGG-19: 0.58 s, then 0.44 and 0.45 s)."""
    runs = [compile_in_fresh_process(path, spec, cache, strategy, precision) for _ in range(WARM_RUNS)]
    bad = [r for r in runs if "compile_s" not in r]
    if bad:
        return bad[0]
    runs.sort(key=lambda r: r["compile_s"])
    return {**runs[len(runs) // 2], "max_s": runs[-1]["compile_s"]}


# ---- the candidates -------------------------------------------------------------------------------------
def make_dynshape(path: str, spec: Spec, strategy: str, env: dict[str, int] | None = None,
                  graph: Any = None, undeclared: bool = False, precision: str = "fp32") -> Call:
    """The generic build over the declared dims, or (`env`) a static build with every dim fixed at a probe.

    `graph`: the static build is made from this loaded graph (`graph.specialize(env)`, initializers shared), as
    the executable's own static variants are, so both builds stream the same packed weights. Why it matters
    on this VM: the same packed FC weights stream at 13-21 GB/s on one core depending on where they land
    (three identical AlexNet builds, interleaved: 26.0 / 23.7 / 22.9 ms, all of it in the FC products), which
    swamped the difference eta is after (the generated code's)."""
    import dynshape as ds

    if graph is not None and env:
        exe = ds.compile(graph.specialize(env), strategy=strategy, precision=precision)
    else:
        graph = ds.load_onnx(path) if undeclared else ds.load_onnx(path, dims={**spec.dims, **(env or {})})
        exe = ds.compile(graph, strategy=strategy, precision=precision)
    names = list(spec.outputs)

    def call(feed: Feed) -> list[np.ndarray]:
        out = exe.run(feed)
        return [out[n] for n in names] if isinstance(out, dict) else list(out)

    call.exe = exe  # type: ignore[attr-defined]
    call.graph = graph  # type: ignore[attr-defined]
    return call


def make_ort(path: str, spec: Spec, threads: int) -> Call:
    sess = ort_session(path, threads)  # ORT_ENABLE_ALL, intra = threads, inter 1, sequential
    names = list(spec.outputs)
    return lambda feed: sess.run(names, feed)


def installed_peers(spec: str) -> list[str]:
    """The comma-separated peers, OpenVINO dropped (with a line saying so) when it is not installed."""
    peers = [p for p in spec.split(",") if p]
    if "ov" in peers:
        try:
            import openvino  # noqa: F401
        except ImportError:
            print("OpenVINO not installed: its column is skipped (pip install openvino)")
            peers.remove("ov")
    return peers


def ov_config(threads: int, precision: str = "fp32") -> dict[str, Any]:
    """fp32 pins OpenVINO to f32; bf16 leaves its default (bf16 on AVX512-BF16 / AMX CPUs)."""
    hint = {"INFERENCE_PRECISION_HINT": "f32"} if precision == "fp32" else {}
    return {**hint, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}


def make_ov(path: str, spec: Spec, threads: int, env: dict[str, int] | None = None, precision: str = "fp32"
            ) -> Call:
    """OpenVINO CPU; dynamic over the declared ranges, or static at `env`'s exact shape."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(path)
    shapes = {}
    for i in spec.inputs:
        dims = []
        for d in i.shape:
            if isinstance(d, int):
                dims.append(ov.Dimension(d))
            elif env is not None:
                dims.append(ov.Dimension(env[d]))
            else:
                lo, hi, _ = spec.sym_range(d)
                dims.append(ov.Dimension(lo, hi))
        shapes[i.name] = ov.PartialShape(dims)
    model.reshape(shapes)
    compiled = core.compile_model(model, "CPU", ov_config(threads, precision))
    req = compiled.create_infer_request()
    outs = [compiled.output(n) for n in spec.outputs]

    def call(feed: Feed) -> list[np.ndarray]:
        res = req.infer(feed)
        return [res[o] for o in outs]

    return call


# ---- one model ------------------------------------------------------------------------------------------
def compare(got: list[np.ndarray], want: list[np.ndarray], precision: str = "fp32") -> tuple[float, bool]:
    """(max abs diff, allclose at rtol 1e-3 / atol 1e-4) over all outputs; a shape mismatch fails. Under bf16:
    within BF16_TOL of each output's largest magnitude instead."""
    diff, ok = 0.0, True
    for a, b in zip(got, want):
        a = np.asarray(a)
        if a.shape != b.shape:
            return float("inf"), False
        if a.size:
            diff = max(diff, float(np.max(np.abs(a.astype(np.float64) - b))))
        if precision == "fp32":
            ok = ok and bool(np.allclose(a, b, rtol=RTOL, atol=ATOL))
        elif a.size:
            ok = ok and float(np.max(np.abs(a.astype(np.float64) - b))) <= BF16_TOL * float(np.max(np.abs(b)))
    return diff, ok


def compile_times(spec: Spec, args: argparse.Namespace) -> dict[str, Any]:
    """A model's cold and warm compiles (fresh processes) into a new build cache, kept for its bench_model.
    Every model's run before any is benchmarked: in this sandbox a process's first touch of fresh pages gets
    slower as the others hold more memory (VGG-19's warm compile: 0.44 s alone, 0.66-0.71 s beside a process
    holding 5 GB), and the benchmarking process holds the peers' sessions of every model so far."""
    path = onnx_path(spec.name)
    rec: dict[str, Any] = {"model": spec.name, "rows": [], "errors": {}}
    if not os.path.exists(path):
        rec["errors"]["model"] = f"{path} missing: run python bench/export_cnn_models.py --only {spec.name}"
        return rec
    rec["cache"] = cache = tempfile.mkdtemp(prefix="dynshape-cnnbench-")
    rec["cold"] = compile_in_fresh_process(path, spec, cache, args.strategy, args.precision)
    rec["warm"] = warm_compiles(path, spec, cache, args.strategy, args.precision) if "error" not in rec["cold"] else {}
    return rec


def bench_model(spec: Spec, args: argparse.Namespace, peers: list[str], rec: dict[str, Any]) -> dict[str, Any]:
    """Per probe (after compile_times filled `rec`): correctness against onnxruntime and the interleaved timings."""
    path = onnx_path(spec.name)
    if "model" in rec["errors"]:
        return rec
    cache = rec.pop("cache")
    try:
        os.environ["DYNSHAPE_CACHE_DIR"] = cache  # this process builds from the cache the cold run filled
        calls: dict[str, Call] = {}
        low = args.precision
        makers = {"undeclared": lambda: make_dynshape(path, spec, args.strategy, undeclared=True, precision=low),
                  "dynshape": lambda: make_dynshape(path, spec, args.strategy, precision=low),
                  "ort": lambda: make_ort(path, spec, args.threads),
                  "ov": lambda: make_ov(path, spec, args.threads, precision=low)}
        for k in ["undeclared", "dynshape", *peers]:
            try:
                t = time.perf_counter()
                calls[k] = makers[k]()
                rec.setdefault("setup_s", {})[k] = time.perf_counter() - t
            except Exception as e:  # noqa: BLE001 - a model dynshape cannot load is a row, not a crash
                rec["errors"][k] = short_error(e)
        for env in spec.probes:
            rec["rows"].append(bench_probe(spec, env, calls, args))
        if args.eta and "dynshape" in calls:
            for row, t in against_static(spec, calls["dynshape"],
                                         lambda env: make_dynshape(path, spec, args.strategy, env,
                                                                   graph=calls["dynshape"].graph,
                                                                   precision=args.precision), rec["rows"], args):
                if isinstance(t, str):
                    row["static_error"] = t
                else:
                    row["eta"] = t[1] / t[0]
                    row["generic_ms"], row["static_ms"] = 1e3 * t[0], 1e3 * t[1]
        if args.ov_static and "ov" in peers and "ov" in calls:
            for row, t in against_static(spec, calls["ov"],
                                         lambda env: make_ov(path, spec, args.threads, env, args.precision),
                                         rec["rows"], args):
                if isinstance(t, str):
                    row["ov_static_error"] = t
                else:
                    row["ov_dyn_vs_static_ms"], row["ov_static_ms"] = 1e3 * t[0], 1e3 * t[1]
    finally:
        os.environ.pop("DYNSHAPE_CACHE_DIR", None)
        shutil.rmtree(cache, ignore_errors=True)
    return rec


def against_static(spec: Spec, dynamic: Call, make_static: Callable[[dict[str, int]], Call], rows: list[dict],
                   args: argparse.Namespace) -> list[tuple[dict, tuple[float, float] | str]]:
    """Per probe row: a build at exactly that probe's shape, timed interleaved against the dynamic one, as
    (dynamic s, static s), or the error that build or run raised."""
    out: list[tuple[dict, tuple[float, float] | str]] = []
    for row, env in zip(rows, spec.probes):
        try:
            both = time_interleaved({"dynamic": dynamic, "static": make_static(env)}, spec.make_inputs(env, seed=1),
                                    args.budget, rounds=args.rounds)
            out.append((row, (both["dynamic"], both["static"])))
        except Exception as e:  # noqa: BLE001 - a shape one build refuses is a row's error, not a crash
            out.append((row, short_error(e)))
    return out


def bench_probe(spec: Spec, env: dict[str, int], calls: dict[str, Call], args: argparse.Namespace) -> dict:
    feed = spec.make_inputs(env, seed=1)
    row: dict[str, Any] = {"shape": spec.shape_str(env), "env": env, "ms": {}, "errors": {}}
    ok_calls: dict[str, Call] = {}
    outs: dict[str, list[np.ndarray]] = {}
    for k, f in calls.items():
        try:
            outs[k] = [np.array(o) for o in f(feed)]  # a copy: OpenVINO's outputs alias its request's buffers
            ok_calls[k] = f
        except Exception as e:  # noqa: BLE001 - e.g. a kernel that refuses this shape
            row["errors"][k] = short_error(e)
    limit_threads(args.threads)  # the first call loaded dynshape's BLAS / OpenMP: limit them now
    if "ort" in outs:
        for k in ("undeclared", "dynshape", "ov"):
            if k in outs:
                # (OpenVINO in bf16 too under --precision bf16: its outputs are held to the same bound)
                row[f"{k}_diff"], row[f"{k}_ok"] = compare(outs[k], outs["ort"], args.precision)
    if ok_calls:
        t = time_interleaved(ok_calls, feed, args.budget, rounds=args.rounds, warm_calls=args.warm_calls)
        row["ms"] = {k: 1e3 * v for k, v in t.items()}
    print(f"  {spec.name} {row['shape']}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in row["ms"].items()) +
          ("".join(f"; {k} FAILED: {e}" for k, e in row["errors"].items())), flush=True)
    return row


# ---- tables ---------------------------------------------------------------------------------------------
def _ms(row: dict, k: str, model_err: dict) -> str:
    if k in row["ms"]:
        return f"{row['ms'][k]:.2f}"
    err = row["errors"].get(k) or model_err.get(k)
    return f"error: {err[:90]}" if err else "-"


def print_tables(recs: list[dict], peers: list[str], args: argparse.Namespace) -> None:
    print(f"\n## Time per call, {args.threads} thread(s), {args.precision} (OpenVINO at "
          f"{'f32' if args.precision == 'fp32' else 'its default precision'}), median of interleaved rounds "
          "(ratio > 1: dynshape faster)\n")
    print("undeclared: ds.load_onnx(path), nothing declared (the default path, first); dynshape: dims declared; "
          "peers relative to the undeclared build; decl/undecl >= 1: undeclared as fast\n")
    cols = ["undeclared", "dynshape", *peers]
    static_col = " | ov static ms (ov dynamic, same rounds)" if args.ov_static else ""
    print("| model | shape | " + " | ".join(f"{k} ms" for k in cols) + " | " +
          " | ".join(f"{k}/undecl" for k in peers) + " | decl/undecl" + static_col + " |")
    print("|" + "---|" * (3 + len(cols) + len(peers) + (1 if args.ov_static else 0)))
    ratios: dict[str, list[float]] = {k: [] for k in [*peers, "decl/undecl"]}
    peer_vs: dict[str, list[float]] = {"ov/ort": []}
    for rec in recs:
        if "model" in rec["errors"]:
            print(f"| {rec['model']} | - | error: {rec['errors']['model']} |")
            continue
        for row in rec["rows"]:
            cells = [_ms(row, k, rec["errors"]) for k in cols]
            rs = []
            for k, over in [*((p, k) for p, k in zip(peers, ["undeclared"] * len(peers))),
                            ("dynshape", "undeclared")]:
                name = k if k != "dynshape" else "decl/undecl"
                if k in row["ms"] and over in row["ms"]:
                    r = row["ms"][k] / row["ms"][over]
                    ratios[name].append(r)
                    rs.append(f"{r:.2f}")
                else:
                    rs.append("-")
            if "ov" in row["ms"] and "ort" in row["ms"]:
                peer_vs["ov/ort"].append(row["ms"]["ov"] / row["ms"]["ort"])
            extra = (f" | {row['ov_static_ms']:.2f} ({row['ov_dyn_vs_static_ms']:.2f})" if "ov_static_ms" in row
                     else " | -" if args.ov_static else "")
            print(f"| {rec['model']} | {row['shape']} | " + " | ".join(cells) + " | " + " | ".join(rs) + extra + " |")
    gm = statistics.geometric_mean
    etas = [(rec["model"], row) for rec in recs for row in rec["rows"] if "eta" in row]
    if etas:
        print("\n## eta = T(static build at the probe) / T(generic build), same rounds\n")
        print("| model | shape | generic ms | static ms | eta |\n|---|---|---|---|---|")
        for model, row in etas:
            print(f"| {model} | {row['shape']} | {row['generic_ms']:.2f} | {row['static_ms']:.2f} | {row['eta']:.3f} |")
        v = [row["eta"] for _, row in etas]
        print(f"\neta geomean {gm(v):.3f}, min {min(v):.3f} over {len(v)} probes")
    print("\ngeometric means: " + "; ".join(f"{k if '/' in k else k + '/undecl'} {gm(v):.2f} over {len(v)} rows "
                                             f"(min {min(v):.2f})" for k, v in ratios.items() if v) +
          "".join(f"; {k} {gm(v):.2f} over {len(v)} rows (time ratio of the peers: < 1 = OpenVINO faster)"
                  for k, v in peer_vs.items() if v))

    print("\n## dynshape compile (load_onnx + compile, each in a fresh process, after importing dynshape)\n")
    print(f"| model | cold cache s | warm (build cache) s: median of {WARM_RUNS} (slowest) | of it load_onnx s "
          "| import before (numpy, onnx, dynshape) s | status |")
    print("|---|---|---|---|---|---|")
    for rec in recs:
        cold, warm = rec.get("cold", {}), rec.get("warm", {})
        status = cold.get("error") or rec["errors"].get("dynshape") or rec["errors"].get("model") or "ok"
        c = f"{cold['compile_s']:.2f}" if "compile_s" in cold else "-"
        w = f"{warm['compile_s']:.2f} ({warm['max_s']:.2f})" if "compile_s" in warm else "-"
        ld = f"{warm['load_s']:.2f}" if "load_s" in warm else "-"
        imp = f"{warm['import_s']:.2f}" if "import_s" in warm else "-"
        print(f"| {rec['model']} | {c} | {w} | {ld} | {imp} | {status} |")

    bound = f"rtol {RTOL:g}, atol {ATOL:g}" if args.precision == "fp32" else \
        f"bf16: max |diff| <= {BF16_TOL:g} of the output's largest magnitude"
    print(f"\n## Correctness against onnxruntime ({bound}; max abs diff)\n")
    print("| model | shape | undeclared | dynshape | ov |")
    print("|---|---|---|---|---|")
    bad = []
    for rec in recs:
        for row in rec["rows"]:
            cells = []
            for k in ("undeclared", "dynshape", "ov"):
                if f"{k}_diff" in row:
                    ok = row[f"{k}_ok"]
                    cells.append(f"{row[f'{k}_diff']:.1e} {'ok' if ok else '**FAIL**'}")
                    if not ok:
                        bad.append(f"{rec['model']} {row['shape']} {k}")
                else:
                    cells.append("not run")
            print(f"| {rec['model']} | {row['shape']} | " + " | ".join(cells) + " |")
    if bad:
        print(f"\n!!! OUTPUTS DIFFER FROM ONNXRUNTIME beyond {bound}: {', '.join(bad)} !!!")


# ---- --memory -------------------------------------------------------------------------------------------
def fill_plan_caches(exe: Any, one: Callable[[], None], stall: int = 200, limit: int = 5000) -> tuple[int, int]:
    """Call until every arena's plan cache is full (or no new plan was cached in `stall` calls: a model with
    fewer keys than the cache holds), at most `limit` calls; (calls made, plans cached). Why: the cache holds up
    to Options.plan_cache plans an arena (256; a few KB each), so a stream of new shapes grows resident memory
    until it is full, by design; 'flat' is measured after that, and the fill is reported on its own line."""

    def cached() -> int:
        return sum(len(a.plans) for a in exe.arenas)

    calls = since = 0
    last = cached()
    while calls < limit and since < stall and last < exe.options.plan_cache * len(exe.arenas):
        one()
        calls += 1
        now = cached()
        since = 0 if now > last else since + 1
        last = now
    return calls, last


class RandomShapes:
    """Admissible shapes drawn at random, each symbol in the lowest `frac` of its declared range (its step kept),
    and their feeds: views of one buffer of the largest shape (so a caller's memory does not grow with them)."""

    def __init__(self, spec: Spec, frac: float):
        self.spec, self.ranges = spec, {}
        for s in spec.dims:
            lo, hi, k = spec.sym_range(s)
            top = lo + int(frac * (hi - lo))
            self.ranges[s] = (-(-lo // k), max(-(-lo // k), top // k), k)
        self.biggest = {s: b * k for s, (_, b, k) in self.ranges.items()}
        self._flat = {n: a.reshape(-1) for n, a in spec.make_inputs(self.biggest, seed=1).items()}

    def draw(self, rng: np.random.Generator) -> dict[str, int]:
        return {s: int(rng.integers(a, b + 1)) * k for s, (a, b, k) in self.ranges.items()}

    def feed(self, env: dict[str, int]) -> Feed:
        return {i.name: self._flat[i.name][: int(np.prod(i.concrete(env)))].reshape(i.concrete(env))
                for i in self.spec.inputs}


def memory_run(spec: Spec, args: argparse.Namespace) -> None:
    """RSS over args.calls calls at random admissible shapes (each symbol in the low --mem-frac of its range)."""
    call = make_dynshape(onnx_path(spec.name), spec, args.strategy)
    rng = np.random.default_rng(0)
    shapes = RandomShapes(spec, args.mem_frac)
    ranges, biggest, feed_of = shapes.ranges, shapes.biggest, shapes.feed

    def one() -> None:
        call(feed_of(shapes.draw(rng)))

    call(feed_of(biggest))  # the largest shape first: the arenas reach their full size
    limit_threads(args.threads)
    t = time.perf_counter()
    for _ in range(args.warmup):
        one()
    call.exe.wait_for_builds(600)  # type: ignore[attr-defined]
    gc.collect()
    early = rss_bytes()
    print(f"{spec.name}: shapes {', '.join(f'{s} in {a * k}..{b * k}' for s, (a, b, k) in ranges.items())}; after "
          f"{args.warmup} warm-up calls ({time.perf_counter() - t:.1f} s): RSS {early / 2**20:.1f} MiB", flush=True)
    filled = fill_plan_caches(call.exe, one)  # type: ignore[attr-defined]
    gc.collect()
    base = rss_bytes()
    print(f"  plan cache filled: {filled[0]} more calls, {filled[1]} plans cached: RSS {base / 2**20:.1f} MiB "
          f"({100 * (base - early) / early:+.2f}%: the cached plans, bounded by the cache's capacity)", flush=True)
    peak, step, t = base, max(1, args.calls // 5), time.perf_counter()
    for i in range(1, args.calls + 1):
        one()
        if i % step == 0:
            now = rss_bytes()
            peak = max(peak, now)
            print(f"  {i:>6d} calls: RSS {now / 2**20:.1f} MiB ({100 * (now - base) / base:+.2f}%), "
                  f"{time.perf_counter() - t:.1f} s", flush=True)
    gc.collect()
    top = max(rss_bytes(), peak)
    growth = 100 * (top - base) / base
    print(f"{spec.name}: RSS growth over {args.calls} calls after warm-up and the plan cache's fill: {growth:+.2f}% "
          f"(peak {peak / 2**20:.1f} MiB; {100 * (top - early) / early:+.2f}% from the end of the "
          f"{args.warmup} warm-up calls, fill included); goal < 1%: {'met' if growth < 1 else 'NOT MET'}",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="", help=f"comma-separated (default all): {', '.join(ALL_SPECS)}")
    ap.add_argument("--peers", default="ort,ov")
    ap.add_argument("--quick", action="store_true", help="0.6 s and 6 rounds per probe instead of 3 s and 12")
    ap.add_argument("--warm-calls", type=int, default=0,
                    help="untimed calls opening each timed block (default 0: each block starts right after "
                         "another runtime's block and a settle pause; 1: steady state)")
    ap.add_argument("--ov-static", action="store_true", help="also OpenVINO compiled per probe shape")
    ap.add_argument("--eta", action="store_true", help="also dynshape built static at each probe (eta)")
    ap.add_argument("--strategy", default="generic", help="dynshape's ds.compile strategy")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="dynshape's precision; bf16 leaves OpenVINO at its default (bf16 where the CPU has it)")
    ap.add_argument("--json", default=None, help="write the raw records here")
    ap.add_argument("--memory", action="store_true", help="resident memory over random shapes instead")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--mem-frac", type=float, default=0.25)
    args = ap.parse_args()
    args.budget, args.rounds = (0.6, 6) if args.quick else (3.0, 12)
    names = [n for n in args.models.split(",") if n] or list(ALL_SPECS)
    unknown = [n for n in names if n not in ALL_SPECS]
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; known: {', '.join(ALL_SPECS)}")
    limit_threads(args.threads)
    if args.memory:
        if len(names) > 1:  # one process per model: a model run after another reuses the heap it freed,
            for n in names:  # which would hide its own growth
                argv = [a for i, a in enumerate(sys.argv[1:]) if a != "--models" and sys.argv[i] != "--models"
                        and not a.startswith("--models=")]
                subprocess.run([sys.executable, sys.argv[0], *argv, "--models", n], check=False)
            return
        try:
            memory_run(ALL_SPECS[names[0]], args)
        except Exception as e:  # noqa: BLE001 - reported: e.g. a model dynshape cannot load yet
            print(f"{names[0]}: memory run failed: {short_error(e)}", flush=True)
        return
    peers = installed_peers(args.peers)
    print(f"threads {args.threads}; dynshape strategy {args.strategy!r}; peers {peers}; "
          f"{'quick' if args.quick else 'full'} timing ({args.budget} s, {args.rounds} rounds per probe)")
    recs = [compile_times(ALL_SPECS[n], args) for n in names]
    for n, rec in zip(names, recs):
        t = time.perf_counter()
        bench_model(ALL_SPECS[n], args, peers, rec)
        print(f"{n}: {time.perf_counter() - t:.0f} s", flush=True)
    print_tables(recs, peers, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(recs, f, indent=1, default=str)


if __name__ == "__main__":
    main()
