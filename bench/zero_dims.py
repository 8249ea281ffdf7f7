"""Zero-sized dims through the reference executor: every node-suite case, every input axis emptied in turn.

For each case (its model made symbolic, as the suite's --symbolic mode does) and each axis of each tensor input,
the input is cut to length 0 along that axis and run through onnx's own ReferenceEvaluator. Where ONNX's
evaluator accepts it, dynshape must too (`ds.load_onnx(model).run`) and produce outputs of the same shapes and
values. Prints a count per outcome and every disagreement:

    ref-error      dynshape raised where ONNX ran (a ShapeError is a shape-rule bug; a ConstraintViolation
                   rejects an input the op allows)
    mismatch       both ran, outputs differ (shape, dtype or values)

Usage: python bench/zero_dims.py [--data DIR] [--filter REGEX] [--jobs 2] [--json out.json] [--compiled]
(--compiled runs `ds.compile(graph).run` instead of `graph.run`)
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing as mp
import os
import re
import signal
import sys
from typing import Any

import numpy as np

DATA = os.environ.get("ONNX_SUITE_DATA") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "onnx_node_suite")
SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared")


def _inputs(case_dir: str, model: Any) -> list:
    sys.path.insert(0, SHARED)
    import onnx_node_suite as suite

    inits = {i.name for i in model.graph.initializer}
    graph_inputs = [vi for vi in model.graph.input if vi.name not in inits]
    ds0 = sorted(glob.glob(os.path.join(case_dir, "test_data_set_*")))[0]
    n = len(glob.glob(os.path.join(ds0, "input_*.pb")))
    return [suite._load_pb(os.path.join(ds0, f"input_{i}.pb"), graph_inputs[i].type) for i in range(n)], \
        graph_inputs[:n]


def _same(a: Any, b: Any) -> str | None:
    if isinstance(a, list) or isinstance(b, list):
        if not (isinstance(a, list) and isinstance(b, list)) or len(a) != len(b):
            return "sequence lengths differ"
        return next((m for m in (_same(x, y) for x, y in zip(a, b)) if m), None)
    if a is None or b is None:
        return None if a is None and b is None else "one output is None"
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shape {a.shape} != onnx's {b.shape}"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} != onnx's {b.dtype}"
    if a.dtype == object or a.size == 0:
        return None if a.dtype != object or (a == b).all() else "strings differ"
    try:
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-3, atol=1e-5)
    except (AssertionError, TypeError, ValueError):
        return "values differ"
    return None


def _alarm(*_: Any) -> None:
    raise TimeoutError


COMPILED = False


def _init(compiled: bool) -> None:
    global COMPILED
    COMPILED = compiled


def check_case(case_dir: str) -> list[dict]:
    import onnx
    from onnx.reference import ReferenceEvaluator

    import dynshape as ds

    sys.path.insert(0, SHARED)
    import onnx_node_suite as suite

    name = os.path.basename(case_dir)
    model = onnx.load(os.path.join(case_dir, "model.onnx"))
    try:
        feeds, vis = _inputs(case_dir, model)
    except Exception:
        return []
    model, _ = suite.symbolize_model(model)
    out: list[dict] = []
    for i, (x, vi) in enumerate(zip(feeds, vis)):
        if not isinstance(x, np.ndarray) or x.ndim == 0:
            continue
        for axis in range(x.ndim):
            if x.shape[axis] == 0:
                continue
            cut = list(feeds)
            cut[i] = np.take(x, np.arange(0), axis=axis)
            item = {"case": name, "input": vi.name, "axis": axis}
            signal.signal(signal.SIGALRM, _alarm)
            signal.alarm(20)
            try:
                try:
                    want = ReferenceEvaluator(model).run(None, {v.name: f for v, f in zip(vis, cut)})
                except TimeoutError:
                    raise
                except Exception:
                    continue  # ONNX's evaluator refuses it: the op does not allow this empty input
                try:
                    g = ds.load_onnx(model)
                    run = ds.compile(g).run if COMPILED else g.run
                    got_map = run({v.name: f for v, f in zip(g.inputs, cut)})
                    got = [got_map[v.name] for v in g.outputs]
                except TimeoutError:
                    raise
                except Exception as e:
                    out.append({**item, "outcome": "ref-error", "error": f"{type(e).__name__}: {e}"[:400]})
                    continue
                diff = next((m for m in (_same(a, b) for a, b in zip(got, want)) if m), None)
                out.append({**item, "outcome": "mismatch" if diff else "ok", "error": diff})
            except TimeoutError:
                out.append({**item, "outcome": "timeout", "error": None})
            finally:
                signal.alarm(0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--filter", default=None)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--compiled", action="store_true")
    args = ap.parse_args()
    dirs = sorted(glob.glob(os.path.join(args.data, "node", "*")))
    if args.filter:
        dirs = [d for d in dirs if re.search(args.filter, os.path.basename(d))]
    with mp.get_context("spawn").Pool(args.jobs, _init, (args.compiled,), maxtasksperchild=50) as pool:
        results = [r for rs in pool.imap_unordered(check_case, dirs, chunksize=4) for r in rs]
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print(json.dumps(counts))
    for r in sorted(results, key=lambda r: (r["outcome"], r["case"])):
        if r["outcome"] != "ok":
            print(f"{r['outcome']:9s} {r['case']} input {r['input']!r} axis {r['axis']}: {r['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
