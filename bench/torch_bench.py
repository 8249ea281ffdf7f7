"""dynshape for PyTorch users, side by side with eager and inductor, at 1 thread (issue 14's figures).

    python bench/torch_bench.py [--sections first,fixed,overhead,stream,cnn] [--systems ...] [--quick] [--json F]

Systems: eager; inductor (torch.compile default) and inductor_dyn (dynamic=True); ds_compile
(torch.compile(backend="dynshape", dynamic=True)); ds_export (exe.run on ds.compile(ds.from_torch(...)));
ds_onnx (exe.run on the same model's ONNX export, for the from_torch comparison).

Sections:
- first: first call, compile included, of bert_small at (1, 16), each system in a fresh process (imports and
  model construction excluded; Dynamo's one-time start-up included, as a user sees it), with cold compile
  caches (fresh inductor and dynshape cache directories) and again warm;
- fixed: per-call medians at (1,16) (1,128) (8,128) (1,512), interleaved rounds, every output checked against
  eager (max abs difference);
- overhead: the function the dynshape backend returns to Dynamo, timed beside `exe.run` on the same inputs,
  and the whole Dynamo call;
- stream: the shared 200-request stream, compile included, each system compiled afresh: total, p50, p99,
  Dynamo's graph count, dynshape's builds, every output checked against eager;
- cnn: a MobileNetV3-style and a ResNet-style CNN (tests/torch_frontend/torch_models.py) at several
  resolutions, checked against eager.
Needs `python ../shared/bench/export_models.py` for ds_onnx. Inductor compiles take tens of seconds here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchutil import common, limit_threads

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "torch_frontend"))  # the small CNNs the tests use

FIXED = [(1, 16), (1, 128), (8, 128), (1, 512)]
ALL = ["eager", "inductor", "inductor_dyn", "ds_compile", "ds_export", "ds_onnx"]


def setup_torch(threads: int):
    import torch

    import dynshape.torch as dt

    torch.set_num_threads(threads)
    limit_threads(threads)
    dt.register()
    return torch


def bert_inputs(shape, seed=1):
    return common.make_inputs("bert_small", shape, seed=seed)


def make_system(name: str, m, example_np: dict):
    """A callable taking the numpy feed and returning numpy outputs, plus its compile-time setup (seconds)."""
    import torch

    import dynshape as ds

    t0 = time.perf_counter()
    if name == "eager":
        def call(x):
            with torch.inference_mode():
                out = m(*[torch.from_numpy(v) for v in x.values()])
            return [o.numpy() for o in _flat(out)]
        return call, 0.0
    if name in ("inductor", "inductor_dyn", "ds_compile"):
        kw = {"backend": "dynshape", "dynamic": True} if name == "ds_compile" else {}
        if name == "inductor_dyn":
            kw["dynamic"] = True
        c = torch.compile(m, **kw)

        def call(x):
            with torch.no_grad():
                out = c(*[torch.from_numpy(v) for v in x.values()])
            return [o.numpy() for o in _flat(out)]
        return call, 0.0
    if name == "ds_export":
        from torch.export import Dim

        b, s = Dim("batch", min=1, max=8), Dim("seq", min=1, max=512)  # the bench BERT's declared dims
        dims = {n: {0: b, 1: s} for n in example_np}
        g = ds.from_torch(m, tuple(torch.from_numpy(v) for v in example_np.values()), dynamic_shapes=dims)
        exe = ds.compile(g)
        outs = [v.name for v in g.outputs]
        setup = time.perf_counter() - t0
        return _outputs_of(exe, outs), setup
    if name == "ds_onnx":
        from benchutil import DIMS

        g = ds.load_onnx(common.onnx_path("bert_small"), dims=DIMS["bert_small"])
        exe = ds.compile(g)
        outs = [v.name for v in g.outputs]
        return _outputs_of(exe, outs), time.perf_counter() - t0
    raise SystemExit(f"unknown system {name}")


def _outputs_of(exe, names: list):
    """The call: one exe.run, its outputs in order."""
    def call(x):
        r = exe.run(x)
        return [r[o] for o in names]

    return call


def _flat(out):
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        return list(out.to_tuple())
    return list(out)


def max_diff(a: list, b: list) -> float:
    import numpy as np

    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in zip(a, b))


def time_calls(calls: dict, x: dict, budget: float) -> dict:
    from compile_bench import time_interleaved

    return time_interleaved(calls, x, budget, rounds=8)


# ---- sections ----------------------------------------------------------------------------------------------
def first_call_child(system: str, threads: int) -> None:
    """In a fresh process: the first call of bert_small at (1, 16), compile included. For the dynshape backend, when
    Dynamo handed the graph over, when aot_autograd finished tracing, and dynshape's own share."""
    torch = setup_torch(threads)
    import dynshape.torch.backend as backend

    m = common.build_torch_model("bert_small")
    x = bert_inputs((1, 16))
    marks: dict = {}
    if system == "ds_compile_specialize_float":
        torch._dynamo.config.specialize_float = True
        system = "ds_compile"
    inner, compile_graph = backend.dynshape_backend, backend._compile_graph

    def traced(gm, ex, **kw):
        marks.setdefault("dynamo_traced_s", time.perf_counter() - t0)
        marks["backend_calls"] = marks.get("backend_calls", 0) + 1
        return inner(gm, ex, **kw)

    def timed(*a, **kw):
        t = time.perf_counter()
        marks["aot_traced_s"] = t - t0
        try:
            return compile_graph(*a, **kw)
        finally:
            marks["dynshape_s"] = time.perf_counter() - t

    from torch._dynamo.backends import registry

    registry._COMPILER_FNS["dynshape"] = traced
    backend._compile_graph = timed
    t0 = time.perf_counter()
    call, setup = make_system(system, m, x)
    out = call(x)
    total = time.perf_counter() - t0
    ref = make_system("eager", m, x)[0](x)
    marks = {k: round(v, 3) if isinstance(v, float) else v for k, v in marks.items()}
    print(json.dumps({"system": system, "first_call_s": round(total, 3), "setup_s": round(setup, 3),
                      "max_diff": max_diff(out, ref), **marks}))


def section_first(args) -> dict:
    """Each system in a fresh process, with its compile caches cold (fresh inductor and dynshape cache dirs)
    and then warm (the caches that cold run filled)."""
    import os
    import tempfile

    res = {}
    for system in args.systems_first:
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor", DYNSHAPE_CACHE_DIR=f"{tmp}/dynshape")
            for cache in ("cold", "warm"):
                cmd = [sys.executable, str(Path(__file__)), "--child-first", system, "--threads", str(args.threads)]
                p = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, env=env)
                line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
                r = json.loads(line[-1]) if line else {"error": p.stderr[-800:]}
                res[f"{system} {cache}"] = r
                print(f"first call {system} ({cache} caches): {r}", flush=True)
    return res


def section_fixed(args, m) -> dict:
    systems = [s for s in args.systems if s in ALL]
    calls = {}
    for s in systems:
        calls[s], setup = make_system(s, m, bert_inputs((2, 16)))
    res = {}
    print("\n| shape | " + " | ".join(f"{s} ms" for s in systems) + " | max abs diff vs eager |")
    print("|" + "---|" * (len(systems) + 2))
    for shape in FIXED:
        x = bert_inputs(shape)
        ref = calls["eager"](x) if "eager" in calls else None
        diffs = {s: max_diff(f(x), ref) for s, f in calls.items() if ref is not None and s != "eager"}
        t = time_calls(calls, x, args.budget)
        res[str(shape)] = {"ms": {k: 1e3 * v for k, v in t.items()}, "max_diff": diffs}
        print(f"| {shape} | " + " | ".join(f"{1e3 * t[s]:.2f}" for s in systems) + " | " +
              ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()) + " |", flush=True)
    return res


def section_overhead(args, m) -> dict:
    """The backend's own cost per call: its returned function vs exe.run on the same inputs."""
    torch = setup_torch(args.threads)
    from torch._dynamo.backends import registry

    from dynshape.torch.backend import dynshape_backend

    captured = []

    def capture(gm, ex, **kw):
        before = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        fn = dynshape_backend(gm, ex, **kw)
        after = {n.name for n in gm.graph.nodes if n.op == "placeholder"}  # the backend may drop module floats
        captured.append((fn, [x for name, x in zip(before, ex) if name in after]))
        return fn

    if "dynshape_capture" not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=capture, name="dynshape_capture")
    res = {}
    mlp = common.build_torch_model("mlp")
    for label, model, shape, make in (("bert_small (1,16)", m, (1, 16), lambda s: bert_inputs(s)),
                                      ("mlp batch 1", mlp, (1,), lambda s: common.make_inputs("mlp", s, 1))):
        torch._dynamo.reset()
        captured.clear()
        c = torch.compile(model, backend="dynshape_capture", dynamic=True)
        x = make(shape)
        big = make((2,) + shape[1:])
        tensors = [torch.from_numpy(v) for v in x.values()]
        with torch.no_grad():
            c(*[torch.from_numpy(v) for v in big.values()])
            c(*tensors)
        fn, ex = captured[-1]
        args_ = list(ex)
        for k, i in enumerate(fn.input_positions):  # Dynamo's example tensors -> this call's inputs
            args_[i] = tensors[k]
        run = fn.scope["_S"][0]
        names = fn.scope["_names"]
        feed = {n: t.numpy() for n, t in zip(names, tensors)}
        with torch.no_grad():
            t = time_calls({"backend fn": lambda _, f=fn, a=args_: f(*a),
                            "exe.run": lambda _, r=run, fd=feed: r(fd),
                            "Dynamo call": lambda _, f=c, a=tensors: f(*a)}, x, args.budget)
        over = (t["backend fn"] - t["exe.run"]) * 1e6
        # the same function with exe.run replaced by a stub returning the outputs: only the backend's own work
        state = fn.scope["_S"]
        cached = run(feed)
        fn.scope["_S"] = (lambda fd, out=cached: out, *state[1:])
        try:
            with torch.no_grad():
                stub = time_calls({"stubbed fn": lambda _, f=fn, a=args_: f(*a)}, x, args.budget / 3)["stubbed fn"]
        finally:
            fn.scope["_S"] = state
        res[label] = {"backend_fn_us": t["backend fn"] * 1e6, "exe_run_us": t["exe.run"] * 1e6,
                      "dynamo_call_us": t["Dynamo call"] * 1e6, "overhead_diff_us": over,
                      "overhead_stubbed_us": stub * 1e6, "params_checked": len(fn.scope) and
                      sum(1 for k in fn.scope if k.startswith("_ver"))}
        print(f"overhead {label}: backend fn {t['backend fn'] * 1e6:.1f} us, exe.run {t['exe.run'] * 1e6:.1f} us "
              f"(difference {over:.1f} us); backend's own work with exe.run stubbed {stub * 1e6:.1f} us "
              f"({res[label]['params_checked']} weights checked); whole Dynamo call {t['Dynamo call'] * 1e6:.1f} us",
              flush=True)
    return res


def section_stream(args, m) -> dict:
    import torch

    import dynshape.torch as dt

    reqs = common.load_stream()["streams"]["bert_small"]
    if args.quick:
        reqs = reqs[:40]
    eager, _ = make_system("eager", m, bert_inputs((2, 16)))
    refs = [eager(bert_inputs(common.req_shape("bert_small", r), r["data_seed"])) for r in reqs]
    res = {}
    for s in args.systems:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        dt.reset()
        t0 = time.perf_counter()
        call, setup = make_system(s, m, bert_inputs((2, 16)))
        lat, worst = [], 0.0
        for r, ref in zip(reqs, refs):
            x = bert_inputs(common.req_shape("bert_small", r), r["data_seed"])
            t = time.perf_counter()
            out = call(x)
            lat.append(time.perf_counter() - t)
            worst = max(worst, max_diff(out, ref))
        total = time.perf_counter() - t0
        lat.sort()
        graphs = torch._dynamo.utils.counters["stats"].get("unique_graphs", 0)
        rec = {"total_s": total, "setup_s": setup, "p50_ms": 1e3 * lat[len(lat) // 2],
               "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], "max_diff": worst,
               "dynamo_graphs": graphs}
        if s == "ds_compile":
            rep = dt.explain()
            rec.update(dynamo_graphs=len(rep.records), builds_compiled=rep.builds, builds_serving=rep.serving)
        res[s] = rec
        shown = {k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in rec.items()}
        print(f"stream {s}: {json.dumps(shown)}", flush=True)
    return res


def section_cnn(args) -> dict:
    import numpy as np
    import torch
    import torch_models as tm

    import dynshape as ds

    res = {}
    for name in ("MobileNetV3ish", "ResNetish"):
        torch.manual_seed(0)
        m = getattr(tm, name)().eval()
        systems = {}
        systems["eager"] = lambda x, m=m: [m(torch.from_numpy(x["x"])).detach().numpy()]
        if "ds_compile" in args.systems:
            torch._dynamo.reset()
            c = torch.compile(m, backend="dynshape", dynamic=True)
            systems["ds_compile"] = lambda x, c=c: [c(torch.from_numpy(x["x"])).numpy()]
        if "ds_export" in args.systems:
            g = ds.from_torch(m, (torch.randn(2, 3, 64, 64),))
            exe = ds.compile(g)
            systems["ds_export"] = lambda x, exe=exe: exe(**x)
        if "inductor_dyn" in args.systems:
            ci = torch.compile(m, dynamic=True)
            systems["inductor_dyn"] = lambda x, ci=ci: [ci(torch.from_numpy(x["x"])).numpy()]
        for shape in ((1, 3, 64, 64), (1, 3, 128, 128), (1, 3, 224, 224), (4, 3, 160, 120)):
            x = {"x": np.random.default_rng(0).standard_normal(shape, dtype=np.float32)}
            with torch.no_grad():
                ref = systems["eager"](x)
                diffs = {k: max_diff(f(x), ref) for k, f in systems.items() if k != "eager"}
                t = time_calls(systems, x, args.budget / 2)
            res[f"{name} {shape}"] = {"ms": {k: 1e3 * v for k, v in t.items()}, "max_diff": diffs}
            print(f"cnn {name} {shape}: " + ", ".join(f"{k} {1e3 * v:.2f} ms" for k, v in t.items()) +
                  "; max diff " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sections", default="first,fixed,overhead,stream,cnn")
    ap.add_argument("--systems", default=",".join(ALL))
    ap.add_argument("--first-systems", default="ds_compile,ds_compile_specialize_float,ds_export,inductor,"
                    "inductor_dyn")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child-first", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_first:
        first_call_child(args.child_first, args.threads)
        return
    args.systems = [s for s in args.systems.split(",") if s]
    args.systems_first = [s for s in args.first_systems.split(",") if s]
    args.budget = 0.6 if args.quick else 2.0
    sections = args.sections.split(",")
    out: dict = {"threads": args.threads}
    if "first" in sections:
        out["first"] = section_first(args)
    setup_torch(args.threads)
    m = common.build_torch_model("bert_small")
    if "fixed" in sections:
        out["fixed"] = section_fixed(args, m)
    if "overhead" in sections:
        out["overhead"] = section_overhead(args, m)
    if "stream" in sections:
        out["stream"] = section_stream(args, m)
    if "cnn" in sections:
        out["cnn"] = section_cnn(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
