"""Node-suite backend: the plain public API and nothing else: `ds.load_onnx(path)`, `ds.compile(graph)`, then
`exe.run`."""

from __future__ import annotations

import dynshape as ds


def run(model_path: str, inputs: list) -> list:
    exe = ds.compile(ds.load_onnx(model_path))
    out = exe.run({v.name: x for v, x in zip(exe.graph.inputs, inputs)})
    return [out[v.name] for v in exe.graph.outputs]
