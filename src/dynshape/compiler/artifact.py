"""`ds.save` / `ds.load`: the compile step's frontend work around runtime's artefacts (`runtime/artifact.py`).

`save` turns the model the caller gives into a typed build (ONNX bytes, the inferred graph, the declared dims)
and runtime compiles and writes it; `load` lets runtime verify the artefact and reads its verified model.onnx
back into a typed build for runtime to load. Everything an artefact is and checks stays in runtime.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import onnx

from dynshape.errors import ModelError
from dynshape.frontends.onnx import load_onnx, read_model
from dynshape.frontends.onnx_export import dims_of, to_onnx
from dynshape.ir.graph import Fact, Graph
from dynshape.ir.infer import infer_graph
from dynshape.options import Options
from dynshape.runtime import artifact as rt
from dynshape.runtime.executable import Executable
from dynshape.runtime.model_build import ModelBuild

__all__ = ["CONFIG", "LIBS", "MANIFEST", "MODEL", "load", "read_build", "save", "typed_build"]

MODEL, CONFIG, MANIFEST, LIBS = rt.MODEL, rt.CONFIG, rt.MANIFEST, rt.LIBS


def typed_build(model: Any, dims: Mapping[str, Any] | None = None,
                step: Callable[[str], None] = lambda label: None) -> ModelBuild:
    """The typed build of `model` (path, bytes, onnx.ModelProto or a dynshape Graph such as `ds.from_torch`
    makes). A Graph goes through ONNX (`to_onnx`) so that what is compiled is exactly what the artefact stores;
    its symbols' ranges become the default `dims` and its stated requirements (torch's guards) are kept."""
    step("loading model")
    requires: list[Fact] = []
    if isinstance(model, Graph):
        dims = dims_of(model) if dims is None else dims
        requires, model = list(model.requires), to_onnx(model)
    data = _model_bytes(model)
    graph = load_onnx(data, dims, infer=False)
    graph.requires = requires
    step("shape inference")
    return ModelBuild(data, infer_graph(graph), dict(dims or {}))


def read_build(model: bytes, dims: Mapping[str, Any], requires: list[Fact]) -> ModelBuild:
    """An artefact's verified model.onnx read back as its typed build, with its recorded requirements."""
    graph = load_onnx(model, dims, infer=False)
    graph.requires = list(requires)
    return ModelBuild(model, infer_graph(graph), dict(dims))


def save(model: Any, out_dir: str | os.PathLike, dims: Mapping[str, Any] | None = None,
         specialize: list[Mapping[str, int]] | None = None, *, options: Options | None = None,
         on_step: rt.StepFn | None = None, signing_key: bytes | str | None = None, **knobs: Any) -> Executable:
    """Compile `model` (path, bytes, ModelProto or a dynshape Graph such as `ds.from_torch` makes) once and write
    the artefact to `out_dir`; returns the executable. A Graph is stored as ONNX (`to_onnx`), its symbols' ranges
    as the default `dims`, and its stated requirements (`Graph.requires`: torch's guards) in config.json, so the
    loaded artefact checks them per call as the graph did. `options` / keyword options as for `ds.compile` (the
    strategy is always generic: a loaded artefact never compiles). See `runtime.artifact.save` for the
    directory's atomic replacement and `signing_key`."""
    return rt.save(lambda step: typed_build(model, dims, step), out_dir, specialize, options=options,
                   on_step=on_step, signing_key=signing_key, **knobs)


def load(out_dir: str | os.PathLike, *, signing_key: bytes | str | None = None, **overrides: Any) -> Executable:
    """The executable saved in `out_dir`, after verifying every file; never invokes the C compiler.

    `overrides`: options of how calls are served (memory_budget, preallocate, arenas, ...); options that change
    the kernels must match the artefact's. `signing_key`: refuse the artefact unless its manifest carries a
    matching HMAC (`save(..., signing_key=)`)."""
    return rt.load(out_dir, read_build, signing_key=signing_key, **overrides)


def _model_bytes(model: Any) -> bytes:
    """The serialised model (external data inlined, so the artefact is self-contained)."""
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise ModelError(f"no ONNX model at {path!r} (file not found)")
        return read_model(path).SerializeToString()  # external data inlined, read only from beside the model
    raise ModelError(f"save expects a path, bytes, onnx.ModelProto or a dynshape Graph, got {type(model).__name__}")
