"""Out-of-the-box cases of issue 29, each loaded as a user would (`ds.load_onnx(path)`, nothing declared), beside
onnxruntime in one process (interleaved rounds, medians, the CPU printed):

- vad: a VAD-style model (Silero's shape): three If on Equal(sr, 16000) picking the front end (a strided Conv1d
  whose kernel and stride depend on the rate), a scale and the output non-linearity, an LSTM with its state in
  and out; chunks of 512 samples at 16 kHz and 256 at 8 kHz, batch 1..16. `noif` is the same network with the
  branches taken for 16 kHz (what the per-value build should cost, plus one dict lookup);
- kv: one decoder step with a KV cache (Q/K/V projections, past K/V concatenated with the new token's into the
  present outputs, attention, output projection) at past lengths 0..2048, dynshape with `out=` arrays it
  reuses (double-buffered, as a decode loop does) and without; then a 64-token greedy-style loop feeding each
  step's present back as the next step's past, in tokens/s;
- simd: small elementwise kernels (a GELU at 16..4096 elements), where the thread-threshold clause used to
  switch SIMD off.

- loop: an RNN written as a Loop (a 32x32 MatMul + Tanh body, 16 and 64 iterations) and a Scan cumulative op,
  the bodies compiled (called per iteration) against the same executable with them interpreted
  (`compile_bodies=False`) and onnxruntime.

    python bench/ootb_bench.py [--threads 1] [--quick] [--only vad,kv,simd,loop]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as H
from onnx import numpy_helper as N

import dynshape as ds
from benchutil import cpu_model, limit_threads, time_interleaved
from ort_util import ort_session

F = TP.FLOAT


def _ort(path: str, threads: int):
    s = ort_session(path, threads)
    return lambda feed: s.run(None, feed)


# ---- the VAD-style model ---------------------------------------------------------------------------------------
def vad_model(hidden: int = 64, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def w(*s):
        return (rng.standard_normal(s) * 0.1).astype(np.float32)

    def branch(name, nodes, outs, inits):
        return H.make_graph(nodes, name, [], [H.make_tensor_value_info(o, F, None) for o in outs],
                            [N.from_array(v, k) for k, v in inits.items()])

    def front(name, k, stride):  # (b, 1, n) -> conv -> relu -> mean over time: (b, hidden)
        return branch(name, [H.make_node("Conv", ["x3", f"w_{name}"], [f"c_{name}"], strides=[stride]),
                             H.make_node("Relu", [f"c_{name}"], [f"r_{name}"]),
                             H.make_node("ReduceMean", [f"r_{name}", "ax2"], [f"f_{name}"], keepdims=0)],
                      [f"f_{name}"], {f"w_{name}": w(hidden, 1, k)})

    inits = {"k16": np.array(16000, np.int64), "ax1": np.array([1], np.int64), "ax2": np.array([2], np.int64),
             "ax0": np.array([0], np.int64), "W": w(1, 4 * hidden, hidden), "R": w(1, 4 * hidden, hidden),
             "B": w(1, 8 * hidden), "wo": w(hidden, 1), "s16": np.array(1.0, np.float32),
             "s8": np.array(2.0, np.float32)}
    nodes = [H.make_node("Equal", ["sr", "k16"], ["is16"]),
             H.make_node("Unsqueeze", ["x", "ax1"], ["x3"]),
             H.make_node("If", ["is16"], ["f"], then_branch=front("t16", 64, 32), else_branch=front("t8", 32, 16)),
             H.make_node("If", ["is16"], ["g"],
                         then_branch=branch("s16b", [H.make_node("Mul", ["f", "s16"], ["g16"])], ["g16"], {}),
                         else_branch=branch("s8b", [H.make_node("Mul", ["f", "s8"], ["g8"])], ["g8"], {})),
             H.make_node("Unsqueeze", ["g", "ax0"], ["seq"]),
             H.make_node("LSTM", ["seq", "W", "R", "B", "", "h", "c"], ["", "hn", "cn"], hidden_size=hidden),
             H.make_node("Squeeze", ["hn", "ax0"], ["h2"]),
             H.make_node("MatMul", ["h2", "wo"], ["logit"]),
             H.make_node("If", ["is16"], ["prob"],
                         then_branch=branch("o16", [H.make_node("Sigmoid", ["logit"], ["p16"])], ["p16"], {}),
                         else_branch=branch("o8", [H.make_node("Tanh", ["logit"], ["p8"])], ["p8"], {}))]
    inputs = [H.make_tensor_value_info("x", F, ["batch", "samples"]), H.make_tensor_value_info("sr", TP.INT64, []),
              H.make_tensor_value_info("h", F, [1, "batch", hidden]),
              H.make_tensor_value_info("c", F, [1, "batch", hidden])]
    outputs = [H.make_tensor_value_info(o, F, None) for o in ("prob", "hn", "cn")]
    g = H.make_graph(nodes, "vad", inputs, outputs, [N.from_array(v, k) for k, v in inits.items()])
    return H.make_model(g, opset_imports=[H.make_opsetid("", 18)])


def bench_vad(tmp: str, threads: int, budget: float) -> None:
    from dynshape.ir.branches import specialize_values

    path = os.path.join(tmp, "vad.onnx")
    onnx.save(vad_model(), path)
    g = ds.load_onnx(path)
    exe = ds.compile(g)
    noif = ds.compile(specialize_values(g, {"sr": np.array(16000, np.int64)}))
    ort = _ort(path, threads)
    limit_threads(threads)  # the OpenMP runtime loaded with the kernels: limited only once loaded
    print("\nvad (3 If on the sample rate, LSTM state in and out): us per chunk")
    print("| sr, samples, batch | dynshape | same net without If | onnxruntime | ort/dyn | dyn - noif us |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for sr, n in ((16000, 512), (8000, 256)):
        for b in (1, 4, 16):
            feed = {"x": rng.standard_normal((b, n)).astype(np.float32), "sr": np.array(sr, np.int64),
                    "h": np.zeros((1, b, 64), np.float32), "c": np.zeros((1, b, 64), np.float32)}
            ref = ort(feed)
            got = exe.run(feed)
            err = max(float(np.abs(got[k] - r).max()) for k, r in zip(("prob", "hn", "cn"), ref))
            assert err < 1e-4, f"vad sr={sr} b={b}: max error {err}"
            calls = {"dyn": exe.run, "ort": ort}
            if sr == 16000:
                calls["noif"] = lambda f: noif.run({k: v for k, v in f.items() if k != "sr"})
            t = time_interleaved(calls, feed, budget)
            noif_s = f"{1e6 * t['noif']:.1f}" if "noif" in t else "-"
            diff = f"{1e6 * (t['dyn'] - t['noif']):.1f}" if "noif" in t else "-"
            print(f"| {sr}, {n}, {b} | {1e6 * t['dyn']:.1f} | {noif_s} | {1e6 * t['ort']:.1f} | "
                  f"{t['ort'] / t['dyn']:.2f} | {diff} |")


# ---- a decoder step with a KV cache ----------------------------------------------------------------------------
def decoder_step(d: int = 256, heads: int = 4, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    hd = d // heads
    inits = {**{f"w{n}": (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32) for n in "qkvo"},
             "shape4": np.array([0, 1, heads, hd], np.int64), "shape2": np.array([0, 1, d], np.int64),
             "scale": np.array(1 / np.sqrt(hd), np.float32)}
    nodes = []
    for n in "qkv":
        nodes += [H.make_node("MatMul", ["x", f"w{n}"], [f"{n}p"]),
                  H.make_node("Reshape", [f"{n}p", "shape4"], [f"{n}r"]),
                  H.make_node("Transpose", [f"{n}r"], [f"{n}t"], perm=[0, 2, 1, 3])]
    nodes += [H.make_node("Concat", ["past_k", "kt"], ["present_k"], axis=2),
              H.make_node("Concat", ["past_v", "vt"], ["present_v"], axis=2),
              H.make_node("Transpose", ["present_k"], ["kT"], perm=[0, 1, 3, 2]),
              H.make_node("MatMul", ["qt", "kT"], ["s"]), H.make_node("Mul", ["s", "scale"], ["ss"]),
              H.make_node("Softmax", ["ss"], ["p"], axis=-1), H.make_node("MatMul", ["p", "present_v"], ["o"]),
              H.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              H.make_node("Reshape", ["ot", "shape2"], ["o2"]), H.make_node("MatMul", ["o2", "wo"], ["y"])]
    kv = ["batch", heads, "past", hd]
    g = H.make_graph(nodes, "decoder_step", [H.make_tensor_value_info("x", F, ["batch", 1, d]),
                                             H.make_tensor_value_info("past_k", F, kv),
                                             H.make_tensor_value_info("past_v", F, kv)],
                     [H.make_tensor_value_info(o, F, None) for o in ("y", "present_k", "present_v")],
                     [N.from_array(v, k) for k, v in inits.items()])
    return H.make_model(g, opset_imports=[H.make_opsetid("", 17)])


def bench_kv(tmp: str, threads: int, budget: float) -> None:
    path = os.path.join(tmp, "kv.onnx")
    onnx.save(decoder_step(), path)
    exe = ds.compile(ds.load_onnx(path))
    ort = _ort(path, threads)
    limit_threads(threads)  # the OpenMP runtime loaded with the kernels: limited only once loaded
    rng = np.random.default_rng(0)
    print("\nkv (decoder step, d 256, 4 heads, batch 1): us per step")
    print("| past | dynshape out= | dynshape | onnxruntime | ort/dyn out= |")
    print("|---|---|---|---|---|")
    for past in (0, 128, 512, 1024, 2048):
        feed = {"x": rng.standard_normal((1, 1, 256)).astype(np.float32),
                **{k: rng.standard_normal((1, 4, past, 64)).astype(np.float32) for k in ("past_k", "past_v")}}
        outs = {k: np.empty((1, 4, past + 1, 64), np.float32) for k in ("present_k", "present_v")}
        ref = ort(feed)
        got = exe.run(feed, out=outs)
        assert max(float(np.abs(got[k] - r).max()) for k, r in zip(("y", "present_k", "present_v"), ref)) < 1e-4
        t = time_interleaved({"out": lambda f, o=outs: exe.run(f, out=o), "plain": exe.run, "ort": ort}, feed,
                             budget)
        print(f"| {past} | {1e6 * t['out']:.1f} | {1e6 * t['plain']:.1f} | {1e6 * t['ort']:.1f} | "
              f"{t['ort'] / t['out']:.2f} |")
    tokens, start = 64, 64
    ks = {k: rng.standard_normal((1, 4, start, 64)).astype(np.float32) for k in ("past_k", "past_v")}
    cap = start + tokens + 1
    bufs = [{k: np.empty((1, 4, cap, 64), np.float32) for k in ("present_k", "present_v")} for _ in range(2)]

    def generate_dyn() -> None:  # present of step i is the past of step i + 1, in two buffers it owns
        past = dict(ks)
        x = np.ones((1, 1, 256), np.float32)
        for i in range(tokens):
            n = start + i + 1
            out = {k: np.ndarray((1, 4, n, 64), np.float32, buffer=v) for k, v in bufs[i % 2].items()}
            r = exe.run({"x": x, **past}, out=out)
            past = {"past_k": r["present_k"], "past_v": r["present_v"]}
            x = r["y"]

    def generate_ort() -> None:
        past = dict(ks)
        x = np.ones((1, 1, 256), np.float32)
        for _ in range(tokens):
            y, pk, pv = ort({"x": x, **past})
            past, x = {"past_k": pk, "past_v": pv}, y

    first = {}  # the first loop: each step a past length not seen yet (dynshape binds its plan on the way)
    for k, f in (("dyn", generate_dyn), ("ort", generate_ort)):
        t = time.perf_counter()
        f()
        first[k] = tokens / (time.perf_counter() - t)
    times: dict = {"dyn": [], "ort": []}
    for _ in range(3 if budget < 1 else 7):
        for k, f in (("dyn", generate_dyn), ("ort", generate_ort)):
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    tps = {k: tokens / statistics.median(v) for k, v in times.items()}
    print(f"64-token loop from past {start}: dynshape {tps['dyn']:.0f} tokens/s, onnxruntime {tps['ort']:.0f} "
          f"tokens/s ({tps['dyn'] / tps['ort']:.2f}x); its first loop (new past lengths): {first['dyn']:.0f} against "
          f"{first['ort']:.0f} tokens/s ({first['dyn'] / first['ort']:.2f}x)")


# ---- small elementwise kernels ---------------------------------------------------------------------------------
def bench_simd(tmp: str, threads: int, budget: float) -> None:
    path = os.path.join(tmp, "gelu.onnx")
    nodes = [H.make_node("Div", ["x", "sqrt2"], ["a"]), H.make_node("Erf", ["a"], ["e"]),
             H.make_node("Add", ["e", "one"], ["p"]), H.make_node("Mul", ["x", "p"], ["m"]),
             H.make_node("Mul", ["m", "half"], ["y"])]
    inits = {"sqrt2": np.array(np.sqrt(2.0), np.float32), "one": np.array(1.0, np.float32),
             "half": np.array(0.5, np.float32)}
    g = H.make_graph(nodes, "gelu", [H.make_tensor_value_info("x", F, ["n", 256])],
                     [H.make_tensor_value_info("y", F, None)], [N.from_array(v, k) for k, v in inits.items()])
    onnx.save(H.make_model(g, opset_imports=[H.make_opsetid("", 17)]), path)
    exe = ds.compile(ds.load_onnx(path))
    ort = _ort(path, threads)
    limit_threads(threads)  # the OpenMP runtime loaded with the kernels: limited only once loaded
    print("\nsimd (a GELU of n x 256 floats, under the thread threshold): us per call")
    print("| rows | dynshape | onnxruntime | ort/dyn |")
    print("|---|---|---|---|")
    for n in (1, 4, 16, 64):
        feed = {"x": np.random.default_rng(n).standard_normal((n, 256)).astype(np.float32)}
        t = time_interleaved({"dyn": exe.run, "ort": ort}, feed, budget)
        print(f"| {n} | {1e6 * t['dyn']:.2f} | {1e6 * t['ort']:.2f} | {t['ort'] / t['dyn']:.2f} |")


# ---- Loop / Scan bodies -----------------------------------------------------------------------------------------
def rnn_loop_model(hidden: int = 32, seed: int = 0) -> onnx.ModelProto:
    """An RNN written as a Loop: h = tanh(h @ W + xs[i]) for M iterations (M fed), every h a scan output."""
    w = (np.random.default_rng(seed).standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    vi = H.make_tensor_value_info
    body = H.make_graph([H.make_node("Gather", ["xs", "i"], ["x_t"], axis=0),
                         H.make_node("MatMul", ["h_in", "W"], ["hw"]), H.make_node("Add", ["hw", "x_t"], ["pre"]),
                         H.make_node("Tanh", ["pre"], ["h_out"]), H.make_node("Identity", ["cond_in"], ["cond_out"]),
                         H.make_node("Identity", ["h_out"], ["y"])],
                        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("h_in", F, None)],
                        [vi("cond_out", TP.BOOL, []), vi("h_out", F, None), vi("y", F, None)])
    g = H.make_graph([H.make_node("Loop", ["M", "", "h0"], ["h", "ys"], body=body)], "rnn_loop",
                     [vi("M", TP.INT64, []), vi("h0", F, ["batch", hidden]), vi("xs", F, ["steps", "batch", hidden])],
                     [vi("h", F, None), vi("ys", F, None)], [N.from_array(w, "W")])
    return H.make_model(g, opset_imports=[H.make_opsetid("", 17)])


def cumulative_scan_model() -> onnx.ModelProto:
    """A Scan-based cumulative op: s = s * decay + x_t along axis 1 of (batch, steps, width), every s a scan output."""
    vi = H.make_tensor_value_info
    body = H.make_graph([H.make_node("Mul", ["s_in", "decay"], ["sd"]), H.make_node("Add", ["sd", "x_t"], ["s_out"]),
                         H.make_node("Identity", ["s_out"], ["y_t"])],
                        "body", [vi("s_in", F, None), vi("x_t", F, None)], [vi("s_out", F, None), vi("y_t", F, None)])
    g = H.make_graph([H.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                                  scan_input_axes=[1], scan_output_axes=[1])], "cum_scan",
                     [vi("s0", F, ["batch", "width"]), vi("x", F, ["batch", "steps", "width"])],
                     [vi("s", F, None), vi("ys", F, None)], [N.from_array(np.array(0.9, np.float32), "decay")])
    return H.make_model(g, opset_imports=[H.make_opsetid("", 17)])


def bench_loop(tmp: str, threads: int, budget: float) -> None:
    rng = np.random.default_rng(0)
    cases = [("rnn", rnn_loop_model(), lambda b, t: {
        "M": np.array(t, np.int64), "h0": rng.standard_normal((b, 32)).astype(np.float32),
        "xs": rng.standard_normal((t, b, 32)).astype(np.float32)}),
             ("scan", cumulative_scan_model(), lambda b, t: {
        "s0": np.zeros((b, 64), np.float32), "x": rng.standard_normal((b, t, 64)).astype(np.float32)})]
    print("\nloop (an RNN as a Loop: h = tanh(h @ W[32x32] + x_t); a Scan cumulative op s = 0.9 s + x_t over 64 "
          "wide rows): us per call; 'interpreted' is the same executable with compile_bodies=False")
    print("| model, batch, steps | dynshape | interpreted | onnxruntime | interp/dyn | ort/dyn |")
    print("|---|---|---|---|---|---|")
    for name, model, make in cases:
        path = os.path.join(tmp, f"{name}.onnx")
        onnx.save(model, path)
        exe = ds.compile(ds.load_onnx(path))
        old = ds.compile(ds.load_onnx(path), compile_bodies=False)
        assert [b["body"] for b in exe.explain_build()["bodies"]] == ["compiled"]
        ort = _ort(path, threads)
        for b, t in ((1, 16), (4, 16), (4, 64)):
            feed = make(b, t)
            ref = ort(feed)
            for got in (exe.run(feed), old.run(feed)):
                err = max(float(np.abs(got[v.name] - r).max()) for v, r in zip(exe.graph.outputs, ref))
                assert err < 1e-4, f"{name} b={b} t={t}: max error {err}"
            tm = time_interleaved({"dyn": exe.run, "old": old.run, "ort": ort}, feed, budget)
            print(f"| {name}, {b}, {t} | {1e6 * tm['dyn']:.1f} | {1e6 * tm['old']:.1f} | {1e6 * tm['ort']:.1f} | "
                  f"{tm['old'] / tm['dyn']:.2f} | {tm['ort'] / tm['dyn']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="vad,kv,simd")
    args = ap.parse_args()
    limit_threads(args.threads)
    budget = 0.4 if args.quick else 2.0
    print(f"CPU: {cpu_model()}; threads {args.threads}; every model loaded with ds.load_onnx(path), nothing declared")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            {"vad": bench_vad, "kv": bench_kv, "simd": bench_simd, "loop": bench_loop}[name](tmp, args.threads, budget)
            limit_threads(args.threads)


if __name__ == "__main__":
    main()
