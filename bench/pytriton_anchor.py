"""The anchor: a model file behind Triton's own dynamic batcher, through PyTriton (its wheel ships Triton's server)
with onnxruntime inside the inference callable, so that `bench/serve_bench.py` measures it beside `dynshape serve`
on the same machine and load. Imports nothing of dynshape's.

PyTriton pins numpy < 2, so it lives in its own virtual environment, never beside the project:

    python3.11 -m venv /tmp/ptvenv && /tmp/ptvenv/bin/pip install nvidia-pytriton onnxruntime

Triton's Python backend stub loads a libpython3.11; where the system's differs in patch release from the venv's
interpreter (pyenv's 3.11.7 beside Debian's), model load fails with "'_thread.RLock' object has no attribute
'_recursion_count'". This script puts its own interpreter's LIBDIR first on LD_LIBRARY_PATH before Triton starts
(`--no-libpython-fix` leaves it alone); by hand: LD_LIBRARY_PATH=/root/.pyenv/versions/3.11.7/lib. On a CPU-only
machine Triton's NVML/DCGM/CUDA warnings are harmless.

    M=${DYNSHAPE_BENCH_MODELS:-~/.cache/dynshape-bench/models}
    /tmp/ptvenv/bin/python bench/pytriton_anchor.py $M/bert_small.onnx --http-port 8110 --grpc-port 8111 \\
        --metrics-port 8112 --threads 1 --max-batch-size 64            # serves until SIGINT/SIGTERM
    python bench/serve_bench.py --model bert_small --url 127.0.0.1:8110 --metrics-url 127.0.0.1:8112 \\
        --rates 10,20,30 --duration 12 --slo-ms 400
    python bench/serve_bench.py --model bert_small --rates 10,20,30 --duration 12 --slo-ms 400 -- \\
        --threads 1 --max-batch-size 64                                # dynshape serve, same load

The model's name is the file's stem (--name to change it); its inputs and outputs, dtypes and ranks come from
the ONNX file through onnxruntime. With --max-batch-size > 0 the first dim of every input and output is Triton's
batch dim: Triton's dynamic batcher joins requests along it, and only requests whose other dims are equal (a
BERT request of seq 64 never joins one of seq 65; joining those is what `dynshape serve --pad` adds). The
callable does not rely on that: `run_grouped` groups whatever list of requests Triton hands it by the shapes
past dim 0, concatenates each group, runs it once and splits the outputs back by rows. onnxruntime runs as
bench/ort_util.py configures every peer (all graph optimisations, --threads intra-op threads, sequential), one
session per --instances.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ort_util import ort_session  # noqa: E402  (imports nothing of dynshape's)

ORT_DTYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
              "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def io_spec(args: Sequence[Any], batching: bool) -> list[tuple[str, type, tuple[int, ...]]]:
    """(name, numpy dtype, Triton shape) of each onnxruntime NodeArg: symbolic or unknown dims are -1; with
    batching, the first dim (Triton's batch dim) is dropped, and it must not be a fixed size."""
    out = []
    for a in args:
        if a.type not in ORT_DTYPES:
            raise ValueError(f"{a.name}: unsupported type {a.type}")
        dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in a.shape)
        if batching:
            if not dims or dims[0] != -1:
                raise ValueError(f"{a.name}: shape {a.shape} has no dynamic first dim to batch on "
                                 "(use --max-batch-size 0)")
            dims = dims[1:]
        out.append((a.name, ORT_DTYPES[a.type], dims))
    return out


def run_grouped(run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
                feeds: Sequence[dict[str, np.ndarray]], batching: bool = True) -> list[dict[str, np.ndarray]]:
    """Each feed's outputs, in order. With batching, feeds whose inputs agree past dim 0 (shape and dtype) run as
    one call on their concatenation along dim 0, and every output is split back by the feeds' row counts;
    without, each feed runs alone."""
    if not batching:
        return [run(f) for f in feeds]
    groups: dict[tuple, list[int]] = {}
    for i, f in enumerate(feeds):
        key = tuple((n, a.dtype.str, a.shape[1:]) for n, a in sorted(f.items()))
        groups.setdefault(key, []).append(i)
    results: list[dict[str, np.ndarray]] = [{} for _ in feeds]
    for idx in groups.values():
        if len(idx) == 1:
            results[idx[0]] = run(feeds[idx[0]])
            continue
        rows = [len(next(iter(feeds[i].values()))) for i in idx]
        joined = {n: np.concatenate([feeds[i][n] for i in idx]) for n in feeds[idx[0]]}
        outs = run(joined)
        cuts = np.cumsum(rows)[:-1]
        parts = {n: np.split(a, cuts) for n, a in outs.items()}
        for j, i in enumerate(idx):
            results[i] = {n: p[j] for n, p in parts.items()}
    return results


def make_infer(session: Any, batching: bool, stats: dict[str, int] | None = None) -> Callable:
    """PyTriton's inference callable over one onnxruntime session: a list of requests in, a list of output
    dicts out (no @batch decorator: run_grouped joins what may be joined and leaves the rest apart). `stats`
    counts the batches Triton handed over, their requests, and onnxruntime calls (more calls than batches:
    Triton joined requests of different shapes)."""
    names = [o.name for o in session.get_outputs()]

    def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if stats is not None:
            stats["ort_calls"] += 1
        return dict(zip(names, session.run(names, feed)))

    def infer(requests: list) -> list[dict[str, np.ndarray]]:
        if stats is not None:
            stats["batches"] += 1
            stats["requests"] += len(requests)
        return run_grouped(run, [dict(r.data) for r in requests], batching)

    return infer


def libpython_fix() -> None:
    """Put this interpreter's own libpython first on LD_LIBRARY_PATH, for Triton's Python backend stub."""
    libdir = sysconfig.get_config_var("LIBDIR")
    lib = sysconfig.get_config_var("LDLIBRARY")
    if libdir and lib and os.path.exists(os.path.join(libdir, lib)):
        old = os.environ.get("LD_LIBRARY_PATH")
        os.environ["LD_LIBRARY_PATH"] = libdir + (":" + old if old else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="ONNX file.")
    ap.add_argument("--name", default=None, help="Model name on the server (default: the file's stem).")
    ap.add_argument("--max-batch-size", type=int, default=64,
                    help="Triton's max_batch_size: rows per batch (a larger request is refused); 0: no batching.")
    ap.add_argument("--max-queue-delay-us", type=int, default=0, help="Dynamic batcher's max_queue_delay.")
    ap.add_argument("--preferred-batch-size", type=int, action="append", default=None,
                    help="Dynamic batcher's preferred_batch_size (repeatable).")
    ap.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads per instance.")
    ap.add_argument("--instances", type=int, default=1, help="Model instances (one session each).")
    ap.add_argument("--host", default="127.0.0.1", help="Address of the HTTP, gRPC and metrics endpoints.")
    ap.add_argument("--http-port", type=int, default=8110)
    ap.add_argument("--grpc-port", type=int, default=8111)
    ap.add_argument("--metrics-port", type=int, default=8112)
    ap.add_argument("--log-verbose", type=int, default=0)
    ap.add_argument("--no-libpython-fix", action="store_true", help="Leave LD_LIBRARY_PATH as it is.")
    args = ap.parse_args()

    if not args.no_libpython_fix:
        libpython_fix()
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    batching = args.max_batch_size > 0
    sessions = [ort_session(args.model, threads=args.threads) for _ in range(args.instances)]
    inputs = [Tensor(name=n, dtype=t, shape=s) for n, t, s in io_spec(sessions[0].get_inputs(), batching)]
    outputs = [Tensor(name=n, dtype=t, shape=s) for n, t, s in io_spec(sessions[0].get_outputs(), batching)]
    batcher = DynamicBatcher(max_queue_delay_microseconds=args.max_queue_delay_us,
                             preferred_batch_size=args.preferred_batch_size)
    config = ModelConfig(batching=batching, max_batch_size=max(args.max_batch_size, 0), batcher=batcher)
    name = args.name or Path(args.model).stem
    tconf = TritonConfig(http_address=args.host, http_port=args.http_port, grpc_address=args.host,
                         grpc_port=args.grpc_port, metrics_address=args.host, metrics_port=args.metrics_port,
                         allow_gpu_metrics=False, log_verbose=args.log_verbose)

    def interrupt(*_: object) -> None:  # SIGTERM as SIGINT: serve() then stops Triton and its proxies
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    stats = {"batches": 0, "requests": 0, "ort_calls": 0}
    with Triton(config=tconf) as triton:
        triton.bind(model_name=name, infer_func=[make_infer(s, batching, stats) for s in sessions],
                    inputs=inputs, outputs=outputs, config=config, strict=False)
        print(f"serving {name} on http {args.host}:{args.http_port}, grpc {args.host}:{args.grpc_port}, "
              f"metrics {args.host}:{args.metrics_port}", flush=True)
        triton.serve()
    print(f"callable: {stats['batches']} batches from Triton, {stats['requests']} requests, "
          f"{stats['ort_calls']} onnxruntime calls", flush=True)


if __name__ == "__main__":
    main()
