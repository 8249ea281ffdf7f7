"""The `dynshape` command line (also `python -m dynshape`).

Exit codes: 0 success; 1 bad input, model or constraint (one message on stderr, no traceback); 2 bad
invocation (unknown option, malformed --dim or shape, a path that does not exist).
"""

from __future__ import annotations

import typer

from dynshape.cli import bench_cmd, compile_cmd, demo_cmd, explain_cmd, inspect_cmd, run_cmd, serve_cmd

HELP = """dynshape: compile once with symbolic dimensions, run every shape.

Exit codes: 0 ok; 1 bad input, model or constraint (a one-paragraph message, no traceback);
2 bad invocation (unknown option, malformed --dim or shape, missing file).
"""

EPILOG = """Examples:

  dynshape demo

  dynshape inspect model.onnx --dim batch=1:8 --dim seq=1:512:8

  dynshape run model.onnx --shape 2x16 -o out/

  dynshape compile model.onnx --dim batch=1:8 --specialize batch=1 -o model.ds

  dynshape explain model.ds

  dynshape bench model.onnx --shapes 1x16,8x128 --plot latency.png
"""

app = typer.Typer(help=HELP, epilog=EPILOG, no_args_is_help=True, add_completion=False,
                  context_settings={"help_option_names": ["-h", "--help"]})
app.command("demo", epilog=demo_cmd.EPILOG)(demo_cmd.demo)
app.command("inspect", epilog=inspect_cmd.EPILOG)(inspect_cmd.inspect)
app.command("compile", epilog=compile_cmd.EPILOG)(compile_cmd.compile_model)
app.command("explain", epilog=explain_cmd.EPILOG)(explain_cmd.explain)
app.command("run", epilog=run_cmd.EPILOG)(run_cmd.run)
app.command("bench", epilog=bench_cmd.EPILOG)(bench_cmd.bench)
app.command("serve", epilog=serve_cmd.EPILOG)(serve_cmd.serve)


def main() -> None:
    app()
