"""Node-suite backend: the same load as backend_reference, then `ds.compile` and the compiled executable."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from backend_reference import load  # noqa: E402

import dynshape as ds  # noqa: E402


def run(model_path: str, inputs: list) -> list:
    exe = ds.compile(load(model_path, inputs))
    out = exe.run({v.name: x for v, x in zip(exe.graph.inputs, inputs)})
    return [out[v.name] for v in exe.graph.outputs]
