"""`dynshape bench`: dynshape and its peers timed on the same shapes and the same input data.

Each system first runs every distinct shape once, untimed (first-call work such as building a plan belongs in the
runtime's own stats, not in p50), then each request `repeat` times, timed. Inputs come from
`feeds.generated_feed`, the same data shared/bench/common.py makes, so numbers sit beside peers.py's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from dynshape.cli.args import parse_dims, parse_shapes
from dynshape.cli.common import (
    EXECUTOR_NOTE,
    CliInputError,
    DimOpt,
    ModelArg,
    PrecisionOpt,
    console,
    dynshape_executor,
    friendly,
    has_module,
    load_model,
)
from dynshape.cli.feeds import default_requests, env_from_values, generated_feed, generated_shapes, preflight

EPILOG = """Examples:

  dynshape bench bert.onnx --dim batch=1:8 --dim seq=1:512 --shapes 1x16,8x128 --plot lat.png

  dynshape bench bert_small.onnx --stream ../shared/bench/request_stream.json --repeat 1

Shapes give the model's symbols in signature order (see `dynshape inspect`). A stream file holds
streams.<key>[i] = {<symbol>: value, ..., data_seed}; the key defaults to the model file's stem.
"""

KNOWN_PEERS = ("onnxruntime", "torch")


@dataclass
class Request:
    env: dict[str, int]
    seed: int

    @property
    def label(self) -> str:
        return "x".join(str(v) for v in self.env.values()) or "static"


@dataclass
class System:
    name: str
    run: Callable[[dict[str, np.ndarray]], Any]
    setup_s: float
    times: dict[str, list[float]] = field(default_factory=dict)  # shape label -> seconds per timed call


def load_stream(path: Path, key: str, symbols: list[str]) -> list[Request]:
    """Requests of `streams[key]` in the shared request_stream.json format."""
    try:
        streams = json.loads(path.read_text())["streams"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CliInputError(f"cannot read the request stream {str(path)!r}: {type(e).__name__}: {e}; expected JSON "
                            "with streams.<model> = [{<symbol>: value, ..., data_seed}, ...]") from None
    if key not in streams:
        raise CliInputError(f"the stream file has no stream {key!r} (it has {', '.join(streams)}); "
                            "pick one with --stream-key")
    out = []
    for i, r in enumerate(streams[key]):
        missing = [s for s in symbols if s not in r]
        if missing:
            raise CliInputError(f"stream {key!r} request {i} has no value for symbol(s) {', '.join(missing)}")
        out.append(Request({s: int(r[s]) for s in symbols}, int(r.get("data_seed", i))))
    return out


def onnxruntime_system(model: Path, threads: int) -> System:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    return System("onnxruntime", lambda feed: sess.run(None, feed), time.perf_counter() - t0)


def peer_systems(vs: list[str], model: Path, threads: int) -> tuple[list[System], list[str]]:
    """The peers asked for that can run here, and a note for each one skipped."""
    systems, notes = [], []
    for name in vs:
        if name == "onnxruntime":
            if has_module("onnxruntime"):
                systems.append(onnxruntime_system(model, threads))
            else:
                notes.append("onnxruntime: not installed (pip install onnxruntime); skipped")
        elif name == "torch":
            why = ("not installed" if not has_module("torch") else
                   "torch cannot execute an ONNX file; time torch on the source model with shared/bench/peers.py")
            notes.append(f"torch: {why}; skipped")
    return systems, notes


def percentiles(ts: list[float]) -> tuple[float, float]:
    a = np.asarray(ts) * 1e3
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def markdown(systems: list[System], labels: list[str]) -> str:
    head = "| shape | " + " | ".join(f"{s.name} p50 ms | {s.name} p99 ms" for s in systems) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(systems))]
    for label in labels:
        cells = []
        for s in systems:
            p50, p99 = percentiles(s.times[label])
            cells += [f"{p50:.3f}", f"{p99:.3f}"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    total = [cell for s in systems for cell in (f"{sum(sum(t) for t in s.times.values()):.3f} s", "")]
    lines.append("| total timed | " + " | ".join(total) + " |")
    return "\n".join(lines)


def plot(path: Path, title: str, systems: list[System], requests: dict[str, Request], symbols: list[str]) -> None:
    """p50 latency against problem size (product of the symbol values), one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted(requests, key=lambda k: (int(np.prod(list(requests[k].env.values()))), k))
    x = [int(np.prod(list(requests[k].env.values()))) for k in labels]
    fig, ax = plt.subplots(figsize=(8, 5))
    for s in systems:
        ax.plot(x, [percentiles(s.times[k])[0] for k in labels], marker="o", label=s.name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(" * ".join(symbols) if symbols else "shape")
    ax.set_ylabel("p50 latency (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def accuracy_rows(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> list[tuple[str, float, float, Any]]:
    """Per output: max and mean |got - want| relative to max|want|, and, for a classifier's scores (a float
    output of rank 2 with more than one column), the share of rows whose argmax agrees (else None)."""
    rows = []
    for name, w in want.items():
        g = np.asarray(got[name])
        if not np.issubdtype(w.dtype, np.floating) or w.size == 0:
            continue
        d = np.abs(g.astype(np.float64) - w)
        scale = float(np.max(np.abs(w))) or 1.0
        top1 = float(np.mean(g.argmax(-1) == w.argmax(-1))) if w.ndim == 2 and w.shape[1] > 1 else None
        rows.append((name, float(d.max()) / scale, float(d.mean()) / scale, top1))
    return rows


def print_accuracy(graph: Any, low: System, ref: System, requests: list[Request], precision: str) -> None:
    """The low-precision build against the float32 one on each distinct shape's generated inputs."""
    console.print(Text(f"accuracy of {precision} against the float32 build (relative to max|fp32| per output)",
                       style="bold"))
    for r in requests:
        feed = generated_feed(graph, r.env, r.seed)
        for name, mx, mean, top1 in accuracy_rows(low.run(feed), ref.run(feed)):
            agree = "" if top1 is None else f", top-1 agreement {top1:.1%}"
            console.print(Text(f"  {r.label} {name}: max {mx:.2e}, mean {mean:.2e}{agree}"))


@friendly
def bench(
    model: ModelArg,
    dim: DimOpt = None,
    shapes: Annotated[str | None, typer.Option(
        metavar="AxB,CxD", help="Symbol values per shape, in signature order, e.g. 1x16,8x128.")] = None,
    stream: Annotated[Path | None, typer.Option(
        exists=True, dir_okay=False, help="A request stream JSON (shared/bench/request_stream.json format).")] = None,
    stream_key: Annotated[str | None, typer.Option(help="Which stream of the file (default: model stem).")] = None,
    vs: Annotated[str, typer.Option(
        help="Peers to time too, comma-separated: onnxruntime, torch ('' for none).")] = "onnxruntime",
    plot_path: Annotated[Path | None, typer.Option(
        "--plot", dir_okay=False, help="Write a PNG: latency against shape.")] = None,
    repeat: Annotated[int, typer.Option("--repeat", "-n", min=1, help="Timed calls per request.")] = 5,
    threads: Annotated[int, typer.Option(help="onnxruntime intra-op threads (0: its default).")] = 0,
    precision: PrecisionOpt = "fp32",
) -> None:
    """Time dynshape and its peers on the same shapes: p50/p99 per shape, a markdown table, a PNG plot."""
    peers = [p.strip() for p in vs.split(",") if p.strip()]
    unknown = [p for p in peers if p not in KNOWN_PEERS]
    if unknown:
        raise typer.BadParameter(f"unknown system(s) {unknown}; choose from {', '.join(KNOWN_PEERS)}",
                                 param_hint="--vs")
    if shapes is not None and stream is not None:
        raise typer.BadParameter("give at most one of --shapes and --stream", param_hint="--shapes/--stream")
    shape_list = parse_shapes(shapes)
    if plot_path is not None and not has_module("matplotlib"):
        raise CliInputError("--plot needs matplotlib, which is not installed (pip install matplotlib)")
    graph = load_model(model, parse_dims(dim))
    symbols = list(graph.signature.symbols)
    if stream is not None:
        requests = load_stream(stream, stream_key or model.stem, symbols)
    elif shapes is not None:
        requests = [Request(env_from_values(graph, v), 0) for v in shape_list]
    else:  # neither: a few shapes spread over the declared ranges
        envs = default_requests(graph)
        if not envs:
            raise CliInputError("no default shape fits this model's signature and this machine; give --shapes AxB,...")
        requests = [Request(env, 0) for env in envs]
        console.print(Text(f"note: no --shapes or --stream given: timing {len(envs)} shape(s) spread over the declared "
                           f"ranges ({' x '.join(symbols) or 'static'}): "
                           f"{', '.join(Request(e, 0).label for e in envs)} (lowest, geometric middle and highest "
                           "admissible values; unbounded symbols up to 128)", style="yellow"))
    for r in requests:
        preflight(graph, {}, generated_shapes(graph, r.env, set()))

    t0 = time.perf_counter()
    ex = dynshape_executor(graph, precision)
    systems = [System(ex.label, ex.run, time.perf_counter() - t0)]
    if precision != "fp32":  # the float32 build beside it: the speed it is traded against, and the reference
        t0 = time.perf_counter()
        ref = dynshape_executor(graph)
        systems.append(System(ref.label, ref.run, time.perf_counter() - t0))
    more, notes = peer_systems(peers, model, threads)
    systems += more
    if not ex.compiled:
        notes.insert(0, EXECUTOR_NOTE)
    for n in notes:
        console.print(Text(f"note: {n}", style="yellow"))
    for s in systems:
        console.print(Text(f"{s.name}: set-up {s.setup_s * 1e3:.1f} ms"))

    distinct = {r.label: r for r in requests}
    total = len(systems) * (len(distinct) + len(requests) * repeat)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task("benchmarking", total=total)
        for s in systems:
            progress.update(task, description=f"{s.name}: warm-up")
            for r in distinct.values():
                s.run(generated_feed(graph, r.env, r.seed))
                progress.advance(task)
            progress.update(task, description=f"{s.name}: timing")
            for r in requests:
                feed = generated_feed(graph, r.env, r.seed)
                for _ in range(repeat):
                    t = time.perf_counter()
                    s.run(feed)
                    s.times.setdefault(r.label, []).append(time.perf_counter() - t)
                    progress.advance(task)

    labels = sorted(distinct, key=lambda k: (int(np.prod(list(distinct[k].env.values()))), k))
    if precision != "fp32":
        print_accuracy(graph, systems[0], systems[1], [distinct[k] for k in labels], precision)
    console.print(Text(f"{len(requests)} request(s), {len(distinct)} distinct shape(s) "
                       f"({' x '.join(symbols) or 'static'}), {repeat} timed call(s) each"))
    typer.echo(markdown(systems, labels))
    if plot_path is not None:
        plot(plot_path, f"{model.name}: p50 latency per shape", systems, distinct, symbols)
        console.print(Text(f"wrote {plot_path}"))
