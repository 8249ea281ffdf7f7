"""`dynshape demo`: the main job end to end on a built-in encoder, nothing downloaded.

One symbolic load covers every shape of the stream: the demo shows the signature and inferred shapes once, then
runs ~20 different (batch, seq) shapes through the same graph and cross-checks each against onnxruntime (and
against the reference executor when a compiled executable is what runs).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import onnx
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

import dynshape as ds
from dynshape.cli.common import EXECUTOR_NOTE, console, dynshape_executor, fmt_bytes, friendly, has_module, load_model
from dynshape.cli.inspect_cmd import print_signature
from dynshape.ir.graph import format_type
from dynshape.models import build_encoder

DIMS = {"batch": (1, 8), "seq": (1, 256)}
TOLERANCE = 1e-4  # max abs difference allowed against a cross-check (outputs are layer-normalised, |y| ~ 1)

EPILOG = """Examples:

  dynshape demo              (the encoder: signature, a stream of shapes, cross-checks)

  dynshape demo --shapes 5   (a shorter stream)

  dynshape demo --sym        (a tour of the symbolic engine)
"""


def demo_shapes(n: int, seed: int) -> list[tuple[int, int]]:
    """`n` varied (batch, seq) shapes: both extremes plus a seeded spread, lognormal seq like real traffic."""
    rng = np.random.default_rng(seed)
    shapes = [(1, 1), (8, 256)][:n]
    while len(shapes) < n:
        seq = int(np.clip(round(rng.lognormal(np.log(48), 0.8)), 1, 256))
        shapes.append((int(rng.choice([1, 2, 3, 4, 8])), seq))
    return shapes


def demo_feed(batch: int, seq: int, vocab: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Token ids and a padding mask (each row keeps a random-length prefix) like a tokenizer batch."""
    lengths = rng.integers(max(1, seq // 2), seq + 1, size=batch)
    return {"input_ids": rng.integers(0, vocab, size=(batch, seq), dtype=np.int64),
            "attention_mask": (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)}


def cross_checks(graph: Any, model_path: Path, compiled: bool) -> dict[str, Callable[[dict], np.ndarray]]:
    """What each run is compared against: the reference executor (if compiled) and onnxruntime (if present)."""
    checks: dict[str, Callable[[dict], np.ndarray]] = {}
    if compiled:
        checks["reference"] = lambda feed: graph.run(feed)["last_hidden_state"]
    if has_module("onnxruntime"):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
        checks["onnxruntime"] = lambda feed: sess.run(["last_hidden_state"], feed)[0]
    return checks


def show_rejections(run: Callable[[dict], Any], vocab: int) -> None:
    """Feeds the signature rejects, with the runtime's message for each."""
    rng = np.random.default_rng(1)
    bad = {
        "seq = 300 (declared max 256)": demo_feed(1, 300, vocab, rng),
        "batch of the mask differs from the ids": {**demo_feed(2, 16, vocab, rng),
                                                   "attention_mask": np.ones((3, 16), np.int64)},
        "int32 ids": {**demo_feed(1, 8, vocab, rng), "input_ids": np.zeros((1, 8), np.int32)},
    }
    for what, feed in bad.items():
        try:
            run(feed)
            console.print(Text(f"  {what}: accepted (unexpected)", style="red"))
        except ds.ConstraintViolation as e:
            console.print(Text(f"  {what}: ", style="bold") + Text(f"rejected: {e}", style="yellow"))


def _median_ms(run: Callable[[dict], Any], feed: dict, repeats: int = 3) -> float:
    """Median of a few timed calls after one untimed warm-up call."""
    run(feed)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(feed)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def fmt_stats(stats: dict) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items())


def run_encoder_demo(n_shapes: int, seed: int) -> bool:
    """The demo proper; True when every cross-check agreed within TOLERANCE."""
    t_start = time.perf_counter()
    layers, hidden, heads, vocab = 2, 64, 4, 1000
    proto = build_encoder(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seed=seed)
    n_weights = sum(int(np.prod(t.dims)) for t in proto.graph.initializer)
    ops = sorted({n.op_type for n in proto.graph.node})
    console.rule("[bold]1. a model, built here with onnx.helper")
    console.print(Text(f"{layers}-layer transformer encoder, hidden {hidden}, {heads} heads, vocab {vocab}: "
                       f"{len(proto.graph.node)} nodes, {n_weights:,} weights\nops: {', '.join(ops)}"))

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "encoder.onnx"
        onnx.save(proto, str(path))
        console.rule("[bold]2. one symbolic load for every shape")
        t0 = time.perf_counter()
        graph = load_model(path, DIMS)
        console.print(Text(f"loaded and shape-inferred in {(time.perf_counter() - t0) * 1e3:.0f} ms with dims "
                           f"{', '.join(f'{k} in [{lo}, {hi}]' for k, (lo, hi) in DIMS.items())}"))
        print_signature(graph)
        console.print(Text("inferred along the way (exporter shape arithmetic, resolved symbolically)", style="bold"))
        for n in [n for n in graph.nodes if n.op_type in ("Concat", "Softmax")][:3]:
            console.print(Text(f"  {n.op_type} {n.name}: {format_type(graph.types.get(n.outputs[0]))}"))
        mem = graph.memory_bound()
        at = f" (peak at {mem.peak_node})" if mem.bytes is not None else f": {mem}"
        console.print(Text("worst-case memory: ", style="bold") + Text(f"{fmt_bytes(mem.bytes)}{at}"))

        console.rule(f"[bold]3. a stream of {n_shapes} shapes")
        t0 = time.perf_counter()
        executor = dynshape_executor(graph)
        if executor.compiled:
            console.print(Text(f"compiled once in {(time.perf_counter() - t0) * 1e3:.0f} ms; every shape below "
                               "runs that one executable"))
        checks = cross_checks(graph, path, executor.compiled)
        console.print(Text(f"running with {executor.label}"
                           + ("" if executor.compiled else f" ({EXECUTOR_NOTE})")))
        console.print(Text("cross-checked against " + (", ".join(checks) or "nothing (onnxruntime not installed)")))
        rng = np.random.default_rng(seed + 1)
        shapes = demo_shapes(n_shapes, seed)
        feeds = [demo_feed(batch, seq, vocab, rng) for batch, seq in shapes]
        worst, ok = 0.0, True
        static = None
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as progress:
            task = progress.add_task("timing the one generic build beside per-shape builds", total=n_shapes)
            ms_dyn, ms_static = [], [None] * n_shapes
            if executor.compiled:  # the specialised builds first, so each shape's two timings can alternate
                static = ds.compile(graph, specialize=[{"batch": b, "seq": q} for b, q in shapes],
                                    strategy="generic")
            for i, feed in enumerate(feeds):
                if static is None:
                    ms_dyn.append(_median_ms(executor.run, feed))
                else:  # alternating rounds: a noisy moment hits both builds, not one of them
                    ms_dyn.append(_median_ms(executor.run, feed, 1))
                    ms_static[i] = _median_ms(static.run, feed, 1)
                    for _ in range(4):
                        ms_dyn[i] = min(ms_dyn[i], _median_ms(executor.run, feed, 1))
                        ms_static[i] = min(ms_static[i], _median_ms(static.run, feed, 1))
                progress.advance(task)
            rows = {name: [] for name in checks}
            task = progress.add_task("cross-checks", total=n_shapes * max(1, len(checks)))
            for feed in feeds:
                out = executor.run(feed)["last_hidden_state"]
                for name, check in checks.items():
                    t0 = time.perf_counter()
                    ref = check(feed)
                    ms = (time.perf_counter() - t0) * 1e3
                    diff = float(np.max(np.abs(out - ref))) if out.shape == ref.shape else float("inf")
                    rows[name].append((ms, diff))
                    progress.advance(task)
        short = {"reference": "ref", "onnxruntime": "ort"}
        head = f"{'batch':>5} {'seq':>4} {'dynshape ms':>11}"
        if executor.compiled:
            head += f" {'static ms':>9} {'eta':>5}"
        console.print(Text(head + "".join(f" {short.get(n, n) + ' ms':>8} {'|diff|':>7}" for n in checks),
                           style="bold"))
        etas = []
        for i, (batch, seq) in enumerate(shapes):
            row = f"{batch:>5} {seq:>4} {ms_dyn[i]:>11.2f}"
            if executor.compiled:
                etas.append(ms_static[i] / ms_dyn[i])
                row += f" {ms_static[i]:>9.2f} {etas[-1]:>5.2f}"
            good = True
            for name in checks:
                ms, diff = rows[name][i]
                worst, good = max(worst, diff), good and diff <= TOLERANCE
                row += f" {ms:>8.2f} {diff:>7.0e}"
            ok = ok and good
            console.print(Text(row, style=None if good else "red"))
        if checks:
            verdict = "all within" if ok else "NOT all within"
            console.print(Text(f"{verdict} {TOLERANCE:g} (worst max|diff| {worst:.1e})",
                               style="green" if ok else "bold red"))
        if executor.compiled and hasattr(executor.exe, "stats"):
            exe = executor.exe
            geo = float(np.exp(np.mean(np.log(etas))))
            console.print(Text(f"one generic build served all {n_shapes} shapes; eta = T(specialised) / T(generic): "
                               f"geometric mean {geo:.2f}, worst {min(etas):.2f} (1.00 = no loss for being generic)"))
            n = 2000
            t0 = time.perf_counter()
            for _ in range(n):
                exe.binder(feeds[0])
            tax = (time.perf_counter() - t0) / n * 1e6
            console.print(Text(f"call tax: binding symbols + checking every constraint + dispatch key: {tax:.1f} us "
                               "per call"))
            console.print(Text(f"executable stats: {fmt_stats(exe.stats())}"))

        console.rule("[bold]4. inputs outside the signature are refused, with the reason")
        show_rejections(executor.run, vocab)
    console.print(Text(f"\ndemo took {time.perf_counter() - t_start:.1f} s. Next: `dynshape demo --sym` (the "
                       "symbolic engine), `dynshape inspect|run|bench MODEL.onnx` on your own models."))
    return ok


@friendly
def demo(
    sym: Annotated[bool, typer.Option(help="Tour of the symbolic engine instead of the encoder demo.")] = False,
    shapes: Annotated[int, typer.Option("--shapes", "-n", min=1, max=200, help="Shapes in the stream.")] = 20,
    seed: Annotated[int, typer.Option(help="Seed of the weights, shapes and inputs.")] = 0,
) -> None:
    """Build a transformer encoder with dynamic batch and seq, load it once, run a stream of shapes."""
    if sym:
        from dynshape.cli.demo_sym import run_sym_demo

        run_sym_demo(console)
        return
    if not run_encoder_demo(shapes, seed):
        raise ds.DynshapeError(f"the cross-check failed: outputs differ by more than {TOLERANCE:g} (see above)")
