"""Where a compiled model's time goes: every step of one planned call, timed on its own.

    python bench/step_profile.py light_resnet50 1x3x224x224 [--threads 1] [--top 25] [--reps 30] [--in-order]
    python bench/step_profile.py text_det 1x3x320x320 --ort      # + onnxruntime's own per-node profile
    python bench/step_profile.py bert_small 8x128 --precision bf16
    python bench/step_profile.py file 1x16x55x55 --file /tmp/conv.onnx   # any file, one float input

The plan is bound with its native steps kept apart (not joined into one C program). By default each step runs
`--reps` times back to back (hot caches: a lower bound of its share of the real call, where its inputs and
weights may come from L3 or memory); with `--in-order` each step is timed once per call where the call runs it
(its inputs and weights where the steps before left them), the median over `--reps` calls. The table sorts steps
by time, with each step's label (its nodes, a conv's weight shape, the output shape) and, for convs, the rate in
GFLOP/s (direct multiply-adds x 2: Winograd's exceed the machine's peak). `--ort` adds onnxruntime's profile
of the same feed, per node, for a layer-by-layer comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np

from benchutil import limit_threads, option_value
from bf16_bench import SHAPES


def median_time(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def step_details(exe, feed: dict) -> dict[str, tuple[str, float]]:
    """Per step label: its ops (a conv's weight shape, stride and group) and output shape at this feed, and the
    multiply-adds of its convs or products (0 where not counted)."""
    from dynshape.sym import is_expr

    b = exe.generic.build
    _, key = exe.binder(feed)
    env = dict(zip(exe._names, key))
    out: dict[str, tuple[str, float]] = {}
    for st in b.steps:
        nodes = getattr(st, "nodes", None) or (st.node,)
        ops = "+".join(n.attrs.get("op", n.op_type) if n.op_type == "ChannelsLast" else n.op_type for n in nodes)
        shape = [int(d.evaluate(env)) if is_expr(d) else int(d) for d in b.graph.types[st.outputs[0]].shape] \
            if st.outputs and st.outputs[0] in b.graph.types else []
        more, macs = "", 0.0
        for n in nodes:
            if n.attrs.get("op", n.op_type) in ("Conv", "ConvTranspose") and len(n.inputs) > 1:
                w = b.fixed.get(n.inputs[1], b.graph.initializers.get(n.inputs[1]))
                if w is not None:
                    more = f" w{list(w.shape)} s{n.attrs.get('strides', [1])} g{n.attrs.get('group', 1)}"
                    # Conv: per output pixel, OC * C/G * KH * KW; ConvTranspose: per input pixel, C * OC/G * KH * KW
                    v = n.outputs[0] if n.attrs.get("op", n.op_type) == "Conv" else n.inputs[0]
                    dims = b.graph.types[v].shape[:-1]  # channels last
                    pix = np.prod([int(d.evaluate(env)) if is_expr(d) else int(d) for d in dims])
                    macs += float(pix) * int(np.prod(w.shape))
        out[st.label] = (f"[{ops}{more} -> {shape}]", macs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("shape", help="the first input's shape, e.g. 1x3x224x224")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--label-width", type=int, default=130, help="characters of each step's label printed")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--ort", action="store_true", help="also onnxruntime's per-node profile")
    ap.add_argument("--file", default=None,
                    help="profile this ONNX file with the model's feed (e.g. a rewritten copy of a corpus model)")
    ap.add_argument("--precision", default="fp32", help="fp32, bf16, bf16-emulated or int8 (ds.compile's precision)")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="a compile option (dynshape.Options field), e.g. bf16_min_conv_macs=0; repeatable")
    ap.add_argument("--plan-order", action="store_true",
                    help="list the steps in the plan's order (to set beside another runtime's per-layer profile), "
                         "not by time")
    ap.add_argument("--in-order", action="store_true",
                    help="time each step once per call, in the call's order (caches as the call leaves them), "
                         "instead of --reps times back to back")
    args = ap.parse_args()
    limit_threads(args.threads)

    import dynshape as ds
    from dynshape.runtime import plan as plan_mod
    from export_cnn_models import ALL_SPECS, onnx_path, ort_session

    if args.model in ALL_SPECS and (args.file or os.path.exists(onnx_path(args.model))):  # else the corpus's
        spec = ALL_SPECS[args.model]
        env = next((e for e in spec.probes if spec.shape_str(e) == args.shape), None)
        if env is None:
            raise SystemExit(f"{spec.name}: probes are {[spec.shape_str(e) for e in spec.probes]}")
        feed, path, dims, name = spec.make_inputs(env), onnx_path(spec.name), spec.dims, spec.name
    elif args.model in SHAPES:  # the shared bench's BERT and MLP (bench/bf16_bench.py's models), as shipped
        from benchutil import common

        shape = tuple(int(d) for d in args.shape.split("x"))
        feed, path, dims, name = common.make_inputs(args.model, shape), common.onnx_path(args.model), None, args.model
    elif args.model == "file":  # any ONNX file (--file), one float input of this shape, standard normal values
        import onnx

        graph_input = onnx.load(args.file, load_external_data=False).graph.input[0].name
        shape = tuple(int(d) for d in args.shape.split("x"))
        feed = {graph_input: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        path, dims, name = args.file, None, os.path.basename(args.file)
    else:  # a corpus model (bench/zoo_models.py), loaded as shipped: nothing declared
        from zoo_models import BY_NAME

        zm = BY_NAME[args.model]
        labels = [zm.probe_label(i) for i in range(len(zm.probes))]
        if args.shape not in labels:
            raise SystemExit(f"{zm.name}: probes are {labels}")
        feed, path, dims, name = zm.make_feed(labels.index(args.shape)), zm.path(), None, zm.name
    path = args.file or path
    options = {k: option_value(v) for k, v in (o.split("=", 1) for o in args.option)}
    exe = ds.compile(ds.load_onnx(path, dims=dims), strategy="generic", precision=args.precision, **options)
    limit_threads(args.threads)  # compiling loaded dynshape's OpenMP runtime: limit it too
    whole = median_time(lambda: exe.run(feed), args.reps)

    from dynshape.codegen.keep import resolved

    # every native step its own call (its tables' addresses resolved, as the program pass would)
    plan_mod.pack_programs = lambda calls, labels, keep, *_, **__: ([resolved(c) for c in calls], labels)
    exe_split = ds.compile(ds.load_onnx(path, dims=dims), strategy="generic", precision=args.precision,
                           bucket_plans=False, **options)  # the key's own plan at once
    # the plan's words point at this call's output arrays (written in place, then handed to the caller): keep
    # them alive while its steps run again below, or they write into freed memory
    alive = exe_split.run(feed)
    arena = exe_split._pool.arenas[0]
    plan = next(iter(arena.plans.values()))
    details = step_details(exe_split, feed)
    labels = [f"{label} {details[label][0]}" if label in details else label for label in plan.labels]
    macs = [details[label][1] if label in details else 0.0 for label in plan.labels]
    arrays, _ = exe_split.binder(feed)

    def load_inputs() -> None:  # the arena reuses an input's bytes after its last reader: copy them in again
        for view, a in zip(plan.inputs, arrays):
            if view is not None:
                view[...] = a

    if args.in_order:  # each step timed where it runs in the call: its inputs and weights as the call leaves them
        runs = []
        for _ in range(args.reps):
            load_inputs()
            t = [0.0] * len(plan.calls)
            for i, call in enumerate(plan.calls):
                t0 = time.perf_counter()
                call()
                t[i] = time.perf_counter() - t0
            runs.append(t)
        by_step = [(statistics.median(r[i] for r in runs), lb, m) for i, (lb, m) in enumerate(zip(labels, macs))]
    else:  # each step's inputs made by running the call up to it, then the step alone, back to back
        by_step = []
        for i, (call, lb, m) in enumerate(zip(plan.calls, labels, macs)):
            load_inputs()
            for before in plan.calls[:i]:
                before()
            by_step.append((median_time(call, args.reps), lb, m))
    del alive  # (the steps are done)
    total = sum(t for t, _, _ in by_step)
    print(f"{name} {args.shape}, {args.threads} thread(s): whole call {whole * 1e3:.3f} ms, "
          f"{len(by_step)} steps summing to {total * 1e3:.3f} ms")
    for t, label, m in (by_step if args.plan_order else sorted(by_step, key=lambda r: -r[0]))[:args.top]:
        rate = f"{2 * m / t / 1e9:6.1f} GF/s" if m else " " * 11
        print(f"  {t * 1e6:9.1f} us  {100 * t / total:5.1f}%  {rate}  {label[:args.label_width]}")

    if args.ort:
        sess = ort_session(path, args.threads, profile_prefix=os.path.join(tempfile.mkdtemp(), "ort"))
        for _ in range(args.reps):
            sess.run(None, feed)
        prof = sess.end_profiling()
        with open(prof) as f:
            events = json.load(f)
        per_node: dict[tuple, list[float]] = defaultdict(list)
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                a = e["args"]
                shapes = [next(iter(d.values())) for d in a.get("output_type_shape", [])]
                per_node[(a.get("op_name", "?"), e["name"][:-12], str(shapes))].append(e["dur"])
        rows = sorted(((statistics.median(v), *k) for k, v in per_node.items()), reverse=True)
        ort_total = sum(r[0] for r in rows)
        print(f"onnxruntime: {len(rows)} nodes summing to {ort_total / 1e3:.3f} ms (median per node)")
        for us, op, name, shapes in rows[:args.top]:
            print(f"  {us:9.1f} us  {100 * us / ort_total:5.1f}%  {op:16s} {name[:40]} -> {shapes}")


if __name__ == "__main__":
    sys.exit(main())
