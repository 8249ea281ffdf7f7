"""What every command shares: consoles, the error policy, model loading and the choice of executor.

Error policy (the documented exit codes): a `DynshapeError` or a `CliInputError` is the user's to fix, so it
is printed as one message on stderr and the command exits 1; click's own usage errors exit 2; anything else is
a dynshape bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import numpy as np
import typer
from rich.console import Console
from rich.text import Text

import dynshape as ds
from dynshape.errors import DynshapeError

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

F = TypeVar("F", bound=Callable[..., Any])


class CliInputError(Exception):
    """Bad user data the CLI itself detects (unreadable .npy, unknown input name, bad stream file): exit 1."""


def friendly(fn: F) -> F:
    """Turn the user's errors into one message on stderr and exit code 1, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (DynshapeError, CliInputError) as e:
            kind = type(e).__name__ if isinstance(e, DynshapeError) else "error"
            err_console.print(Text(f"{kind}: ", style="bold red") + Text(str(e)), soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def load_model(path: Path, dims: dict[str, Any] | None = None) -> Any:
    """Load and shape-infer an ONNX file (`ds.load_onnx`); ModelError / ShapeError propagate to `friendly`."""
    return ds.load_onnx(str(path), dims=dims or None)


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@dataclass
class Executor:
    """How dynshape runs a graph here: the compiled executable when `ds.compile` exists, else `graph.run`."""

    label: str
    run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
    compiled: bool
    exe: Any = None


def dynshape_executor(graph: Any, precision: str = "fp32") -> Executor:
    compile_ = getattr(ds, "compile", None)
    if compile_ is not None:
        exe = compile_(graph, precision=precision)
        return Executor("dynshape (compiled)" if precision == "fp32" else f"dynshape (compiled, {precision})",
                        exe.run, True, exe)
    return Executor("dynshape reference (numpy)", graph.run, False)


EXECUTOR_NOTE = "dynshape.compile is not available in this build, so dynshape runs its numpy reference executor"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "unbounded"
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def symbol_info(s: Any) -> dict[str, Any]:
    """name/min/max/multiple_of of a signature symbol (an atom-wrapping Expr)."""
    a = s.atom() if hasattr(s, "atom") else s
    return {"name": a.name, "min": a.lo, "max": a.hi, "multiple_of": a.mult}


# Parameter types every command shares.
PrecisionOpt = Annotated[str, typer.Option(
    help="fp32 (default), bf16 (products by constant weights in bfloat16 with float32 accumulation; needs "
         "AVX512-BF16), bf16-emulated (the same rounding on the float32 kernels, any CPU) or int8 (a QDQ "
         "model's products in int8 with int32 accumulation).")]
ModelArg = Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="ONNX model file.")]
DimOpt = Annotated[list[str] | None, typer.Option(
    "--dim", "-d", metavar="NAME=MIN:MAX[:MULT]",
    help="Declare a named dim: its range and divisor (either bound may be empty), or NAME=VALUE to fix it. "
         "Repeatable.")]
