"""Native recurrent layer (codegen/csrc/ds_rnn.c) vs the numpy reference vs onnxruntime, one thread by default.

Shapes: a VAD-like LSTM (input 64 or 576, hidden 128, 1..100 frames, batch 1, state in and out) and a CRNN-like
BiLSTM (hidden 96 or 256, input 2*hidden, seq 80..1000, batch 1 or 4). Every candidate runs the same one-node
ONNX LSTM: `native` is the kernel bound once (W and R packed) and called through its pre-built argument block,
as a compiled plan calls it; `numpy` the op's reference; `ort` an InferenceSession with all graph optimisations.
Times are the median (or min) over --rounds rounds; a round times every candidate on the case (blocks of calls
lasting about --sample-ms), and the ratio columns are medians of per-round ratios, so load that drifts between
rounds (other processes on the cores) cancels. Outputs are checked against each other first.

Run: python bench/rnn_bench.py [--threads 1] [--rounds 15] [--sample-ms 20] [--stat median|min] [--quick]
     [--no-numpy] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--sample-ms", type=float, default=20.0)
    p.add_argument("--quick", action="store_true", help="a few cases only")
    p.add_argument("--no-numpy", action="store_true", help="skip the numpy reference (slow at seq 1000)")
    p.add_argument("--stat", choices=["median", "min"], default="median",
                   help="per-cell statistic over the rounds (min resists other processes sharing the cores)")
    p.add_argument("--json", type=Path)
    return p.parse_args()


ARGS = _args() if __name__ == "__main__" else None
if ARGS is not None:
    os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)  # before any OpenMP runtime loads
    # Both runtimes spin-wait after a parallel region by default; in one process, interleaved, each one's spinning
    # threads would steal the cores the other runs on. Passive waiting for both keeps the rounds independent.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from dynshape.codegen import rnn_kernel as rk  # noqa: E402
from dynshape.ir import opdef  # noqa: E402
from dynshape.ops import rnn as _rnn  # noqa: E402, F401  (registers LSTM)


def cases(quick: bool) -> list[dict]:
    vad = [dict(name=f"vad in={i} T={t}", inp=i, hid=128, seq=t, batch=1, direction="forward")
           for i in (64, 576) for t in (1, 10, 100)]
    bi = [dict(name=f"bilstm h={h} T={t} b={b}", inp=2 * h, hid=h, seq=t, batch=b, direction="bidirectional")
          for h in (96, 256) for t in (80, 1000) for b in (1, 4)]
    if quick:
        return [vad[2], vad[5], bi[0], bi[7]]
    return vad + bi


def feeds(c: dict) -> dict:
    rng = np.random.default_rng(0)
    nd = 2 if c["direction"] == "bidirectional" else 1
    h, s = c["hid"], 0.7 / np.sqrt(c["hid"])

    def rnd(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    return {"X": rnd(c["seq"], c["batch"], c["inp"]), "W": rnd(nd, 4 * h, c["inp"]), "R": rnd(nd, 4 * h, h),
            "B": rnd(nd, 8 * h), "initial_h": rnd(nd, c["batch"], h), "initial_c": rnd(nd, c["batch"], h)}


def ort_session(c: dict, f: dict, threads: int):
    import onnxruntime as ort

    names = ["X", "W", "R", "B", "", "initial_h", "initial_c"]
    node = helper.make_node("LSTM", names, ["Y", "Y_h", "Y_c"], hidden_size=c["hid"], direction=c["direction"])
    ins = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(f[k].shape)) for k in ("X", "initial_h",
                                                                                           "initial_c")]
    inits = [helper.make_tensor(k, TensorProto.FLOAT, f[k].shape, f[k].reshape(-1)) for k in ("W", "R", "B")]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("Y", "Y_h", "Y_c")]
    model = helper.make_model(helper.make_graph([node], "lstm", ins, outs, inits),
                              opset_imports=[helper.make_opsetid("", 14)])
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # see OMP_WAIT_POLICY above
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {k: f[k] for k in ("X", "initial_h", "initial_c")}
    return lambda: sess.run(None, feed)


def native(c: dict, f: dict) -> tuple[Callable[[], None], tuple]:
    """The kernel bound once, outputs and workspace allocated once: one foreign call per run."""
    attrs = {"direction": c["direction"], "hidden_size": c["hid"]}
    k = rk.bind("LSTM", f["W"], f["R"], attrs)
    nd = k.attrs.num_directions
    y = np.empty((c["seq"], nd, c["batch"], c["hid"]), np.float32)
    y_h, y_c = (np.empty((nd, c["batch"], c["hid"]), np.float32) for _ in range(2))
    ws = np.empty(k.workspace_floats(c["seq"], c["batch"]), np.float32)
    block = k.args(x=f["X"].ctypes.data, seq=c["seq"], batch=c["batch"], ws=ws.ctypes.data, b=f["B"].ctypes.data,
                   h0=f["initial_h"].ctypes.data, c0=f["initial_c"].ctypes.data, y=y.ctypes.data,
                   y_h=y_h.ctypes.data, y_c=y_c.ctypes.data)
    fn, addr = getattr(rk.library(), rk.ENTRY["LSTM"]), block.ctypes.data
    keep = (k, y, y_h, y_c, ws, block)
    return (lambda: fn(addr)), keep


def reference(c: dict, f: dict) -> Callable[[], list]:
    ref = opdef.lookup("LSTM").reference
    ins = [f["X"], f["W"], f["R"], f["B"], None, f["initial_h"], f["initial_c"]]
    attrs = {"direction": c["direction"], "hidden_size": c["hid"], "_opset": 14, "_num_outputs": 3}
    return lambda: ref(ins, attrs)


def block_time(fn: Callable, sample_s: float) -> float:
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        t = time.perf_counter() - t0
        if t >= sample_s:
            return t / n


def main() -> int:
    a = ARGS
    rows = []
    try:
        import onnxruntime  # noqa: F401
        have_ort = True
    except ImportError:
        have_ort = False
        print("onnxruntime not installed: its column is skipped", file=sys.stderr)
    print(f"threads={a.threads} rounds={a.rounds} sample={a.sample_ms} ms; {a.stat} microseconds per call; "
          f"load average {os.getloadavg()[0]:.2f}")
    head = f"{'case':28s} {'native':>10s} {'numpy':>10s} {'ort':>10s} {'ort/native':>11s} {'numpy/native':>12s}"
    print(head)
    for c in cases(a.quick):
        f = feeds(c)
        run_native, keep = native(c, f)
        cands = {"native": run_native}
        want = reference(c, f)()
        run_native()
        got = keep[1:4]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        if have_ort:  # right after native in every round: their ratio is the one that matters
            cands["ort"] = ort_session(c, f, a.threads)
            for g, w in zip(cands["ort"](), want):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        if not a.no_numpy:
            cands["numpy"] = reference(c, f)
        for fn in cands.values():  # warm-up
            block_time(fn, a.sample_ms / 1e3 / 5)
        times: dict[str, list[float]] = {k: [] for k in cands}
        for _ in range(a.rounds):
            for k, fn in cands.items():
                times[k].append(block_time(fn, a.sample_ms / 1e3))
        stat = statistics.median if a.stat == "median" else min
        med = {k: stat(v) * 1e6 for k, v in times.items()}
        # paired ratios: both sides of a ratio come from the same round, so load that drifts between rounds cancels
        paired = {k: statistics.median(x / n for x, n in zip(v, times["native"])) for k, v in times.items()}
        row = {**c, **{f"{k}_us": v for k, v in med.items()}, **{f"{k}_over_native": v for k, v in paired.items()}}
        rows.append(row)
        nan = float("nan")
        print(f"{c['name']:28s} {med['native']:10.1f} {med.get('numpy', nan):10.1f} {med.get('ort', nan):10.1f}"
              f" {paired.get('ort', nan):10.2f}x {paired.get('numpy', nan):11.1f}x", flush=True)
    if have_ort:
        ratios = [r["ort_over_native"] for r in rows]
        print(f"geometric mean ort/native: {float(np.exp(np.mean(np.log(ratios)))):.2f}x")
    if a.json:
        a.json.write_text(json.dumps({"threads": a.threads, "stat": a.stat, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
