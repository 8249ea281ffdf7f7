"""What a served model accepts, read from its graph's typed inputs and outputs, and the per-request check.

Why here and not in the batcher: a request is validated alone, before it can join a batch, so a bad one is
refused with its own 400 (naming input, axis, symbol and the violated fact) and never fails its neighbours.
The check mirrors the runtime binder's for what a single tensor says (dtype, rank, static dims, a bare symbol's
range and divisibility, one symbol bound equal across inputs); a fact between symbols that only the run can
decide is left to the run, and a batch that fails there is re-run request by request (batcher.py).

The batch dim: a symbol that is dim 0 of every input and output and appears nowhere else. Requests then join
along it. A model without one is served one request per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dynshape.serve.errors import bad
from dynshape.serve.protocol import datatype_of


@dataclass(frozen=True)
class SymbolInfo:
    """A symbol's declaration as the metadata extension publishes it."""

    name: str
    min: int
    max: int | None
    multiple_of: int

    def admits(self, v: int) -> bool:
        return v >= self.min and (self.max is None or v <= self.max) and v % self.multiple_of == 0

    def describe(self) -> str:
        mult = f", multiple of {self.multiple_of}" if self.multiple_of > 1 else ""
        return f"{self.name} in [{self.min}, {'inf' if self.max is None else self.max}]{mult}"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    dims: tuple  # int | sym Expr per axis

    @property
    def datatype(self) -> str:
        return datatype_of(self.dtype)

    def public_shape(self) -> list[int]:
        """KServe metadata: -1 for every symbolic dim."""
        return [d if isinstance(d, int) else -1 for d in self.dims]

    def dim_names(self) -> list[str]:
        return [str(d) for d in self.dims]


def _atom_name(d: Any) -> str | None:
    return d.atom().name if hasattr(d, "is_atom") and d.is_atom() else None


class ModelSignature:
    """Inputs, outputs, symbols and the batch symbol of one graph; `validate` checks one request's feed."""

    def __init__(self, graph: Any):
        types = graph.types
        self.inputs = [TensorSpec(v.name, np.dtype(v.dtype), tuple(_dims(types.get(v.name), v))) for v in graph.inputs]
        self.outputs = [TensorSpec(v.name, np.dtype(v.dtype), tuple(_dims(types.get(v.name), v)))
                        for v in graph.outputs]
        self.symbols: dict[str, SymbolInfo] = {}
        for e in graph.signature.symbols.values():
            a = e.atom() if hasattr(e, "atom") else e
            self.symbols[a.name] = SymbolInfo(a.name, int(a.lo), None if a.hi is None else int(a.hi), int(a.mult))
        self.batch = self._batch_symbol()
        self._by_name = {t.name: t for t in self.inputs}
        self.output_names = [t.name for t in self.outputs]
        # Per input, per axis: what `validate` checks, worked out once (a request then costs no symbol lookups):
        # ("int", d) a static dim, ("sym", name, SymbolInfo | None) a bare symbol, ("expr", d) a derived dim.
        self._axes = []
        for t in self.inputs:
            axes: list[tuple] = []
            for d in t.dims:
                if isinstance(d, int):
                    axes.append(("int", d))
                else:
                    name = _atom_name(d)
                    axes.append(("expr", d) if name is None else ("sym", name, self.symbols.get(name)))
            self._axes.append((t, axes))

    def _batch_symbol(self) -> str | None:
        specs = self.inputs + self.outputs
        if not specs or any(not t.dims for t in specs):
            return None
        first = {_atom_name(t.dims[0]) for t in specs}
        if len(first) != 1 or None in first:
            return None
        name = first.pop()
        for t in specs:  # the batch symbol must appear at dim 0 only, or the rows of a batch would interact
            for d in t.dims[1:]:
                if not isinstance(d, int) and name in getattr(d, "free_symbols", ()):
                    return None
        return name if name in self.symbols else None

    @property
    def batch_max(self) -> int | None:
        return self.symbols[self.batch].max if self.batch else None

    def validate(self, feed: dict[str, np.ndarray]) -> tuple[tuple, int, dict[str, int]]:
        """Check one request; return its group key (dtype and every non-batch dim of each input, in order), its
        rows along the batch dim (1 without a batch symbol) and the symbols its shapes bind (what the cost model
        evaluates the graph's work at). Raises a 400 naming the input, axis and fact."""
        missing = [t.name for t in self.inputs if t.name not in feed]
        extra = sorted(set(feed) - set(self._by_name))
        if missing or extra:
            raise bad(f"inputs: missing {missing}, unexpected {extra}; the model takes "
                      f"{[t.name for t in self.inputs]}")
        env: dict[str, tuple[int, str]] = {}
        exprs = []
        for t, axes in self._axes:
            a = feed[t.name]
            if a.dtype != t.dtype:
                raise bad(f"input {t.name!r}: datatype {datatype_of(a.dtype)} but the model takes {t.datatype}")
            if a.ndim != len(axes):
                raise bad(f"input {t.name!r}: rank {a.ndim} (shape {list(a.shape)}) but the model takes rank "
                          f"{len(t.dims)} [{', '.join(t.dim_names())}]")
            for ax, (rule, v) in enumerate(zip(axes, a.shape)):
                kind = rule[0]
                if kind == "int":
                    if v != rule[1]:
                        raise bad(f"input {t.name!r} axis {ax} is {v}, but it must equal {rule[1]}")
                    continue
                if kind == "expr":
                    exprs.append((t.name, ax, rule[1], v))
                    continue
                name, info = rule[1], rule[2]
                bound = env.get(name)
                if bound is not None and bound[0] != v:
                    raise bad(f"{_where(t.name, ax)} ({name}) is {v}, but {_where(*bound[1])} bound {name} = "
                              f"{bound[0]}")
                env[name] = (v, (t.name, ax))
                if info is not None and not info.admits(v):
                    raise bad(f"{_where(t.name, ax)} ({name}) is {v}: {name} = {v} violates {info.describe()}")
        values = {k: v for k, (v, _) in env.items()}
        for tname, ax, d, v in exprs:  # a derived dim: checked when its symbols are bound, else left to the run
            if set(d.free_symbols) <= set(values) and d.evaluate(values) != v:
                raise bad(f"{_where(tname, ax)} is {v}, but it must equal {d} = {d.evaluate(values)}")
        key = tuple((t.name, feed[t.name].shape[1 if self.batch else 0:]) for t in self.inputs)
        rows = values[self.batch] if self.batch else 1
        return key, rows, values

    def metadata(self, name: str, versions: list[str], platform: str = "dynshape") -> dict:
        """KServe v2 model metadata (-1 for symbolic dims) plus the `dynshape` extension: each dim's symbolic
        name and each symbol's range and divisibility, and which symbol is the batch dim."""
        def tensor(t: TensorSpec) -> dict:
            return {"name": t.name, "datatype": t.datatype, "shape": t.public_shape()}
        return {
            "name": name, "versions": versions, "platform": platform,
            "inputs": [tensor(t) for t in self.inputs], "outputs": [tensor(t) for t in self.outputs],
            "dynshape": {
                "symbols": [{"name": s.name, "min": s.min, "max": s.max, "multiple_of": s.multiple_of}
                            for s in self.symbols.values()],
                "batch_symbol": self.batch,
                "dims": {t.name: t.dim_names() for t in self.inputs + self.outputs},
            },
        }


def _where(name: str, axis: int) -> str:
    return f"input {name!r} axis {axis}"


def _dims(t: Any, v: Any) -> list:
    shape = getattr(t, "shape", None)
    if shape is None:
        shape = getattr(v, "shape", None)
    if shape is None:
        raise ValueError(f"{v.name!r} has no inferred shape; the server needs typed inputs and outputs")
    return [int(d) if isinstance(d, (int, np.integer)) else d for d in shape]
