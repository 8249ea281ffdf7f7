"""`dynshape compile`: build a model once into an artefact directory that `run`, `explain` and `ds.load` serve."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from dynshape.cli.args import parse_dims
from dynshape.cli.common import DimOpt, ModelArg, PrecisionOpt, console, fmt_bytes, friendly
from dynshape.compiler import artifact
from dynshape.ir.graph import describe_symbol
from dynshape.runtime.build import KernelStep

EPILOG = """Examples:

  dynshape compile bert.onnx --dim batch=1:8 --dim seq=1:512:8 --specialize batch=1,seq=128 -o bert.ds

  dynshape run bert.ds --shape 2x64

  dynshape explain bert.ds
"""

_SPEC = re.compile(r"^[A-Za-z_][\w.\-]*=\d+$")

# Parameter types shared with `run` and `explain`, which take an artefact directory as well as a model.
TargetArg = Annotated[Path, typer.Argument(exists=True, metavar="MODEL.onnx|ARTEFACT",
                                           help="ONNX model file, or an artefact directory from `dynshape compile`.")]
SpecializeOpt = Annotated[list[str] | None, typer.Option(
    "--specialize", "-s", metavar="NAME=V,NAME=V",
    help="Also build a fully static variant for these symbol values (every symbol), e.g. batch=1,seq=128. "
         "Repeatable.")]


SigningKeyOpt = Annotated[Path | None, typer.Option(
    "--signing-key-file", exists=True, dir_okay=False, metavar="KEYFILE", envvar="DYNSHAPE_SIGNING_KEY_FILE",
    help="A secret key (file contents): compile signs the artefact's manifest with HMAC-SHA256; run/explain refuse "
         "an artefact without a matching signature. Artefacts are native code: load only your own. "
         "Default: $DYNSHAPE_SIGNING_KEY_FILE.")]


def read_key(path: Path | None) -> bytes | None:
    """The signing key in `path` (trailing newline dropped); an empty file is a user error."""
    if path is None:
        return None
    key = path.read_bytes().rstrip(b"\r\n")
    if not key:
        raise typer.BadParameter(f"{path} is empty; a signing key needs at least one byte",
                                 param_hint="--signing-key-file")
    return key


def parse_specialize(specs: list[str] | None) -> list[dict[str, int]]:
    """`batch=1,seq=128` -> {"batch": 1, "seq": 128}; malformed syntax is a bad invocation (exit 2)."""
    out = []
    for spec in specs or []:
        parts = [p.strip() for p in spec.split(",")]
        if not all(_SPEC.match(p) for p in parts):
            raise typer.BadParameter(f"{spec!r}: expected NAME=VALUE pairs separated by ',', e.g. batch=1,seq=128",
                                     param_hint="--specialize")
        values = {k: int(v) for k, v in (p.split("=") for p in parts)}
        if len(values) != len(parts):
            raise typer.BadParameter(f"{spec!r}: a symbol is given twice", param_hint="--specialize")
        out.append(values)
    return out


def load_artefact(path: Path, dim: list[str] | None, specialize: list[str] | None = None,
                  key_file: Path | None = None) -> Any:
    """`ds.load(path)`; --dim / --specialize were fixed at compile time, so passing them is a bad invocation."""
    for flag, given in (("--dim", dim), ("--specialize", specialize)):
        if given:
            raise typer.BadParameter(f"{path} is an artefact: its dims and variants were fixed by `dynshape compile` "
                                     f"({path / artifact.CONFIG}); drop {flag} or recompile", param_hint=flag)
    return artifact.load(path, signing_key=read_key(key_file))


def kernel_steps(exe: Any) -> list[KernelStep]:
    """The generic build's steps that run a generated C kernel (the others: native or numpy lowerings)."""
    return [s for s in exe.generic.steps if isinstance(s, KernelStep)]


@friendly
def compile_model(
    model: ModelArg,
    out: Annotated[Path, typer.Option("--out", "-o", file_okay=False,
                                      help="Artefact directory to write (an existing artefact there is replaced).")],
    dim: DimOpt = None,
    specialize: SpecializeOpt = None,
    signing_key_file: SigningKeyOpt = None,
    precision: PrecisionOpt = "fp32",
) -> None:
    """Compile a model once (kernels, variants) into an artefact directory; `run`/`explain` it without recompiling."""
    dims, specs = parse_dims(dim), parse_specialize(specialize)
    t0 = time.perf_counter()
    columns = (TextColumn("{task.description:<32}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("compiling", total=None)

        def on_step(label: str, done: int, total: int) -> None:
            progress.update(task, description=label, completed=done, total=total)

        exe = artifact.save(model, out, dims, specs, on_step=on_step, signing_key=read_key(signing_key_file),
                               precision=precision)
    seconds = time.perf_counter() - t0
    libs = [p for p in (out / artifact.LIBS).rglob("*.so")]
    table = Table(show_header=False, box=None)
    table.add_row("artefact", Text(str(out)))
    table.add_row("symbols", Text(", ".join(describe_symbol(s) for s in exe.graph.signature.symbols.values())
                                  or "none (every input shape is static)"))
    table.add_row("steps", f"{len(exe.generic.steps)} (from {len(exe.graph.nodes)} nodes)")
    table.add_row("kernels", f"{len(kernel_steps(exe))} fused C kernel(s) in {len(libs)} librar"
                             f"{'y' if len(libs) == 1 else 'ies'} ({fmt_bytes(sum(p.stat().st_size for p in libs))})")
    names = [s.name for s in exe.symbols]
    variants = ["generic"] + [", ".join(f"{n}={v}" for n, v in zip(names, key)) for key in exe.variants]
    table.add_row("variants", Text("; ".join(variants)))
    table.add_row("time", f"{seconds:.2f} s")
    console.print(Text(f"compiled {model}", style="bold"))
    console.print(table)
