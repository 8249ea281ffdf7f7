"""Shape-inference speed: a 12-layer BERT-base graph (goal < 0.3 s) and a synthetic 10,000-node graph (< 3 s).

Run from the repository root: `python bench/infer_bench.py`. Models are built in memory with onnx.helper; the
BERT weights are graph inputs of static shape (inference needs their shapes, not their values).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "ir"))
from models import Builder, bert  # noqa: E402

from dynshape.frontends.onnx import load_onnx  # noqa: E402
from dynshape.ir.infer import infer_graph  # noqa: E402


def synthetic(n_nodes: int = 10_000, hidden: int = 8) -> object:
    """A chain of blocks of 10 varied ops (matmul, broadcasting, Shape->Reshape, transpose, softmax, concat)."""
    b = Builder()
    w, bias = b.w("w", hidden, hidden), b.w("bias", hidden)
    flat = b.c("flat", [0, -1])
    x = "x"
    while len(b.nodes) < n_nodes - 1:
        h = b.n("Add", [b.n("MatMul", [x, w]), bias])
        h = b.n("Relu", [b.n("Mul", [h, x])])
        s = b.n("Shape", [h])
        h = b.n("Reshape", [b.n("Reshape", [h, flat]), s])
        h = b.n("Softmax", [b.n("Transpose", [h], perm=[0, 2, 1])], axis=1)
        x = b.n("Transpose", [h], perm=[0, 2, 1])
    b.nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    return b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", hidden])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", hidden])])


def timed(name: str, model: object, goal: float, repeat: int = 3) -> float:
    graph = load_onnx(model, infer=False)
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        infer_graph(graph)
        best = min(best, time.perf_counter() - t0)
    t0 = time.perf_counter()
    load_onnx(model)
    full = time.perf_counter() - t0
    print(f"{name}: {len(graph.nodes)} nodes, inference {best:.3f} s (goal < {goal} s: "
          f"{'ok' if best < goal else 'MISSED'}), load + inference {full:.3f} s; output {graph.outputs[0]}")
    return best


def main() -> None:
    timed("BERT-base 12 layers", bert(layers=12, hidden=768, heads=12, ffn=3072, weights=False), 0.3)
    timed("synthetic", synthetic(), 3.0, repeat=1)


if __name__ == "__main__":
    main()
