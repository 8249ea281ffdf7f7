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
from dynshape.serve.batcher import Batcher
from dynshape.serve.metrics import Metrics
from dynshape.serve.padding import CostModel, PadPlan
from dynshape.serve.server import Server
from dynshape.serve.signature import ModelSignature


class OverheadBound(CostModel):
    """A call costs 1 ms plus 1 us per token: joining always pays for these short sequences."""

    calibrated = True

    def record(self, rows: int, length: int, seconds: float) -> None:
        pass

    def predict(self, rows: int, length: int) -> float:
        return 1e-3 + 1e-6 * rows * length


def test_sequences_of_different_lengths_are_padded_and_joined(enc_graph):
    ref = ds.compile(enc_graph)
    spec = ModelSpec(enc_graph, name="enc", batcher=BatcherConfig(max_batch_size=8, max_queue_delay_us=50_000,
                                                                   pad={"seq": "attention_mask"}))
    with Server([spec], ServerConfig(port=0)) as srv:
        batcher = srv.repo.get("enc").batcher
        assert batcher.cost.calibrated  # probe calls at load fitted it
        batcher.cost = OverheadBound()  # measured times are noisy on shared cores: decide deterministically here
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


def test_cost_model_fits_linear_and_quadratic_terms():
    c = CostModel()
    for rows in (1, 2, 4):
        for n in (8, 32, 128):
            c.record(rows, n, 1e-3 + 2e-6 * rows * n + 1e-8 * rows * n * n)
    assert c.calibrated
    assert abs(c.predict(8, 256) - (1e-3 + 2e-6 * 8 * 256 + 1e-8 * 8 * 256 * 256)) < 1e-6
    # one long request with many short ones: padding the short ones to 512 costs more than apart
    assert c.predict(9, 512) > c.predict(1, 512) + c.predict(8, 16)


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
