"""Undeclared dims (range [0, inf]) get a build for the keys where none is 0, as fast as a declared one; a key with
a 0 runs a second build, made on its first call. Both answer as the reference does."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.runtime.build import NodeStep
from tolerance import assert_f32_close

F = TensorProto.FLOAT


def _heads_model():
    """An embedding-style sum split into heads as exporters write it: x (b, s, 64) plus rows 0..s of a 512-row
    position table, reshaped to [b, s, -1, 16] with b and s read from Shape(x). While s may be 0 the sum's length
    is `max(s, min(512, s)) * min(1, s, ...)`, not provably s, so the -1 gets a fresh data-dependent dim and the
    elementwise work after the Reshape cannot be a kernel; with s >= 1 it is s."""
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Slice", ["sh", "zero", "two"], ["bs"]),
             helper.make_node("Slice", ["sh", "one", "two"], ["s"]),
             helper.make_node("Slice", ["table", "zero", "s", "zero"], ["pos"]),
             helper.make_node("Add", ["x", "pos"], ["e"]),
             helper.make_node("Concat", ["bs", "tail"], ["target"], axis=0),
             helper.make_node("Reshape", ["e", "target"], ["h"]),
             helper.make_node("Tanh", ["h"], ["m"]),
             helper.make_node("Relu", ["m"], ["y"])]
    table = np.random.default_rng(5).standard_normal((512, 64)).astype(np.float32)
    inits = {"zero": np.array([0], np.int64), "one": np.array([1], np.int64), "two": np.array([2], np.int64),
             "tail": np.array([-1, 16], np.int64), "table": table}
    graph = helper.make_graph(nodes, "heads", [helper.make_tensor_value_info("x", F, ["b", "s", 64])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _outside_kernels(exe) -> list[str]:
    return [s.op for s in exe.generic.steps if isinstance(s, NodeStep) and s.how != "native"]


def test_undeclared_dims_compile_as_many_kernels_as_declared_ones():
    model = _heads_model()
    undeclared = ds.compile(ds.load_onnx(model), strategy="generic")
    declared = ds.compile(ds.load_onnx(model, dims={"b": (1, 64), "s": (1, 512)}), strategy="generic")
    single = ds.compile(ds.load_onnx(model), strategy="generic", nonempty_build=False)
    assert _outside_kernels(undeclared) == _outside_kernels(declared) == ["Reshape"]  # a view; the rest kernels
    assert len(_outside_kernels(single)) > len(_outside_kernels(undeclared))  # what the 0 used to cost
    assert any("a key with a 0 runs a second build" in n for n in undeclared.notes)
    rng = np.random.default_rng(0)
    g = ds.load_onnx(model)
    for shape in ((1, 1, 64), (3, 7, 64), (2, 130, 64)):
        x = rng.standard_normal(shape).astype(np.float32)
        assert_f32_close(undeclared.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-5, scale=1e-6)


def test_a_key_with_a_zero_runs_a_second_build_made_on_first_use_and_kept():
    from dynshape.models.mlp import build_mlp

    g = ds.load_onnx(build_mlp())
    exe = ds.compile(g, strategy="generic")
    assert exe._empty is None  # nothing built for empty keys until one arrives
    x0 = np.zeros((0, 64), np.float32)
    out = exe.run({"x": x0})["y"]
    assert out.shape == g.run({"x": x0})["y"].shape == (0, 64)
    empty = exe.empty_build()
    assert exe.empty_build() is empty and empty.stats_.calls == 1  # kept, not rebuilt
    x1 = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    ref = g.run({"x": x1})["y"]
    np.testing.assert_allclose(exe.run({"x": x1})["y"], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert exe.stats_.calls == 1  # the zero key went to the empty build, not through the main dispatch


def test_declared_dims_that_may_be_zero_also_split_and_min_one_dims_do_not():
    from dynshape.models.mlp import build_mlp

    exe = ds.compile(ds.load_onnx(build_mlp(), dims={"batch": (0, 8)}), strategy="generic")
    assert exe._may_be_empty is not None and exe._may_be_empty((0,)) and not exe._may_be_empty((1,))
    assert exe.run({"x": np.zeros((0, 64), np.float32)})["y"].shape == (0, 64)
    none = ds.compile(ds.load_onnx(build_mlp(), default_min=1), strategy="generic")
    assert none._may_be_empty is None


class _Pair:
    """A broadcast requirement as inference records it: a == b, or one of them is 1."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def holds(self, env) -> bool:
        a, b = (x.evaluate(env) if ds.is_expr(x) else x for x in (self.a, self.b))
        return a == b or a == 1 or b == 1


@settings(max_examples=60, deadline=None)
@given(k=st.integers(2, 600), form=st.sampled_from(["min_s", "min_t", "const", "sum"]))
def test_implied_upper_bounds_are_sound_by_brute_force(k, form):
    """Every bound taken is met by every s >= 1 (with t >= 1) that satisfies the requirement, checked by brute
    force; and where the requirement alone bounds s, the bound is found."""
    from types import SimpleNamespace

    from dynshape.ir.graph import Fact
    from dynshape.ir.specialize import implied_upper_bounds

    s, t = ds.sym("s", 1), ds.sym("t", 1)
    other = {"min_s": ds.min_(k, s), "min_t": ds.min_(k, t), "const": k, "sum": ds.min_(k, s) + 1}[form]
    pair = _Pair(other, s)
    graph = SimpleNamespace(signature=SimpleNamespace(facts=[Fact("require", "r", "test", pair)]))
    his = implied_upper_bounds(graph, ["s"])
    ok = [sv for sv in range(1, 2 * k + 3) for tv in (1, 2, k, k + 1) if pair.holds({"s": sv, "t": tv})]
    if "s" in his:
        assert max(ok) <= his["s"]
    if form in ("min_s", "const"):
        assert his.get("s") == k
    if form == "min_t":
        assert "s" not in his  # t = 1 admits every s


_HEADS = {}


def _heads_pair():
    """(undeclared executable, the same with one build, the loaded graph) of _heads_model, made once."""
    if not _HEADS:
        model = _heads_model()
        _HEADS.update(exe=ds.compile(ds.load_onnx(model), strategy="generic"),
                      single=ds.compile(ds.load_onnx(model), strategy="generic", nonempty_build=False),
                      g=ds.load_onnx(model))
    return _HEADS["exe"], _HEADS["single"], _HEADS["g"]


def test_the_binder_checks_the_nonempty_graphs_facts_first():
    """The loaded graph's facts are written for dims that may be 0 (`max(a, b) * min(a, b, 1)` per broadcast);
    the binder checks the graph re-inferred at >= 1 first (a few comparisons) and the loaded one only for a call
    that fails it: a key with a 0 (the empty build) or a bad input (the loaded graph's precise refusal)."""
    exe, single, g = _heads_pair()
    assert "min(" not in exe.binder.source and "max(" not in exe.binder.source
    assert "min(" in single.binder.source  # what every call used to evaluate
    x0 = np.zeros((2, 0, 64), np.float32)  # bound by the loaded graph's binder, for the empty build
    assert exe.binder({"x": x0})[1] == (2, 0) and exe._may_be_empty((2, 0))
    x = np.random.default_rng(3).standard_normal((2, 9, 64)).astype(np.float32)
    assert_f32_close(exe.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-5, scale=1e-6)
    bad = np.zeros((1, 600, 64), np.float32)  # past the 512-row table: no broadcast holds
    with pytest.raises(ds.ConstraintViolation) as got:
        exe.run({"x": bad})
    with pytest.raises(ds.ConstraintViolation) as want:
        single.run({"x": bad})
    assert str(got.value) == str(want.value)


@settings(max_examples=80, deadline=None)
@given(b=st.integers(0, 3), s=st.integers(0, 700), c=st.sampled_from([64, 64, 63]), dt=st.sampled_from(["f", "d"]))
def test_the_two_binders_accept_the_same_calls_with_the_same_keys(b, s, c, dt):
    """By brute force over shapes, dtypes and a wrong width: the two-stage binder accepts exactly the calls the
    loaded graph's binder accepts, with the same key, and refuses the others with the same message."""
    exe, single, _ = _heads_pair()
    feed = {"x": np.zeros((b, s, c), np.float32 if dt == "f" else np.float64)}
    outcomes = []
    for binder in (exe.binder, single.binder):
        try:
            outcomes.append(("ok", binder(feed)[1]))
        except ds.ConstraintViolation as e:
            outcomes.append(("refused", str(e)))
    assert outcomes[0] == outcomes[1]
