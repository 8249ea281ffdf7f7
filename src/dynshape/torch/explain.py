"""`dynshape.torch.explain()`: every graph the dynshape backend was handed, and what became of it.

For each graph: Dynamo's compile id (`frame/recompile`) and, for a recompile, the guard failure Dynamo gave as
its reason; the inputs with their symbolic shapes; each symbol with the range dynshape checks, torch's own range
and the sources it was named after; the ShapeEnv guards; the facts dynshape's binder checks per call; and the
outcome: built (with the compile time), served by an earlier build (with the symbols it fixes), or run eagerly
(with the ops dynshape lacks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dynshape.ir.graph import format_type

RECORDS: list[GraphRecord] = []


@dataclass
class GraphRecord:
    """What explain() reports about one graph."""

    index: int
    compile_id: str
    recompile_reason: str | None
    inputs: list[str] = field(default_factory=list)
    symbols: list[dict] = field(default_factory=list)
    guards: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    outcome: str = "pending"
    build: int | None = None
    exe: Any = None
    convert_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def describe(self, fx: Any) -> None:
        """Fill in the symbols, inputs, guards and facts of a converted graph (`FxConversion`)."""
        g = fx.conversion.graph
        self.inputs = [f"{v.name}: {format_type(g.types.get(v.name), v.dtype)}" for v in g.inputs]
        t = fx.table
        self.symbols = []
        for name, e in sorted(g.signature.symbols.items()):
            s = e.atom()
            lo, hi = t.torch_ranges.get(name, (s.lo, s.hi))
            self.symbols.append({"name": name, "range": (s.lo, s.hi), "torch_range": (lo, hi),
                                 "sources": list(t.sources.get(name, []))})
        self.guards = list(fx.guards)
        self.facts = [str(f) for f in g.signature.facts if f.kind in ("require", "eq", "range")]
        self.notes = list(fx.notes)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "exe"}

    def __str__(self) -> str:
        head = f"graph {self.index} (Dynamo compile {self.compile_id})"
        lines = [head]
        if self.recompile_reason:
            lines.append(f"  recompiled because: {self.recompile_reason}")
        lines.append(f"  outcome: {self.outcome}")
        if self.inputs:
            lines.append("  inputs: " + "; ".join(self.inputs))
        for s in self.symbols:
            lo, hi = s["range"]
            tlo, thi = s["torch_range"]
            rng = f"[{lo}, {'inf' if hi is None else hi}]"
            trng = f"[{tlo}, {'inf' if thi is None else thi}]"
            extra = "" if (lo, hi) == (tlo, thi) else f" (torch: {trng}; 1 admitted so the size-1 graph can reuse it)"
            lines.append(f"  symbol {s['name']} in {rng}{extra} from {', '.join(s['sources'][:3])}")
        if not self.symbols:
            lines.append("  no symbols: every size is static")
        for gtext in self.guards:
            lines.append(f"  guard: {gtext}")
        for f in self.facts:
            lines.append(f"  checked per call: {f}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


@dataclass
class Report:
    """explain()'s result: print it, or read `.graphs` (one dict each)."""

    records: list[GraphRecord]

    @property
    def graphs(self) -> list[dict]:
        return [r.as_dict() for r in self.records]

    @property
    def builds(self) -> int:
        """How many dynshape builds the graphs needed (graphs served by an earlier build do not count)."""
        return sum(1 for r in self.records if r.outcome.startswith("built"))

    @property
    def serving(self) -> int:
        """How many distinct executables serve the graphs now (a retired build's graphs count with their new one)."""
        return len({id(r.exe) for r in self.records if r.exe is not None})

    def __str__(self) -> str:
        if not self.records:
            return "dynshape backend: no graph compiled yet"
        fell = sum(1 for r in self.records if r.outcome.startswith("eager"))
        head = (f"dynshape backend: {len(self.records)} graph(s) from Dynamo, {self.builds} dynshape build(s) "
                f"compiled, {self.serving} serving them, {fell} eager fallback(s)")
        return "\n".join([head, *(str(r) for r in self.records)])


def explain() -> Report:
    """Every graph the dynshape backend has compiled in this process (see the module docstring)."""
    return Report(list(RECORDS))


def new_record(gm: Any, example_inputs: Any) -> GraphRecord:
    """Start the record of a graph Dynamo just handed over (compile id, recompile reason)."""
    rec = GraphRecord(len(RECORDS), _compile_id(), _recompile_reason())
    RECORDS.append(rec)
    return rec


def drop(rec: GraphRecord) -> None:
    """Forget a record whose trace Dynamo abandoned (it restarts and hands the graph over again)."""
    if rec in RECORDS:
        RECORDS.remove(rec)
        for i, r in enumerate(RECORDS):
            r.index = i


def _compile_id() -> str:
    try:
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
        return str(cid) if cid is not None else "?"
    except Exception:  # noqa: BLE001
        return "?"


def _recompile_reason() -> str | None:
    """The guard failure Dynamo recorded for this recompilation (its metrics context; private torch API)."""
    try:
        from torch._dynamo.utils import get_metrics_context

        return get_metrics_context()._metrics.get("recompile_reason")
    except Exception:  # noqa: BLE001
        return None
