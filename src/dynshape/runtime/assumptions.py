"""Inputs that break what inference assumed: valid calls served by a build at their exact shapes.

Some ONNX semantics depend on a dim's value in a way a symbolic shape cannot carry: a Reshape target entry
that is 0 copies the input's dim, any other value is taken as it is, so a target built from `Shape(y)` means
two different things for len(y) = 0 and len(y) > 0. Inference then types the graph for the common case and
records the other as an assumption (`Fact(kind="assume")`): inputs that break it are valid, the generic build
just does not describe them. The binder does not refuse such a call; `Assumptions.breaks(key)` (one generated
Python comparison per assumption, over the bound symbols) routes it to an executable compiled from the graph
re-inferred at exactly that shape (`ir.specialize.static_variant`), built on first sight, cached (at most
`max_variants`, least recently used dropped), and noted for explain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dynshape.ir.graph import Graph
from dynshape.options import Options
from dynshape.sym import Cond
from dynshape.sym.pysource import compile_key_function, cond_to_py, key_names

__all__ = ["Assumptions"]



class Assumptions:
    """The graph's assumptions over the bound symbols, and the exact-shape builds of keys that break them."""

    def __init__(self, graph: Graph, names: list[str], options: Options, notes: list[str],
                 build: Callable[[Graph], Any]):
        self.graph, self.names, self.options, self.notes, self._build = graph, names, options, notes, build
        self.facts = [f for f in graph.signature.facts if f.kind == "assume" and isinstance(f.check, Cond)
                      and f.check.free_symbols <= set(names)]
        self._builds: dict[tuple, Any] = {}
        if not self.facts:
            self.breaks = _never
            return
        var = key_names(names)
        tests = [cond_to_py(f.check, var) for f in self.facts]
        self.breaks = compile_key_function("breaks", names, "return not (" + " and ".join(tests) + ")")

    def run(self, key: tuple, feed: dict) -> dict:
        exe = self._builds.pop(key, None)
        if exe is None:
            from dynshape.ir.specialize import static_variant

            env = dict(zip(self.names, key))
            broken = [f for f in self.facts if not f.check.evaluate(env)]
            exe = self._build(static_variant(self.graph, env))
            cap = self.options.max_variants or 16
            while len(self._builds) >= cap:
                self._builds.pop(next(iter(self._builds)))
            at = ", ".join(f"{k} = {v}" for k, v in env.items())
            self.notes.append(f"{at}: the inputs break {broken[0].text!r} ({broken[0].origin}), which the generic "
                              "build assumes; served by a build at exactly this shape")
        self._builds[key] = exe  # most recently used last
        return exe.run(feed)

    @property
    def builds(self) -> dict[tuple, Any]:
        return dict(self._builds)


def _never(key: tuple) -> bool:
    return False
