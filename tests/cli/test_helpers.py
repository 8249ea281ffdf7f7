"""The built-in encoder, the option parsers and the input generator the commands rely on."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import typer

import dynshape as ds
from dynshape.cli.args import parse_dims, parse_randoms, parse_shapes
from dynshape.cli.feeds import generated_feed
from dynshape.ir.graph import format_type
from dynshape.models import build_encoder
from tolerance import assert_f32_close


@pytest.fixture(scope="module")
def encoder():
    proto = build_encoder(layers=1, hidden=16, heads=2, ffn=32, vocab=30522)
    return proto, ds.load_onnx(proto, dims={"batch": (1, 8), "seq": (1, 64)})


def test_encoder_has_symbolic_signature_and_exporter_idioms(encoder):
    proto, graph = encoder
    assert format_type(graph.types["last_hidden_state"]) == "float32[batch, seq, 16]"
    ops = {n.op_type for n in proto.graph.node}
    assert {"Shape", "Gather", "Unsqueeze", "Concat", "Reshape", "Transpose", "Softmax", "Erf",
            "LayerNormalization", "Slice", "Sub", "Mul", "Div"} <= ops


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="onnxruntime not installed")
def test_encoder_reference_matches_onnxruntime_with_padding(encoder):
    import onnxruntime as ort

    proto, graph = encoder
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for batch, seq in [(1, 1), (3, 17)]:
        feed = {"input_ids": rng.integers(0, 30522, (batch, seq)),
                "attention_mask": (np.arange(seq) < max(1, seq - 5)).astype(np.int64)[None].repeat(batch, 0)}
        ours = graph.run(feed)["last_hidden_state"]
        assert_f32_close(ours, sess.run(None, feed)[0], rtol=1e-7, scale=1e-4)


def test_encoder_rejects_heads_not_dividing_hidden():
    with pytest.raises(ValueError, match="not divisible"):
        build_encoder(hidden=10, heads=4)


def test_generated_inputs_match_the_shared_benchmark(encoder):
    common = Path(__file__).resolve().parents[2].parent / "shared" / "bench" / "common.py"
    if not common.exists():
        pytest.skip("shared/bench is not next to this checkout")
    spec = importlib.util.spec_from_file_location("bench_common", common)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ours = generated_feed(encoder[1], {"batch": 2, "seq": 9}, seed=1234)
    theirs = mod.make_inputs("bert_small", (2, 9), 1234)
    assert ours.keys() == theirs.keys()
    for k in ours:
        np.testing.assert_array_equal(ours[k], theirs[k])


def test_parse_dims():
    assert parse_dims(["seq=1:512:8", "batch=:64", "h=32:", "heads=12"]) == {
        "seq": {"min": 1, "max": 512, "multiple_of": 8}, "batch": {"max": 64}, "h": {"min": 32}, "heads": 12}
    for bad in ["seq", "seq=", "seq=1:2:3:4", "=1:2", "seq=-1:4"]:
        with pytest.raises(typer.BadParameter):
            parse_dims([bad])


def test_parse_shapes_and_randoms():
    assert parse_shapes("1x16,8x128,7") == [(1, 16), (8, 128), (7,)]
    r = parse_randoms(["x=2,16", "ids=2x3:0:10"])
    assert r["x"].shape == (2, 16) and r["x"].low is None
    assert (r["ids"].shape, r["ids"].low, r["ids"].high) == ((2, 3), 0, 10)
    with pytest.raises(typer.BadParameter):
        parse_randoms(["x=2,16:5"])
