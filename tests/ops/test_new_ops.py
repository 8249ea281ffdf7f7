"""The op families added for issue 13, each against an independent numpy computation written from the spec
(ONNX's own cases run in tests/conformance); shape rules checked on symbolic inputs where they do work."""

from __future__ import annotations

import numpy as np
import pytest
from nodecase import one_node, run_one
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.frontends.onnx import load_onnx
from tolerance import assert_f32_close

rng = np.random.default_rng(1)
F32 = np.float32


# ---- losses ----------------------------------------------------------------------------------------------
def test_nll_mean_divides_by_the_weights_of_the_counted_targets() -> None:
    x = rng.standard_normal((3, 4, 2)).astype(F32)
    t = np.array([[0, 3], [1, -1], [-1, 2]], np.int64)
    w = np.array([0.5, 1.0, 2.0, 3.0], F32)
    (y,) = run_one("NegativeLogLikelihoodLoss", {"x": x, "t": t, "w": w}, ignore_index=-1)
    num = den = 0.0
    for n in range(3):
        for d in range(2):
            if t[n, d] != -1:
                num += -x[n, t[n, d], d] * w[t[n, d]]
                den += w[t[n, d]]
    np.testing.assert_allclose(y, num / den, rtol=1e-6)


def test_softmax_cross_entropy_is_nll_of_log_softmax() -> None:
    x = rng.standard_normal((5, 3)).astype(F32)
    t = np.array([0, 2, 1, 1, 0], np.int64)
    loss, logp = run_one("SoftmaxCrossEntropyLoss", {"x": x, "t": t}, 2, reduction="none")
    ref = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(logp, ref, rtol=1e-5)
    np.testing.assert_allclose(loss, -ref[np.arange(5), t], rtol=1e-5)


# ---- quantization --------------------------------------------------------------------------------------
def test_blocked_quantize_and_dequantize_round_trip() -> None:
    x = rng.standard_normal((2, 6)).astype(F32)
    scale = np.abs(rng.standard_normal((2, 3))).astype(F32) + 0.1
    zp = np.array([[1, -2, 0], [3, 0, -1]], np.int8)
    (q,) = run_one("QuantizeLinear", {"x": x, "s": scale, "zp": zp}, opset=21, axis=1, block_size=2)
    s_full, zp_full = np.repeat(scale, 2, axis=1), np.repeat(zp, 2, axis=1).astype(np.int64)
    want = np.clip(np.rint(x / s_full) + zp_full, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(q, want)
    (dq,) = run_one("DequantizeLinear", {"q": q, "s": scale, "zp": zp}, opset=21, axis=1, block_size=2)
    np.testing.assert_allclose(dq, (want.astype(np.int64) - zp_full) * s_full, rtol=1e-6)


def test_blocked_scale_shape_is_tied_to_the_input_symbolically() -> None:
    g = one_node("DequantizeLinear", {"q": np.zeros((2, 6), np.int8), "s": np.ones((2, 3), F32)}, opset=21,
                 axis=1, block_size=4, dims={"q": ["n", "k"], "s": ["n", "kb"]})
    assert any(f.kind == "eq" and f.text == "kb == (k + 3)//4" for f in g.signature.facts)
    assert g.run({"q": np.zeros((2, 6), np.int8), "s": np.ones((2, 2), F32)})["out0"].shape == (2, 6)
    with pytest.raises(ds.ConstraintViolation, match="kb"):
        g.run({"q": np.zeros((2, 6), np.int8), "s": np.ones((2, 3), F32)})  # 6 elements in blocks of 4: 2


def test_dynamic_quantize_linear_matches_the_spec_formulas() -> None:
    x = np.array([-1.0, 0.5, 2.0, 3.0], F32)
    y, s, zp = run_one("DynamicQuantizeLinear", {"x": x}, 3, opset=11)
    scale = np.float32((3.0 - (-1.0)) / 255)
    z = np.clip(np.rint(0 - (-1.0) / scale), 0, 255)
    assert s == scale and zp == z
    np.testing.assert_array_equal(y, np.clip(np.rint(x / scale) + z, 0, 255).astype(np.uint8))


def test_qlinear_matmul_is_the_requantized_float_product() -> None:
    a = rng.integers(0, 255, (3, 4)).astype(np.uint8)
    b = rng.integers(0, 255, (4, 2)).astype(np.uint8)
    args = {"a": a, "as": np.array(0.02, F32), "az": np.array(128, np.uint8), "b": b, "bs": np.array(0.01, F32),
            "bz": np.array(100, np.uint8), "ys": np.array(0.05, F32), "yz": np.array(10, np.uint8)}
    (y,) = run_one("QLinearMatMul", args, opset=21)
    real = ((a.astype(np.int64) - 128) @ (b.astype(np.int64) - 100)) * np.float32(0.02 * 0.01 / 0.05)
    np.testing.assert_array_equal(y, np.clip(np.rint(real + 10), 0, 255).astype(np.uint8))


# ---- vision ----------------------------------------------------------------------------------------------
def test_grid_sample_bilinear_reproduces_a_linear_function() -> None:
    """Bilinear interpolation is exact on an affine image; align_corners maps -1/1 to the corner centres."""
    h, w = 5, 7
    img = (2.0 * np.arange(h)[:, None] + 3.0 * np.arange(w)[None, :]).astype(F32)[None, None]
    grid = rng.uniform(-1, 1, (1, 4, 6, 2)).astype(F32)
    (y,) = run_one("GridSample", {"x": img, "g": grid}, opset=20, mode="linear", align_corners=1)
    px, py = (grid[..., 0] + 1) / 2 * (w - 1), (grid[..., 1] + 1) / 2 * (h - 1)
    np.testing.assert_allclose(y[0, 0], 2 * py[0] + 3 * px[0], rtol=1e-5, atol=1e-5)


def test_affine_grid_of_the_identity_is_the_base_grid() -> None:
    theta = np.array([[[1, 0, 0], [0, 1, 0]]], F32)
    (g,) = run_one("AffineGrid", {"t": theta, "size": np.array([1, 1, 2, 3], np.int64)}, opset=20)
    xs = (2 * np.arange(3) + 1) / 3 - 1
    ys = (2 * np.arange(2) + 1) / 2 - 1
    np.testing.assert_allclose(g[0, :, :, 0], np.broadcast_to(xs, (2, 3)), rtol=1e-6)
    np.testing.assert_allclose(g[0, :, :, 1], np.broadcast_to(ys[:, None], (2, 3)), rtol=1e-6)


def test_non_max_suppression_keeps_the_best_of_each_overlapping_group() -> None:
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 2, 1, 3], [0, 2.05, 1, 3.05]]], F32)
    scores = np.array([[[0.9, 0.95, 0.5, 0.7]]], F32)
    (sel,) = run_one("NonMaxSuppression", {"b": boxes, "s": scores, "m": np.array([3], np.int64),
                                            "iou": np.array([0.5], F32)}, opset=11)
    assert sel.tolist() == [[0, 0, 1], [0, 0, 3]]


def test_col2im_inverts_im2col_up_to_overlap_counts() -> None:
    x = rng.standard_normal((1, 2, 4, 5)).astype(F32)
    cols = []
    for i in range(3):
        for j in range(4):
            cols.append(x[0, :, i:i + 2, j:j + 2].reshape(2, 4))
    inp = np.stack(cols, axis=-1).reshape(1, 2 * 4, 12)
    (y,) = run_one("Col2Im", {"x": inp, "img": np.array([4, 5], np.int64), "blk": np.array([2, 2], np.int64)},
                   opset=18)
    counts = np.zeros((4, 5))
    for i in range(3):
        for j in range(4):
            counts[i:i + 2, j:j + 2] += 1
    np.testing.assert_allclose(y[0], x[0] * counts, rtol=1e-5)


def test_deform_conv_with_zero_offsets_is_conv() -> None:
    x = rng.standard_normal((1, 2, 5, 5)).astype(F32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(F32)
    (y,) = run_one("DeformConv", {"x": x, "w": w, "off": np.zeros((1, 18, 3, 3), F32)}, opset=19)
    (c,) = run_one("Conv", {"x": x, "w": w})
    assert_f32_close(y, c, rtol=1e-5, scale=1e-6)  # outputs ~10


def test_center_crop_pad_crops_and_pads_around_the_centre() -> None:
    x = np.arange(20, dtype=F32).reshape(4, 5)
    (y,) = run_one("CenterCropPad", {"x": x, "s": np.array([2, 7], np.int64)}, opset=18)
    want = np.zeros((2, 7), F32)
    want[:, 1:6] = x[1:3]
    np.testing.assert_array_equal(y, want)


# ---- signal ----------------------------------------------------------------------------------------------
def test_dft_is_the_textbook_sum_and_rfft_keeps_half() -> None:
    x = rng.standard_normal((2, 6, 1)).astype(F32)
    (y,) = run_one("DFT", {"x": x}, opset=20)
    n = np.arange(6)
    want = np.stack([(x[b, :, 0] * np.exp(-2j * np.pi * np.outer(n, n) / 6)).sum(axis=1) for b in range(2)])
    assert_f32_close(y[..., 0] + 1j * y[..., 1], want, rtol=1e-4, scale=1e-5)
    (r,) = run_one("DFT", {"x": x}, opset=20, onesided=1)
    assert r.shape == (2, 4, 2)


def test_stft_frames_and_symbolic_frame_count() -> None:
    g = one_node("STFT", {"x": np.zeros((1, 16, 1), F32), "step": np.array(4, np.int64),
                          "win": np.ones(8, F32)}, opset=17, dims={"x": ["b", "n", 1], "step": [],
                                                                   "win": [8]})
    # the step is fed at run time: the frame count is a fresh dim; the bins follow the window
    assert g.types["out0"].shape[2] == 5
    out = g.run({"x": np.ones((1, 16, 1), F32), "step": np.array(4, np.int64), "win": np.ones(8, F32)})["out0"]
    assert out.shape == (1, 3, 5, 2) and np.allclose(out[0, :, 0, 0], 8)


@pytest.mark.parametrize("op,terms", [("HannWindow", (0.5, 0.5)), ("HammingWindow", (25 / 46, 21 / 46)),
                                      ("BlackmanWindow", (0.42, 0.5, 0.08))])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_follow_the_cosine_sums(op: str, terms: tuple, periodic: int) -> None:
    (w,) = run_one(op, {"n": np.array(8, np.int64)}, opset=17, periodic=periodic)
    n, big = np.arange(8), 8 if periodic else 7
    want = sum((-1) ** k * a * np.cos(2 * np.pi * k * n / big) for k, a in enumerate(terms))
    np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-6)


# ---- random ----------------------------------------------------------------------------------------------
def test_seeded_random_ops_repeat_and_unseeded_ones_do_not() -> None:
    g = one_node("RandomNormalLike", {"x": np.zeros((100,), F32)}, opset=22, seed=3.0)
    a, b = (g.run({"x": np.zeros(100, F32)})["out0"] for _ in range(2))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, np.random.RandomState(3).normal(0, 1, 100).astype(F32))
    g = one_node("RandomUniformLike", {"x": np.zeros((100,), F32)}, opset=22)
    a, b = (g.run({"x": np.zeros(100, F32)})["out0"] for _ in range(2))
    assert not np.array_equal(a, b) and (a >= 0).all() and (a < 1).all()


def test_seeded_training_dropout_is_numpys_mask() -> None:
    x = rng.standard_normal((3, 4)).astype(F32)
    y, mask = run_one("Dropout", {"x": x, "r": np.array(0.3, F32), "t": np.array(True)}, 2, opset=13, seed=7)
    keep = np.random.RandomState(7).uniform(0, 1, x.shape) >= 0.3
    np.testing.assert_array_equal(mask, keep)
    np.testing.assert_allclose(y, x * keep / 0.7, rtol=1e-6)


# ---- sequences and strings ---------------------------------------------------------------------------------
def _graph(nodes: list, inputs: list, outputs: list, opset: int = 21, ml: bool = False) -> ds.Graph:
    g = helper.make_graph(nodes, "t", inputs, outputs)
    ops = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("ai.onnx.ml", 5)] if ml else [])
    return load_onnx(helper.make_model(g, opset_imports=ops))


def test_split_to_sequence_then_concat_round_trips_uneven_chunks() -> None:
    nodes = [helper.make_node("SplitToSequence", ["x", "split"], ["seq"], axis=1),
             helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=1),
             helper.make_node("SequenceAt", ["seq", "one"], ["second"])]
    g = _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "m"]),
                       helper.make_tensor_value_info("split", TensorProto.INT64, [3]),
                       helper.make_tensor_value_info("one", TensorProto.INT64, [])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("second", TensorProto.FLOAT, None)])
    assert g.types["seq"].shape is None and g.types["seq"].rank == 2  # chunks differ: only the rank is known
    x = rng.standard_normal((2, 6)).astype(F32)
    out = g.run({"x": x, "split": np.array([1, 3, 2], np.int64), "one": np.array(1, np.int64)})
    np.testing.assert_array_equal(out["y"], x)
    np.testing.assert_array_equal(out["second"], x[:, 1:4])


def test_sequence_map_runs_the_body_per_element() -> None:
    body = helper.make_graph([helper.make_node("Mul", ["e", "k"], ["o"])], "body",
                             [helper.make_tensor_value_info("e", TensorProto.FLOAT, None),
                              helper.make_tensor_value_info("k", TensorProto.FLOAT, None)],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0, keepdims=0),
             helper.make_node("SequenceMap", ["seq", "k"], ["mapped"], body=body),
             helper.make_node("ConcatFromSequence", ["mapped"], ["y"], axis=0, new_axis=1)]
    g = _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]),
                       helper.make_tensor_value_info("k", TensorProto.FLOAT, [3])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    x, k = rng.standard_normal((4, 3)).astype(F32), np.array([1, 2, 3], F32)
    np.testing.assert_allclose(g.run({"x": x, "k": k})["y"], x * k, rtol=1e-6)


def _strings(*s: str) -> np.ndarray:
    a = np.empty(len(s), dtype=object)
    a[:] = list(s)
    return a


def test_string_ops() -> None:
    (y, n) = run_one("StringSplit", {"x": _strings("a,b,,c", "d")}, 2, opset=20, delimiter=",")
    assert y.tolist() == [["a", "b", "", "c"], ["d", "", "", ""]] and n.tolist() == [4, 1]
    (c,) = run_one("StringConcat", {"a": _strings("x", "y"), "b": _strings("!")}, opset=20)
    assert c.tolist() == ["x!", "y!"]
    (m,) = run_one("RegexFullMatch", {"x": _strings("ab12", "ab", "12")}, opset=20, pattern=r"[a-z]+\d*")
    assert m.tolist() == [True, True, False]
    (s,) = run_one("StringNormalizer", {"x": _strings("The", "cat", "the")}, opset=10, stopwords=["the"],
                   case_change_action="UPPER")
    assert s.tolist() == ["CAT"]


def test_tfidf_counts_ngrams_with_skips() -> None:
    x = np.array([1, 2, 3, 1, 3], np.int64)
    (y,) = run_one("TfIdfVectorizer", {"x": x}, opset=9, mode="TF", min_gram_length=1, max_gram_length=2,
                   max_skip_count=1, ngram_counts=[0, 2], ngram_indexes=[0, 1, 2, 3], pool_int64s=[1, 3, 1, 3, 3, 1])
    # unigrams 1 (x2), 3 (x2); bigram (1, 3): adjacent at 3-4, skip 1 at 0-2; (3, 1): adjacent at 2-3
    assert y.tolist() == [2, 2, 2, 1]


def test_ml_label_encoder_and_tree_ensemble() -> None:
    nodes = [helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", keys_strings=["a", "b"],
                              values_int64s=[1, 2], default_int64=-5)]
    g = _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.STRING, ["n"])],
               [helper.make_tensor_value_info("y", TensorProto.INT64, None)], ml=True)
    assert g.run({"x": _strings("b", "z", "a")})["y"].tolist() == [2, -5, 1]
    tree = helper.make_node(
        "TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", n_targets=1, tree_roots=[0], aggregate_function=1,
        nodes_featureids=[0], nodes_modes=helper.make_tensor("m", TensorProto.UINT8, [1], [0]),
        nodes_splits=helper.make_tensor("s", TensorProto.FLOAT, [1], [0.5]), nodes_truenodeids=[0],
        nodes_trueleafs=[1], nodes_falsenodeids=[1], nodes_falseleafs=[1], leaf_targetids=[0, 0],
        leaf_weights=helper.make_tensor("w", TensorProto.FLOAT, [2], [10.0, 20.0]))
    g = _graph([tree], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], ml=True)
    assert g.run({"x": np.array([[0.2], [0.9], [0.5]], F32)})["y"].ravel().tolist() == [10, 20, 10]


def test_momentum_step() -> None:
    x, gr, v = (rng.standard_normal(3) for _ in range(3))
    nodes = [helper.make_node("Momentum", ["r", "t", "x", "g", "v"], ["x2", "v2"],
                              domain="ai.onnx.preview.training", alpha=0.9, beta=0.5, mode="standard",
                              norm_coefficient=0.1)]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("r", TensorProto.DOUBLE, []),
                                       helper.make_tensor_value_info("t", TensorProto.INT64, []),
                                       *[helper.make_tensor_value_info(n, TensorProto.DOUBLE, [3])
                                         for n in "xgv"]],
                          [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in ("x2", "v2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid("ai.onnx.preview.training", 1)])
    out = load_onnx(m).run({"r": np.array(0.1), "t": np.array(2, np.int64), "x": x, "g": gr, "v": v})
    vn = 0.9 * v + 0.5 * (0.1 * x + gr)
    np.testing.assert_allclose(out["v2"], vn)
    np.testing.assert_allclose(out["x2"], x - 0.1 * vn)


def test_unsupported_ops_are_listed_once_with_counts() -> None:
    nodes = [helper.make_node("Frobnicate", ["x"], ["a"], domain="com.example"),
             helper.make_node("Frobnicate", ["a"], ["b"], domain="com.example"),
             helper.make_node("Zap", ["b"], ["y"], domain="com.example")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.example", 1)])
    with pytest.raises(ds.ModelError, match=r"2 op type\(s\).*com.example::Frobnicate x2.*com.example::Zap x1"):
        load_onnx(m)


def test_ml_category_maps_and_one_hot() -> None:
    nodes = [helper.make_node("CategoryMapper", ["x"], ["ids"], domain="ai.onnx.ml", cats_strings=["a", "b"],
                              cats_int64s=[7, 9], default_int64=-1),
             helper.make_node("OneHotEncoder", ["x"], ["hot"], domain="ai.onnx.ml", cats_strings=["b", "a"]),
             helper.make_node("FeatureVectorizer", ["f", "g"], ["feat"], domain="ai.onnx.ml",
                              inputdimensions=[2, 3])]
    g = _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.STRING, ["n"]),
                       helper.make_tensor_value_info("f", TensorProto.FLOAT, ["m", 3]),
                       helper.make_tensor_value_info("g", TensorProto.FLOAT, ["m", 2])],
               [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in ("ids", "hot", "feat")], ml=True)
    f, h = np.ones((2, 3), F32), 2 * np.ones((2, 2), F32)
    out = g.run({"x": _strings("a", "zz", "b"), "f": f, "g": h})
    assert out["ids"].tolist() == [7, -1, 9]
    assert out["hot"].tolist() == [[0, 1], [0, 0], [1, 0]]
    assert out["feat"].tolist() == [[1, 1, 2, 2, 0]] * 2
