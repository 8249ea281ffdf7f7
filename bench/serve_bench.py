"""Open-loop load generator for any KServe v2 server (dynshape serve, Triton, PyTriton): Poisson arrivals at set
rates from the shared request stream, over HTTP (JSON or binary tensors) or gRPC, with the unchanged tritonclient.

Reports per offered rate: throughput, p50/p90/p99/p99.9 latency, refusals (429/504/other), and from the server's
/metrics when it has dynshape's (or Triton's) metrics: mean queue and compute time, mean batch size (requests per
call), padding waste. A sweep over rates finds the highest throughput whose p99 meets the SLO.

    python bench/serve_bench.py --model bert_small --rates 2,4,8 --duration 10             # starts dynshape serve
    python bench/serve_bench.py --model bert_small --rates 2,4,8 -- --max-batch-size 1      # extra server flags
    python bench/serve_bench.py --model bert_small --url 127.0.0.1:8000 --name bert_small   # any running server
    python bench/serve_bench.py --overhead      # the server's own cost: an identity model, small JSON and 1 MiB binary
                                                # (beside a bare uvicorn echo of the same 1 MiB body)
    python bench/serve_bench.py --model bert_small --overload-rps 100 --duration 60 -- --max-queue-size 16 \
        --default-timeout-us 500000 --threads 1   # past capacity: outcomes checked, counted, memory each second

Models come from ../shared/bench/export_models.py ($DYNSHAPE_BENCH_MODELS); nothing is downloaded. Open loop:
a request is sent at its arrival time whether or not earlier ones were answered (a closed loop hides queueing,
Triton's issue 5957), bounded by --max-outstanding so an overloaded server cannot exhaust the client.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchutil import SHARED  # puts ../shared/bench on sys.path

common = importlib.import_module("common")  # ../shared/bench/common.py: the stream, inputs, model paths


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        m = re.search(r"Model name:\s*(.+)", out)
        return m.group(1).strip() if m else platform.processor()
    except (OSError, subprocess.SubprocessError):
        return platform.processor()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_path: str, name: str, dims: list[str], extra: list[str], grpc: bool) -> tuple:
    port = free_port()
    gport = free_port() if grpc else None
    argv = [sys.executable, "-m", "dynshape", "serve", model_path, "--name", name, "--port", str(port)]
    for d in dims:
        argv += ["--dim", d]
    if gport:
        argv += ["--grpc-port", str(gport)]
    proc = subprocess.Popen(argv + extra, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return proc, f"127.0.0.1:{port}", f"127.0.0.1:{gport}" if gport else None
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not become ready in 300 s")


def rss_mb(pid: int | None) -> float | None:
    """Resident memory of the server process (when this script started it)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def scrape(url: str) -> dict[str, float]:
    """Sums of /metrics samples by metric name (all labels together); {} when the server has no /metrics."""
    try:
        with urllib.request.urlopen(f"http://{url}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{[^}]*\})? (\S+)$", line)
        if m and 'le="' not in line:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


class Client:
    """One tritonclient (HTTP aio or gRPC aio) and the stream's requests as prepared InferInputs."""

    def __init__(self, protocol: str, url: str, name: str, model: str, requests: list[dict]):
        self.protocol, self.name = protocol, name
        if protocol == "grpc":
            import tritonclient.grpc.aio as mod
        else:
            import tritonclient.http.aio as mod
        self.mod = mod
        self.client = mod.InferenceServerClient(url) if protocol == "grpc" else \
            mod.InferenceServerClient(url, conn_limit=1000, conn_timeout=600.0)
        binary = protocol != "http-json"
        self.feeds, self.inputs = [], []
        for r in requests:
            feed = common.make_inputs(model, common.req_shape(model, r), r["data_seed"])
            self.feeds.append(feed)
            ins = []
            for n, a in feed.items():
                i = mod.InferInput(n, list(a.shape), "FP32" if a.dtype == np.float32 else "INT64")
                if protocol == "grpc":
                    i.set_data_from_numpy(a)
                else:
                    i.set_data_from_numpy(a, binary_data=binary)
                ins.append(i)
            self.inputs.append(ins)
        self.expected: list[dict[str, np.ndarray]] | None = None
        outs = common.output_names(model)
        self.outputs = [mod.InferRequestedOutput(o) if protocol == "grpc" else
                        mod.InferRequestedOutput(o, binary_data=binary) for o in outs]

    async def infer(self, k: int) -> str:
        try:
            result = await self.client.infer(self.name, self.inputs[k], outputs=self.outputs)
            if self.expected is not None:  # every answer checked against onnxruntime on the request alone
                for name, ref in self.expected[k].items():
                    got = result.as_numpy(name)
                    if got is None or got.shape != ref.shape or not np.allclose(got, ref, rtol=1e-4, atol=1e-4):
                        return "wrong"
            return "ok"
        except Exception as e:  # noqa: BLE001 (a refusal is a measured outcome)
            s = str(e)
            for code, label in (("429", "429"), ("queue full", "429"), ("504", "504"), ("timed out", "504"),
                                ("UNAVAILABLE", "429"), ("DEADLINE", "504")):
                if code in s:
                    return label
            return "error: " + s[:120]

    async def close(self) -> None:
        await self.client.close()


async def run_rate(client: Client, rate: float, duration: float, seed: int, max_outstanding: int) -> dict:
    rng = np.random.default_rng(seed)
    n = max(1, int(rate * duration))
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
    order = rng.integers(0, len(client.inputs), size=n)
    lat, status, tasks = [], [], []
    outstanding = 0
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def one(k: int) -> None:
        nonlocal outstanding
        t = time.perf_counter()
        s = await client.infer(int(k))
        lat.append(time.perf_counter() - t)
        status.append(s)
        outstanding -= 1

    for at, k in zip(arrivals, order):
        delay = t0 + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if outstanding >= max_outstanding:
            status.append("client-dropped")
            continue
        outstanding += 1
        tasks.append(asyncio.ensure_future(one(k)))
    sent_s = loop.time() - t0
    await asyncio.gather(*tasks)
    wall = loop.time() - t0
    ok = np.array([x for x, s in zip(lat, status) if s == "ok"]) if lat else np.array([])
    counts: dict[str, int] = {}
    for s in status:
        counts[s] = counts.get(s, 0) + 1
    pct = {f"p{p}": float(np.percentile(ok, p) * 1e3) if ok.size else float("nan") for p in (50, 90, 99, 99.9)}
    return {"offered_rps": rate, "sent": n, "send_s": round(sent_s, 2), "wall_s": round(wall, 2),
            "throughput_rps": round(counts.get("ok", 0) / wall, 2), **{k: round(v, 2) for k, v in pct.items()},
            "outcomes": counts}


def server_deltas(before: dict, after: dict) -> dict:
    def d(k: str) -> float:
        return after.get(k, 0.0) - before.get(k, 0.0)

    out = {}
    if d("dynshape_queue_duration_seconds_count"):
        out["queue_ms"] = round(d("dynshape_queue_duration_seconds_sum") / d("dynshape_queue_duration_seconds_count")
                                * 1e3, 2)
    if d("dynshape_compute_infer_duration_seconds_count"):
        out["compute_ms_per_call"] = round(d("dynshape_compute_infer_duration_seconds_sum")
                                           / d("dynshape_compute_infer_duration_seconds_count") * 1e3, 2)
    if d("dynshape_batch_size_requests_count"):
        out["mean_batch_requests"] = round(d("dynshape_batch_size_requests_sum")
                                           / d("dynshape_batch_size_requests_count"), 2)
    if d("nv_inference_exec_count_total"):
        out["mean_batch_rows"] = round(d("nv_inference_count_total") / d("nv_inference_exec_count_total"), 2)
    if d("nv_inference_exec_count"):  # Triton's own counters (no _total suffix, microseconds summed per request)
        out["mean_batch_rows"] = round(d("nv_inference_count") / d("nv_inference_exec_count"), 2)
        out["mean_batch_requests"] = round(d("nv_inference_request_success") / d("nv_inference_exec_count"), 2)
        if d("nv_inference_request_success"):
            out["queue_ms"] = round(d("nv_inference_queue_duration_us") / d("nv_inference_request_success") / 1e3, 2)
            out["compute_ms_per_request"] = round(d("nv_inference_compute_infer_duration_us")
                                                  / d("nv_inference_request_success") / 1e3, 2)  # its call's
    if d("dynshape_padding_waste_ratio_count"):
        out["padding_waste"] = round(d("dynshape_padding_waste_ratio_sum") / d("dynshape_padding_waste_ratio_count"), 3)
    return out


async def bench(args: argparse.Namespace, url: str, grpc_url: str | None, pid: int | None = None) -> list[dict]:
    stream = common.load_stream()["streams"][args.model]
    target = grpc_url if args.protocol == "grpc" else url
    client = Client(args.protocol, target, args.name, args.model, stream)
    murl = args.metrics_url or url
    try:
        for k in range(min(args.warmup, len(stream))):  # every shape once at low load: variants, arenas, caches
            await client.infer(k)
        rows = []
        for i, rate in enumerate(args.rates):
            before = scrape(murl)
            r = await run_rate(client, rate, args.duration, args.seed + i, args.max_outstanding)
            r.update(server_deltas(before, scrape(murl)))
            if pid is not None:
                r["server_rss_mb"] = round(rss_mb(pid) or 0.0, 1)
            r["meets_slo"] = bool(r["p99"] <= args.slo_ms and r["outcomes"].get("ok", 0) == r["sent"])
            rows.append(r)
            print(json.dumps(r), flush=True)
            await asyncio.sleep(args.settle)
        return rows
    finally:
        await client.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bucket_share(text_before: str, text_after: str, name: str, le: str) -> float:
    """The share of `name`'s observations between two /metrics texts that fell at or below `le`."""
    def get(text: str, suffix: str, le_: str | None) -> float:
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + suffix) and (le_ is None or f'le="{le_}"' in line):
                total += float(line.rsplit(" ", 1)[1])
        return total
    count = get(text_after, "_count", None) - get(text_before, "_count", None)
    return (get(text_after, "_bucket", le) - get(text_before, "_bucket", le)) / count if count else float("nan")


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=5) as r:
        return r.read().decode()


def reference_outputs(model: str, feeds: list[dict]) -> list[dict[str, np.ndarray]]:
    """onnxruntime's outputs for each request alone (1 thread): what every accepted answer must equal."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(common.onnx_path(model), so, providers=["CPUExecutionProvider"])
    names = common.output_names(model)
    return [dict(zip(names, sess.run(names, feed))) for feed in feeds]


def outcome_counts(url: str) -> dict[str, float]:
    """The server's request counter by reason (success, rejected, timeout, invalid, ...), all models."""
    out: dict[str, float] = {}
    for line in metrics_text(url).splitlines():
        m = re.match(r'^nv_inference_request_total\{(.*)\} (\S+)$', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            key = labels.get("reason") or labels.get("outcome", "?")
            out[key] = out.get(key, 0.0) + float(m.group(2))
    return out


async def overload(args: argparse.Namespace, url: str, grpc_url: str | None, pid: int | None) -> dict:
    """One long run at an offered load past capacity: outcomes (each answer checked against onnxruntime),
    the server's own counts of them, resident memory every second, and the accepted requests' latency."""
    stream = common.load_stream()["streams"][args.model]
    client = Client(args.protocol, grpc_url if args.protocol == "grpc" else url, args.name, args.model, stream)
    murl = args.metrics_url or url
    client.expected = reference_outputs(args.model, client.feeds)
    rss: list[tuple[float, float]] = []
    try:
        for k in range(len(stream)):  # every shape once at low load: variants, arenas, caches
            await client.infer(k)
        before, counts0 = scrape(murl), outcome_counts(murl)
        t0 = time.perf_counter()

        async def sample() -> None:
            while True:
                rss.append((time.perf_counter() - t0, rss_mb(pid) or 0.0))
                await asyncio.sleep(1.0)

        sampler = asyncio.ensure_future(sample())
        row = await run_rate(client, args.overload_rps, args.duration, args.seed, args.max_outstanding)
        sampler.cancel()
        after = scrape(murl)
    finally:
        await client.close()

    warm = [m for t, m in rss if t >= args.duration / 6] or [m for _, m in rss]
    row.update(server_deltas(before, after))
    row["server_counted"] = {k: v - counts0.get(k, 0.0) for k, v in outcome_counts(murl).items()}
    row["rss_mb"] = {"first": rss[0][1] if rss else None, "after_warmup": warm[0] if warm else None,
                     "max_after_warmup": max(warm) if warm else None, "last": rss[-1][1] if rss else None}
    row["rss_mb_each_10s"] = [round(m, 1) for t, m in rss[::10]]
    if warm and warm[0]:  # an external server (--url): no pid, no memory figures
        row["rss_growth_after_warmup_pct"] = round((max(warm) - warm[0]) / warm[0] * 100, 2)
    return row


def overhead(n: int = 3000) -> dict:
    """The server's own cost per request: `dynshape serve` on an identity model (exe.run takes ~15 us), one
    keep-alive connection, requests one at a time: a small JSON tensor, a 1 MiB binary one, and GET live.

    Three views, because on a shared 2-core machine each misleads alone: the round trip (includes the client's
    own http.client work and the kernel's loopback on both sides), the server process's CPU time per request
    (uvicorn's HTTP parsing and the socket system calls included), and the server's own request time (its
    request histogram: the infer handler's start, before the body is read, to the response encoded), with the
    share of requests under 100 us."""
    import http.client
    import tempfile

    import onnx
    import orjson
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "ident", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ident.onnx")
        onnx.save(model, path)
        proc, url, _ = start_server(path, "id", ["batch=1:64", "n=1:1048576"], ["--threads", "1"], False)
    try:
        host, port = url.split(":")
        conn = http.client.HTTPConnection(host, int(port))

        def times(method: str, path: str, body: bytes | None, headers: dict, k: int) -> np.ndarray:
            out = []
            for _ in range(k):
                t = time.perf_counter()
                conn.request(method, path, body=body, headers=headers)
                r = conn.getresponse()
                r.read()
                out.append(time.perf_counter() - t)
                assert r.status == 200, r.status
            return np.array(out) * 1e6

        small = np.ones((1, 16), np.float32)
        body = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                                         "data": small.ravel().tolist()}]})
        times("POST", "/v2/models/id/infer", body, {}, 300)
        before, text0, c0 = scrape(url), metrics_text(url), cpu_seconds(proc.pid)
        js = times("POST", "/v2/models/id/infer", body, {}, n)
        c1, text1 = cpu_seconds(proc.pid), metrics_text(url)
        d = {k: scrape(url).get(k, 0.0) - before.get(k, 0.0) for k in
             ("dynshape_request_duration_seconds_sum", "dynshape_request_duration_seconds_count",
              "dynshape_compute_infer_duration_seconds_sum", "dynshape_compute_infer_duration_seconds_count")}
        c2 = cpu_seconds(proc.pid)
        live = times("GET", "/v2/health/live", None, {}, n)
        c3 = cpu_seconds(proc.pid)
        big = np.random.default_rng(0).standard_normal((1, 262144)).astype(np.float32)
        head = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 262144], "datatype": "FP32",
                                         "parameters": {"binary_data_size": big.nbytes}}],
                             "outputs": [{"name": "y", "parameters": {"binary_data": True}}]})
        body = head + big.tobytes()
        times("POST", "/v2/models/id/infer", body, {"Inference-Header-Content-Length": str(len(head))}, 20)
        b0 = scrape(url)
        binary = times("POST", "/v2/models/id/infer", body, {"Inference-Header-Content-Length": str(len(head))}, 300)
        b1 = scrape(url)
        t = time.perf_counter()
        for _ in range(200):
            big.copy()
        copy_us = (time.perf_counter() - t) / 200 * 1e6
    finally:
        proc.terminate()
        proc.wait(30)
    echo = echo_round_trip(body, 300)

    def server_us(a: dict, b: dict, what: str) -> float:
        k = f"dynshape_{what}_duration_seconds"
        return (b.get(k + "_sum", 0.0) - a.get(k + "_sum", 0.0)) / max(b.get(k + "_count", 0.0)
                                                                       - a.get(k + "_count", 0.0), 1) * 1e6
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "load_avg": os.getloadavg()[0],
            "json_16_floats_us": {"p50": round(float(np.median(js))), "p99": round(float(np.percentile(js, 99)))},
            "server_side_request_us": round(d["dynshape_request_duration_seconds_sum"]
                                            / max(d["dynshape_request_duration_seconds_count"], 1) * 1e6),
            "server_side_request_share": {f"<= {le} s": round(bucket_share(
                text0, text1, "dynshape_request_duration_seconds", le), 3) for le in ("5e-05", "0.0001", "0.00025")},
            "server_cpu_us_per_infer": round((c1 - c0) / n * 1e6), "server_cpu_us_per_live": round((c3 - c2) / n * 1e6),
            "exe_run_us": round(d["dynshape_compute_infer_duration_seconds_sum"]
                                / max(d["dynshape_compute_infer_duration_seconds_count"], 1) * 1e6),
            "get_live_us": {"p50": round(float(np.median(live))), "p99": round(float(np.percentile(live, 99)))},
            "binary_1MiB_us": {"p50": round(float(np.median(binary))),
                               "p99": round(float(np.percentile(binary, 99)))},
            "binary_1MiB_server_side_us": round(server_us(b0, b1, "request")),
            "binary_1MiB_exe_run_us": round(server_us(b0, b1, "compute_infer")),
            "bare_uvicorn_echo_1MiB_us": {"p50": round(float(np.median(echo))),
                                          "p99": round(float(np.percentile(echo, 99)))},
            "numpy_copy_1MiB_us": round(copy_us)}


ECHO_APP = """
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif m["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    chunks = []
    while True:
        m = await receive()
        chunks.append(m.get("body", b""))
        if not m.get("more_body"):
            break
    body = b"".join(chunks)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
"""


def echo_round_trip(body: bytes, n: int) -> np.ndarray:
    """The JSON-free baseline of the binary figure: the same body POSTed to a bare ASGI app on the same uvicorn
    stack (httptools, one keep-alive connection) that returns it unread, so the figure compares the server's
    KServe path with moving the same bytes through the same HTTP stack and loopback (microseconds per call)."""
    import http.client
    import importlib.util
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "ds_echo.py").write_text(ECHO_APP)
        port = free_port()
        loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "ds_echo:app", "--port", str(port), "--http",
                                 "httptools", "--loop", loop, "--log-level", "warning"], cwd=tmp,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port)
                    conn.request("POST", "/", body=body)
                    conn.getresponse().read()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            out = []
            for _ in range(n + 20):
                t = time.perf_counter()
                conn.request("POST", "/", body=body)
                r = conn.getresponse()
                assert len(r.read()) == len(body)
                out.append(time.perf_counter() - t)
            return np.array(out[20:]) * 1e6
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert_small", choices=["bert_small", "mlp", "bert_base"],
                    help="Stream and ONNX file from ../shared/bench.")
    ap.add_argument("--name", default=None, help="Model name on the server (default: --model).")
    ap.add_argument("--url", default=None, help="A running server's HTTP host:port (default: start dynshape serve).")
    ap.add_argument("--grpc-url", default=None, help="Its gRPC host:port (with --protocol grpc).")
    ap.add_argument("--metrics-url", default=None,
                    help="host:port of the server's /metrics (default: --url; Triton serves it on its own port).")
    ap.add_argument("--protocol", default="http-binary", choices=["http-json", "http-binary", "grpc"])
    ap.add_argument("--rates", default="2,4,8", help="Offered loads, requests/s, comma-separated.")
    ap.add_argument("--duration", type=float, default=10.0, help="Seconds of arrivals per rate.")
    ap.add_argument("--warmup", type=int, default=40, help="Requests sent one by one before measuring.")
    ap.add_argument("--slo-ms", type=float, default=50.0, help="p99 latency target of the sweep.")
    ap.add_argument("--max-outstanding", type=int, default=512)
    ap.add_argument("--settle", type=float, default=1.0, help="Pause between rates, seconds.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dim", action="append", default=None, help="--dim for the started server (repeatable).")
    ap.add_argument("--json", default=None, help="Write the results here.")
    ap.add_argument("--overhead", action="store_true", help="Measure the server's own cost per request and exit.")
    ap.add_argument("--overload-rps", type=float, default=None,
                    help="One run of --duration seconds at this offered load (past capacity): outcomes checked "
                         "against onnxruntime, the server's counts, resident memory each second.")
    ap.add_argument("server_args", nargs="*", help="After --: extra flags for the started dynshape serve.")
    args = ap.parse_args()
    if args.overhead:
        print(json.dumps(overhead()))
        return
    args.name = args.name or args.model
    args.rates = [float(r) for r in args.rates.split(",")]
    dims = args.dim or (["batch=1:64", "seq=1:512"] if args.model.startswith("bert") else ["batch=1:256"])
    proc = None
    url, grpc_url = args.url, args.grpc_url
    if url is None:
        path = common.onnx_path(args.model)
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run {SHARED / 'export_models.py'} --models {args.model}")
        proc, url, grpc_url = start_server(path, args.name, dims, args.server_args, args.protocol == "grpc")
    try:
        if args.overload_rps:
            row = asyncio.run(overload(args, url, grpc_url, proc.pid if proc is not None else None))
            row.update({"cpu": cpu_model(), "cores": os.cpu_count(), "model": args.model,
                        "protocol": args.protocol, "server_args": args.server_args})
            print(json.dumps(row))
            if args.json:
                Path(args.json).write_text(json.dumps(row, indent=1))
            return
        rows = asyncio.run(bench(args, url, grpc_url, proc.pid if proc is not None else None))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    ok = [r for r in rows if r["meets_slo"]]
    best = max(ok, key=lambda r: r["throughput_rps"]) if ok else None
    summary = {"cpu": cpu_model(), "cores": os.cpu_count(), "model": args.model, "protocol": args.protocol,
               "server_args": args.server_args, "slo_p99_ms": args.slo_ms,
               "max_throughput_under_slo_rps": best["throughput_rps"] if best else None, "rates": rows}
    print(json.dumps({k: v for k, v in summary.items() if k != "rates"}))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
