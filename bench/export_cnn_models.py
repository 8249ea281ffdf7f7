"""Export issue 12's CNN / RNN benchmark models to ONNX with symbolic dims, and check every export.

    python bench/export_cnn_models.py [--only text_det,vad,light_resnet50,...] [--exporter auto|dynamo|torchscript]
                                      [--threads 1] [--ops]

Models (see cnn_models.py and light_models.py): text_det, text_rec, text_rec_svtr, vad, byte_cls (torch.nn,
seeded random weights, opset 18) and the onnx package's light_* CNNs made symbolic (opset 9). Files go to
$DYNSHAPE_BENCH_MODELS or ~/.cache/dynshape-bench/models (never commit them); cnn_info.json beside them records
per model the exporter used, the exporters that failed and why, the op histogram with the attributes kernels
care about, and the max abs diff of onnxruntime against torch eager (light_*: against the copy with the file's
fixed dims) at every probe.

Exporter choice: the dynamo exporter (torch.export + dynamic_shapes; H, W multiples of 32 as derived dims
32*_H) is tried first and kept only if onnxruntime matches torch eager at *every* probe; otherwise the
TorchScript exporter (dynamic_axes). The check is needed: on torch 2.13 the dynamo exporter writes nn.LSTM's
output Reshape with the example's sequence length as a constant, so any other length silently gives a wrong
shape. Symbol names are normalised afterwards (the graph inputs carry exactly the spec's names; output dims
that are not a plain symbol are left unnamed; intermediate value_info is dropped) so `ds.load_onnx(path,
dims=spec.dims)` binds them.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import sys
import time
import warnings
from typing import Any

import numpy as np
import onnx
from onnx import helper

import ort_util
from cnn_models import BUILDERS, SPECS, Spec
from light_models import LIGHT_SPECS, make_symbolic

ALL_SPECS: dict[str, Spec] = {**SPECS, **LIGHT_SPECS}
OPSET = 18
RTOL, ATOL = 1e-3, 1e-4


def models_dir() -> str:
    """Where the shared benchmark models live (../shared/bench/common.py's convention)."""
    return os.environ.get("DYNSHAPE_BENCH_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dynshape-bench", "models")


def onnx_path(name: str, root: str | None = None) -> str:
    return os.path.join(root or models_dir(), f"{name}.onnx")


# ---- export ---------------------------------------------------------------------------------------------
def _example_env(spec: Spec) -> dict[str, int]:
    """An example shape for tracing: no symbol at 0 or 1 (torch.export specialises those), divisibility kept,
    and W unlike H (equal example values can be read as one symbol)."""
    env = {}
    for s in spec.dims:
        lo, hi, k = spec.sym_range(s)
        env[s] = min(hi, max(-(-max(lo, 2) // k) * k, 2 * k))
    if "H" in env and env.get("W") == env["H"]:
        env["W"] += spec.sym_range("W")[2]
    return env


def _dynamic_shapes(spec: Spec) -> tuple[dict[int, Any], ...]:
    from torch.export import Dim

    made: dict[str, Any] = {}
    for s in spec.dims:
        lo, hi, k = spec.sym_range(s)
        made[s] = Dim(s, min=lo, max=hi) if k == 1 else k * Dim(f"_{s}", min=-(-lo // k), max=hi // k)
    return tuple({a: made[d] for a, d in enumerate(i.shape) if isinstance(d, str)} for i in spec.inputs)


def export_torch(spec: Spec, module: Any, path: str, exporter: str) -> None:
    """Write `module` to `path` with the spec's symbolic dims through one exporter (dynamo | torchscript)."""
    import torch

    example = tuple(torch.from_numpy(v) for v in spec.make_inputs(_example_env(spec)).values())
    names_in = [i.name for i in spec.inputs]
    quiet = io.StringIO()
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(quiet):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            prog = torch.onnx.export(module, example, None, input_names=names_in, output_names=list(spec.outputs),
                                     opset_version=OPSET, dynamo=True, dynamic_shapes=_dynamic_shapes(spec),
                                     external_data=False, verbose=False)
            prog.save(path, external_data=False)
        else:
            axes = {i.name: {a: d for a, d in enumerate(i.shape) if isinstance(d, str)} for i in spec.inputs}
            torch.onnx.export(module, example, path, input_names=names_in, output_names=list(spec.outputs),
                              opset_version=OPSET, dynamo=False, dynamic_axes=axes, do_constant_folding=True)
    normalise_dims(path, spec)


def normalise_dims(path: str, spec: Spec) -> None:
    """Graph inputs get exactly the spec's dim names; output dims that are no plain spec symbol are unnamed;
    intermediate value_info is dropped (it names the exporter's own symbols, s16 or 32*_H)."""
    m = onnx.load(path)
    spec_inputs = {i.name: i for i in m.graph.input}
    rename: dict[str, str] = {}
    for i in spec.inputs:
        for d, want in zip(spec_inputs[i.name].type.tensor_type.shape.dim, i.shape):
            if isinstance(want, str):
                if d.dim_param:
                    rename[d.dim_param] = want
                d.dim_param = want
            else:
                d.dim_value = want
    for o in m.graph.output:
        for d in o.type.tensor_type.shape.dim:
            if d.dim_param:
                new = rename.get(d.dim_param, d.dim_param)
                if new in spec.dims:
                    d.dim_param = new
                else:
                    d.Clear()
    del m.graph.value_info[:]
    onnx.save(m, path)


# ---- checks ---------------------------------------------------------------------------------------------
def ort_session(path_or_bytes: str | bytes, threads: int = 1, profile_prefix: str | None = None) -> Any:
    """onnxruntime as the benchmarks run it (ort_util.ort_session), its log at fatal only: a failing export's check
    raises, and onnxruntime's own log line is noise beside it."""
    return ort_util.ort_session(path_or_bytes, threads, profile_prefix, log_level=4)


def _max_diff(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[float, bool]:
    diff, ok = 0.0, True
    for a, b in zip(got, want):
        if a.shape != b.shape:
            return float("inf"), False
        diff = max(diff, float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0)
        ok = ok and bool(np.allclose(a, b, rtol=RTOL, atol=ATOL))
    return diff, ok


def check_vs_torch(spec: Spec, module: Any, path: str, threads: int = 1,
                   envs: tuple[dict[str, int], ...] | None = None) -> dict[str, Any]:
    """onnxruntime against torch eager at every probe (or `envs`): {shape: max abs diff}, and whether all are
    allclose at rtol 1e-3 / atol 1e-4."""
    import torch

    sess = ort_session(path, threads)
    diffs: dict[str, float] = {}
    ok_all = True
    for env in envs or spec.probes:
        feed = spec.make_inputs(env, seed=3)
        with torch.no_grad():
            ref = module(*[torch.from_numpy(v) for v in feed.values()])
        ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
        diff, ok = _max_diff(sess.run(None, feed), [r.numpy() for r in ref])
        diffs[spec.shape_str(env)] = diff
        ok_all = ok_all and ok
    return {"max_abs_diff": diffs, "ok": ok_all}


def check_light(spec: Spec, static: onnx.ModelProto, path: str, threads: int = 1) -> dict[str, Any]:
    """The symbolic copy against the fixed-dims copy at 1x3x224x224, and that it runs at every probe."""
    sym = ort_session(path, threads)
    ref = ort_session(static.SerializeToString(), threads)
    env = spec.probes[0]
    feed = spec.make_inputs(env, seed=3)
    diff, ok = _max_diff(sym.run(None, feed), ref.run(None, feed))
    shapes = {}
    for e in spec.probes:
        outs = sym.run(None, spec.make_inputs(e, seed=3))
        shapes[spec.shape_str(e)] = [list(o.shape) for o in outs]
        ok = ok and all(np.isfinite(o).all() for o in outs)
    return {"max_abs_diff": {spec.shape_str(env) + " (vs fixed-dims copy)": diff}, "ok": ok, "ran_at": shapes}


def dynshape_loads(spec: Spec, path: str) -> str:
    """'ok' if dynshape loads the file with the spec's dims (shape inference included), else the error."""
    try:
        import dynshape as ds

        ds.load_onnx(path, dims=spec.dims)
        return "ok"
    except Exception as e:  # noqa: BLE001 - reported, not raised: LSTM is not supported yet
        return f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"


# ---- op histogram ---------------------------------------------------------------------------------------
def _attrs(n: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in n.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _fmt(vals: Any) -> str:
    return "x".join(str(v) for v in vals) if isinstance(vals, (list, tuple)) else str(vals)


def op_summary(model: onnx.ModelProto) -> dict[str, Any]:
    """Op histogram, plus per op the attribute combinations that decide a kernel (count of each).

    Conv/ConvTranspose: kernel, groups (dw = depthwise), strides, dilations, pads, auto_pad; pools: kernel,
    strides, pads, ceil_mode, count_include_pad; Resize/Upsample: mode, coordinate_transformation_mode,
    nearest_mode; LSTM/GRU/RNN: direction, layout, hidden_size; Pad: mode; Reshape/Transpose ranks and perms.
    """
    g = model.graph
    shapes = {t.name: list(t.dims) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR:
            shapes[n.output[0]] = list(n.attribute[0].t.dims)
    hist = collections.Counter(n.op_type for n in g.node)
    detail: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for n in g.node:
        a = _attrs(n)
        op = n.op_type
        if op in ("Conv", "ConvTranspose"):
            w = shapes.get(n.input[1], [])
            k = w[2:] or a.get("kernel_shape", "?")
            grp = a.get("group", 1)
            cin = (w[1] * grp) if (w and op == "Conv") else (w[0] if w else "?")
            kind = "dw" if (grp > 1 and op == "Conv" and w and w[1] == 1) else f"g{grp}" if grp > 1 else "dense"
            parts = [f"k{_fmt(k)}", kind, f"{cin}->{(w[0] if op == 'Conv' else w[1] * grp) if w else '?'}",
                     f"s{_fmt(a.get('strides', 1))}"]
            if any(d != 1 for d in a.get("dilations", [1])):
                parts.append(f"d{_fmt(a['dilations'])}")
            if "pads" in a and any(a["pads"]):
                parts.append(f"p{_fmt(a['pads'])}")
            if a.get("auto_pad", "NOTSET") != "NOTSET":
                parts.append(a["auto_pad"])
            if op == "ConvTranspose" and "output_padding" in a:
                parts.append(f"op{_fmt(a['output_padding'])}")
            parts.append("bias" if len(n.input) > 2 and n.input[2] else "nobias")
            detail[op][" ".join(parts)] += 1
        elif op in ("MaxPool", "AveragePool", "LpPool"):
            parts = [f"k{_fmt(a.get('kernel_shape'))}", f"s{_fmt(a.get('strides', 1))}"]
            if "pads" in a and any(a["pads"]):
                parts.append(f"p{_fmt(a['pads'])}")
            for key in ("ceil_mode", "count_include_pad", "auto_pad", "dilations"):
                if key in a and a[key] not in (0, "NOTSET", [1, 1], [1]):
                    parts.append(f"{key}={_fmt(a[key])}")
            detail[op][" ".join(parts)] += 1
        elif op in ("Resize", "Upsample"):
            by = "scales" if len(n.input) > 2 and n.input[2] else "sizes" if len(n.input) > 3 else "scales-input"
            detail[op][" ".join(f"{k}={a[k]}" for k in ("mode", "coordinate_transformation_mode", "nearest_mode")
                                if k in a) + f" by {by}"] += 1
        elif op in ("LSTM", "GRU", "RNN"):
            a = {"direction": "forward", "layout": 0, **a}  # the ONNX defaults, shown when absent
            parts = [f"{k}={a[k]}" for k in ("direction", "layout", "hidden_size", "linear_before_reset",
                                             "input_forget", "clip", "activations") if k in a]
            opt = [nm for nm, x in zip(["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"],
                                       n.input) if x][4:]
            detail[op][" ".join(parts) + (f" inputs+{','.join(opt)}" if opt else "")] += 1
        elif op in ("Pad", "Transpose", "Softmax", "HardSigmoid", "LRN", "Gemm", "Concat", "Split", "Gather",
                    "ReduceMean", "ReduceMax", "LeakyRelu", "Clip", "Dropout", "Unsqueeze", "Squeeze",
                    "Flatten", "BatchNormalization", "LayerNormalization"):
            keep = {k: v for k, v in a.items() if k not in ("value", "training_mode") and not isinstance(v, bytes)}
            if keep:
                detail[op][" ".join(f"{k}={_fmt(v)}" for k, v in sorted(keep.items()))] += 1
    return {"n_nodes": len(g.node), "op_histogram": dict(hist.most_common()),
            "attributes": {k: dict(v.most_common()) for k, v in sorted(detail.items())},
            "opset": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
            "params": int(sum(int(np.prod(t.dims)) for t in g.initializer
                              if t.data_type == onnx.TensorProto.FLOAT))}


# ---- driver ---------------------------------------------------------------------------------------------
def export_one(name: str, root: str, exporter: str, threads: int) -> dict[str, Any]:
    """Build, export and check one model; the record that goes to cnn_info.json."""
    spec = ALL_SPECS[name]
    path = onnx_path(name, root)
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"about": spec.about, "dims": spec.dims,
                           "probes": [spec.shape_str(e) for e in spec.probes]}
    if spec.source == "light":
        static, sym = make_symbolic(name)
        onnx.save(sym, path)
        rec["exporter"] = "onnx rewrite (light_models.make_symbolic)"
        rec.update(check_light(spec, static, path, threads))
    else:
        module = BUILDERS[name]()
        order = {"auto": ["dynamo", "torchscript"], "dynamo": ["dynamo"], "torchscript": ["torchscript"]}[exporter]
        failed: dict[str, str] = {}
        for exp in order:
            try:
                t = time.perf_counter()
                export_torch(spec, module, path, exp)
                onnx.checker.check_model(path)
                check = check_vs_torch(spec, module, path, threads)
                if not check["ok"]:
                    raise AssertionError(f"onnxruntime differs from torch eager: {check['max_abs_diff']}")
                rec.update(check, exporter=exp, export_s=round(time.perf_counter() - t, 2))
                break
            except Exception as e:  # noqa: BLE001 - recorded; the next exporter is tried
                failed[exp] = f"{type(e).__name__}: {str(e).splitlines()[0][:400] if str(e) else ''}"
        else:
            rec["error"] = failed
        if failed:
            rec["failed_exporters"] = failed
        if "error" in rec and os.path.exists(path):
            os.remove(path)
    if os.path.exists(path):
        rec.update(op_summary(onnx.load(path)), file_mb=round(os.path.getsize(path) / 2**20, 2))
        rec["dynshape_load"] = dynshape_loads(spec, path)
    rec["total_s"] = round(time.perf_counter() - t0, 1)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    ap.add_argument("--exporter", default="auto", choices=["auto", "dynamo", "torchscript"])
    ap.add_argument("--threads", type=int, default=1, help="onnxruntime threads for the checks")
    ap.add_argument("--ops", action="store_true", help="print each model's op histogram and attributes")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(ALL_SPECS)
    unknown = [n for n in names if n not in ALL_SPECS]
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; known: {', '.join(ALL_SPECS)}")
    root = models_dir()
    os.makedirs(root, exist_ok=True)
    info_path = os.path.join(root, "cnn_info.json")
    info = json.load(open(info_path)) if os.path.exists(info_path) else {}
    for name in names:
        rec = export_one(name, root, args.exporter, args.threads)
        info[name] = rec
        with open(info_path, "w") as f:
            json.dump(info, f, indent=1, default=str)
        if "error" in rec:
            print(f"{name:20s} FAILED: {rec['error']}", flush=True)
            continue
        diffs = ", ".join(f"{k} {v:.1e}" for k, v in rec["max_abs_diff"].items())
        fell = f" (after {', '.join(rec['failed_exporters'])} failed)" if rec.get("failed_exporters") else ""
        print(f"{name:20s} {'ok ' if rec['ok'] else 'BAD'} {rec['exporter']}{fell}; {rec['n_nodes']} nodes, "
              f"{rec['params'] / 1e6:.2f}M params, {rec['file_mb']} MB; max|ort-ref| {diffs}; "
              f"dynshape load: {rec['dynshape_load'][:80]}; {rec['total_s']} s", flush=True)
        if args.ops:
            print("   ops:", rec["op_histogram"])
            for op, d in rec["attributes"].items():
                print(f"   {op}: {d}")
    print(f"info: {info_path}")


if __name__ == "__main__":
    main()
