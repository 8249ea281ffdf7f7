"""Executables for graphs whose `If`s branch on an input's value: one compiled build per value seen.

A model that picks its path by a small input (a voice-activity model's sample rate: three `If(Equal(sr, 16000))`,
the LSTM state in and out) ran every branch on the interpreter, every call. `BranchVariants` reads those inputs
(`ir.branches.branch_inputs`), and the first call with a new value compiles the graph specialised to it, with each
`If` replaced by its taken branch (`ir.branches.specialize_values`): an ordinary executable, every dim still
symbolic. Later calls with that value take it by one dict lookup on the value. Past `max_branch_variants` values a
new one is refused by name, so a stream of ever-new values cannot grow memory without bound. Where the condition
does not follow from those inputs alone, the `If` stays and runs as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.errors import ConstraintViolation, ShapeError
from dynshape.ir.branches import specialize_values, symbol_sources
from dynshape.ir.graph import Graph
from dynshape.options import Options
from dynshape.runtime.binder import InputSpec, as_input_array
from dynshape.runtime.keyed_builds import KeyedBuilds
from dynshape.sym import Cond
from dynshape.sym.pysource import compile_key_function, cond_to_py, key_names

__all__ = ["BranchVariants"]


class BranchVariants(KeyedBuilds):
    """An executable for a graph whose `If` conditions follow from small inputs or from the shapes: a build per
    value of those inputs and truth value of those conditions."""

    def __init__(self, graph: Graph, names: list[str], specialize: list | None, options: Options, build: Any,
                 conds: list[tuple[str, Cond]] | None = None):
        super().__init__(graph, specialize, options, build)
        self.names = names
        self._specs = [InputSpec(v.name, np.dtype(v.dtype), tuple(v.shape)) for v in graph.inputs if v.name in names]
        # Ifs on shapes: their conditions over the input symbols, evaluated per call by one generated function
        self.conds = list(conds or [])
        sources = symbol_sources(graph)
        syms = sorted({x for _, c in self.conds for x in c.free_symbols})
        self._dims = [sources[x] for x in syms]
        var = key_names(syms)
        tests = ", ".join(cond_to_py(c, var) for _, c in self.conds)
        self._truths = compile_key_function("truths", syms, f"return ({tests},)") if self.conds else None

    # ---- running --------------------------------------------------------------------------------------------
    def run(self, feed: dict, out: dict | None = None) -> dict[str, np.ndarray]:
        exe, key, rest = self.executable_for(feed)
        self._count(key)
        return exe.run(rest, out)

    def executable_for(self, feed: dict) -> tuple[Any, tuple, dict]:
        """(the build for the values `feed` gives the branch inputs, its key, the feed without those inputs)."""
        if not isinstance(feed, dict):
            raise ConstraintViolation(f"inputs must be a dict name -> array, got {type(feed).__name__}")
        values = []
        for spec in self._specs:
            if spec.name not in feed:
                raise ConstraintViolation(f"missing input {spec.name!r}: its value picks the model's branches "
                                          f"(If); expected {spec.dtype}{list(spec.shape)}")
            a = as_input_array(feed[spec.name], spec)
            if a.dtype != spec.dtype or a.shape != spec.shape:
                raise ConstraintViolation(f"input {spec.name!r}: {a.dtype}{list(a.shape)}, but the model takes "
                                          f"{spec.dtype}{list(spec.shape)} (its value picks the model's branches)")
            values.append(a)
        key = tuple(tuple(a.reshape(-1).tolist()) for a in values)
        if self._truths is not None:
            key += (self._truths(self._dim_values(feed)),)
        rest = {k: v for k, v in feed.items() if k not in self.names} if self.names else feed
        cap = self.options.max_branch_variants

        def refusal() -> str:
            seen = "; ".join(self._describe(k) for k in self._by_key)
            return (f"{self._describe(key)}: a new value of an input that picks the model's branches, and this "
                    f"executable has built max_branch_variants={cap} already ({seen}); refused. Feed one of those "
                    "values, or compile with a larger max_branch_variants")

        def graph_for() -> Graph:
            decided = dict(zip((name for name, _ in self.conds), key[-1])) if self.conds else None
            try:
                return specialize_values(self.graph, dict(zip(self.names, values)), decided)
            except ShapeError as e:  # the branch this value takes does not fit the model's shapes
                raise ConstraintViolation(f"{self._describe(key)} picks branches the model does not admit at these "
                                          f"inputs: {e}") from None

        return self._built(key, cap, refusal, graph_for), key, rest

    def _dim_values(self, feed: dict) -> tuple[int, ...]:
        """The symbols the shape conditions read, from the feed's shapes (a missing or short input is refused by
        name, as the binder would)."""
        out = []
        for name, axis in self._dims:
            if name not in feed:
                raise ConstraintViolation(f"missing input {name!r}")
            shape = np.shape(feed[name])
            if len(shape) <= axis:
                raise ConstraintViolation(f"input {name!r} has rank {len(shape)} (shape {shape}); its axis {axis} "
                                          "decides which branches the model takes")
            out.append(int(shape[axis]))
        return tuple(out)

    def _describe(self, key: tuple) -> str:
        parts = [f"{n} = {v[0] if len(v) == 1 else list(v)}" for n, v in zip(self.names, key)]
        if self.conds:
            parts += [f"{c.text}: {t}" for (_, c), t in zip(self.conds, key[-1])]
        return ", ".join(parts)

    # ---- reporting ------------------------------------------------------------------------------------------
    def explain_build(self) -> dict:
        builds = [{"values": self._describe(k), "calls": self._calls.get(k, 0), "build": exe.explain_build()}
                  for k, exe in self._by_key.items()]
        return {"branch_variants": builds, "branch_inputs": list(self.names),
                "max_branch_variants": self.options.max_branch_variants, "options": self.options.explain()}

    def stats(self) -> dict:
        return {"branch_variants": len(self._by_key),
                "calls": {self._describe(k): n for k, n in self._calls.items()}}

    def explain(self) -> str:
        what = [f"the value of {', '.join(self.names)}"] if self.names else []
        what += [f"the shapes ({'; '.join(c.text for _, c in self.conds)})"] if self.conds else []
        lines = [f"If conditions follow from {' and '.join(what)}: one build per combination seen, each If replaced "
                 f"by its taken branch (at most {self.options.max_branch_variants})"]
        for k, exe in self._by_key.items():
            lines.append(f"  built for {self._describe(k)}: {self._calls.get(k, 0)} calls, "
                         f"{len(exe.explain_build().get('kernels', []))} kernels")
        if not self._by_key:
            lines.append("  (nothing built yet: the first call with each value builds it)")
        return "\n".join(lines)
