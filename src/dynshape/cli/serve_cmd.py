"""`dynshape serve`: the KServe v2 server (dynshape.serve) from the command line.

The server layer is imported inside the command, so the other commands never load uvicorn or grpc.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from dynshape.cli.args import parse_dims
from dynshape.cli.common import DimOpt, friendly

EPILOG = """Examples:

  dynshape serve bert.onnx --dim batch=1:64 --dim seq=1:512 --max-queue-delay-us 2000

  dynshape serve mlp.onnx bert.ds --name mlp --name bert --port 8000 --grpc-port 8001 --instances 2

  curl localhost:8000/v2/models/mlp          (metadata: -1 for symbolic dims, symbols under "dynshape")

Batching: requests whose non-batch dims are equal are joined along the batch symbol (dim 0 of every input and
output) into one call and split back; --max-batch-size 1 turns it off. Install with `pip install dynshape[serve]`.
"""


@friendly
def serve(
    models: Annotated[list[Path], typer.Argument(exists=True, help="ONNX files or artefact folders (`dynshape "
                                                                   "compile`) to serve.")],
    name: Annotated[list[str] | None, typer.Option(
        "--name", "-n", help="Public name of each model, in order (default: the file's stem). Repeatable.")] = None,
    dim: DimOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port (KServe v2 REST and /metrics).")] = 8000,
    grpc_port: Annotated[int | None, typer.Option(help="Also serve KServe v2 gRPC on this port.")] = None,
    strategy: Annotated[str | None, typer.Option(
        help="ds.compile's strategy for ONNX models (auto, generic, multi_version, bucketed, static); default: "
             "auto. `generic`: one build, no variants built in the background while serving.")] = None,
    instances: Annotated[int, typer.Option(min=1, help="Executables per model (each its own arenas and worker "
                                                       "thread); batches run on them concurrently.")] = 1,
    threads: Annotated[int, typer.Option(min=0, help="Threads per kernel call (OMP_NUM_THREADS and the BLAS's); "
                                                     "0: the libraries' default.")] = 0,
    max_batch_size: Annotated[int, typer.Option(min=0, help="Rows (sum of batch dims) per joined call; 0 or 1: "
                                                            "no joining. Capped by the batch symbol's max.")] = 64,
    max_queue_delay_us: Annotated[int, typer.Option(min=0, help="How long a batch below max/preferred size waits "
                                                                "for more requests (Triton's semantics).")] = 0,
    preferred_batch_size: Annotated[list[int] | None, typer.Option(
        help="A batch size sent at once when it can be formed (the largest wins). Repeatable.")] = None,
    max_queue_size: Annotated[int, typer.Option(min=0, help="Pending requests beyond which a request gets 429 at "
                                                            "once; 0: unbounded.")] = 0,
    default_timeout_us: Annotated[int, typer.Option(min=0, help="A request queued longer gets 504 (its `timeout` "
                                                                "parameter may lower it); 0: none.")] = 0,
    priority_levels: Annotated[int, typer.Option(min=0, help="Priority levels (1 highest); requests pick one with "
                                                             "the `priority` parameter.")] = 0,
    default_priority_level: Annotated[int, typer.Option(min=0, help="Level of a request without a priority "
                                                                    "(0: the lowest).")] = 0,
    pad: Annotated[str | None, typer.Option(
        metavar="SYMBOL=MASK_INPUT|auto", help="Pad sequences of different lengths to the longest of a batch and "
        "join them, where the model masks padding with that input (checked exact at load; only when a cost model "
        "fitted to measured call times predicts it cheaper), e.g. seq=attention_mask; auto: an input named like a "
        "mask, of dims (batch, S), if padding along S is exact.")] = None,
    inline_below_us: Annotated[int, typer.Option(min=0, help="Run a call on the event loop's thread when its shape "
                                                             "last ran faster than this (two thread hand-offs cost "
                                                             "more); 0: always the worker threads.")] = 100,
    reserve_memory: Annotated[bool, typer.Option(
        help="Reserve at load each instance's arena for the largest call the declared dims admit (--dim bounds "
             "on every symbol), so memory stays flat under any traffic; off: it grows with the largest call "
             "served.")] = True,
    max_request_bytes: Annotated[int, typer.Option(min=1, help="Larger request bodies get 413.")] = 64 << 20,
    access_log: Annotated[bool, typer.Option(help="Log one JSON line per inference request.")] = False,
) -> None:
    """Serve models over KServe v2 (REST, optionally gRPC) with a shape-aware dynamic batcher and /metrics."""
    if threads:
        from dynshape.options import set_thread_count

        set_thread_count(threads)
    names = list(name or [])
    if len(names) > len(models):
        raise typer.BadParameter(f"{len(names)} names for {len(models)} models", param_hint="--name")
    dims = parse_dims(dim)
    pads: dict[str, str] | str = {}
    if pad == "auto":
        pads = "auto"
    elif pad:
        sym_name, eq, mask = pad.partition("=")
        if not eq or not sym_name.strip() or not mask.strip():
            raise typer.BadParameter(f"{pad!r}: expected SYMBOL=MASK_INPUT, e.g. seq=attention_mask",
                                     param_hint="--pad")
        pads = {sym_name.strip(): mask.strip()}
    from dynshape.serve.config import BatcherConfig, ModelSpec, ServerConfig
    from dynshape.serve.server import serve_forever

    logging.basicConfig(level=logging.INFO if access_log else logging.WARNING, format="%(message)s")
    specs = []
    for i, path in enumerate(models):
        batcher = BatcherConfig(max_batch_size=max_batch_size, max_queue_delay_us=max_queue_delay_us,
                                preferred_batch_size=list(preferred_batch_size or []), max_queue_size=max_queue_size,
                                default_timeout_us=default_timeout_us, priority_levels=priority_levels,
                                default_priority_level=default_priority_level, pad=pads,
                                inline_below_us=inline_below_us)
        specs.append(ModelSpec(str(path), names[i] if i < len(names) else None, dims=None if path.is_dir() else dims,
                               instances=instances, batcher=batcher, reserve_memory=reserve_memory))
    serve_forever(specs, ServerConfig(host=host, port=port, grpc_port=grpc_port, max_request_bytes=max_request_bytes,
                                      access_log=access_log), {"strategy": strategy} if strategy else None)
