"""`dynshape inspect`: what the symbolic engine concluded about a model, before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from dynshape.cli.args import parse_dims
from dynshape.cli.common import DimOpt, ModelArg, console, fmt_bytes, friendly, load_model, symbol_info
from dynshape.ir.graph import format_type, upper_bound
from dynshape.ir.types import TensorType

EPILOG = """Examples:

  dynshape inspect bert.onnx --dim batch=1:8 --dim seq=1:512:8

  dynshape inspect mlp.onnx --json > mlp.json
"""


def tensor_rows(graph: Any) -> list[dict[str, Any]]:
    """Graph inputs then every node output: producer, type, element count and its upper bound."""
    producers: list[tuple[str, str]] = [(v.name, "input") for v in graph.inputs]
    producers += [(o, n.op_type) for n in graph.nodes for o in n.outputs if o]
    rows = []
    for name, producer in producers:
        t = graph.types.get(name)
        numel = graph.numel(name)
        rows.append({
            "name": name,
            "producer": producer,
            "dtype": str(t.dtype) if t is not None else None,
            "shape": [str(d) for d in t.shape] if isinstance(t, TensorType) and t.shape is not None else None,
            "type": format_type(t),
            "numel": None if numel is None else str(numel),
            "numel_bound": upper_bound(numel) if numel is not None else None,
        })
    return rows


def report(graph: Any, model: Path) -> dict[str, Any]:
    """The whole inspection as plain data (what --json prints)."""
    mem = graph.memory_bound()
    return {
        "model": str(model),
        "graph": graph.name,
        "opset": graph.opset,
        "symbols": [{**symbol_info(s), "default_range": symbol_info(s)["name"] in graph.signature.defaulted}
                    for s in graph.signature.symbols.values()],
        "rank_symbols": dict(graph.rank_symbols),
        "dynamic": graph.dynamic,
        "facts": [{"kind": f.kind, "text": f.text, "origin": f.origin} for f in graph.signature.facts],
        "inputs": [{"name": v.name, "type": format_type(graph.types.get(v.name), v.dtype)} for v in graph.inputs],
        "outputs": [{"name": v.name, "type": format_type(graph.types.get(v.name), v.dtype)} for v in graph.outputs],
        "tensors": tensor_rows(graph),
        "memory_bound": {"bytes": mem.bytes, "peak_node": mem.peak_node, "unbounded": mem.unbounded,
                         "text": str(mem)},
    }


def print_signature(graph: Any) -> None:
    """Symbols with ranges and divisors, then every fact inference found (with the node it came from)."""
    sig = graph.signature
    console.print(Text("signature", style="bold"))
    if not sig.symbols:
        console.print("  (no symbols: every input shape is static)")
    defaulted = False
    for s in sig.symbols.values():
        i = symbol_info(s)
        hi = "inf" if i["max"] is None else i["max"]
        mult = f", multiple of {i['multiple_of']}" if i["multiple_of"] > 1 else ""
        mark = i["name"] in sig.defaulted
        defaulted = defaulted or mark
        console.print(Text(f"  {i['name']} in [{i['min']}, {hi}]{mult}") +
                      Text("  (default range)" if mark else "", style="dim"))
    if defaulted:
        console.print(Text("  named dims default to [0, inf]: ONNX admits empty tensors; --dim NAME=1: excludes 0 "
                           "(simpler shapes: a broadcast of two such dims is max(a, b), not max(a, b)*min(a, b, 1))",
                           style="dim"))
    for f in sig.facts:
        console.print(Text(f"  {f.kind}: {f.text}  ", style="cyan") + Text(f"(from {f.origin})", style="dim"))
    for title, values in (("inputs", graph.inputs), ("outputs", graph.outputs)):
        console.print(Text(title, style="bold"))
        for v in values:
            console.print(Text(f"  {v.name}: {format_type(graph.types.get(v.name), v.dtype)}"))


@friendly
def inspect(
    model: ModelArg,
    dim: DimOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON (for scripts).")] = False,
) -> None:
    """Show a model's symbolic signature, every tensor's shape and size bound, and the worst-case memory."""
    graph = load_model(model, parse_dims(dim))
    data = report(graph, model)
    if as_json:
        typer.echo(json.dumps(data, indent=1))
        return
    console.print(Text(f"{model}: graph {graph.name!r}, opset {graph.opset}, {len(graph.nodes)} nodes",
                       style="bold"))
    print_signature(graph)
    table = Table(title="tensors", title_justify="left", box=box.SIMPLE_HEAD)
    for col, ratio in (("tensor", 4), ("op", 2), ("type", 4), ("elements", 3), ("max elements", 2)):
        table.add_column(col, overflow="fold", ratio=ratio, justify="right" if col == "max elements" else "left")
    for r in data["tensors"]:
        bound = "unbounded" if r["numel_bound"] is None else f"{r['numel_bound']:,}"
        table.add_row(Text(r["name"]), Text(r["producer"]), Text(r["type"]), Text(r["numel"] or "?"), bound)
    console.print(table)
    mem = data["memory_bound"]
    console.print(Text("worst-case memory: ", style="bold") + Text(f"{fmt_bytes(mem['bytes'])}; {mem['text']}"))
