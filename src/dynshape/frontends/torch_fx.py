"""aot_autograd's forward graph of a Dynamo graph, as a dynshape Graph.

Dynamo hands a backend its FX graph whose placeholders say where each value comes from
(`meta['grapharg'].source`): a user tensor (`L['x']`), a parameter or buffer of the model
(`L['self']._modules['fc']._parameters['weight']`), or a size (`L['x'].size()[0]`). aot_autograd then traces it
to ATen with the same placeholders, in the same order. Here:

- each size symbol of the ShapeEnv becomes a dynshape symbol named after its first source (`x_0`), with torch's
  range (`var_to_range`); Dynamo's default lower bound of 2 (its 0/1 specialisation) is relaxed to 1 when
  `relax_lower` is set, because the graph Dynamo later traces for size 1 is then served by this build, after
  checking that it is this graph with the symbol fixed (see `dynshape.torch.backend`);
- parameters and buffers become constants (their values when the graph is compiled: weights are frozen);
- ShapeEnv guards and runtime asserts that ranges do not already imply become signature facts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dynshape.frontends.aten import (
    Conversion,
    Converter,
    PlaceholderSpec,
    SymbolTable,
    Unsupported,
    condition,
    finish,
    range_of,
    symbol_name,
)


@dataclass
class DynamoInput:
    """One placeholder of the Dynamo graph: its source text, the real value at compile time, whether it is a
    parameter/buffer of the model."""

    source: str
    value: Any
    is_param: bool


@dataclass
class FxConversion:
    """A converted Dynamo graph: the dynshape conversion and what explain() shows about it."""

    conversion: Conversion
    table: SymbolTable
    inputs: list[DynamoInput]
    guards: list[str] = field(default_factory=list)  # ShapeEnv guards, in dynshape's symbol names
    notes: list[str] = field(default_factory=list)


def is_param_source(source: str) -> bool:
    """Whether a Dynamo source names a parameter or buffer of a module (frozen as a constant)."""
    return "._parameters[" in source or "._buffers[" in source


def dynamo_inputs(gm: Any, example_inputs: Sequence[Any]) -> list[DynamoInput]:
    """Source and real value of each placeholder of a Dynamo graph, in order."""
    import torch

    out = []
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(phs, example_inputs):
        ga = node.meta.get("grapharg")
        src = getattr(getattr(ga, "source", None), "name", None)
        src = src() if callable(src) else src
        src = str(src) if src is not None else node.name
        is_param = isinstance(value, torch.Tensor) and (is_param_source(src) or isinstance(value, torch.nn.Parameter))
        out.append(DynamoInput(src, value, is_param))
    return out


def symbol_table(shape_env: Any, *, relax_lower: bool, subs: dict | None = None,
                 input_sources: Sequence[str] = ()) -> SymbolTable:
    """Every integer symbol of the ShapeEnv with a source, named after it, with torch's range. A symbol several
    inputs carry is named after the earliest of them in `input_sources` (the graph's input order), so graphs
    Dynamo recompiles name their symbols alike."""
    table = SymbolTable(subs=dict(subs or {}))
    used: set[str] = set()
    sources = getattr(shape_env, "var_to_sources", {}) or {}
    ranges = getattr(shape_env, "var_to_range", {}) or {}
    replaced = getattr(shape_env, "replacements", {}) or {}
    merged: dict[Any, list] = {k: list(v) for k, v in sources.items()}
    for r, target in replaced.items():  # s_ids1 -> s_mask1 after a guard: s_mask1 is also the ids' size
        if getattr(target, "is_Symbol", False):
            merged.setdefault(target, []).extend(sources.get(r, []))
    sources = merged
    for s in sorted(ranges, key=lambda s: str(s)):
        name = str(s)
        if s in replaced:
            continue  # torch replaced it (by a constant or another symbol) everywhere
        if not name.startswith(("s", "u")) or name.startswith("sf"):
            continue  # float symbols (zf*) are replaced by constants before this point
        srcs = [source_text(x) for x in sources.get(s, [])]
        if not srcs:
            continue
        srcs.sort(key=lambda x: _input_rank(x, input_sources))
        lo, hi = range_of(ranges[s])
        lo_used = 1 if relax_lower and lo == 2 else lo
        table.declare(name, symbol_name(srcs[0], used), lo_used, hi, srcs, torch_range=(lo, hi))
    return table


def _input_rank(src: str, input_sources: Sequence[str]) -> int:
    for i, base in enumerate(input_sources):
        if src.startswith(base + ".") or src == base:
            return i
    return len(input_sources)


def source_text(src: Any) -> str:
    """A Dynamo source's text (`L['self'].norm.eps`): its `name`, a method or a property by torch version."""
    n = getattr(src, "name", src)
    return str(n() if callable(n) else n)


def input_name(source: str, used: set[str]) -> str:
    """`L['input_ids']` -> `input_ids`."""
    return symbol_name(source, used)


def convert_aot(gm: Any, inputs: list[DynamoInput], shape_env: Any, *, relax_lower: bool = True,
                subs: dict | None = None, exact_safe_softmax: bool = False, name: str = "torch",
                infer: bool = True) -> FxConversion:
    """Convert aot_autograd's forward graph `gm` whose placeholders match `inputs` one to one (`infer=False`:
    only the structure stream is wanted, no shape inference)."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(phs) != len(inputs):
        raise Unsupported(f"aot_autograd's graph has {len(phs)} inputs for Dynamo's {len(inputs)} (mutated or "
                          "aliased inputs)")
    table = symbol_table(shape_env, relax_lower=relax_lower, subs=subs,
                         input_sources=[i.source for i in inputs if not i.is_param])
    used: set[str] = set()
    specs = []
    for node, inp in zip(phs, inputs):
        val = node.meta.get("val")
        if inp.is_param:
            specs.append(PlaceholderSpec("const", name=_param_name(inp.source), value=inp.value,
                                         key=(id(inp.value), tuple(inp.value.shape), str(inp.value.dtype))))
        elif hasattr(val, "shape") and not node.users and all(isinstance(d, int) for d in val.shape):
            specs.append(PlaceholderSpec("unused"))  # e.g. a module float made a constant: not a dynshape input
        elif hasattr(val, "shape"):
            specs.append(PlaceholderSpec("input", name=input_name(inp.source, used)))
        else:
            specs.append(PlaceholderSpec("size"))
    conv = Converter(gm, table, specs, name=name, exact_safe_softmax=exact_safe_softmax).run()
    facts, texts, notes = _guard_facts(shape_env, table)
    if infer:
        finish(conv, facts)
    return FxConversion(conv, table, inputs, texts, notes + conv.notes)


def _param_name(source: str) -> str:
    s = source.replace("L['self']", "").replace("._modules['", ".").replace("._parameters['", ".")
    s = s.replace("._buffers['", ".").replace("']", "")
    return s.strip(".") or "param"


def _guard_facts(shape_env: Any, table: SymbolTable) -> tuple[list, list[str], list[str]]:
    """ShapeEnv guards and deferred runtime asserts on sizes as (condition, text, origin) facts."""
    facts, texts, notes = [], [], []
    items = [(g.expr, "Dynamo guard") for g in getattr(shape_env, "guards", []) or []]
    for ras in (getattr(shape_env, "deferred_runtime_asserts", {}) or {}).values():
        items += [(ra.expr, f"torch runtime assert ({getattr(ra, 'msg', '')})") for ra in ras]
    for expr, origin in items:
        try:
            expr = shape_env.simplify(expr)
        except Exception:  # noqa: BLE001 - keep the raw guard
            pass
        if not getattr(expr, "free_symbols", None) or any(str(s).startswith(("zf", "sf"))
                                                          for s in expr.free_symbols):
            continue
        try:
            c = condition(expr, table, origin)
        except Unsupported as e:
            notes.append(f"{origin} {expr} is not checked by dynshape: {e}")
            continue
        if isinstance(c, bool):
            if not c:
                texts.append(f"{expr} (always false here)")
            continue
        texts.append(c.text)
        facts.append((c, c.text, origin))
    return facts, texts, notes
