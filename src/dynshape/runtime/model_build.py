"""The typed build: what the compile step hands runtime, and all runtime needs of a model.

Why a type of its own: runtime compiles and serves graphs whose types are already inferred; turning a file, a
ModelProto or a torch graph into one is frontend work, done by the compile step (`dynshape.compiler`) above
runtime. The boundary is this record, so runtime never imports a frontend (pyproject.toml's import contracts
say so), and an artefact stores exactly what one holds: the model bytes, the declared dims and the
requirements the graph carries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynshape.errors import DynshapeError
from dynshape.ir.graph import Fact, Graph

__all__ = ["BuildReader", "CompileStep", "ModelBuild"]


@dataclass(frozen=True)
class ModelBuild:
    """A model ready for runtime: `graph` typed by shape inference (its `requires` attached), `model` the
    serialised ONNX it was read from (what an artefact stores as model.onnx), `dims` the declarations it was
    read with (what an artefact's config records, so a load reads it the same way)."""

    model: bytes
    graph: Graph
    dims: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        untyped = [v.name for v in self.graph.inputs if v.name not in self.graph.types]
        if untyped:  # a graph straight from load_onnx(..., infer=False): the compile step skipped inference
            raise DynshapeError(f"a ModelBuild needs an inferred graph; inputs {untyped} have no type")


# The compile step as save calls it: given `step(label)` to report progress, the typed build.
CompileStep = Callable[[Callable[[str], None]], ModelBuild]
# The compile step as load calls it: (verified model bytes, declared dims, requirements) -> the typed build.
BuildReader = Callable[[bytes, Mapping[str, Any], list[Fact]], ModelBuild]
