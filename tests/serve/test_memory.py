"""Memory under joined batches (issue 30): with every symbol bounded, each instance reserves at load the arena of
the largest call the declared dims admit, so batches the batcher joins (shapes no single request had) never grow
it. Measured on the executable's own arena accounting (`exe.stats()["arena_bytes"]`, `exe.arenas`), not the
process's resident memory, which concurrent frees make noisy."""

from __future__ import annotations

import numpy as np
from serve_util import close, metric
from test_batching import send

import dynshape as ds
from dynshape.models.encoder import build_encoder
from dynshape.serve import BatcherConfig, ModelSpec, ServerConfig
from dynshape.serve.server import Server


def _feeds(rng, rows: list[int], seq: int) -> list[dict]:
    return [{"input_ids": rng.integers(0, 50, (r, seq)).astype(np.int64), "attention_mask": np.ones((r, seq), np.int64)}
            for r in rows]


def test_joined_batches_allocate_no_arena_memory(enc_graph):
    """A warm-up of single requests (as the overload bench's), then joined batches of up to 8 rows at varying
    lengths, larger than any single request: the arena is the reserve from load to the end (without the
    reservation it grew at the first 8-row join)."""
    ref = ds.compile(enc_graph)
    spec = ModelSpec(enc_graph, name="enc_mem", batcher=BatcherConfig(max_batch_size=8, max_queue_delay_us=20_000))
    with Server([spec], ServerConfig(port=0)) as srv:
        exe = srv.repo.get("enc_mem").batcher.executables[0]
        reserve = exe.worst_case_memory().reserve
        assert reserve and exe.stats()["arena_bytes"] == reserve and len(exe.arenas) == 1  # reserved at load
        rng = np.random.default_rng(30)
        seqs = (32, 3, 17, 9, 25, 1, 31)
        for seq in seqs:  # warm-up: each length once, alone
            for f in _feeds(rng, [3], seq):
                close(send(srv.url, "enc_mem", [f])[0]["last_hidden_state"], ref.run(f)["last_hidden_state"])
        warm = exe.stats()["arena_bytes"]
        for seq in seqs:  # concurrent requests of one length: joined into calls of up to 8 rows
            feeds = _feeds(rng, [2, 2, 1, 3, 2, 1, 2, 3], seq)
            for f, o in zip(feeds, send(srv.url, "enc_mem", feeds)):
                close(o["last_hidden_state"], ref.run(f)["last_hidden_state"])
        small = metric(srv, "dynshape_batch_size_rows_bucket", model="enc_mem", le="4.0")  # the warm-up's 7 at least
        assert 7 <= small < metric(srv, "dynshape_batch_size_rows_count", model="enc_mem")  # some calls had > 4 rows
        assert exe.stats()["arena_bytes"] == warm == reserve and len(exe.arenas) == 1  # none grown, none added


def test_unbounded_dims_or_off_reserve_nothing(enc_graph):
    """Nothing reserved where the worst case is unbounded (seq has no max) or reserve_memory is off: the arena
    grows with the calls served, as ds.compile's does."""
    unbounded = ds.load_onnx(build_encoder(layers=1, hidden=32, heads=2, ffn=64, vocab=50), dims={"batch": (1, 8)})
    specs = [ModelSpec(enc_graph, name="enc_off", reserve_memory=False), ModelSpec(unbounded, name="enc_unb")]
    with Server(specs, ServerConfig(port=0)) as srv:
        for name in ("enc_off", "enc_unb"):
            exe = srv.repo.get(name).batcher.executables[0]
            assert exe.stats()["arena_bytes"] == 0 and not exe.arenas
            feed = _feeds(np.random.default_rng(31), [2], 7)[0]
            out = send(srv.url, name, [feed])[0]["last_hidden_state"]
            assert exe.stats()["arena_bytes"] > 0  # grown by the call
            close(out, exe.run(feed)["last_hidden_state"])
