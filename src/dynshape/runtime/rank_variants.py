"""Executables for graphs whose ranks depend on an input's length: one compiled build per length.

ONNX lets a model feed a shape or an axes list at run time (`Reshape(x, shape)` with `shape` an input): the
output's rank is that input's length, a dim the caller picks per call. Inference stops at such a node and
names the symbols that fix ranks (`Graph.rank_symbols`); `RankVariants` guards on them instead of running
the rest op by op. Each call binds those symbols from the input shapes (`ir.specialize.rank_values`, one
dict lookup once a length has been seen); the first call with a new length builds a fully typed copy of the
graph (`Graph.specialize`) and compiles it as an ordinary executable (every other dim stays symbolic, so one
build still serves every batch or sequence length); later calls with that length reuse it, never rebuild it.
Past `max_rank_variants` lengths a new one is refused with an error naming the input, the length and the
limit, so a stream of ever-new lengths cannot grow memory without bound. `explain_build` lists every
length seen: the input and axis it comes from, why it fixes a rank, its calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.errors import DynshapeError
from dynshape.ir.graph import Graph
from dynshape.ir.specialize import rank_values
from dynshape.options import Options
from dynshape.runtime.keyed_builds import KeyedBuilds
from dynshape.sym import Expr

__all__ = ["RankVariants"]


class RankVariants(KeyedBuilds):
    """An executable for a graph with `rank_symbols`: a compiled build per value of those symbols."""

    def __init__(self, graph: Graph, specialize: list | None, options: Options, build: Any):
        super().__init__(graph, specialize, options, build)
        self.sources = {s: _source(graph, s) for s in graph.rank_symbols}

    # ---- running --------------------------------------------------------------------------------------------
    def run(self, feed: dict, out: dict | None = None) -> dict[str, np.ndarray]:
        exe, key = self.executable_for(feed)
        self._count(key)
        return exe.run(feed, out)

    def executable_for(self, feed: dict) -> tuple[Any, tuple]:
        """The build serving `feed`'s rank-fixing lengths (compiled now if this is their first call)."""
        if not isinstance(feed, dict):
            raise DynshapeError(f"inputs must be a dict name -> array, got {type(feed).__name__}")
        values = rank_values(self.graph, feed)
        key = tuple(values.items())
        cap = self.options.max_rank_variants

        def refusal() -> str:
            seen = ", ".join(_describe(k) for k in self._by_key)
            return (f"{_describe(key, self.sources)}: a new rank-fixing length, and this executable has built "
                    f"max_rank_variants={cap} already ({seen}); refused. Feed one of those lengths, or compile with "
                    "a larger max_rank_variants")

        return self._built(key, cap, refusal, lambda: self.graph.specialize(values)), key

    # ---- reporting ------------------------------------------------------------------------------------------
    def explain_build(self) -> dict:
        lengths = [{"values": dict(k), "from": {s: self.sources[s] for s, _ in k},
                    "why": {s: self.graph.rank_symbols[s] for s, _ in k}, "calls": self._calls.get(k, 0),
                    "build": exe.explain_build()} for k, exe in self._by_key.items()]
        return {"rank_variants": lengths, "max_rank_variants": self.options.max_rank_variants,
                "rank_symbols": dict(self.graph.rank_symbols), "options": self.options.explain()}

    def stats(self) -> dict:
        return {"rank_variants": len(self._by_key), "calls": dict((_describe(k), n) for k, n in self._calls.items())}

    def explain(self) -> str:
        lines = [f"ranks fixed by input lengths: one build per length (at most {self.options.max_rank_variants})"]
        for s, why in self.graph.rank_symbols.items():
            lines.append(f"  {s}: {self.sources[s]}; {why}")
        for k, exe in self._by_key.items():
            lines.append(f"  built for {_describe(k)}: {self._calls.get(k, 0)} calls, "
                         f"{len(exe.explain_build().get('kernels', []))} kernels")
        if not self._by_key:
            lines.append("  (nothing built yet: the first call with each length builds it)")
        return "\n".join(lines)


def _source(graph: Graph, symbol: str) -> str:
    """Where a rank symbol's value comes from: the first input axis whose declared dim holds it."""
    for v in graph.inputs:
        for axis, d in enumerate(v.shape or ()):
            if isinstance(d, Expr) and symbol in d.free_symbols:
                return f"input {v.name!r} axis {axis}"
    return "no input axis"


def _describe(key: tuple, sources: dict | None = None) -> str:
    parts = []
    for s, v in key:
        where = f" ({sources[s]})" if sources and s in sources else ""
        parts.append(f"{s} = {v}{where}")
    return ", ".join(parts)
