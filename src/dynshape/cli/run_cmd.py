"""`dynshape run`: one call of a model on inputs from files, random data, or symbol values."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.table import Table
from rich.text import Text

from dynshape.cli.args import parse_dims, parse_inputs, parse_randoms, parse_shape
from dynshape.cli.common import (
    EXECUTOR_NOTE,
    CliInputError,
    DimOpt,
    Executor,
    console,
    dynshape_executor,
    friendly,
    load_model,
)
from dynshape.cli.compile_cmd import SigningKeyOpt, TargetArg, load_artefact
from dynshape.cli.feeds import (
    env_from_values,
    file_feed,
    generated_feed,
    generated_shapes,
    preflight,
    random_feed,
    random_shapes,
)

EPILOG = """Examples:

  dynshape run mlp.onnx --input x=x.npy -o out/

  dynshape run bert.onnx --random input_ids=2,16:0:1000 --random attention_mask=2,16:1:2

  dynshape run bert.onnx --shape 2x16   (every input generated for batch=2, seq=16)

  dynshape run bert.ds --shape 2x16     (an artefact from `dynshape compile`: nothing is recompiled)

Generated integers are drawn from [0, 100), token ids from [0, rows of the table they index), masks are ones.
"""


def summary_table(outputs: dict[str, np.ndarray]) -> Table:
    table = Table("output", "shape", "dtype", "min", "max", "mean")
    for name, a in outputs.items():
        a = np.asarray(a)
        numeric = a.size > 0 and (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_)
        stats = [f"{float(f(a)):.6g}" for f in (np.min, np.max, np.mean)] if numeric else ["-"] * 3
        table.add_row(Text(name), str(a.shape), str(a.dtype), *stats)
    return table


@friendly
def run(
    model: TargetArg,
    inputs: Annotated[list[str] | None, typer.Option(
        "--input", "-i", metavar="NAME=FILE.npy", help="An input from a .npy file. Repeatable.")] = None,
    randoms: Annotated[list[str] | None, typer.Option(
        "--random", "-r", metavar="NAME=SHAPE[:LOW:HIGH]",
        help="A random input of that shape, e.g. x=2,16 or ids=2,16:0:1000 (integers from [LOW, HIGH)). "
             "Repeatable.")] = None,
    shape: Annotated[str | None, typer.Option(
        metavar="AxB", help="Values of the model's symbols (signature order) to generate every input not given "
                            "by --input/--random.")] = None,
    dim: DimOpt = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", "-o", file_okay=False, help="Write each output to OUT/<name>.npy, not only a summary.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the generated inputs.")] = 0,
    signing_key_file: SigningKeyOpt = None,
) -> None:
    """Run a model once and summarise (or save) its outputs; inputs that break the signature are rejected."""
    files, rand = parse_inputs(inputs), parse_randoms(randoms)
    values = parse_shape(shape, "--shape") if shape is not None else None
    exe = load_artefact(model, dim, key_file=signing_key_file) if model.is_dir() else None
    graph = exe.graph if exe is not None else load_model(model, parse_dims(dim))
    given = file_feed(graph, files)
    planned = random_shapes(graph, rand)
    env = env_from_values(graph, values) if values is not None else None
    if env is not None:
        planned.update(generated_shapes(graph, env, skip={*given, *planned}))
    missing = [v.name for v in graph.inputs if v.name not in given and v.name not in planned]
    if missing:
        raise CliInputError(f"no data for input(s) {', '.join(missing)}; give each with --input NAME=FILE.npy or "
                            "--random NAME=SHAPE, or generate them all with --shape AxB (values of "
                            f"{' x '.join(graph.signature.symbols) or 'no symbols'})")
    preflight(graph, given, planned)  # shapes, ranges, facts and memory: checked before any data is drawn
    feed = {**given, **random_feed(graph, rand, seed)}
    if env is not None:
        feed.update(generated_feed(graph, env, seed, skip=set(feed)))
    feed = {v.name: feed[v.name] for v in graph.inputs}
    executor = Executor(f"dynshape (artefact {model})", exe.run, True, exe) if exe is not None else \
        dynshape_executor(graph)
    console.print(Text(f"executor: {executor.label}", style="bold"))
    if not executor.compiled:
        console.print(Text(f"  ({EXECUTOR_NOTE})", style="dim"))
    for name, a in feed.items():
        console.print(Text(f"  input {name}: {a.dtype}{list(a.shape)}"))
    t0 = time.perf_counter()
    outputs = executor.run(feed)
    ms = (time.perf_counter() - t0) * 1e3
    console.print(summary_table(outputs))
    console.print(f"ran in {ms:.2f} ms")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, a in outputs.items():
            path = out_dir / (re.sub(r"[^\w.\-]", "_", name) + ".npy")
            np.save(path, np.asarray(a))
            console.print(Text(f"wrote {path}"))
