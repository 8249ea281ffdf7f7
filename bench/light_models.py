"""Symbolic copies of the `light_*` CNNs that ship inside the onnx package (onnx/backend/test/data/light/).

Those files are weightless: every weight is `ConstantOfShape(shape) = 0.02`, the input is fixed at 1x3x224x224
and the flatten before the classifier is a Reshape to the constant [1, K]. A benchmark needs neither
constant weights (every channel would carry the same number, so a wrong kernel could still match) nor fixed
dims, so `make_symbolic` writes a copy that:

- replaces each ConstantOfShape weight by a seeded random initializer chosen by its role (He-normal conv and
  Gemm weights, small biases, BatchNormalization scale/bias random and mean/var *calibrated*: set, in depth
  order, to the statistics of its input on random images, so activations stay O(1) through 50-120 layers);
- makes the batch dim a symbol `batch` (the Reshape constants [1, K] become [0, K]);
- for the models whose classifier sits behind a pool that covers the whole 224 feature map (ResNet50,
  ShuffleNet, Inception v1/v2: an AveragePool with a 7x7 window; DenseNet and SqueezeNet already use
  GlobalAveragePool), also makes H and W symbols and turns that pool into GlobalAveragePool (identical at 224:
  checked), and rewrites ShuffleNet's channel shuffles (Reshape to the constant [1, g, C/g, H, W], Transpose,
  Reshape back) to take their shapes from the tensor (Shape, Gather, Concat);
- drops the initializers from the graph inputs (IR 3 lists them there, which makes onnxruntime treat them as
  overridable inputs and skip constant folding) and sets IR 8, keeping opset 9;
- strips intermediate value_info (there is none in these files, but a copy must not carry stale fixed shapes).

VGG19, AlexNet and ZFNet flatten a fixed 7x7 / 6x6 map into their first FC layer, so only their batch is symbolic.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cnn_models import Input, Spec

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")

# spec name -> (file stem, input name, output name, H/W symbolic)
LIGHT: dict[str, tuple[str, str, str, bool]] = {
    "light_resnet50": ("light_resnet50", "gpu_0/data_0", "gpu_0/softmax_1", True),
    "light_densenet121": ("light_densenet121", "data_0", "fc6_1", True),
    "light_squeezenet": ("light_squeezenet", "data_0", "softmaxout_1", True),
    "light_shufflenet": ("light_shufflenet", "gpu_0/data_0", "gpu_0/softmax_1", True),
    "light_inception_v1": ("light_inception_v1", "data_0", "prob_1", True),
    "light_inception_v2": ("light_inception_v2", "data_0", "prob_1", True),
    "light_vgg19": ("light_vgg19", "data_0", "prob_1", False),
    "light_bvlc_alexnet": ("light_bvlc_alexnet", "data_0", "prob_1", False),
    "light_zfnet512": ("light_zfnet512", "gpu_0/data_0", "gpu_0/softmax_1", False),
}
HW_DIM = {"min": 64, "max": 640, "multiple_of": 32}


def light_spec(name: str) -> Spec:
    """The benchmark spec of one light model: symbolic batch (and H, W where the head allows it)."""
    stem, inp, out, hw = LIGHT[name]
    if hw:
        shape: tuple[int | str, ...] = ("batch", 3, "H", "W")
        dims: dict[str, Any] = {"batch": (1, 8), "H": dict(HW_DIM), "W": dict(HW_DIM)}
        probes = ({"batch": 1, "H": 224, "W": 224}, {"batch": 1, "H": 320, "W": 320},
                  {"batch": 2, "H": 160, "W": 256})
    else:
        shape, dims = ("batch", 3, 224, 224), {"batch": (1, 8)}
        probes = ({"batch": 1}, {"batch": 2})
    return Spec(name, (Input(inp, shape),), (out,), dims, probes,
                f"onnx package's {stem}.onnx (opset 9), random weights, symbolic {'batch, H, W' if hw else 'batch'}",
                source="light", extra={"stem": stem})


LIGHT_SPECS: dict[str, Spec] = {n: light_spec(n) for n in LIGHT}


def _consumers(g: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    out: dict[str, list[tuple[onnx.NodeProto, int]]] = collections.defaultdict(list)
    for n in g.node:
        for i, x in enumerate(n.input):
            out[x].append((n, i))
    return out


def _role(name: str, cons: dict, depth: int = 0) -> tuple[str, int, onnx.NodeProto | None]:
    """(consumer op, input index, node) of a weight, looking through Unsqueeze / Reshape of the weight itself."""
    uses = cons.get(name, [])
    if not uses:
        return "", -1, None
    node, idx = uses[0]
    if node.op_type in ("Unsqueeze", "Reshape") and idx == 0 and depth < 3:
        return _role(node.output[0], cons, depth + 1)
    return node.op_type, idx, node


def _random_weight(shape: tuple[int, ...], role: tuple[str, int, Any], rng: np.random.Generator) -> np.ndarray:
    """A weight for its role: He-normal for Conv/Gemm weights (variance kept through ReLU stacks), small
    biases, BatchNormalization / Caffe Scale affine parameters near 1 and 0 (mean/var get calibrated later)."""
    op, idx, _ = role
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    if op in ("Conv", "Gemm", "MatMul") and idx == 1 and len(shape) > 1:
        if op == "Gemm" and not _attr(role[2], "transB", 0):
            fan_in = shape[0]
        w = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
    elif op == "BatchNormalization" and idx in (1, 4):  # scale, var
        w = rng.uniform(0.6, 1.4, shape)
    elif op == "Mul":
        w = rng.uniform(0.6, 1.4, shape)
    else:  # biases, BN bias and mean, Add operands
        w = np.float32(0.05) * rng.standard_normal(shape, dtype=np.float32)
    return w.astype(np.float32)


def _attr(node: onnx.NodeProto | None, name: str, default: Any) -> Any:
    if node is not None:
        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
    return default


def materialize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace ConstantOfShape weights (and float initializers) by seeded random initializers; drop
    initializers from the graph inputs; IR 8."""
    g = model.graph
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in g.initializer}
    cons = _consumers(g)
    new_inits: list[onnx.TensorProto] = []
    keep_nodes = []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[n.input[0]]))
            w = _random_weight(shape, _role(n.output[0], cons), rng)
            new_inits.append(numpy_helper.from_array(w, n.output[0]))
        else:
            keep_nodes.append(n)
    used = {x for n in keep_nodes for x in n.input}
    for t in g.initializer:
        if t.name not in used:
            continue  # the __SHAPE tensors of the removed ConstantOfShape nodes
        a = numpy_helper.to_array(t)
        if a.dtype == np.float32 and a.size > 1:
            a = _random_weight(a.shape, _role(t.name, cons), rng)
        new_inits.append(numpy_helper.from_array(a, t.name))
    del g.node[:]
    g.node.extend(keep_nodes)
    del g.initializer[:]
    g.initializer.extend(new_inits)
    names = {t.name for t in new_inits}
    real_inputs = [i for i in g.input if i.name not in names and i.name not in inits]
    del g.input[:]
    g.input.extend(real_inputs)
    del g.value_info[:]
    model.ir_version = 8
    return model


def _set_dims(vi: onnx.ValueInfoProto, dims: list[int | str | None]) -> None:
    shape = vi.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, str):
            dim.dim_param = d
        elif d is not None:
            dim.dim_value = d


def _const(g: onnx.GraphProto, name: str, values: list[int]) -> str:
    g.initializer.append(numpy_helper.from_array(np.array(values, dtype=np.int64), name))
    return name


def make_dims_symbolic(model: onnx.ModelProto, spec: Spec) -> onnx.ModelProto:
    """Batch (and H, W) symbolic: Reshape constants, the final pool, ShuffleNet's channel shuffles."""
    g = model.graph
    hw = "H" in spec.dims
    inits = {t.name: t for t in g.initializer}
    producers = {o: n for n in g.node for o in n.output}
    _set_dims(g.input[0], list(spec.inputs[0].shape))
    out_dims = [d.dim_value for d in g.output[0].type.tensor_type.shape.dim]
    _set_dims(g.output[0], ["batch", *out_dims[1:]])  # (1, 1000) or (1, 1000, 1, 1): only the batch varies
    new_nodes: list[onnx.NodeProto] = []
    shuffle_back: dict[str, str] = {}  # output of a shuffle's first Reshape -> the Shape of its input
    k = 0
    for n in g.node:
        if n.op_type == "Reshape" and n.input[1] in inits and n.input[0] not in inits:
            target = [int(v) for v in numpy_helper.to_array(inits[n.input[1]])]
            if len(target) == 5 and hw:
                # channel shuffle: x (N, C, H, W) -> (N, g, C/g, H, W); its partner reshapes back to x's shape
                k += 1
                shp, tag = f"shuffle{k}_shape", f"shuffle{k}"
                new_nodes += [
                    helper.make_node("Shape", [n.input[0]], [shp]),
                    helper.make_node("Gather", [shp, _const(g, f"{tag}_i0", [0])], [f"{tag}_n"], axis=0),
                    helper.make_node("Gather", [shp, _const(g, f"{tag}_i23", [2, 3])], [f"{tag}_hw"], axis=0),
                    helper.make_node("Concat", [f"{tag}_n", _const(g, f"{tag}_gc", target[1:3]), f"{tag}_hw"],
                                     [f"{tag}_target"], axis=0)]
                n.input[1] = f"{tag}_target"
                new_nodes.append(n)
                shuffle_back[n.output[0]] = shp
                continue
            if len(target) == 4 and hw and n.input[0] in producers and producers[n.input[0]].op_type == "Transpose":
                src = producers[producers[n.input[0]].input[0]].output[0]
                if src in shuffle_back:
                    n.input[1] = shuffle_back.pop(src)
                    new_nodes.append(n)
                    continue
            if target[0] == 1:
                name = n.input[1] + "_batch"
                _const(g, name, [0, *target[1:]])
                n.input[1] = name
        elif n.op_type == "AveragePool" and hw and _is_last_pool(n, g):
            n = helper.make_node("GlobalAveragePool", [n.input[0]], list(n.output), name=n.name)
        new_nodes.append(n)
    del g.node[:]
    g.node.extend(new_nodes)
    _prune_initializers(g)
    return model


def _is_last_pool(n: onnx.NodeProto, g: onnx.GraphProto) -> bool:
    """The pool over the last feature map: 7x7 window and no pool, conv or Gemm between it and the flatten."""
    return list(_attr(n, "kernel_shape", [])) == [7, 7] and not any(
        m.op_type in ("Conv", "AveragePool", "MaxPool") for m in _downstream(n, g))


def _downstream(n: onnx.NodeProto, g: onnx.GraphProto) -> list[onnx.NodeProto]:
    cons = _consumers(g)
    seen: list[onnx.NodeProto] = []
    todo = list(n.output)
    while todo:
        for m, _ in cons.get(todo.pop(), []):
            if m not in seen:
                seen.append(m)
                todo += list(m.output)
    return seen


def _prune_initializers(g: onnx.GraphProto) -> None:
    used = {x for n in g.node for x in n.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)


def calibrate_bn(model: onnx.ModelProto, spec: Spec, seed: int = 0, threads: int = 1) -> onnx.ModelProto:
    """Set each BatchNormalization's mean and var to its input's per-channel statistics on random images.

    In depth order (a BN's depth: how many BNs lie on the longest path above it), one onnxruntime run per
    depth level, with every mean/var fed as a graph input so one session serves all levels. Without it the
    random weights compound through the network (a ResNet's residual sums grow per block).
    """
    import onnxruntime as ort

    g = model.graph
    bns = [n for n in g.node if n.op_type == "BatchNormalization"]
    if not bns:
        return model
    depth: dict[str, int] = {}
    level: dict[int, int] = {}
    for n in g.node:  # the light files are topologically ordered
        d = max((depth.get(x, 0) for x in n.input), default=0)
        if n.op_type == "BatchNormalization":
            level[id(n)] = d
            d += 1
        for o in n.output:
            depth[o] = d
    stats = {t.name for n in bns for t in g.initializer if t.name in (n.input[3], n.input[4])}
    cal = onnx.ModelProto()
    cal.CopyFrom(model)
    cg = cal.graph
    by_name = {t.name: numpy_helper.to_array(t) for t in cg.initializer if t.name in stats}
    keep = [t for t in cg.initializer if t.name not in stats]
    del cg.initializer[:]
    cg.initializer.extend(keep)
    for name, a in by_name.items():
        cg.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(a.shape)))
    del cg.output[:]
    for n in bns:
        cg.output.append(helper.make_tensor_value_info(n.input[0], TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(cal.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = spec.make_inputs(_calibration_env(spec), seed=seed + 7)
    for lv in range(max(level.values()) + 1):
        outs = sess.run(None, {**feed, **by_name})
        for n, x in zip(bns, outs):
            if level[id(n)] == lv:
                by_name[n.input[3]] = x.mean(axis=(0, 2, 3)).astype(np.float32)
                by_name[n.input[4]] = x.var(axis=(0, 2, 3)).astype(np.float32)
    for t in g.initializer:
        if t.name in by_name:
            t.CopyFrom(numpy_helper.from_array(by_name[t.name], t.name))
    return model


def _calibration_env(spec: Spec) -> dict[str, int]:
    return {"batch": 2, "H": 96, "W": 96} if "H" in spec.dims else {"batch": 2}


def rescale_logits(model: onnx.ModelProto, spec: Spec, seed: int = 0, std: float = 3.0) -> onnx.ModelProto:
    """Scale the classifier (the Gemm or Conv behind the final Softmax) so the logits have standard deviation
    `std` on random images: with random weights the softmax is otherwise flat at 1/1000 in some of these
    models (Inception v1's LRNs shrink everything), and an absolute tolerance there checks nothing."""
    import onnxruntime as ort

    g = model.graph
    producers = {o: n for n in g.node for o in n.output}
    n = producers.get(g.output[0].name)
    if n is None or n.op_type != "Softmax":
        return model
    x = n.input[0]
    while producers[x].op_type in ("Dropout", "Reshape", "Flatten"):
        x = producers[x].input[0]
    fc = producers[x]
    if fc.op_type not in ("Gemm", "Conv"):
        return model
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, None))
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    logits = sess.run(None, spec.make_inputs(_calibration_env(spec), seed=seed + 8))[0]
    k = std / float(logits.reshape(len(logits), -1).std(axis=1).mean())  # spread across classes, per image
    params = set()
    for p in fc.input[1:3]:
        while p in producers and producers[p].op_type in ("Reshape", "Unsqueeze"):
            p = producers[p].input[0]  # Inception v1 reshapes its classifier weight first
        params.add(p)
    for t in g.initializer:
        if t.name in params:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * np.float32(k), t.name))
    return model


def make_symbolic(name: str, seed: int = 0) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(static copy with random weights, symbolic copy with the same weights) of one light model.

    Calibration runs on the symbolic copy (2 images of 96x96: the models with BatchNormalization are all
    global-pool ones) and its statistics go into both copies.
    """
    spec = LIGHT_SPECS[name]
    static = materialize_weights(onnx.load(os.path.join(LIGHT_DIR, spec.extra["stem"] + ".onnx")), seed)
    sym = onnx.ModelProto()
    sym.CopyFrom(static)
    make_dims_symbolic(sym, spec)
    rescale_logits(calibrate_bn(sym, spec, seed), spec, seed)
    calibrated = {t.name: t for t in sym.graph.initializer}
    for t in static.graph.initializer:
        if t.name in calibrated:
            t.CopyFrom(calibrated[t.name])
    onnx.checker.check_model(sym)
    return static, sym
