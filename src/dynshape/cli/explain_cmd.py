"""`dynshape explain`: what a compiled model does on every call, and why.

It reports the variants and the specialisations that created them, how the binder reads each symbol from an
input axis, every guard checked before a kernel runs, the fused kernels and the worst-case memory.  The binding
and guard list follow `runtime.binder.make_binder` rule for rule (same input order, same first-linear-axis
choice), so what is printed is what the generated binder executes; --json also carries its source.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.text import Text

from dynshape.cli.args import parse_dims
from dynshape.cli.common import DimOpt, PrecisionOpt, console, fmt_bytes, friendly, load_model
from dynshape.cli.compile_cmd import (
    SigningKeyOpt,
    SpecializeOpt,
    TargetArg,
    kernel_steps,
    load_artefact,
    parse_specialize,
)
from dynshape.ir.graph import format_type
from dynshape.ir.types import TensorType
from dynshape.runtime.binder import linear_symbol
from dynshape.runtime.build import NodeStep
from dynshape.runtime.executable import compile as ds_compile
from dynshape.sym import Cond, Expr

EPILOG = """Examples:

  dynshape explain bert.ds

  dynshape explain bert.onnx --dim batch=1:8 --dim seq=1:512:8 --specialize batch=1,seq=128

  dynshape explain bert.ds --json > plan.json

  dynshape explain bert.onnx --dim batch=1:8 --dim seq=1:512 --profile served.json --memory-budget 2GiB
"""


def binding(exe: Any) -> tuple[dict[str, dict], list[dict]]:
    """symbol -> where the binder reads it, and every per-call guard (the binder tests them all in one expression)."""
    graph = exe.graph
    bound: dict[str, dict] = {}
    guards: list[dict] = []
    for v in graph.inputs:
        t = graph.types.get(v.name)
        if not isinstance(t, TensorType):  # sequences / optionals: the reference executor's general binder
            guards.append({"kind": "input", "text": f"{v.name}: {format_type(t, v.dtype)}"})
            continue
        shape = tuple(t.shape)
        guards.append({"kind": "input", "text": f"{v.name}: dtype {np.dtype(v.dtype)}, rank {len(shape)}"})
        for ax, d in enumerate(shape):
            axis = f"{v.name}.shape[{ax}]"
            if isinstance(d, int):
                guards.append({"kind": "static", "text": f"{axis} == {d}"})
                continue
            lin = linear_symbol(d)
            if lin is not None and lin[0].name not in bound:
                s, c, k0 = lin
                read = axis if k0 == 0 else f"({axis} - {k0})"
                expr = read if c == 1 else f"{read} / {c}"
                bound[s.name] = {"input": v.name, "axis": ax, "dim": str(d), "expression": f"{s.name} = {expr}"}
                if c != 1:
                    guards.append({"kind": "divisibility", "text": f"{read} % {c} == 0"})
            else:
                names = sorted(d.free_symbols) if isinstance(d, Expr) else []
                src = "; ".join(f"{n} from {bound[n]['input']}.shape[{bound[n]['axis']}]" for n in names if n in bound)
                guards.append({"kind": "equality", "text": f"{axis} == {d}", "origin": src or "solver"})
    for s in exe.symbols:
        if s.name not in bound:
            bound[s.name] = {"input": None, "axis": None, "dim": None,
                             "expression": f"{s.name} solved from all input shapes (no axis carries it linearly)"}
        hi = "" if s.hi is None else f" <= {s.hi}"
        guards.append({"kind": "range", "text": f"{s.lo} <= {s.name}{hi}"})
        if s.mult > 1:
            guards.append({"kind": "divisibility", "text": f"{s.name} % {s.mult} == 0"})
    for f in graph.signature.facts:  # the residual facts, filtered as Executable does
        if f.kind == "assume":  # not refused: a key that breaks it runs on a build at its exact shape
            if isinstance(f.check, Cond):
                guards.append({"kind": "assumed", "text": f"{f.text} (else: a build at the call's exact shape)",
                               "origin": f.origin})
        elif isinstance(f.check, Cond):
            guards.append({"kind": "fact", "text": f.text, "origin": f.origin})
        elif hasattr(f.check, "a") and hasattr(f.check, "b"):
            guards.append({"kind": "broadcast", "text": f"{f.text} (equal, or one side is 1)", "origin": f.origin})
    return bound, guards


def _precision(step: NodeStep, graph: Any, options: Any) -> str:
    """", on 8-bit weights..." for a native step that does not compute in plain float32 (NativeRule.describe)."""
    said = step.native.describe(step.node, graph, options) if step.how == "native" and step.native is not None \
        else None
    return f": {said}" if said else ""


def report(exe: Any, target: Path, declared_by: str) -> dict[str, Any]:
    """The whole explanation as plain data (what --json prints)."""
    graph = exe.graph
    names = [s.name for s in exe.symbols]
    bound, guards = binding(exe)
    variants = [{"values": None, "why": "generic: serves every admissible shape", "steps": len(exe.generic.steps)}]
    variants += [{"values": dict(zip(names, key)), "steps": len(v.steps), "guard": v.guard.text(),
                  "why": f"declared by {declared_by}: shapes precomputed, chosen by a dict lookup on the bound symbols"
                  if v.guard.where == "compile" and v.guard.why.startswith("declared") else
                  f"{v.guard.why} ({v.guard.where})"}
                 for key, v in exe.variants.items()]
    kernels = [{"name": f"kernel {i}", "kind": s.kind, "ops": [{"node": n.name, "op": n.op_type} for n in s.nodes],
                "inputs": [str(x) for x in s.inputs], "outputs": list(s.outputs), "shares_code_with": s.shared_with,
                "method": s.method}
               for i, s in enumerate(kernel_steps(exe), 1)]
    built_graph = exe.generic.build.graph
    lowered = Counter(f"{s.node.op_type} ({s.how}{_precision(s, built_graph, exe.options)})"
                      for s in exe.generic.steps if isinstance(s, NodeStep))
    built = exe.explain_build()
    mem = graph.memory_bound()
    return {
        "target": str(target),
        "symbols": [{"name": s.name, "min": s.lo, "max": s.hi, "multiple_of": s.mult, "bound_from": bound[s.name]}
                    for s in exe.symbols],
        "variants": variants,
        "guards": guards,
        "kernels": kernels,
        "library_steps": dict(sorted(lowered.items())),
        "uncompiled": built["uncompiled"],
        "bodies": built["bodies"],
        "concat_slices": built["concat_slices"],
        "per_key": built["per_key"],
        "builds": built["builds"],
        "folded": built["folded"],
        "options": built["options"],
        "memory": {"bytes": mem.bytes, "peak_node": mem.peak_node, "unbounded": mem.unbounded, "text": str(mem)},
        "binder_source": getattr(exe.binder, "source", None),
        "specialisation": exe.explain_strategy(),
    }


def _print(data: dict[str, Any]) -> None:
    def head(title: str) -> None:
        console.print(Text(title, style="bold"))

    def line(text: str, note: str = "") -> None:
        console.print(Text(f"  {text}") + (Text(f"  ({note})", style="dim") if note else Text("")))

    console.print(Text(f"{data['target']}", style="bold underline"))
    head("which keys take which build")
    for b in data["builds"]:
        line(f"{b['keys']}: {b['build']}")
    f = data["folded"]
    if f["nodes"]:
        line(f"constant subgraphs computed at compile time: {fmt_bytes(f['bytes'])} (cap {fmt_bytes(f['cap'])}), "
             + ", ".join(f"{op} x{n}" for op, n in sorted(f["nodes"].items())))
    head("variants")
    for v in data["variants"]:
        vals = ", ".join(f"{k}={x}" for k, x in v["values"].items()) if v["values"] else "generic"
        line(f"{vals}: {v['steps']} steps", v["why"])
    head("symbols (bound per call)")
    if not data["symbols"]:
        line("none: every input shape is static")
    for s in data["symbols"]:
        b = s["bound_from"]
        where = f"{b['input']} axis {b['axis']} is {b['dim']}" if b["input"] is not None else ""
        line(b["expression"], where)
    head("guards (checked on every call, before any kernel runs)")
    for g in data["guards"]:
        line(f"{g['kind']}: {g['text']}", g.get("origin", ""))
    head(f"fused kernels ({len(data['kernels'])})")
    for k in data["kernels"]:
        line(f"{k['name']}: " + " -> ".join(f"{o['op']} {o['node']}" for o in k["ops"]),
             f"outputs {', '.join(k['outputs'])}" + (f"; {k['method']}" if k["method"] else ""))
    low = sum(1 for k in data["kernels"] if k["method"].startswith("bf16"))
    if low:
        line(f"precision: {low} kernel(s) multiply in bf16 (marked: products, attention); everything else float32")
    if data["library_steps"]:
        line("other steps: " + ", ".join(f"{op} x{n}" for op, n in data["library_steps"].items()))
    if data["concat_slices"]:
        line("written into their Concat's columns (no copy): " + ", ".join(
            f"{c['value']} -> {c['into']}[{c['columns'][0]}:{c['columns'][1]}]" for c in data["concat_slices"]))
    if data["per_key"]:
        arena = sum(p["bucket plans"].startswith("every") for p in data["per_key"])
        line(f"computed from the shape alone ({len(data['per_key'])} steps): once per shape in a shape's own plan; "
             f"{arena} of them on every call, in the arena, in a plan serving shapes not seen before")
    head(f"nodes without a compiled kernel ({len(data['uncompiled'])})")
    for u in data["uncompiled"]:
        line(f"{u['node']}: runs its {u['runs']}, {u['when']}", u["why"])
    if data["bodies"]:
        head(f"Loop / Scan bodies ({len(data['bodies'])})")
        for b in data["bodies"]:
            line(f"{b['node']}: body {b['body']}", b["why"])
    head("options (explicit ones marked; 'build' options are part of the kernels' cache key)")
    for o in data["options"]:
        mark = "" if o["origin"] == "default" else f" [{o['origin']}]"
        line(f"{o['name']} = {o['value']!r}{mark}", f"{o['kind']}: {o['doc']}")
    mem = data["memory"]
    head("worst-case memory")
    line(f"{fmt_bytes(mem['bytes'])}; {mem['text']}")
    spec = data["specialisation"]
    head(f"specialisation: {spec['requested']} -> {spec['strategy']}")
    for reason in spec["reasons"]:
        line(reason)
    line(f"dispatch: {spec['dispatch']}")
    for g in (*spec["variants"], *spec["buckets"]):
        line(f"{g['kind']} guard: {g['guard']}", f"{g['why']}; {g['where']}")
        for d in g["dropped"]:
            line(f"  dropped {d}")
    for note in spec["notes"]:
        line(f"note: {note}")
    line(f"plans: {spec['plans']['rule']}")
    arena = spec["memory"]
    if arena is not None:
        line(f"memory plan: {arena['text']}")
        if arena.get("kernel_scratch"):
            line(f"  {arena['kernel_scratch']['text']}")


@friendly
def explain(
    target: TargetArg,
    dim: DimOpt = None,
    specialize: SpecializeOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the explanation as JSON (for scripts).")] = False,
    strategy: Annotated[str, typer.Option(help="auto, generic, multi_version, bucketed or static (ONNX targets).")]
    = "auto",
    profile: Annotated[Path | None, typer.Option(exists=True, help="Key counts from exe.save_profile: the "
                                                 "variants it prebuilds are shown (ONNX targets).")] = None,
    memory_budget: Annotated[str | None, typer.Option(help="e.g. 2GiB: refuse if the worst case exceeds it.")]
    = None,
    signing_key_file: SigningKeyOpt = None,
    precision: PrecisionOpt = "fp32",
) -> None:
    """Explain a compiled model: variants and why, symbol binding, per-call guards, fused kernels, worst-case memory."""
    if target.is_dir():
        for flag, given in (("--strategy", strategy != "auto"), ("--profile", profile),
                            ("--memory-budget", memory_budget), ("--precision", precision != "fp32")):
            if given:
                raise typer.BadParameter(f"{target} is an artefact: it serves its build as saved (generic strategy);"
                                         f" drop {flag} or explain the ONNX model", param_hint=flag)
        exe = load_artefact(target, dim, specialize, signing_key_file)
        declared_by = "`dynshape compile --specialize`"
    else:
        dims, specs = parse_dims(dim), parse_specialize(specialize)
        exe = ds_compile(load_model(target, dims), specialize=specs, strategy=strategy, profile=profile,
                         memory_budget=memory_budget, precision=precision)
        declared_by = "--specialize"
    data = report(exe, target, declared_by)
    if as_json:
        typer.echo(json.dumps(data, indent=1))
    else:
        _print(data)
