"""If / Loop / Scan: shapes across branches and iterations, and the reference executor vs onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import dynshape as ds
from control_flow_models import BOOL, F32, I64, grow_body, vi
from control_flow_models import model as make_model
from dynshape.frontends.onnx import load_onnx

ort = pytest.importorskip("onnxruntime")


def _check_vs_ort(model: object, feed: dict) -> dict:
    out = load_onnx(model).run(feed)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for v, ref in zip(sess.get_outputs(), sess.run(None, feed)):
        np.testing.assert_allclose(out[v.name], ref, rtol=1e-6)
    return out


def _if_model(cond_const: bool | None = None) -> object:
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"])],
                             "then", [], [vi("a", F32, None), vi("b", F32, None)])
    other = helper.make_graph([helper.make_node("Concat", ["x", "x"], ["a2"], axis=0),
                               helper.make_node("Abs", ["x"], ["b2"])],
                              "else", [], [vi("a2", F32, None), vi("b2", F32, None)])
    nodes = [helper.make_node("If", ["c"], ["a_out", "b_out"], name="branch", then_branch=then, else_branch=other)]
    inits, inputs = [], [vi("x", F32, ["n", 4])]
    if cond_const is None:
        inputs.insert(0, vi("c", BOOL, []))
    else:
        inits.append(helper.make_tensor("c", BOOL, [], [cond_const]))
    return make_model(nodes, inputs, [vi("a_out", F32, None), vi("b_out", F32, None)], inits)


def test_if_keeps_dims_equal_in_both_branches_and_freshens_the_rest() -> None:
    g = load_onnx(_if_model())
    n = g.signature.symbols["n"]
    a, b = g.outputs[0].shape, g.outputs[1].shape
    assert b == (n, 4)
    assert a[1] == 4 and ds.is_expr(a[0]) and a[0].free_symbols.isdisjoint({"n"})
    assert any(f.kind == "fresh" and "node 'branch'" in f.origin for f in g.signature.facts)


def test_if_with_constant_condition_takes_its_branch_exactly() -> None:
    g = load_onnx(_if_model(cond_const=False))
    n = g.signature.symbols["n"]
    assert g.outputs[0].shape == (2 * n, 4)


@pytest.mark.parametrize("cond", [True, False])
def test_if_runs_like_onnxruntime(cond: bool) -> None:
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    out = _check_vs_ort(_if_model(), {"c": np.array(cond), "x": x})
    assert out["a_out"].shape == ((3, 4) if cond else (6, 4))


def _loop_model(trips: int | None) -> object:
    body = grow_body()
    inputs = [vi("x", F32, ["n"]), vi("grow0", F32, ["g"])]
    inits = []
    if trips is None:
        inputs.insert(0, vi("M", I64, []))
    else:
        inits.append(helper.make_tensor("M", I64, [], [trips]))
    nodes = [helper.make_node("Loop", ["M", "", "grow0", "x"], ["grow", "acc", "scan"], name="loop", body=body)]
    return make_model(nodes, inputs, [vi("grow", F32, None), vi("acc", F32, None), vi("scan", F32, None)], inits)


def test_loop_carried_dims_that_change_become_fresh_and_fixed_ones_stay() -> None:
    g = load_onnx(_loop_model(trips=None))
    n, g0 = g.signature.symbols["n"], g.signature.symbols["g"]
    grow, acc, scan = (v.shape for v in g.outputs)
    assert acc == (n,)
    assert len(grow) == 1 and ds.is_expr(grow[0]) and grow[0] != g0  # grows by n each iteration
    assert scan[1] == n and ds.is_expr(scan[0]) and scan[0].free_symbols.isdisjoint({"n", "g"})


def test_loop_with_known_trip_count_gives_exact_scan_length() -> None:
    g = load_onnx(_loop_model(trips=3))
    n = g.signature.symbols["n"]
    assert g.outputs[2].shape == (3, n)


@pytest.mark.parametrize(("trips", "n", "g"), [(0, 2, 1), (1, 3, 2), (4, 2, 0)])
def test_loop_runs_like_onnxruntime(trips: int, n: int, g: int) -> None:
    rng = np.random.default_rng(trips)
    feed = {"M": np.array(trips, np.int64), "x": rng.standard_normal(n).astype(np.float32),
            "grow0": rng.standard_normal(g).astype(np.float32)}
    model = _loop_model(trips=None)
    model_graph = load_onnx(model, default_min=0)
    out = model_graph.run(feed)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, ref in zip(("grow", "acc", "scan"), sess.run(None, feed)):
        if trips or name != "scan":  # with zero trips onnxruntime cannot tell the scan shape and gives (0,)
            np.testing.assert_allclose(out[name], ref, rtol=1e-6)
    assert out["grow"].shape == (g + trips * n,) and out["scan"].shape == (trips, n)


def test_scan_cumulative_sum_matches_onnxruntime() -> None:
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["y_t"])],
                             "body", [vi("s_in", F32, None), vi("x_t", F32, None)],
                             [vi("s_out", F32, None), vi("y_t", F32, None)])
    nodes = [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], name="scan", body=body, num_scan_inputs=1)]
    model = make_model(nodes, [vi("s0", F32, ["k"]), vi("xs", F32, ["T", "k"])],
                   [vi("s", F32, None), vi("ys", F32, None)])
    g = load_onnx(model)
    T, k = g.signature.symbols["T"], g.signature.symbols["k"]
    assert g.outputs[0].shape == (k,) and g.outputs[1].shape == (T, k)
    xs = np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32)
    out = _check_vs_ort(model, {"s0": np.zeros(3, np.float32), "xs": xs})
    np.testing.assert_allclose(out["ys"], np.cumsum(xs, axis=0), rtol=1e-5)
