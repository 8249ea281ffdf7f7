"""Node-suite backend: the plain public API and nothing else: `ds.load_onnx(path)`, then `graph.run`.

Every dim the model (or the suite's --symbolic mode) names is a symbol with dynshape's default range; no
reloading with fixed lengths, no test-only option: what passes here passes for a user.
"""

from __future__ import annotations

import dynshape as ds


def run(model_path: str, inputs: list) -> list:
    graph = ds.load_onnx(model_path)
    out = graph.run({v.name: x for v, x in zip(graph.inputs, inputs)})
    return [out[v.name] for v in graph.outputs]
