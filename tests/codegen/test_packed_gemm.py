"""Products by constant matrices: packed weights, our micro-kernels and their fused epilogues, against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen.lowering import PackedWeight
from dynshape.codegen.packed_gemm import NR, pack_b
from dynshape.frontends.onnx import load_onnx
from tolerance import assert_f32_close

F = TensorProto.FLOAT


def _model(nodes, inputs, consts, output, dims):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, F, s) for k, s in inputs.items()],
        [helper.make_tensor_value_info(output, F, None)],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts.items()])
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), dims=dims)


def _kernels(exe) -> list:
    return [s.name for s in exe.generic.steps]


def test_pack_b_panels_are_zero_padded_columns():
    b = np.arange(5 * 40, dtype=np.float32).reshape(5, 40)
    p = pack_b(b)
    assert p.shape == (2, 5, NR)
    np.testing.assert_array_equal(p[0], b[:, :32])
    np.testing.assert_array_equal(p[1][:, :8], b[:, 32:])
    assert not p[1][:, 8:].any()
    np.testing.assert_array_equal(pack_b(b.T.copy(), trans=True), p)


@pytest.mark.parametrize("k,n", [(1, 1), (7, 5), (64, 32), (300, 33), (256, 96), (40, 16), (50, 48), (3, 17)])
def test_matmul_by_a_constant_matches_numpy_for_every_row_count(k, n):
    rng = np.random.default_rng(k * 1000 + n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    g = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": ["m", k]}, {"w": w}, "y", {"m": (1, 200)})
    exe = ds.compile(g)
    assert len(_kernels(exe)) == 1
    # 61..72 rows: one block takes the tail (60 + up to 12); 73 and 200: a block of their own
    for m in (1, 2, 3, 7, 8, 9, 11, 12, 13, 16, 24, 59, 60, 61, 63, 64, 65, 72, 73, 120, 130, 132, 133, 200):
        x = rng.standard_normal((m, k)).astype(np.float32)
        np.testing.assert_allclose(exe.run({"x": x})["y"], x @ w, rtol=2e-5, atol=2e-5 * np.sqrt(k))
    x = rng.standard_normal((9, k)).astype(np.float32)  # the unplanned path (allocating) runs the same kernel
    np.testing.assert_allclose(ds.compile(g, planned=False).run({"x": x})["y"], x @ w, rtol=2e-5,
                               atol=2e-5 * np.sqrt(k))


def test_gemm_trans_b_alpha_beta_and_each_bias_shape():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((40, 24)).astype(np.float32)  # (n, k): transB
    for bias in (rng.standard_normal(40), rng.standard_normal((1, 40)), np.array([0.5]),
                 rng.standard_normal((6, 40))):
        node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1, alpha=0.5, beta=2.0)
        g = _model([node], {"x": [6, 24]}, {"w": w, "c": bias}, "y", None)
        exe = ds.compile(g)
        assert len(_kernels(exe)) == 1
        x = rng.standard_normal((6, 24)).astype(np.float32)
        want = 0.5 * x @ w.T + 2.0 * bias.astype(np.float32)
        assert_f32_close(exe.run({"x": x})["y"], want, rtol=1e-5, scale=1e-6)


def test_epilogue_bias_relu_residual_runs_in_the_product_and_keeps_nan():
    rng = np.random.default_rng(2)
    w, b = rng.standard_normal((16, 48)).astype(np.float32), rng.standard_normal(48).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("Add", ["r", "res"], ["y"])]
    g = _model(nodes, {"x": ["batch", "seq", 16], "res": ["batch", "seq", 48]}, {"w": w, "b": b}, "y",
               {"batch": (1, 4), "seq": (1, 70)})
    exe = ds.compile(g)
    assert _kernels(exe) == ["MatMul_0+Add_1+Relu_2+Add_3"]
    for shape in ((1, 1), (2, 33), (4, 70)):
        x = rng.standard_normal((*shape, 16)).astype(np.float32)
        x[0, 0, 3] = np.nan  # a NaN row must stay NaN through the Relu
        res = rng.standard_normal((*shape, 48)).astype(np.float32)
        got = exe.run({"x": x, "res": res})["y"]
        want = np.maximum(x @ w + b, 0, dtype=np.float32) + res
        want[np.isnan(x @ w + b)] = np.nan
        assert_f32_close(got, want, rtol=1e-5, scale=1e-6)
        assert np.isnan(got[0, 0]).all()


def test_a_product_read_elsewhere_keeps_its_own_output():
    """The epilogue is fused only when the group is the product's sole reader."""
    w = np.eye(8, dtype=np.float32) * 2
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Add", ["h", "r"], ["y"])]
    g = _model(nodes, {"x": [3, 8]}, {"w": w}, "y", None)
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_allclose(ds.compile(g).run({"x": x})["y"], 2 * x + np.maximum(2 * x, 0), rtol=1e-6)


def test_packed_products_off_by_environment(monkeypatch):
    monkeypatch.setenv("DYNSHAPE_PACKED_GEMM", "0")
    w = np.ones((4, 4), np.float32)
    g = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [2, 4]}, {"w": w}, "y", None)
    exe = ds.compile(g)
    assert [s.op for s in exe.generic.steps] == ["MatMul"]
    np.testing.assert_allclose(exe.run({"x": np.ones((2, 4), np.float32)})["y"], np.full((2, 4), 4.0))


@pytest.mark.parametrize("heads,d", [(2, 32), (3, 64)])
def test_a_product_reshaped_to_heads_and_transposed_is_written_transposed(heads, d):
    rng = np.random.default_rng(heads)
    n = heads * d
    w, bias = rng.standard_normal((24, n)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    shape = helper.make_tensor("shape", TensorProto.INT64, [4], [0, 0, heads, d])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Reshape", ["hb", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["batch", "seq", 24])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b"), shape])
    g = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                  dims={"batch": (1, 3), "seq": (1, 130)})
    exe = ds.compile(g)
    assert [s.name for s in exe.generic.steps] == ["MatMul_0+Add_1+Reshape_2+Transpose_3"]
    for b, s in [(1, 1), (2, 61), (3, 130), (3, 7), (2, 36)]:  # row blocks straddle the batch boundaries
        x = rng.standard_normal((b, s, 24)).astype(np.float32)
        want = (x @ w + bias).reshape(b, s, heads, d).transpose(0, 2, 1, 3)
        assert_f32_close(exe.run({"x": x})["y"], want, rtol=1e-5, scale=1e-6)


@pytest.mark.parametrize("with_bias", [True, False])
def test_residual_then_layernorm_runs_in_the_product(with_bias):
    """MatMul + bias + residual, then LayerNormalization over the last axis: one kernel, rows normalised per
    block (enough blocks) or after all tiles (few rows), both against numpy."""
    rng = np.random.default_rng(3)
    w, b = rng.standard_normal((16, 96)).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    scale, shift = rng.standard_normal(96).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    ln_inputs = ["s", "scale", "shift"] if with_bias else ["s", "scale"]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Add", ["hb", "res"], ["s"]),
             helper.make_node("LayerNormalization", ln_inputs, ["y"], axis=-1, epsilon=1e-3)]
    consts = {"w": w, "b": b, "scale": scale} | ({"shift": shift} if with_bias else {})
    g = _model(nodes, {"x": ["m", 16], "res": ["m", 96]}, consts, "y", {"m": (1, 400)})
    exe = ds.compile(g)
    assert [s.name for s in exe.generic.steps] == ["MatMul_0+Add_1+Add_2+LayerNormalization_3"]
    for m in (1, 59, 61, 130, 132, 400):
        x = rng.standard_normal((m, 16)).astype(np.float32)
        res = rng.standard_normal((m, 96)).astype(np.float32)
        s = x @ w + b + res
        want = (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + 1e-3) * scale
        want = want + shift if with_bias else want
        assert_f32_close(exe.run({"x": x, "res": res})["y"], want, rtol=1e-4, scale=1e-5)


def test_executables_of_one_graph_share_packed_weights():
    w = np.ones((8, 40), np.float32)
    g = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": ["m", 8]}, {"w": w}, "y", {"m": (1, 9)})
    a, b = ds.compile(g), ds.compile(g, specialize=[{"m": 3}])
    packed_a = [v for k, v in a.generic.fixed.items() if isinstance(k, PackedWeight)]
    packed_b = [v for k, v in b.variants[(3,)].fixed.items() if isinstance(k, PackedWeight)]
    assert len(packed_a) == 1 and packed_a[0] is packed_b[0]


def test_an_epilogue_that_reads_the_products_own_input():
    """y = relu(x @ W + x): the residual is the product's A operand, passed to the kernel twice."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((48, 48)) * 0.2).astype(np.float32)
    g = _model([helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "x"], ["a"]),
                helper.make_node("Relu", ["a"], ["y"])], {"x": ["m", 48]}, {"w": w}, "y", {"m": (1, 100)})
    exe = ds.compile(g)
    assert _kernels(exe) == ["MatMul_0+Add_1+Relu_2"]
    x = rng.standard_normal((37, 48)).astype(np.float32)
    assert_f32_close(exe.run({"x": x})["y"], np.maximum(x @ w + x, 0), rtol=2e-5, scale=2e-6)


@pytest.mark.parametrize("shape,trans", [((300, 333), False), ((333, 300), True), ((64, 1100), True),
                                         ((144, 16), True), ((40, 70), True), ((5, 3), True)])  # 16 x 16 blocks, tails
def test_pack_b_in_c_equals_the_numpy_packing(shape, trans, monkeypatch):
    from dynshape.codegen import packed_gemm

    b = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    in_c = packed_gemm.pack_b(b, trans)
    monkeypatch.setattr(packed_gemm, "LIBRARY", type("NoCompiler", (), {"try_load": staticmethod(lambda: None)}))
    np.testing.assert_array_equal(in_c, packed_gemm.pack_b(b, trans))


@pytest.mark.parametrize("shape,groups,scaled", [((64, 16, 3, 3), 1, False), ((70, 8, 5, 5), 2, True),
                                                  ((96, 24, 1, 1), 3, True), ((40, 33, 7), 1, True),
                                                  ((33, 200, 1, 1), 1, False)])
def test_pack_conv_in_c_equals_the_numpy_packing(shape, groups, scaled, monkeypatch):
    """The one-pass C packer (scale folded in) against numpy's transposes: the same floats, bit for bit."""
    from dynshape.codegen import packed_gemm

    rng = np.random.default_rng(2)
    w = rng.standard_normal(shape).astype(np.float32)
    scale = rng.standard_normal(shape[0]).astype(np.float32) if scaled else None
    in_c = packed_gemm.pack_conv(w, groups, scale)
    monkeypatch.setattr(packed_gemm, "LIBRARY", type("NoCompiler", (), {"try_load": staticmethod(lambda: None)}))
    by_numpy = packed_gemm.pack_conv(w, groups, scale)
    np.testing.assert_array_equal(in_c, by_numpy)
    # and the layout itself: panel q of group g, row k = tap * cig + c, column j
    w4 = (w if w.ndim == 4 else w[:, :, None, :]) * (1 if scale is None else scale.reshape(-1, 1, 1, 1))
    cog, cig = shape[0] // groups, shape[1]
    taps = w4.shape[2] * w4.shape[3]
    panels = -(-cog // 32)
    for g in range(groups):
        o = g * cog + cog - 1  # the group's last channel: panel (cog - 1) // 32, column (cog - 1) % 32
        q, j = (cog - 1) // 32, (cog - 1) % 32
        for t in (0, taps - 1):
            for c in (0, cig - 1):
                assert by_numpy[g * panels + q, t * cig + c, j] == w4[o, c].reshape(-1)[t]
    assert not by_numpy[panels - 1, :, (cog - 1) % 32 + 1:].any()  # zero past the group's channels


def _packed_weights(exe) -> list:
    return [k for k in exe.generic.fixed if isinstance(k, PackedWeight)]


@pytest.mark.parametrize("k,n", [(1, 1), (7, 5), (16, 8), (33, 31), (100, 32), (48, 33), (250, 70), (64, 100)])
def test_few_rows_read_a_transposed_weight_in_place(k, n, monkeypatch):
    """Gemm transB over at most 8 rows reads W (n, k) in place (ds_gemm_block_nt), with its epilogue: every row
    count, the k tail (k % 16) and the column tails (n % 32, % 8, % 4) against numpy."""
    from dynshape.codegen.lower import product

    monkeypatch.setattr(product, "INPLACE_MIN_BYTES", 0)  # the real threshold (4 MB) needs big weights
    rng = np.random.default_rng(k * 100 + n)
    w = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["t"], transB=1), helper.make_node("Relu", ["t"], ["y"])]
    g = _model(nodes, {"x": ["m", k]}, {"w": w, "c": bias}, "y", {"m": (1, 8)})
    exe = ds.compile(g)
    assert len(_kernels(exe)) == 1 and not _packed_weights(exe)
    for m in range(1, 9):
        x = rng.standard_normal((m, k)).astype(np.float32)
        np.testing.assert_allclose(exe.run({"x": x})["y"], np.maximum(x @ w.T + bias, 0), rtol=2e-5,
                                   atol=2e-5 * np.sqrt(k))


def test_in_place_weights_only_where_every_shape_has_few_rows(monkeypatch):
    from dynshape.codegen.lower import product

    monkeypatch.setattr(product, "INPLACE_MIN_BYTES", 0)
    w = np.ones((40, 24), np.float32)
    node = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
    assert not _packed_weights(ds.compile(_model([node], {"x": ["m", 24]}, {"w": w}, "y", {"m": (1, 8)})))
    wide = ds.compile(_model([node], {"x": ["m", 24]}, {"w": w}, "y", {"m": (1, 9)}))
    assert _packed_weights(wide)  # 9 rows: packed
    off = ds.compile(_model([node], {"x": ["m", 24]}, {"w": w}, "y", {"m": (1, 8)}), inplace_weights=False)
    assert _packed_weights(off)
    x = np.random.default_rng(0).standard_normal((9, 24)).astype(np.float32)
    assert_f32_close(wide.run({"x": x})["y"], x @ w.T, rtol=1e-5, scale=1e-6)
    unplanned = ds.compile(_model([node], {"x": ["m", 24]}, {"w": w * 2}, "y", {"m": (1, 8)}), planned=False)
    assert_f32_close(unplanned.run({"x": x[:5]})["y"], 2 * x[:5] @ w.T, rtol=1e-5, scale=1e-6)


def test_one_row_by_large_weights_runs_on_every_thread():
    """A batch-1 classifier (1 x 1024 by 1024 x 1000: a million multiply-adds, under a par_min_flops of 2 M)
    streams 4 MB of weights, which the threads share from par_min_weights on; below it the row count decides."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((1024, 1000)).astype(np.float32)

    def build(**opts):
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
        return ds.compile(_model([node], {"x": ["m", 1024]}, {"w": w}, "y", {"m": (1, 64)}), **opts)

    def omp_ifs(exe) -> list[str]:  # the printer's branch around each parallel loop: its condition
        head = "if (omp_get_max_threads() > 1 && "
        return [ln.strip()[len(head):-3] for ln in exe.generic.steps[0].source.splitlines()
                if ln.strip().startswith(head)]

    shared, by_rows = build(par_min_flops=1 << 21), build(par_min_flops=1 << 21, par_min_weights=1 << 40)
    assert omp_ifs(shared) == ["1"] and "L0" in omp_ifs(by_rows)[0]
    for m in (1, 3):
        x = rng.standard_normal((m, 1024)).astype(np.float32)
        for exe in (shared, by_rows):
            assert_f32_close(exe.run({"x": x})["y"], x @ w, rtol=2e-5, scale=2e-6)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("n", [5, 40, 1000])
def test_a_classifier_head_softmax_runs_on_the_products_rows(n):
    """MatMul -> + bias -> Softmax(last axis) is one kernel (each block of rows normalised in cache): every row
    count from one block shared by the team to several blocks a thread, against numpy."""
    rng = np.random.default_rng(n)
    k = 24
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
             helper.make_node("Softmax", ["u"], ["y"], axis=-1)]
    g = _model(nodes, {"x": ["m", k]}, {"w": w, "b": bias}, "y", {"m": (1, 400)})
    exe = ds.compile(g)
    assert _kernels(exe) == ["MatMul_0+Add_1+Softmax_2"]
    for m in (1, 2, 7, 60, 61, 73, 130, 250, 400):
        x = rng.standard_normal((m, k)).astype(np.float32)
        assert_f32_close(exe.run({"x": x})["y"], _softmax(x @ w + bias), rtol=1e-5, scale=1e-7)
    unfused = ds.compile(g, fused_product_softmax=False)
    assert len(_kernels(unfused)) == 2


def test_a_fused_head_softmax_keeps_its_nan_clean_up_and_gemm_bias():
    """Gemm (transB, bias C) -> Softmax -> Where(IsNaN(p), 0, p): a row with a NaN comes out all zeros, others
    as numpy's; the same kernel."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((33, 16)).astype(np.float32)
    c = rng.standard_normal(33).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["t"], transB=1), helper.make_node("Softmax", ["t"], ["p"]),
             helper.make_node("IsNaN", ["p"], ["bad"]), helper.make_node("Where", ["bad", "zero", "p"], ["y"])]
    g = _model(nodes, {"x": ["m", 16]}, {"w": w, "c": c, "zero": np.float32(0)}, "y", {"m": (1, 100)})
    exe = ds.compile(g)
    assert len(_kernels(exe)) == 1
    x = rng.standard_normal((9, 16)).astype(np.float32)
    x[3, 5] = np.nan
    want = _softmax(x @ w.T + c)
    want[3] = 0
    assert_f32_close(exe.run({"x": x})["y"], want, rtol=1e-5, scale=1e-7)


def test_a_head_softmax_stays_apart_where_the_product_is_read_elsewhere():
    rng = np.random.default_rng(6)
    w = rng.standard_normal((8, 12)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Softmax", ["t"], ["s"]),
             helper.make_node("Add", ["s", "t"], ["y"])]
    g = _model(nodes, {"x": ["m", 8]}, {"w": w}, "y", {"m": (1, 50)})
    exe = ds.compile(g)
    assert len(_kernels(exe)) == 2
    x = rng.standard_normal((5, 8)).astype(np.float32)
    t = x @ w
    assert_f32_close(exe.run({"x": x})["y"], _softmax(t) + t, rtol=1e-5, scale=1e-6)


@pytest.mark.parametrize("threads", [2, 3])
def test_product_row_blocks_split_among_threads_cover_every_row_once(threads):
    """With several threads a product's rows are cut into as many blocks as a multiple of the threads, of equal
    size to 4 rows (product.py's row_blocks / block_rows): every row in exactly one block, plain, with a fused
    LayerNormalization, and with a fused Softmax, from 1 row to 512 (the balanced split from 24 rows on at 3
    threads), with an odd last panel."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((48, 72)) * 0.2).astype(np.float32)
    for tail in ("", "ln", "softmax"):
        nodes = [helper.make_node("MatMul", ["x", "w"], ["u" if tail else "y"])]
        consts = {"w": w}
        if tail == "ln":
            consts["s"] = np.ones(72, np.float32)
            nodes.append(helper.make_node("LayerNormalization", ["u", "s"], ["y"], axis=-1))
        elif tail == "softmax":
            nodes.append(helper.make_node("Softmax", ["u"], ["y"], axis=-1))
        g = _model(nodes, {"x": ["m", 48]}, consts, "y", {"m": (1, 1024)})
        exe = ds.compile(g, par_min_flops=1)
        with threadpoolctl.threadpool_limits(threads, user_api="openmp"):
            for m in (1, 7, 24, 61, 128, 133, 512):
                x = rng.standard_normal((m, 48)).astype(np.float32)
                assert_f32_close(exe.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-4, scale=1e-5)


@pytest.mark.parametrize("k", [1023, 1024])
def test_equal_columns_give_equal_results_in_every_panel(k):
    """A one-row product whose weight columns are all equal gives one value in every column, whichever panel
    holds it: a narrow last panel (1000 = 31 x 32 + 8) sums its k in the order a full panel does. ONNX's light
    Inception v1 ends in 1000 such logits of 1.2e21 and a Softmax, which turned 12 ulps into 1/8 against 0."""
    rng = np.random.default_rng(4)
    w = np.repeat(rng.standard_normal((k, 1)).astype(np.float32), 1000, axis=1)
    g = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": ["m", k]}, {"w": w}, "y", {"m": (1, 8)})
    y = ds.compile(g).run({"x": rng.standard_normal((1, k)).astype(np.float32)})["y"]
    assert np.unique(y).size == 1, np.unique(y)


@pytest.mark.parametrize("m", [2, 3, 5, 8, 11, 12, 13, 23])
def test_a_first_block_that_prefetches_computes_what_one_that_does_not_does(m):
    """ds_gemm_block's first block (i0 == 0) runs micro-tiles that prefetch its panels (DS_PMICRO: 2..11 rows
    as one tile, 12 and more through ds_pmicro_12); a block further down runs the plain ones (ds_gemm_panel):
    bit for bit the same values, nothing written outside the block."""
    from dynshape.codegen.packed_gemm import LIBRARY

    lib = LIBRARY.load()
    rng = np.random.default_rng(m)
    k, n = 300, 70
    lda, ldc = k + 3, n + 5
    a = rng.standard_normal((m, lda)).astype(np.float32)
    bp = pack_b(rng.standard_normal((k, n)).astype(np.float32))
    first = np.full((m + 1, ldc), 7.0, np.float32)
    plain = first.copy()
    for q in range(bp.shape[0]):
        lib.ds_gemm_block(a.ctypes.data, lda, bp.ctypes.data, first.ctypes.data, ldc, 0, m, q, n, k)
        lib.ds_gemm_panel(a.ctypes.data, lda, bp[q].ctypes.data, 32, plain[:, 32 * q:].ctypes.data, ldc, 0, m,
                          min(32, n - 32 * q), k)
    assert np.array_equal(first, plain)
    assert (first[m] == 7.0).all() and (first[:, n:] == 7.0).all()
    np.testing.assert_allclose(first[:m, :n], a[:, :k] @ bp.transpose(1, 0, 2).reshape(k, -1)[:, :n], rtol=1e-4,
                               atol=1e-4 * np.sqrt(k))
