"""Malformed-model fuzzer: mutants of a dozen seed models, each loaded, compiled and run by dynshape in a worker
process with a timeout, and compared with onnxruntime wherever both accept it.

The only outcomes allowed (issue 15): a correct result, a `DynshapeError` subclass, or a hang onnxruntime shares.
Every case is reproducible from its number: case i mutates seed `SEEDS[i % 13]` with `random.Random(hash of
(--seed, i))`, one to three mutations, about a sixth of them byte-level (flips, truncation, insertions in the
serialised protobuf), the rest protobuf-level (attribute values and types, node inputs/outputs/op types,
initializer values/dims/dtypes/external data, graph input/output types and dims, opset imports, node order).

Outcomes, per case:
    clean_error       dynshape raised a DynshapeError (split by whether onnxruntime also refused)
    correct           dynshape ran and agrees with onnxruntime (or, where onnxruntime refused, its compiled
                      executable agrees with its reference executor)
    other_exception   dynshape raised anything else                                  (must be 0)
    crash             the worker died in dynshape (a signal)                        (must be 0)
    wrong_result      outputs differ from onnxruntime, or compiled from reference   (must be 0)
    hang              dynshape timed out and onnxruntime did not                    (must be 0)
    hang_shared       both time out (huge trip counts)
`wrapped` counts clean errors that still quote a raw Python exception (quality, not correctness).

onnxruntime runs with its graph optimisations off (FUZZ_ORT_OPTIMIZE=1 turns them on): with them on it accepts
models that break ONNX's semantics and its own unoptimised kernels, e.g. `Gather(Shape(x), 255)` or a Reshape
whose element counts differ when the target comes from a Shape -> Gather -> Concat chain (it returns the
unmutated model's result), which would count dynshape's correct refusals as disagreements.

Usage:
    python bench/fuzz_models.py --cases 4000 [--jobs 2] [--seed 0] [--timeout 30] [--json out.json]
                                [--save-failures DIR] [--case N]   (one case, verbose)
A bounded run is in tests/hardening/test_fuzz_models.py (CI).
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import random
import selectors
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import onnx  # noqa: E402
from onnx import AttributeProto, TensorProto  # noqa: E402

from fuzz_seeds import SEEDS, Seed  # noqa: E402

MUST_BE_ZERO = ("other_exception", "crash", "wrong_result", "hang")
NONFINITE = "non-finite values differ"
RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
              "Dropout"}
INTS = [0, 1, -1, 2, 3, -2, 7, 64, 255, 1 << 16, 2**31 - 1, 2**31, 2**32, -(2**31), 2**62, -(2**63), 2**63 - 1]
FLOATS = [0.0, -1.0, 1e-30, 1e30, float("inf"), float("-inf"), float("nan"), 0.5, 3.0]
STRINGS = ["", "SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET", "linear", "cubic", "nearest", "reflect", "edge",
           "DCR", "CRD", "\x00", "x" * 300, "half_pixel", "tf_crop_and_resize", "round_prefer_ceil"]
OPS = ["Add", "Mul", "Sub", "Div", "Relu", "Softmax", "LogSoftmax", "Transpose", "Reshape", "Gather", "Conv",
       "MaxPool", "AveragePool", "Concat", "Slice", "Squeeze", "Unsqueeze", "Expand", "Tile", "Pad", "TopK", "Cast",
       "ReduceSum", "ReduceMean", "MatMul", "Gemm", "Where", "Range", "ConstantOfShape", "Resize", "Identity",
       "LayerNormalization", "Gelu", "Flatten", "Split", "CumSum", "ArgMax", "Shape", "Size", "NonZero", "Equal",
       "Less", "Not", "Abs", "Sqrt", "Pow", "Einsum", "GatherND", "ScatterND", "OneHot", "DepthToSpace",
       "SpaceToDepth", "InstanceNormalization", "BatchNormalization", "GlobalMaxPool", "ConvTranspose", "Upsample",
       "Frobnicate", "Mod", "BitShift", "Trilu", "ReverseSequence", "Compress", "Hardmax", "Col2Im", "GridSample"]
ATTR_NAMES = ["axis", "axes", "perm", "pads", "strides", "kernel_shape", "dilations", "group", "keepdims", "to",
              "mode", "epsilon", "alpha", "transA", "transB", "k", "largest", "sorted", "exclusive", "reverse",
              "blocksize", "ceil_mode", "auto_pad", "output_padding", "coordinate_transformation_mode", "value"]


# ---- mutation ---------------------------------------------------------------------------------------------------
def _nodes(g: onnx.GraphProto) -> list[tuple[onnx.GraphProto, onnx.NodeProto]]:
    """Every (graph, node) pair, subgraphs included."""
    out = []
    for n in g.node:
        out.append((g, n))
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                out += _nodes(a.g)
            for sub in a.graphs:
                out += _nodes(sub)
    return out


def _values(m: onnx.ModelProto) -> list[str]:
    g = m.graph
    return [*(i.name for i in g.input), *(t.name for t in g.initializer), *(o for n in g.node for o in n.output)]


def _mutate_attr(m: onnx.ModelProto, r: random.Random) -> str:
    pairs = _nodes(m.graph)
    _, n = r.choice(pairs)
    attrs = [a for a in n.attribute if a.type != AttributeProto.GRAPH]
    what = r.random()
    if not attrs or what < 0.15:
        name = r.choice(ATTR_NAMES)
        a = n.attribute.add()
        a.name = name
        if r.random() < 0.5:
            a.type, a.i = AttributeProto.INT, r.choice(INTS)
        else:
            a.type = AttributeProto.INTS
            a.ints.extend(r.choice(INTS) for _ in range(r.randint(0, 5)))
        return f"{n.name}: add attribute {name}"
    a = r.choice(attrs)
    if what < 0.25:
        n.attribute.remove(a)
        return f"{n.name}: remove attribute {a.name}"
    if what < 0.32:  # retype
        a.type = r.choice([AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.STRING, AttributeProto.INTS])
        return f"{n.name}: attribute {a.name} retyped"
    if a.type == AttributeProto.INT:
        a.i = r.choice(INTS)
        return f"{n.name}: {a.name} = {a.i}"
    if a.type == AttributeProto.INTS:
        ints = list(a.ints)
        op = r.random()
        if ints and op < 0.5:
            ints[r.randrange(len(ints))] = r.choice(INTS)
        elif op < 0.75:
            ints.insert(r.randint(0, len(ints)), r.choice(INTS))
        elif ints:
            ints.pop(r.randrange(len(ints)))
        del a.ints[:]
        a.ints.extend(ints)
        return f"{n.name}: {a.name} = {ints}"
    if a.type == AttributeProto.FLOAT:
        a.f = r.choice(FLOATS)
        return f"{n.name}: {a.name} = {a.f}"
    if a.type == AttributeProto.STRING:
        a.s = r.choice(STRINGS).encode()
        return f"{n.name}: {a.name} = {a.s[:20]!r}"
    if a.type == AttributeProto.TENSOR:
        _mutate_tensor(a.t, r)
        return f"{n.name}: tensor attribute {a.name} changed"
    return f"{n.name}: attribute {a.name} untouched"


def _mutate_io(m: onnx.ModelProto, r: random.Random) -> str:
    g, n = r.choice(_nodes(m.graph))
    names = _values(m)
    what = r.random()
    ins = list(n.input)
    if what < 0.2 and ins:
        ins.pop(r.randrange(len(ins)))
        desc = "drop an input"
    elif what < 0.4:
        ins.insert(r.randint(0, len(ins)), r.choice(names) if names else "x")
        desc = "extra input"
    elif what < 0.55 and ins:
        ins[r.randrange(len(ins))] = ""
        desc = "empty input"
    elif what < 0.75 and ins:
        ins[r.randrange(len(ins))] = r.choice(names)
        desc = "input rewired"
    elif what < 0.85:
        outs = list(n.output)
        if r.random() < 0.5 and outs:
            outs.pop()
        else:
            outs.append(f"extra_{r.randrange(99)}")
        del n.output[:]
        n.output.extend(outs)
        return f"{n.name}: outputs {outs}"
    else:
        n.op_type = r.choice(OPS)
        return f"{n.name}: op -> {n.op_type}"
    del n.input[:]
    n.input.extend(ins)
    return f"{n.name}: {desc} -> {ins}"


def _mutate_tensor(t: TensorProto, r: random.Random) -> str:
    import numpy as np
    from onnx import numpy_helper

    what = r.random()
    if what < 0.45 and t.data_location != TensorProto.EXTERNAL:
        try:
            a = numpy_helper.to_array(t).copy()
        except Exception:
            return "undecodable"
        if a.size:
            flat = a.reshape(-1)
            i = r.randrange(flat.size)
            if a.dtype.kind == "f":
                flat[i] = r.choice(FLOATS)
            elif a.dtype.kind in "iu":
                info = np.iinfo(a.dtype)
                flat[i] = max(info.min, min(info.max, r.choice(INTS)))
        t.CopyFrom(numpy_helper.from_array(a, t.name))
        return "value"
    if what < 0.6:
        dims = list(t.dims)
        if dims and r.random() < 0.6:
            dims[r.randrange(len(dims))] = r.choice([0, 1, 2, 3, 5, 1 << 20, -1])
        else:
            dims.append(r.choice([1, 2]))
        del t.dims[:]
        t.dims.extend(dims)
        return f"dims {dims}"
    if what < 0.75:
        t.data_type = r.choice([TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL,
                                TensorProto.STRING, TensorProto.FLOAT16, TensorProto.DOUBLE, 0, 99])
        return f"dtype {t.data_type}"
    if what < 0.87 and t.raw_data:
        t.raw_data = t.raw_data[: r.randrange(len(t.raw_data))]
        return "truncated"
    t.data_location = TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", r.choice(["w.bin", "../w.bin", "/etc/passwd", ""])
    return f"external {e.value!r}"


def _mutate_init(m: onnx.ModelProto, r: random.Random) -> str:
    inits = list(m.graph.initializer)
    if not inits:
        return _mutate_attr(m, r)
    t = r.choice(inits)
    return f"initializer {t.name}: {_mutate_tensor(t, r)}"


def _mutate_types(m: onnx.ModelProto, r: random.Random) -> str:
    g = m.graph
    vis = [*g.input, *g.output]
    vi = r.choice(vis)
    tt = vi.type.tensor_type
    what = r.random()
    if what < 0.2:
        tt.elem_type = r.choice([TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL,
                                 TensorProto.DOUBLE, TensorProto.STRING, TensorProto.FLOAT16, 0])
        return f"{vi.name}: elem_type {tt.elem_type}"
    if what < 0.55 and tt.HasField("shape") and tt.shape.dim:
        d = r.choice(tt.shape.dim)
        if r.random() < 0.5:
            d.dim_value = r.choice([0, 1, 2, 3, 7, 1 << 20, 10**9])
        else:
            d.dim_param = r.choice(["N", "B", "S", "H", "W", "L", "batch", "fresh", "?"])
        return f"{vi.name}: a dim -> {d}"
    if what < 0.7 and tt.HasField("shape"):
        if r.random() < 0.5 and tt.shape.dim:
            del tt.shape.dim[r.randrange(len(tt.shape.dim))]
        else:
            tt.shape.dim.add().dim_value = r.choice([1, 2])
        return f"{vi.name}: rank changed"
    if what < 0.8:
        tt.ClearField("shape")
        return f"{vi.name}: shape removed"
    if what < 0.9 and len(g.output) > 0 and vi in list(g.output):
        g.output.remove(vi)
        return f"output {vi.name} removed"
    vi.name = r.choice(_values(m))
    return f"value info renamed to {vi.name}"


def _mutate_graph(m: onnx.ModelProto, r: random.Random) -> str:
    g = m.graph
    what = r.random()
    if what < 0.25:
        m.opset_import[0].version = r.choice([0, 1, 6, 9, 10, 11, 13, 17, 20, 21, 23, 28, 29, 1000])
        return f"opset {m.opset_import[0].version}"
    if what < 0.35:
        m.ir_version = r.choice([0, 1, 3, 7, 8, 10, 99])
        return f"ir_version {m.ir_version}"
    nodes = list(g.node)
    if what < 0.55 and nodes:
        i = r.randrange(len(nodes))
        del g.node[i]
        return f"node {nodes[i].name} removed"
    if what < 0.7 and nodes:
        g.node.append(r.choice(nodes))
        return "node duplicated"
    if what < 0.85 and nodes:
        r.shuffle(nodes)
        del g.node[:]
        g.node.extend(nodes)
        return "nodes shuffled"
    n = r.choice([n for _, n in _nodes(g)])
    n.domain = r.choice(["com.microsoft", "ai.onnx.ml", "acme", "ai.onnx"])
    return f"{n.name}: domain {n.domain}"


def _mutate_bytes(data: bytes, r: random.Random) -> tuple[bytes, str]:
    b = bytearray(data)
    what = r.random()
    if what < 0.5:
        for _ in range(r.randint(1, 8)):
            b[r.randrange(len(b))] = r.randrange(256)
        return bytes(b), "bytes flipped"
    if what < 0.7:
        return bytes(b[: r.randrange(len(b))]), "truncated"
    at = r.randrange(len(b))
    return bytes(b[:at] + bytes(r.randrange(256) for _ in range(r.randint(1, 16))) + b[at:]), "bytes inserted"


def _mutate_gentle(m: onnx.ModelProto, r: random.Random) -> str:
    """A plausible change (small attribute values, small integer constants, small input dims): mutants that
    mostly still load, so the compiler and the run time see odd but valid models."""
    import numpy as np
    from onnx import numpy_helper

    small = list(range(-3, 9))
    what = r.random()
    ints = [(n, a) for _, n in _nodes(m.graph) for a in n.attribute if a.type in (AttributeProto.INT,
                                                                                    AttributeProto.INTS)]
    if what < 0.45 and ints:
        n, a = r.choice(ints)
        if a.type == AttributeProto.INT:
            a.i = r.choice(small)
        elif a.ints:
            a.ints[r.randrange(len(a.ints))] = r.choice(small)
        return f"{n.name}: {a.name} -> {a.i if a.type == AttributeProto.INT else list(a.ints)}"
    int_inits = [t for t in m.graph.initializer if t.data_type in (TensorProto.INT64, TensorProto.INT32)
                 and t.data_location != TensorProto.EXTERNAL]
    if what < 0.8 and int_inits:
        t = r.choice(int_inits)
        a = numpy_helper.to_array(t).copy()
        if a.size:
            a.reshape(-1)[r.randrange(a.size)] = r.choice(small)
        t.CopyFrom(numpy_helper.from_array(np.asarray(a), t.name))
        return f"initializer {t.name} -> {a.reshape(-1).tolist()[:8]}"
    vis = [vi for vi in m.graph.input if vi.type.tensor_type.shape.dim]
    if vis:
        vi = r.choice(vis)
        d = r.choice(vi.type.tensor_type.shape.dim)
        d.dim_value = r.choice([0, 1, 2, 3, 5, 9])
        return f"input {vi.name}: a dim -> {d.dim_value}"
    return _mutate_attr(m, r)


MUTATORS = [(_mutate_attr, 0.22), (_mutate_io, 0.14), (_mutate_init, 0.12), (_mutate_types, 0.12),
            (_mutate_graph, 0.1), (_mutate_gentle, 0.3)]


def make_case(i: int, base_seed: int = 0) -> tuple[Seed, bytes, list[str]]:
    """Case i: (seed, mutant bytes, what was done): deterministic."""
    seed = SEEDS[i % len(SEEDS)]
    r = random.Random(base_seed * 1_000_003 + i)
    m = seed.build()
    done = []
    for _ in range(r.choice([1, 1, 2, 3])):
        fn = r.choices([f for f, _ in MUTATORS], [w for _, w in MUTATORS])[0]
        try:
            done.append(fn(m, r))
        except Exception as e:  # noqa: BLE001 - a mutation that does not apply to this (already mutated) model
            done.append(f"skipped ({type(e).__name__})")
    data = m.SerializeToString()
    if r.random() < 0.17:
        data, what = _mutate_bytes(data, r)
        done.append(what)
    return seed, data, done


# ---- running one case (in the worker) -------------------------------------------------------------------------
def make_feed(data: bytes, seed: Seed, r: random.Random) -> tuple[dict, bool]:
    """Valid-looking inputs for the mutant's declared inputs (symbols at the seed's values); huge ones are
    zero-strided views (dynshape gets them; onnxruntime is skipped: it would copy them)."""
    import numpy as np
    from onnx import helper

    try:
        m = onnx.load_from_string(data)
    except Exception:
        return {}, False
    inits = {t.name for t in m.graph.initializer}
    rng = np.random.default_rng(r.randrange(2**31))
    feed, huge = {}, False
    for vi in m.graph.input:
        if vi.name in inits or vi.type.WhichOneof("value") != "tensor_type":
            continue
        tt = vi.type.tensor_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type != TensorProto.STRING \
                else np.dtype(object)
        except Exception:
            continue
        shape = []
        for d in (tt.shape.dim if tt.HasField("shape") else []):
            shape.append(d.dim_value if d.HasField("dim_value") else seed.env.get(d.dim_param, 2))
        if not tt.HasField("shape"):
            shape = [2]
        if any(s < 0 for s in shape):
            continue
        n = int(np.prod(shape)) if shape else 1
        if n > 1 << 22:
            try:
                feed[vi.name] = np.broadcast_to(np.zeros((), dtype), shape)
            except ValueError:  # more bytes than any array may have (case 13445, seed 4242: it killed the worker,
                pass  # counted as a crash in dynshape): left out, which dynshape must refuse by name
            huge = True
            continue
        lo, hi = seed.int_ranges.get(vi.name, (0, 3))
        if dtype.kind == "f":
            a = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            a = rng.integers(lo, hi, shape).astype(dtype)
        elif dtype.kind == "b":
            a = rng.random(shape) < 0.5
        elif dtype.kind == "O":
            a = np.array(rng.choice(["a", "bc", ""], shape), dtype=object).reshape(shape)
        else:
            a = np.zeros(shape, dtype)
        feed[vi.name] = a
    return feed, huge


def _site(tb: Any) -> str:
    """The innermost dynshape frame of a traceback: where an unclean exception escaped from."""
    frames = [f for f in traceback.extract_tb(tb) if "dynshape" in f.filename]
    f = frames[-1] if frames else traceback.extract_tb(tb)[-1]
    return f"{Path(f.filename).name}:{f.lineno} ({f.name})"


def _same(a: Any, b: Any, rtol: float = 1e-3) -> str | None:
    """None when two outputs agree (shape, dtype, values within `rtol`), else why not."""
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} vs {b.dtype}"
    if a.dtype == object or a.dtype.kind in "biuSU":
        return None if np.array_equal(a, b) else "values differ"
    fa, fb = a.reshape(-1), b.reshape(-1)
    nonfinite = False
    for at in range(0, fa.size, _CHUNK):  # in chunks: a mutant's huge output must not exhaust the worker's memory
        try:
            x, y = fa[at:at + _CHUNK].astype(np.float64), fb[at:at + _CHUNK].astype(np.float64)
        except (TypeError, ValueError):
            return None if np.array_equal(a, b) else "values differ"
        both = np.isfinite(x) & np.isfinite(y)
        if not np.allclose(x[both], y[both], rtol=rtol, atol=1e-4):
            return f"values differ (max |d| {np.max(np.abs(x[both] - y[both])):.3g})"
        if not np.array_equal(np.isnan(x), np.isnan(y)) or not np.array_equal(x[np.isinf(x)], y[np.isinf(x)]):
            nonfinite = True
    # nan against inf, or overflow in one summation order: IEEE edge cases, reported apart
    return NONFINITE if nonfinite else None


_CHUNK = 1 << 20


def run_dynshape(data: bytes, feed: dict, rtol: float = 1e-3) -> tuple[dict, Any]:
    """Load, compile and run; compare the compiled executable with the reference executor (`rtol` 1e-2 for huge
    feeds: float32 sums over millions of elements differ by summation order, in onnxruntime too)."""
    import dynshape as ds

    try:
        g = ds.load_onnx(data)
        exe = ds.compile(g)
        out = exe.run(dict(feed))
    except ds.DynshapeError as e:
        msg = str(e).splitlines()[0][:300]
        wrapped = any(f"{n}:" in str(e) for n in ("IndexError", "TypeError", "ValueError", "KeyError",
                                                    "AttributeError", "ZeroDivisionError", "AssertionError"))
        return {"status": "clean", "error": f"{type(e).__name__}: {msg}", "wrapped": wrapped}, None
    except Exception as e:  # noqa: BLE001 - exactly what the fuzzer looks for
        return {"status": "other", "error": f"{type(e).__name__}: {str(e)[:300]}", "site": _site(e.__traceback__)}, \
            None
    try:
        ref = g.run(dict(feed))
    except Exception:  # noqa: BLE001 - the reference refusing what compiled ran is not an oracle here
        ref = None
    bad = None
    if ref is not None and not _has_random(data):
        bad = _worst({name: _same(v, ref.get(name), rtol) for name, v in out.items()}, "compiled vs reference")
    return {"status": "ok", "ref_mismatch": bad}, out


def _worst(whys: dict, what: str) -> str | None:
    """The first real disagreement, else the first non-finite one, else None."""
    found = [(name, why) for name, why in whys.items() if why is not None]
    found.sort(key=lambda nw: nw[1] == NONFINITE)
    return f"{what}, output {found[0][0]!r}: {found[0][1]}" if found else None


def _has_random(data: bytes) -> bool:
    try:
        m = onnx.load_from_string(data)
    except Exception:
        return False
    return any(n.op_type in RANDOM_OPS for _, n in _nodes(m.graph))


def run_ort(data: bytes, feed: dict, out: dict | None) -> dict:
    try:
        import onnxruntime as ort
    except ImportError:
        return {"status": "missing"}
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 4
    if not os.environ.get("FUZZ_ORT_OPTIMIZE"):  # its graph optimisations accept some invalid models (see doc)
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        res = sess.run(None, {k: v for k, v in feed.items() if k in {i.name for i in sess.get_inputs()}})
    except Exception as e:  # noqa: BLE001 - onnxruntime refusing is an outcome
        return {"status": "rejected", "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    if out is None:
        return {"status": "ok"}
    mismatch = None
    if not _has_random(data):
        mismatch = _worst({name: _same(out[name], v) for name, v in zip(names, res) if name in out},
                          "vs onnxruntime")
    return {"status": "ok", "mismatch": mismatch}


def worker() -> None:
    """Read cases (JSON lines) on stdin, answer each with a 'ds' line, then an 'ort' line."""
    try:
        import resource

        limit = int(os.environ.get("FUZZ_MEMORY_LIMIT", 8 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass
    import dynshape  # noqa: F401  (import cost paid once, before the first case)

    proto = os.fdopen(os.dup(1), "w")  # answers go here; anything else printing to fd 1 (C code) goes to stderr
    os.dup2(2, 1)

    def answer(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    for line in sys.stdin:
        case = json.loads(line)
        data = base64.b64decode(case["model"])
        seed = next(s for s in SEEDS if s.name == case["seed"])
        feed, huge = make_feed(data, seed, random.Random(case["id"]))
        phase = case.get("phase", "both")
        out = None
        if phase != "ort":
            res, out = run_dynshape(data, feed, 1e-2 if huge else 1e-3)
            answer({"phase": "ds", **res})
        if huge:
            answer({"phase": "ort", "status": "skipped"})
            continue
        answer({"phase": "ort", **run_ort(data, feed, out)})


# ---- the driver -------------------------------------------------------------------------------------------
class Worker:
    """One worker process and a line protocol with per-answer timeouts."""

    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
        self.p = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, bufsize=0)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.p.stdout, selectors.EVENT_READ)
        self.buf = b""

    def send(self, case: dict) -> None:
        self.p.stdin.write((json.dumps(case) + "\n").encode())
        self.p.stdin.flush()

    def recv(self, timeout: float) -> dict | str:
        """The next answer, or 'timeout' / 'died'."""
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                return "timeout"
            if not self.sel.select(left):
                continue
            chunk = os.read(self.p.stdout.fileno(), 1 << 16)
            if not chunk:
                return "died"
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()
        self.sel.close()


@dataclass
class Outcome:
    case: int
    seed: str
    mutations: list[str]
    outcome: str
    detail: str = ""
    sub: str = ""
    extra: dict = field(default_factory=dict)


def classify(ds: dict | str, ort: dict | str) -> tuple[str, str, str]:
    """(outcome, sub-outcome, detail) from the worker's two answers."""
    ort_status = ort.get("status") if isinstance(ort, dict) else f"ort {ort}"
    if ds == "died":
        return "crash", "", "worker died in dynshape"
    if ds == "timeout":
        return ("hang_shared" if ort in ("timeout", "shared") else "hang"), "", f"onnxruntime: {ort_status}"
    if ds["status"] == "other":
        return "other_exception", "", f"{ds['error']} at {ds['site']}"
    if ds["status"] == "clean":
        sub = "ort_runs" if ort_status == "ok" else "ort_rejects"
        return "clean_error", sub, ds["error"]
    for why in (ds.get("ref_mismatch"), ort.get("mismatch") if isinstance(ort, dict) else None):
        if why and why.endswith(NONFINITE):
            return "correct", "nonfinite", why
        if why:
            return "wrong_result", "", why
    return "correct", ("ort_agrees" if ort_status == "ok" else f"ort_{ort_status}".replace(" ", "_")), ""


def run_cases(ids: list[int], jobs: int = 2, timeout: float = 30.0, base_seed: int = 0,
              progress: bool = False) -> list[Outcome]:
    """Run the cases on `jobs` workers; a worker that dies or times out is replaced."""
    pending = collections.deque(ids)
    workers: list[Worker | None] = [None] * max(1, jobs)
    results: list[Outcome] = []
    inflight: dict[int, tuple[int, Seed, list[str], bytes, float, Any]] = {}
    t0 = time.monotonic()

    def start(slot: int) -> None:
        i = pending.popleft()
        seed, data, done = make_case(i, base_seed)
        if workers[slot] is None:
            workers[slot] = Worker()
        workers[slot].send({"id": i, "seed": seed.name, "model": base64.b64encode(data).decode()})
        inflight[slot] = (i, seed, done, data, time.monotonic(), None)

    while pending or inflight:
        for slot in range(len(workers)):
            if slot not in inflight and pending:
                start(slot)
        for slot in list(inflight):
            i, seed, done, data, _, ds = inflight.pop(slot)
            w = workers[slot]
            ds = w.recv(timeout) if ds is None else ds
            ort = "skipped"
            if isinstance(ds, dict):
                ort = w.recv(timeout)
                if not isinstance(ort, dict):  # onnxruntime hung or crashed: not our outcome
                    w.kill()
                    workers[slot] = None
            else:
                w.kill()
                workers[slot] = None
                if ds == "timeout":
                    ort = _ort_alone(i, seed, data, timeout)
            outcome, sub, detail = classify(ds, ort)
            results.append(Outcome(i, seed.name, done, outcome, detail, sub,
                                   {"wrapped": bool(isinstance(ds, dict) and ds.get("wrapped"))}))
            if progress and len(results) % 100 == 0:
                counts = collections.Counter(r.outcome for r in results)
                print(f"  {len(results)}/{len(ids)} in {time.monotonic() - t0:.0f} s: {dict(counts)}", flush=True)
    for w in workers:
        if w is not None:
            w.kill()
    return sorted(results, key=lambda r: r.case)


def _ort_alone(i: int, seed: Seed, data: bytes, timeout: float) -> str:
    """Whether onnxruntime also hangs on a case dynshape timed out on ('shared'), in a fresh worker."""
    w = Worker()
    try:
        w.send({"id": i, "seed": seed.name, "model": base64.b64encode(data).decode(), "phase": "ort"})
        ans = w.recv(timeout)
        return "shared" if ans in ("timeout", "died") else "ran"
    finally:
        w.kill()


def summary(results: list[Outcome]) -> dict:
    counts = collections.Counter(r.outcome for r in results)
    subs = collections.Counter(f"{r.outcome}/{r.sub}" for r in results if r.sub)
    sites = collections.Counter(r.detail.rsplit(" at ", 1)[-1] for r in results if r.outcome == "other_exception")
    return {"cases": len(results), "counts": {k: counts.get(k, 0) for k in
                                              ("clean_error", "correct", *MUST_BE_ZERO, "hang_shared")},
            "sub": dict(sorted(subs.items())), "wrapped": sum(r.extra.get("wrapped", False) for r in results),
            "sites": dict(sites.most_common()),
            "failures": [r.__dict__ for r in results if r.outcome in MUST_BE_ZERO],
            # dynshape refused what onnxruntime ran: each is a stricter check or a false refusal, worth reading
            "stricter": [f"case {r.case} ({r.seed}): {r.detail}" for r in results if r.sub == "ort_runs"],
            "wrapped_examples": [f"case {r.case} ({r.seed}): {r.detail}" for r in results
                                 if r.extra.get("wrapped")][:200],
            "nonfinite": [f"case {r.case} ({r.seed}): {r.detail}" for r in results if r.sub == "nonfinite"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--save-failures", type=Path)
    ap.add_argument("--case", type=int, help="run one case and print everything about it")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    if args.case is not None:
        seed, data, done = make_case(args.case, args.seed)
        print(f"case {args.case}: seed {seed.name}; mutations: {done}")
        feed, _ = make_feed(data, seed, random.Random(args.case))
        res, out = run_dynshape(data, feed)
        print("dynshape:", res)
        print("onnxruntime:", run_ort(data, feed, out))
        return
    t0 = time.monotonic()
    results = run_cases(list(range(args.start, args.start + args.cases)), args.jobs, args.timeout, args.seed,
                        progress=True)
    s = summary(results)
    s["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps({k: v for k, v in s.items() if k not in ("failures", "stricter", "wrapped_examples", "nonfinite")},
                     indent=1))
    for f in s["failures"]:
        print(f"FAIL case {f['case']} ({f['seed']}): {f['outcome']}: {f['detail']}  [{'; '.join(f['mutations'])}]")
    if args.save_failures and s["failures"]:
        args.save_failures.mkdir(parents=True, exist_ok=True)
        for f in s["failures"]:
            _, data, _ = make_case(f["case"], args.seed)
            (args.save_failures / f"case{f['case']}.onnx").write_bytes(data)
    if args.json:
        args.json.write_text(json.dumps(s, indent=1))
    sys.exit(1 if any(s["counts"][k] for k in MUST_BE_ZERO) else 0)


if __name__ == "__main__":
    main()
