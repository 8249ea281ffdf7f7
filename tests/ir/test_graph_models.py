"""End-to-end inference on realistic graphs: exact symbolic shapes, and the reference executor vs onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from models import bert, cnn

import dynshape as ds
from dynshape.frontends.onnx import load_onnx
from dynshape.ir.types import TensorType
from tolerance import assert_f32_close

ort = pytest.importorskip("onnxruntime")


def _ort(model, feed: dict) -> list:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def _bert_feed(batch: int, seq: int, hidden: int = 16, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), bool)
    mask[0, seq // 2:] = False  # padding in the first sequence
    return {"x": rng.standard_normal((batch, seq, hidden)).astype(np.float32), "mask": mask}


def test_bert_output_is_exactly_batch_seq_hidden_with_no_unknown_dims() -> None:
    g = load_onnx(bert(layers=2))
    batch, seq = g.signature.symbols["batch"], g.signature.symbols["seq"]
    assert g.outputs[0].shape == (batch, seq, 16)
    for name, t in g.types.items():
        assert isinstance(t, TensorType)
        for d in t.shape:
            assert isinstance(d, int) or d.free_symbols <= {"batch", "seq"}, (name, t.shape)
    assert not [f for f in g.signature.facts if f.kind == "fresh"]
    scores = [g.types[n.outputs[0]] for n in g.nodes if n.op_type == "Softmax"]
    assert scores and all(t.shape == (batch, 2, seq, seq) for t in scores)


def test_bert_reshape_chain_propagates_symbolic_shape_values() -> None:
    g = load_onnx(bert())
    concat = next(n for n in g.nodes if n.op_type == "Concat")
    assert [str(v) for v in g.types[concat.outputs[0]].value.tolist()] == ["batch", "seq", "2", "8"]


@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (2, 7), (3, 16)])
def test_bert_run_agrees_with_onnxruntime(batch: int, seq: int) -> None:
    model = bert(layers=2)
    g = load_onnx(model)
    feed = _bert_feed(batch, seq)
    out = g.run(feed)["y"]
    (ref,) = _ort(model, feed)
    assert out.shape == (batch, seq, 16)
    assert_f32_close(out, ref, rtol=1e-4, scale=1e-5)


def test_cnn_floor_division_chain() -> None:
    g = load_onnx(cnn())
    H, W = g.signature.symbols["H"], g.signature.symbols["W"]
    feat = g.types["features"].shape
    # conv/pool with k3 s2 p1 gives (h + 1)//2 each time: five of them are ceil(h / 32)
    assert ds.prove(ds.eq(feat[2], (H + 31) // 32)) is True
    assert ds.prove(ds.eq(feat[3], (W + 31) // 32)) is True
    assert g.outputs[0].shape == (g.signature.symbols["N"], 10)


def test_cnn_floor_division_chain_is_simplified() -> None:
    g = load_onnx(cnn())
    H = g.signature.symbols["H"]
    assert g.types["features"].shape[2] == (H + 31) // 32


def test_cnn_with_multiple_of_32_simplifies_to_exact_division() -> None:
    g = load_onnx(cnn(), dims={"H": {"multiple_of": 32}, "W": {"multiple_of": 32}})
    H, W = g.signature.symbols["H"], g.signature.symbols["W"]
    n = g.signature.symbols["N"]
    assert g.types["features"].shape == (n, 4, H // 32, W // 32)
    assert [g.types[n.outputs[0]].shape[2] for n in g.nodes if n.op_type == "Conv"] == \
        [H // 2, H // 8, H // 16, H // 32]


@pytest.mark.parametrize(("n", "h", "w"), [(1, 32, 32), (2, 45, 70), (1, 7, 100)])
def test_cnn_run_agrees_with_onnxruntime(n: int, h: int, w: int) -> None:
    model = cnn()
    g = load_onnx(model)
    x = np.random.default_rng(1).standard_normal((n, 3, h, w)).astype(np.float32)
    out = g.run({"x": x})
    ref = _ort(model, {"x": x})
    assert_f32_close(out["logits"], ref[0], rtol=1e-4, scale=1e-5)
    assert out["features"].shape == ref[1].shape == (n, 4, -(-h // 32), -(-w // 32))


def test_print_shows_signature_then_one_line_per_node() -> None:
    g = load_onnx(cnn(), dims={"N": (1, 8), "H": {"min": 32, "max": 512, "multiple_of": 32}})
    text = str(g)
    assert text.index("signature:") < text.index("nodes:")
    assert "N in [1, 8]" in text and "H in [32, 512], multiple of 32" in text
    lines = text.split("nodes:")[1].split("outputs:")[0].strip().splitlines()
    assert len(lines) == len(g.nodes)
    assert "Conv 'Conv_8' -> conv8_0: float32[N, 4, H//32, (W + 31)//32]" in text


def test_numel_and_memory_bound() -> None:
    g = load_onnx(cnn(), dims={"N": (1, 8), "H": (1, 64), "W": (1, 64)})
    assert g.numel_bound("x") == 8 * 3 * 64 * 64
    mb = g.memory_bound()
    assert mb.bytes is not None
    weights = sum(a.nbytes for a in g.initializers.values())
    # peak: the input and the first conv's output are live together; the input dies right after
    assert mb.bytes == weights + 4 * (8 * 3 * 64 * 64 + 8 * 4 * 32 * 32)
    assert "Conv_1" in str(mb)


def test_memory_bound_names_the_unbounded_symbol() -> None:
    g = load_onnx(cnn(), dims={"N": (1, 8), "H": (1, 64)})
    mb = g.memory_bound()
    assert mb.bytes is None and set(mb.unbounded) == {"W"}
    assert "W" in str(mb) and "max=" in str(mb)
