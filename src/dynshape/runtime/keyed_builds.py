"""An executable made of ordinary builds, one per key its calls compute: what RankVariants (a length that fixes
a rank) and BranchVariants (a value or shape that picks an If's branch) share.

Each key's build is compiled on its first call, under a lock (two threads with the same new key build it once),
and reused by one dict lookup afterwards; past a cap a new key is refused by name, so a stream of ever-new keys
cannot grow memory without bound.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from dynshape.errors import DynshapeError
from dynshape.ir.graph import Graph
from dynshape.options import Options

__all__ = ["KeyedBuilds"]


class KeyedBuilds:
    """The builds by key, their call counts, and the reporting both kinds of keyed executable share."""

    def __init__(self, graph: Graph, specialize: list | None, options: Options, build: Any):
        self.graph, self.options = graph, options
        self._specialize, self._build = specialize, build  # build(graph, specialize, options=) -> executable
        self._by_key: dict[tuple, Any] = {}
        self._calls: dict[tuple, int] = {}
        self._lock = threading.Lock()

    def __call__(self, **inputs: Any) -> list[np.ndarray]:
        out = self.run(inputs)  # type: ignore[attr-defined]
        return [out[v.name] for v in self.graph.outputs]

    def _built(self, key: tuple, cap: int, refusal: Callable[[], str], graph_for: Callable[[], Graph]) -> Any:
        """The build for `key`, compiled from `graph_for()` on its first call; past `cap` builds, `refusal()` is
        raised instead (it names the key, the builds made and the option)."""
        exe = self._by_key.get(key)
        if exe is not None:
            return exe
        with self._lock:
            exe = self._by_key.get(key)
            if exe is None:
                if len(self._by_key) >= cap:
                    raise DynshapeError(refusal())
                exe = self._build(graph_for(), self._specialize, options=self.options)
                self._by_key[key] = exe
        return exe

    def _count(self, key: tuple) -> None:
        self._calls[key] = self._calls.get(key, 0) + 1

    @property
    def variants(self) -> dict[tuple, Any]:
        """The builds by key, in the order they were first needed."""
        return dict(self._by_key)

    @property
    def symbols(self) -> list:
        return [e.atom() for e in self.graph.signature.symbols.values()]
