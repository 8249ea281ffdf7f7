"""The kernel IR and its printer: structure first (what a lowering built), printed C second, numbers last."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen import cc, kir
from dynshape.codegen.cgen import prelude
from dynshape.codegen.lower.elementwise import fusible
from dynshape.codegen.lowering import LowerCtx, Unsupported, get_lowering, lowerings
from dynshape.codegen.printer import print_c
from dynshape.frontends.onnx import load_onnx
from dynshape.options import Options
from dynshape.passes.fusion import fuse
from dynshape.passes.items import Elementwise, Product, Softmax
from dynshape.runtime.build import KernelStep

F = TensorProto.FLOAT


def _graph(nodes, inputs, output, consts=None, dims=None, opset=21):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, F, s) for k, s in inputs.items()],
                          [helper.make_tensor_value_info(output, F, None)],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in (consts or {}).items()])
    return load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), dims=dims)


def _items(g):
    return fuse(list(g.nodes), g, set(g.constants()), Options(), fusible)


def _lower(item, g, name="k"):
    rule = get_lowering(item.kind, "kernel").rule
    return rule(item, LowerCtx(g, name, tuple(s for s in g.signature.symbols), Options()))


def test_the_printer_names_types_and_parenthesises():
    n, x = kir.Var("n"), kir.Buffer("x")
    y = kir.Buffer("y", const=False)
    i, i2 = kir.Var("i"), kir.Var("i")
    body = (kir.For(i, kir.Extent(0), (kir.Store(y, i, kir.Bin("*", kir.Load(x, i), kir.Const(0.1, kir.F32))),),
                    omp=kir.Omp(parallel=True, simd=True, if_=kir.Bin(">=", kir.Extent(0), kir.Const(64, kir.I64)))),
            kir.Let(n, kir.Const(3, kir.I64)),
            kir.For(i2, n, (kir.Store(y, i2, kir.Const(0.0, kir.F32)),)))
    src = print_c(kir.Kernel("scale", (ds.sym("m") // 2,), (y,), (x,), body, ("m",)))
    assert src.startswith("void scale(const int64_t *key, float *restrict y, const float *restrict x) {")
    assert "const int64_t L0 = (((key[0]) / 2));" in src  # floor division of a non-negative symbol: plain /
    # the threshold (and one thread) chooses a branch, not an `if` clause (a false one still set up a one-thread
    # team, ~300 ns a call); below it the loop still runs on SIMD, without the parallel construct
    lines = [ln.strip() for ln in src.splitlines()]
    at = lines.index("if (omp_get_max_threads() > 1 && (L0 >= 64)) {")
    assert lines[at + 1] == "#pragma omp parallel for simd schedule(static)"
    assert lines[lines.index("} else {", at) + 1] == "#pragma omp simd"
    assert not any("if(parallel" in ln for ln in lines)
    assert "y[i] = (x[i] * 1e-01f);" in src and "y[i_1] = (x[i_1] * 1e-01f);" in src
    assert "for (int64_t i_2 = 0; i_2 < n; i_2++) {" in src  # loop variables hinted "i": unique names
    lib = cc.compile_c(prelude() + src, "ir_printer_test", symbols=["scale"], openmp=True)
    xs = np.arange(10, dtype=np.float32)
    ys = np.full(10, -1, np.float32)
    key = np.array([9], np.int64)  # m = 9: L0 = 4
    lib.scale(ctypes.c_void_p(key.ctypes.data), ctypes.c_void_p(ys.ctypes.data), ctypes.c_void_p(xs.ctypes.data))
    np.testing.assert_array_equal(ys[:3], 0.0)
    assert ys[3] == np.float32(3) * np.float32(0.1) and (ys[4:] == -1).all()


def test_every_name_is_a_unique_c_identifier_whatever_its_hint():
    bufs = [kir.Buffer(h) for h in ("seq-len", "seq_len", "3d", "")]
    src = print_c(kir.Kernel("k", (), (), tuple(bufs), ()))
    params = [p.split()[-1].lstrip("*") for p in src[src.index("(") + 1:src.index(")")].split(", ")]
    assert len(set(params)) == len(params) == 5 and all(p.isidentifier() for p in params), params


def test_an_undeclared_variable_is_an_error_not_bad_c():
    with pytest.raises(ValueError, match="before declaring"):
        print_c(kir.Kernel("k", (), (), (), (kir.Assign(kir.Var("x"), kir.Const(1, kir.I64)),)))


def test_an_elementwise_group_is_one_coalesced_parallel_loop():
    g = _graph([helper.make_node("Add", ["x", "b"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
               {"x": ["n", 64]}, "y", {"b": np.ones(64)}, {"n": (1, 99)})
    (item,) = _items(g)
    assert isinstance(item, Elementwise) and [n.op_type for n in item.nodes] == ["Add", "Relu"]
    k = _lower(item, g).kernel
    assert len(k.extents) == 2 and k.extents[1] == 64  # the bias axis stays a literal the compiler unrolls
    loops = [s for s in kir.walk(k.body) if isinstance(s, kir.For)]
    assert loops[0].omp.parallel and not loops[1].omp
    src = print_c(k)
    assert "const int64_t L1 = 64;" in src and "(t0 < 0e+00f) ? 0e+00f : t0" in src


def test_a_product_kernel_calls_the_micro_kernel_on_tiles_and_applies_its_epilogue():
    g = _graph([helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Tanh", ["t"], ["y"])],
               {"x": ["n", 40]}, "y", {"w": np.ones((40, 48))}, {"n": (1, 99)})
    (item,) = _items(g)
    assert isinstance(item, Product) and item.epilogue is not None
    lk = _lower(item, g)
    calls = [s.call.fn for s in kir.walk(lk.kernel.body) if isinstance(s, kir.Eval)]
    assert calls == ["ds_gemm_block"] and lk.needs == ("packed_gemm",)
    assert "ds_tanhf(acc)" in print_c(lk.kernel)


def test_a_lowering_that_declines_says_why_and_explain_lists_the_node():
    # a float64 softmax: no kernel or native lowering takes it (a softmax over any float32 axis is native now)
    nodes = [helper.make_node("Cast", ["x"], ["x64"], to=TensorProto.DOUBLE),
             helper.make_node("Softmax", ["x64"], ["y64"], axis=0),
             helper.make_node("Cast", ["y64"], ["y"], to=TensorProto.FLOAT)]
    g = _graph(nodes, {"x": [4, "n"]}, "y", dims={"n": (1, 9)})
    exe = ds.compile(g)
    (u,) = exe.explain_build()["uncompiled"]
    assert u["op"] == "Softmax" and u["runs"] != "native" and "not float32" in u["why"]
    with pytest.raises(Unsupported, match="depends on tensor data"):
        sm = Softmax(("x",), ("y",), g.nodes[0], None, None, (4, ds.sym("?u0", min=0)))
        _lower(sm, g)


def test_softplus_is_compiled_through_one_expression_rule():
    """The op added through DESIGN.md's list: a reference (ops/elementwise.py) and one expr rule."""
    assert any(lw.op == "Softplus" for lw in lowerings("expr"))
    g = _graph([helper.make_node("Softplus", ["x"], ["y"])], {"x": ["n"]}, "y", dims={"n": (1, 10**6)})
    exe = ds.compile(g)
    assert [type(s) for s in exe.generic.steps] == [KernelStep] and not exe.explain_build()["uncompiled"]
    x = np.concatenate([np.linspace(-100, 100, 2001), [0.0, -0.0, 1e-8, 88.0, 89.0, np.inf, -np.inf, np.nan]])
    x = x.astype(np.float32)
    want = g.run({"x": x})["y"]
    got = exe.run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)
    assert np.isnan(got[-1]) and got[-3] == np.inf and got[-2] == 0.0
