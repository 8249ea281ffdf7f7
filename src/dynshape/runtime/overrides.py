"""Calls that feed an initializer the model also lists as a graph input (`Graph.overridable`).

Why: in an ONNX file of IR version < 4 every initializer must also be a graph input, and in later versions an
initializer listed as an input is that input's default value: either way a caller may feed it. The common call
feeds none of them, and then they are constants: folded, packed and laid out once at compile time, as fast as
plain initializers. A call that feeds some is served by a second build in which exactly those names are graph
inputs (made on first use, one per set of fed names, at most MAX_OVERRIDE_BUILDS), so the fast path never pays
for the possibility. A fed value must have its initializer's dtype and shape: anything else is refused by name
before anything runs.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dynshape.errors import ConstraintViolation
from dynshape.ir.graph import Graph, Value
from dynshape.ir.infer import infer_graph
from dynshape.ir.types import TensorType

MAX_OVERRIDE_BUILDS = 8  # sets of fed initializers; past it a new set is refused (each is a whole build)


def fed_overrides(graph: Graph, feed: Any) -> frozenset[str]:
    """The overridable initializers `feed` names (empty when it is not a mapping)."""
    if not graph.overridable or not isinstance(feed, Mapping):
        return frozenset()
    return frozenset(n for n in graph.overridable if n in feed)


def check_overrides(graph: Graph, feed: Mapping, names: frozenset[str]) -> None:
    """Refuse a fed initializer whose dtype or shape differs from the initializer's, naming it."""
    for n in sorted(names):
        init = graph.initializers[n]
        got = feed[n]
        dt, shape = getattr(got, "dtype", None), np.shape(got)
        if dt is None or np.dtype(dt) != init.dtype or tuple(shape) != init.shape:
            got_text = f"{np.dtype(dt) if dt is not None else type(got).__name__} {tuple(shape)}"
            raise ConstraintViolation(
                f"input {n!r}: it overrides the initializer {n!r} of {init.dtype} {init.shape} (the model lists it "
                f"as a graph input), but the value fed is {got_text}; feed a numpy array of that dtype and shape, "
                "or leave it out to use the model's own")


def with_inputs(graph: Graph, names: frozenset[str]) -> Graph:
    """`graph` with the initializers `names` turned into graph inputs of their static type, re-inferred (what was
    folded from them is computed per call again)."""
    inputs = [*graph.inputs, *(Value(n, graph.initializers[n].dtype, graph.initializers[n].shape)
                               for n in sorted(names))]
    inits = {k: v for k, v in graph.initializers.items() if k not in names}
    types = {n: TensorType(graph.initializers[n].dtype, graph.initializers[n].shape) for n in names}
    g = dataclasses.replace(graph, inputs=inputs, initializers=inits, types=types, variants={},
                            overridable=tuple(n for n in graph.overridable if n not in names))
    return infer_graph(g)


class Overrides:
    """The builds of one executable for calls that feed overridable initializers, by the set of names fed."""

    def __init__(self, graph: Graph, compile_fn: Callable[[Graph], Any]):
        self._graph = graph
        self._compile = compile_fn
        self._builds: dict[frozenset[str], Any] = {}
        self._lock = threading.Lock()

    def fed(self, feed: Any) -> frozenset[str]:
        return fed_overrides(self._graph, feed)

    def run(self, feed: Mapping, names: frozenset[str], out: dict | None) -> dict[str, np.ndarray]:
        check_overrides(self._graph, feed, names)
        exe = self._builds.get(names)
        if exe is None:
            with self._lock:
                exe = self._builds.get(names)
                if exe is None:
                    if len(self._builds) >= MAX_OVERRIDE_BUILDS:
                        raise ConstraintViolation(
                            f"inputs {sorted(names)}: {MAX_OVERRIDE_BUILDS} other sets of fed initializers already "
                            "have builds; feed one of those sets, or none")
                    exe = self._builds[names] = self._compile(with_inputs(self._graph, names))
        return exe.run(dict(feed), out)

    @property
    def builds(self) -> list[list[str]]:
        return [sorted(k) for k in self._builds]
