"""Pad-and-join (`pad={"seq": "attention_mask"}`): exact against each request alone, joined only when the cost
model says so, the waste in the metrics; refused for a model where padding is not exact."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from serve_util import close, metric
from test_batching import send

import dynshape as ds
from dynshape.serve import BatcherConfig, ModelSpec, ServerConfig
from dynshape.serve.batcher import Batcher, Pending
from dynshape.serve.metrics import Metrics
from dynshape.serve.padding import CostModel, PadPlan, nnls
from dynshape.serve.server import Server
from dynshape.serve.signature import ModelSignature


class Fixed(CostModel):
    """A cost model with set constants (`t = a + b * flops + c * bytes`) that measured calls do not move."""

    def __init__(self, work, a: float, b: float, c: float = 0.0):
        super().__init__(work)
        self.coef = np.array([a, b, c])

    def record(self, values, seconds) -> None:
        pass


def overhead_bound(exe) -> Fixed:
    """A call costs 1 ms plus next to nothing per FLOP: joining always pays for these short sequences."""
    return Fixed(exe.work, 1e-3, 1e-15)


def test_sequences_of_different_lengths_are_padded_and_joined(enc_graph):
    ref = ds.compile(enc_graph)
    spec = ModelSpec(enc_graph, name="enc", batcher=BatcherConfig(max_batch_size=8, max_queue_delay_us=50_000,
                                                                   pad={"seq": "attention_mask"}))
    with Server([spec], ServerConfig(port=0)) as srv:
        batcher = srv.repo.get("enc").batcher
        assert batcher.cost.calibrated  # probe calls at load fitted it
        batcher.cost = overhead_bound(ref)  # measured times are noisy on shared cores: decide deterministically
        rng = np.random.default_rng(8)
        feeds = [{"input_ids": rng.integers(0, 50, (1, s)).astype(np.int64),
                  "attention_mask": np.ones((1, s), np.int64)} for s in (5, 6, 7, 8, 12)]
        feeds[1]["attention_mask"][0, -2:] = 0  # a request that carries its own padding stays exact too
        e0 = metric(srv, "nv_inference_exec_count_total", model="enc")
        outs = send(srv.url, "enc", feeds)
        for f, o in zip(feeds, outs):
            assert o["last_hidden_state"].shape == (1, f["input_ids"].shape[1], 32)
            close(o["last_hidden_state"], ref.run(f)["last_hidden_state"])
        assert metric(srv, "nv_inference_exec_count_total", model="enc") - e0 < len(feeds)
        assert metric(srv, "dynshape_padding_waste_ratio_sum", model="enc") > 0
        assert metric(srv, "dynshape_padding_flops_waste_ratio_sum", model="enc") > 0
        assert metric(srv, "dynshape_pad_decisions_total", model="enc", decision="join") > 0


def _mean_model():
    """y = mean over seq of x * mask: the mask zeroes padded positions, but the mean still counts them."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])
    m = helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])
    nodes = [helper.make_node("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "mf"], ["xm"]),
             helper.make_node("ReduceMean", ["xm"], ["y"], axes=[1], keepdims=1)]
    return helper.make_model(helper.make_graph(nodes, "mean", [x, m], [y]), opset_imports=[helper.make_opsetid("", 17)])


def test_padding_refused_where_not_exact(enc_graph):
    sig = ModelSignature(enc_graph)
    with pytest.raises(ValueError, match="no input 'mask'"):
        PadPlan(sig, {"seq": "mask"})
    with pytest.raises(ValueError, match="that is the batch symbol"):
        PadPlan(sig, {"batch": "attention_mask"})
    g = ds.load_onnx(_mean_model(), dims={"batch": (1, 8), "seq": (1, 32)})
    b = Batcher("mean", "1", [ds.compile(g)], ModelSignature(g), BatcherConfig(pad={"seq": "mask"}), Metrics())
    with pytest.raises(ValueError, match="output 'y' of a seq=1 request padded to 6 differs"):
        b.calibrate()


def _pending(enc_graph, length: int, rows: int = 1) -> Pending:
    sig = ModelSignature(enc_graph)
    feed = {"input_ids": np.zeros((rows, length), np.int64), "attention_mask": np.ones((rows, length), np.int64)}
    key, rows, values = sig.validate(feed)
    plan = PadPlan(sig, {"seq": "attention_mask"})
    return Pending(feed, plan.loose_key(key), rows, 0, None, 0.0, None, length, values)


def test_cost_model_learns_the_machine_constants_over_the_symbolic_work(enc_graph):
    """Times made from known constants over the encoder's real work counts: the fit recovers them (predictions at
    unseen shapes within 1%), and the quadratic attention term comes from the graph, not from the fit."""
    exe = ds.compile(enc_graph)
    a, b, c = 2e-4, 3e-10, 1e-10
    c_model = CostModel(exe.work)
    for rows in (1, 2, 4):
        for n in (4, 8, 16):
            w = exe.work({"batch": rows, "seq": n})
            c_model.record({"batch": rows, "seq": n}, a + b * w["flops"] + c * w["bytes"])
    assert c_model.calibrated and (c_model.coef >= 0).all()
    for rows, n in ((8, 32), (3, 27), (1, 1)):
        w = exe.work({"batch": rows, "seq": n})
        want = a + b * w["flops"] + c * w["bytes"]
        assert abs(c_model.predict({"batch": rows, "seq": n}) - want) < 0.01 * want


def test_cost_model_fit_is_non_negative_least_squares():
    """Collinear features: the fit matches the exact NNLS optimum (no coefficient below 0, the same residual),
    found by brute force: the best feasible least-squares solution over every support (8 for 3 features)."""
    import itertools

    def brute_nnls(x, y):
        best, best_r = np.zeros(x.shape[1]), float(np.sum(y ** 2))
        for k in range(1, x.shape[1] + 1):
            for cols in itertools.combinations(range(x.shape[1]), k):
                c, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
                if (c >= 0).all():
                    full = np.zeros(x.shape[1])
                    full[list(cols)] = c
                    r = float(np.sum((x @ full - y) ** 2))
                    if r < best_r:
                        best, best_r = full, r
        return best

    rng = np.random.default_rng(3)
    for _ in range(20):
        x = rng.random((12, 3))
        x[:, 2] = x[:, 1] * 2 + rng.normal(0, 0.01, 12)
        y = x @ np.array([1.0, -0.5, 0.8]) + rng.normal(0, 0.05, 12)
        got, ref = nnls(x, y), brute_nnls(x, y)
        assert (got >= 0).all()
        assert np.sum((x @ got - y) ** 2) <= np.sum((x @ ref - y) ** 2) + 1e-9


def test_cost_model_keeps_a_very_short_sequence_apart_from_a_very_long_one(enc_graph):
    """With a call overhead of 0.1 ms and the time per FLOP at which a (1, 32) call takes about 1 ms, padding a
    1-token request to 32 costs more than the call it saves: kept apart and counted; a 30-token request padded
    to 32 costs less: joined."""
    exe = ds.compile(enc_graph)
    per_flop = 0.9e-3 / exe.work({"batch": 1, "seq": 32})["flops"]
    b = Batcher("enc", "1", [exe], ModelSignature(enc_graph), BatcherConfig(pad={"seq": "attention_mask"}),
                metrics := Metrics())
    b.cost = Fixed(exe.work, 1e-4, per_flop)
    long_, short, near = _pending(enc_graph, 32), _pending(enc_graph, 1), _pending(enc_graph, 30)
    batch, rows, apart = b._choose([long_, short], cap=8)
    assert batch == [long_] and rows == 1 and apart == 1
    batch, rows, apart = b._choose([long_, near, short], cap=8)
    assert batch == [long_, near] and rows == 2 and apart == 1
    b._take(batch, apart)  # the decision counted once the batch is taken
    assert metrics.pad_decisions.labels("enc", "1", "apart")._value.get() == 1
    # the same pair with no call overhead: joining never pays
    b.cost = Fixed(exe.work, 0.0, per_flop)
    assert b._choose([long_, near], cap=8)[0] == [long_]


def test_pad_auto_finds_the_mask_and_drops_padding_that_is_not_exact(enc_graph):
    b = Batcher("enc", "1", [ds.compile(enc_graph)], ModelSignature(enc_graph), BatcherConfig(pad="auto"), Metrics())
    assert (b.pad.symbol, b.pad.mask) == ("seq", "attention_mask")
    b.calibrate()
    assert b.pad is not None and b.cost.calibrated
    g = ds.load_onnx(_mean_model(), dims={"batch": (1, 8), "seq": (1, 32)})
    b = Batcher("mean", "1", [ds.compile(g)], ModelSignature(g), BatcherConfig(pad="auto"), Metrics())
    assert b.pad.mask == "mask"
    b.calibrate()  # not exact: a warning, and the model is served without padding
    assert b.pad is None and b.cost is None
