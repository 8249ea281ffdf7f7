"""A build's long library of kernels compiles as two halves at once (codegen/library.py)."""

from types import SimpleNamespace

from dynshape.codegen import library
from tolerance import assert_f32_close


def _kernels(sizes: list[int]) -> tuple[list, dict[str, str]]:
    ks = [SimpleNamespace(kernel=SimpleNamespace(name=f"k{i}")) for i in range(len(sizes))]
    return ks, {f"k{i}": "x" * n for i, n in enumerate(sizes)}


def test_a_short_library_stays_whole():
    ks, src = _kernels([100, 200, 300])
    assert library._halves(ks, src) == [ks]


def test_a_long_library_splits_into_balanced_halves_in_build_order():
    sizes = [5000, 300, 2900, 2800, 100, 2000]
    ks, src = _kernels(sizes)
    halves = library._halves(ks, src)
    assert len(halves) == 2 and all(halves)
    names = [k.kernel.name for h in halves for k in h]
    assert sorted(names) == sorted(src)  # every kernel exactly once
    for h in halves:  # each half keeps the order of the build
        assert [k.kernel.name for k in h] == [k.kernel.name for k in ks if k in h]
    loads = [sum(len(src[k.kernel.name]) for k in h) for h in halves]
    assert abs(loads[0] - loads[1]) <= max(sizes)
    assert max(loads) <= sum(sizes) * 0.6


def test_kernels_that_only_call_helpers_build_at_O1_the_others_at_O3(monkeypatch):
    """A conv's kernel is geometry plus a parallel loop of calls into ds_conv.c: built apart at -O1 (cheaper, no
    slower); an elementwise kernel, whose loops store values themselves, keeps -O3 (it must vectorise)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    import dynshape as ds
    from dynshape.runtime.build import KernelStep

    w = np.random.default_rng(0).standard_normal((16, 8, 3, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("ReduceMean", ["r"], ["m"], keepdims=1, axes=[1]), helper.make_node("Exp", ["m"], ["e"]),
         helper.make_node("Mul", ["e", "r"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
    built: dict[str, tuple] = {}
    real = library.build_shared

    def record(source, name, flags, openmp):
        built[source] = tuple(flags)
        return real(source, name, flags=flags, openmp=openmp)

    monkeypatch.setattr(library, "build_shared", record)
    graph = ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    exe = ds.compile(graph, strategy="generic")
    steps = [s for s in exe.generic.steps if isinstance(s, KernelStep)]
    flags = {}
    for s in steps:
        src = next(text for text in built if s.source in text)
        flags[s.kind] = "-O1" if "-O1" in built[src] else "-O3" if "-O3" in built[src] else "?"
    assert flags.get("conv") == "-O1", flags
    assert set(flags.values()) == {"-O1", "-O3"}, flags  # the rest (elementwise, the reduction) at -O3
    x = np.random.default_rng(1).standard_normal((2, 8, 12, 20)).astype(np.float32)
    assert_f32_close(exe.run({"x": x})["y"], graph.run({"x": x})["y"], rtol=1e-4, scale=1e-6)


def test_calls_only_is_a_kernel_whose_loops_only_index_and_call():
    from dynshape.codegen import kir

    out, x = kir.Buffer("o0", const=False), kir.Buffer("i0")
    i, acc, r0 = kir.Var("i"), kir.Var("s", kir.F32), kir.Var("r0")
    call = kir.Eval(kir.Call("ds_conv_tile", (kir.Addr(x),), kir.I64))
    n = kir.Const(64, kir.I64)

    def kernel(*body):
        return kir.Kernel("k", (), (out,), (x,), tuple(body))

    assert library.calls_only(kernel(kir.For(i, n, (kir.Let(r0, i), call))))
    # a loop that stores, or accumulates into a scalar stored after it, computes: -O3
    assert not library.calls_only(kernel(kir.For(i, n, (call, kir.Store(out, i, kir.Load(x, i))))))
    assert not library.calls_only(kernel(
        kir.Decl(acc, kir.lit(0.0)), kir.For(i, n, (kir.Assign(acc, kir.Bin("+", acc, kir.Load(x, i))), call)),
        kir.Store(out, kir.Const(0, kir.I64), acc)))
    # no call at all: not a wrapper
    assert not library.calls_only(kernel(kir.For(i, n, (kir.Let(r0, i),))))
