"""Ray Serve scale-out: throughput of `dynshape.serve.ray` with 1 and then 2 replicas (1 CPU, 1 thread each) on a
local Ray instance of 2 CPUs, the shared stream's requests sent by a closed loop of --concurrency clients.

    python bench/serve_ray_bench.py --model bert_small --duration 20 --concurrency 8

Closed loop on purpose: the figure is throughput at saturation, and an open loop past capacity would only fill
Ray's proxy queue. The client runs on the same 2 cores as the replicas and Ray's proxy and controller.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import time

from serve_bench import Client, common, cpu_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def closed_loop(client: Client, n: int, duration: float, concurrency: int) -> dict:
    for k in range(n):  # every shape once in each replica is not guaranteed; one pass warms the common ones
        await client.infer(k)
    counts: dict[str, int] = {}
    stop = time.perf_counter() + duration
    next_k = 0

    async def worker() -> None:
        nonlocal next_k
        while time.perf_counter() < stop:
            k, next_k = next_k % n, next_k + 1
            s = await client.infer(k)
            counts[s] = counts.get(s, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"throughput_rps": round(counts.get("ok", 0) / wall, 2), "wall_s": round(wall, 1), "outcomes": counts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert_small", choices=["bert_small", "mlp"])
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--replicas", default="1,2")
    args = ap.parse_args()
    import ray
    from ray import serve

    from dynshape.serve import BatcherConfig, ModelSpec
    from dynshape.serve.ray import application

    dims = {"batch": (1, 64), "seq": (1, 512)} if args.model.startswith("bert") else {"batch": (1, 256)}
    stream = common.load_stream()["streams"][args.model]
    rows = []
    for n in [int(r) for r in args.replicas.split(",")]:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        port = free_port()
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            spec = ModelSpec(common.onnx_path(args.model), name=args.model, dims=dims, batcher=BatcherConfig())
            serve.run(application([spec], num_replicas=n, max_ongoing_requests=16,
                                  ray_actor_options={"num_cpus": 1}), route_prefix="/", name="dynshape")

            async def go(url: str) -> dict:
                client = Client("http-binary", url, args.model, args.model, stream)
                try:
                    return await closed_loop(client, len(stream), args.duration, args.concurrency)
                finally:
                    await client.close()

            row = {"replicas": n, **asyncio.run(go(f"127.0.0.1:{port}")), "load_avg": os.getloadavg()[0]}
            rows.append(row)
            print(json.dumps(row), flush=True)
        finally:
            serve.shutdown()
            ray.shutdown()
    if len(rows) == 2 and rows[0]["throughput_rps"]:
        print(json.dumps({"cpu": cpu_model(), "cores": os.cpu_count(), "model": args.model,
                          "speedup_2_vs_1": round(rows[1]["throughput_rps"] / rows[0]["throughput_rps"], 2)}))


if __name__ == "__main__":
    main()
