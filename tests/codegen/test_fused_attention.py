"""softmax(mask + Q @ KT) @ V as one kernel, against numpy, over ragged shapes and masks."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.frontends.onnx import load_onnx
from dynshape.runtime.build import KernelStep
from tolerance import assert_f32_close

F = TensorProto.FLOAT


def _attention(mask_shape, post_nan_clean: bool = True, transpose_out: bool = False, dv: int = 40):
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Add", ["s", "mask"], ["sm"]),
             helper.make_node("Softmax", ["sm"], ["p0"], axis=-1)]
    if post_nan_clean == "none":  # the softmax straight into the second product
        nodes[-1].output[0] = "p"
    elif post_nan_clean:  # what torch's exporter emits after a masked softmax
        nodes += [helper.make_node("IsNaN", ["p0"], ["nan"]),
                  helper.make_node("Where", ["nan", "zero", "p0"], ["p"])]
    else:
        nodes += [helper.make_node("Identity", ["p0"], ["p"])]
    if transpose_out:  # (b, heads, m, d) -> (b, m, heads, d), as attention layers do before merging heads
        nodes += [helper.make_node("MatMul", ["p", "v"], ["o"]),
                  helper.make_node("Transpose", ["o"], ["y"], perm=[0, 2, 1, 3])]
    else:
        nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
    inputs = [helper.make_tensor_value_info("q", F, ["b", 3, "m", "k"]),
              helper.make_tensor_value_info("kt", F, ["b", 3, "k", "n"]),
              helper.make_tensor_value_info("v", F, ["b", 3, "n", dv]),
              helper.make_tensor_value_info("mask", F, mask_shape)]
    zero = helper.make_tensor("zero", F, [], [0.0])
    graph = helper.make_graph(nodes, "att", inputs, [helper.make_tensor_value_info("y", F, None)], [zero])
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                     dims={"b": (1, 3), "m": (1, 140), "k": (1, 70), "n": (1, 140)})


def _reference(q, kt, v, mask):
    s = q @ kt + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    return np.nan_to_num(p, nan=0.0) @ v


@pytest.mark.parametrize("post", [True, "none"])  # the exporters NaN clean-up, or the softmax alone
@pytest.mark.parametrize("mask_shape", [["b", 1, "m", "n"], ["b", 1, 1, "n"], ["n"]])
def test_fused_attention_matches_numpy_on_ragged_shapes(mask_shape, post):
    g = _attention(mask_shape, post)
    exe = ds.compile(g)
    labels = [s.name for s in exe.generic.steps]
    assert len(labels) == 1 and labels[0].startswith("MatMul_0+Add_1+Softmax_2"), labels
    rng = np.random.default_rng(len(mask_shape))
    for b, m, k, n in [(1, 1, 1, 1), (2, 65, 7, 33), (3, 140, 64, 140), (1, 64, 70, 31)]:
        q = rng.standard_normal((b, 3, m, k)).astype(np.float32)
        kt = rng.standard_normal((b, 3, k, n)).astype(np.float32)
        v = rng.standard_normal((b, 3, n, 40)).astype(np.float32)
        full = {"b": b, "m": m, "n": n}
        mshape = [full.get(d, d) if isinstance(d, str) else d for d in mask_shape]
        mask = np.where(rng.random(mshape) < 0.2, np.float32(-3.4e38), np.float32(0)).astype(np.float32)
        got = exe.run({"q": q, "kt": kt, "v": v, "mask": mask})["y"]
        assert_f32_close(got, _reference(q, kt, v, mask), rtol=2e-5, scale=2e-5)


@pytest.mark.parametrize("dv", [16, 32, 24])
def test_value_widths_of_one_panel_are_read_in_place(dv):
    """V of 16 or 32 columns feeds S @ V as it lies (no packed copy); 24 is packed (reading it in place would run
    past each row). Logits spread over ~120 put exps in the subnormal range, where the native exp pass rounds
    gradually (VSCALEFPS) instead of flushing: both within float32's reach of numpy."""
    exe = ds.compile(_attention(["b", 1, "m", "n"], "none", dv=dv))
    source = next(s.source for s in exe.generic.steps if isinstance(s, KernelStep))
    assert ("ds_gemm_panel" in source) == (dv in (16, 32)), dv
    assert "ds_softmax_exp_sum" in source
    rng = np.random.default_rng(dv)
    for b, m, k, n in [(2, 65, 7, 33), (1, 140, 16, 140), (3, 9, 32, 66), (1, 5, 3, 1)]:
        q = (rng.standard_normal((b, 3, m, k)) * 4).astype(np.float32)
        kt = (rng.standard_normal((b, 3, k, n)) * 4).astype(np.float32)
        v = rng.standard_normal((b, 3, n, dv)).astype(np.float32)
        mask = np.where(rng.random((b, 1, m, n)) < 0.2, np.float32(-1e9), np.float32(0)).astype(np.float32)
        got = exe.run({"q": q, "kt": kt, "v": v, "mask": mask})["y"]
        assert_f32_close(got, _reference(q, kt, v, mask), rtol=2e-5, scale=2e-5)


def test_nan_rows_follow_the_reference_with_and_without_the_clean_up():
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 3, 5, 8)).astype(np.float32)
    kt = rng.standard_normal((1, 3, 8, 6)).astype(np.float32)
    v = rng.standard_normal((1, 3, 6, 40)).astype(np.float32)
    q[0, 1, 2, 3] = np.nan  # one query row of one head is NaN
    mask = np.zeros((1, 1, 5, 6), np.float32)
    feed = {"q": q, "kt": kt, "v": v, "mask": mask}
    clean = ds.compile(_attention(["b", 1, "m", "n"], True)).run(feed)["y"]
    assert_f32_close(clean, _reference(q, kt, v, mask), rtol=2e-5, scale=2e-5)  # zeros for that row
    raw = ds.compile(_attention(["b", 1, "m", "n"], "none")).run(feed)["y"]
    assert np.isnan(raw[0, 1, 2]).all() and not np.isnan(np.delete(raw[0, 1], 2, axis=0)).any()


def test_fully_masked_rows_give_zeros_not_nan():
    g = _attention(["b", 1, "m", "n"])
    exe = ds.compile(g)
    q = np.ones((1, 3, 4, 8), np.float32)
    kt = np.ones((1, 3, 8, 5), np.float32)
    v = np.ones((1, 3, 5, 40), np.float32)
    mask = np.zeros((1, 1, 4, 5), np.float32)
    mask[0, 0, 2] = -np.inf  # every key masked for query 2: softmax is NaN there, the Where makes it 0
    got = exe.run({"q": q, "kt": kt, "v": v, "mask": mask})["y"]
    assert not np.isnan(got).any()
    assert (got[0, :, 2] == 0).all() and np.allclose(got[0, :, [0, 1, 3]], 1.0)


def test_attention_fusion_off_by_environment(monkeypatch):
    monkeypatch.setenv("DYNSHAPE_FUSED_ATTENTION", "0")
    exe = ds.compile(_attention(["n"], post_nan_clean=False))
    assert [s.op for s in exe.generic.steps][0] == "MatMul"


def test_attention_writes_its_transposed_output_directly():
    exe = ds.compile(_attention(["b", 1, 1, "n"], transpose_out=True))
    assert [s.name for s in exe.generic.steps][0].endswith("Transpose_6")
    rng = np.random.default_rng(5)
    for b, m, k, n in [(1, 1, 1, 1), (3, 70, 16, 33)]:
        q = rng.standard_normal((b, 3, m, k)).astype(np.float32)
        kt = rng.standard_normal((b, 3, k, n)).astype(np.float32)
        v = rng.standard_normal((b, 3, n, 40)).astype(np.float32)
        mask = np.zeros((b, 1, 1, n), np.float32)
        got = exe.run({"q": q, "kt": kt, "v": v, "mask": mask})["y"]
        assert_f32_close(got, _reference(q, kt, v, mask).transpose(0, 2, 1, 3), rtol=2e-5, scale=2e-5)


def _attention_from_rows(torch_style: bool):
    """Attention given K as (b, heads, n, k): Kᵀ made by a Transpose (..., 3, 2), or by torch's exporter's
    Reshape (b * heads, n, k) -> Transpose (0, 2, 1) -> Reshape (b, heads, k, n)."""
    i64 = TensorProto.INT64
    consts = [helper.make_tensor("minus1", i64, [1], [-1])]
    if torch_style:
        nodes = [helper.make_node("Shape", ["k"], ["ks"]),
                 helper.make_node("Slice", ["ks", "at0", "at2"], ["lead"]),
                 helper.make_node("Slice", ["ks", "at2", "at3"], ["nn"]),
                 helper.make_node("Slice", ["ks", "at3", "at4"], ["kk"]),
                 helper.make_node("Concat", ["minus1", "nn", "kk"], ["merged"], axis=0),
                 helper.make_node("Concat", ["lead", "kk", "nn"], ["split"], axis=0),
                 helper.make_node("Reshape", ["k", "merged"], ["k3"]),
                 helper.make_node("Transpose", ["k3"], ["kt3"], perm=[0, 2, 1]),
                 helper.make_node("Reshape", ["kt3", "split"], ["kt"])]
        consts += [helper.make_tensor(f"at{i}", i64, [1], [i]) for i in (0, 2, 3, 4)]
    else:
        nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    nodes += [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Add", ["s", "mask"], ["sm"]),
              helper.make_node("Softmax", ["sm"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    inputs = [helper.make_tensor_value_info("q", F, ["b", 3, "m", "k"]),
              helper.make_tensor_value_info("k", F, ["b", 3, "n", "k"]),
              helper.make_tensor_value_info("v", F, ["b", 3, "n", 40]),
              helper.make_tensor_value_info("mask", F, ["b", 1, 1, "n"])]
    graph = helper.make_graph(nodes, "att_rows", inputs, [helper.make_tensor_value_info("y", F, None)], consts)
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                     dims={"b": (1, 3), "m": (1, 140), "k": (1, 70), "n": (1, 140)})


@pytest.mark.parametrize("torch_style", [False, True])
def test_attention_packs_kt_from_k_as_stored(torch_style):
    """The copy that makes Kᵀ is gone: the kernel packs Kᵀ's panels from K's rows (ragged panel edges too)."""
    exe = ds.compile(_attention_from_rows(torch_style))
    fused = [s for s in exe.generic.steps if isinstance(s, KernelStep)]
    assert len(fused) == 1 and "Transpose" in fused[0].name, [s.name for s in exe.generic.steps]
    assert not any(s.op == "Transpose" for s in exe.generic.steps)
    rng = np.random.default_rng(11)
    for b, m, k, n in [(1, 1, 1, 1), (2, 65, 7, 33), (3, 140, 64, 140), (1, 64, 70, 31)]:
        q = rng.standard_normal((b, 3, m, k)).astype(np.float32)
        kr = rng.standard_normal((b, 3, n, k)).astype(np.float32)
        v = rng.standard_normal((b, 3, n, 40)).astype(np.float32)
        mask = np.where(rng.random((b, 1, 1, n)) < 0.2, np.float32(-1e9), np.float32(0)).astype(np.float32)
        got = exe.run({"q": q, "k": kr, "v": v, "mask": mask})["y"]
        assert_f32_close(got, _reference(q, kr.swapaxes(-1, -2), v, mask), rtol=2e-5, scale=2e-5)


@pytest.mark.parametrize("from_rows", [False, True])
@pytest.mark.parametrize("m", [1, 2, 4, 5, 9])
def test_decode_rows_read_k_and_v_unpacked_and_match(from_rows, m):
    """Up to DECODE_ROWS query rows (a decoder step) take the unpacked path (dot products with K's rows, or sums
    of KT's rows, then sums of V's rows); more take the packed row blocks: both match numpy, with masks and
    ragged widths (key counts not a multiple of 4, head dims not of 16)."""
    from dynshape.codegen.lower.attention import DECODE_ROWS

    assert DECODE_ROWS == 4  # m = 1, 2, 4 decode; 5, 9 packed
    g = _attention_from_rows(False) if from_rows else _attention(["b", 1, 1, "n"], "none")
    exe = ds.compile(g)
    assert sum(isinstance(s, KernelStep) for s in exe.generic.steps) == 1
    rng = np.random.default_rng(m)
    for b, k, n in [(1, 64, 140), (2, 7, 33), (3, 1, 1), (1, 70, 3)]:
        q = rng.standard_normal((b, 3, m, k)).astype(np.float32)
        kk = rng.standard_normal((b, 3, n, k)).astype(np.float32)
        v = rng.standard_normal((b, 3, n, 40)).astype(np.float32)
        mask = np.where(rng.random((b, 1, 1, n)) < 0.2, -1e4, 0.0).astype(np.float32)
        feed = {"q": q, "k" if from_rows else "kt": kk if from_rows else kk.swapaxes(-1, -2).copy(), "v": v,
                "mask": mask}
        assert_f32_close(exe.run(feed)["y"], _reference(q, kk.swapaxes(-1, -2), v, mask), rtol=1e-4, scale=1e-5)


def test_a_cast_to_the_same_dtype_does_not_stop_the_fusion():
    """GPT-2's export casts the float32 softmax to float32 before the second product: that Cast runs no step
    (passes.fold.drop_identities), so the attention is one kernel, as without it."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Add", ["s", "mask"], ["sm"]),
             helper.make_node("Softmax", ["sm"], ["p0"], axis=-1),
             helper.make_node("Cast", ["p0"], ["p"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    inputs = [helper.make_tensor_value_info("q", F, ["b", 3, "m", "k"]),
              helper.make_tensor_value_info("kt", F, ["b", 3, "k", "n"]),
              helper.make_tensor_value_info("v", F, ["b", 3, "n", 40]),
              helper.make_tensor_value_info("mask", F, ["b", 1, 1, "n"])]
    graph = helper.make_graph(nodes, "att_cast", inputs, [helper.make_tensor_value_info("y", F, None)])
    g = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    exe = ds.compile(g)
    assert [s.kind for s in exe.generic.steps] == ["attention"], [s.name for s in exe.generic.steps]
    rng = np.random.default_rng(5)
    for b, m, k, n in [(1, 1, 16, 300), (2, 9, 8, 33)]:
        q = rng.standard_normal((b, 3, m, k)).astype(np.float32)
        kt = rng.standard_normal((b, 3, k, n)).astype(np.float32)
        v = rng.standard_normal((b, 3, n, 40)).astype(np.float32)
        mask = np.zeros((b, 1, 1, n), np.float32)
        assert_f32_close(exe.run({"q": q, "kt": kt, "v": v, "mask": mask})["y"], _reference(q, kt, v, mask),
                         rtol=1e-4, scale=1e-5)
