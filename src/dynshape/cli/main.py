"""The `dynshape` command line."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(help="dynshape: compile once with symbolic dimensions, run every shape.", no_args_is_help=True,
                  add_completion=False)
console = Console()


@app.command()
def demo() -> None:
    """Tour of dynshape on built-in examples (nothing downloaded).

    Example: dynshape demo
    """
    from dynshape.cli.demo_sym import run_sym_demo

    run_sym_demo(console)


@app.callback()
def _root() -> None:
    """Exit codes: 0 ok, 1 bad input or model (a clear message), 2 bad invocation."""


def main() -> None:
    app()
