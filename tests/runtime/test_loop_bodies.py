"""Loop / Scan bodies compiled once and called per iteration (runtime/loop_bodies.py), against onnxruntime and
onnx's ReferenceEvaluator; the interpreter must not run them; a body that cannot compile is interpreted, and
explain says why."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import dynshape as ds
import dynshape.ir.execute
from control_flow_models import BOOL, F32, I64, grow_body, vi
from control_flow_models import model as make_model
from tolerance import assert_f32_close

ort = pytest.importorskip("onnxruntime")


def _rnn_loop(h: int = 8, trips: bool = True) -> object:
    """An RNN as a Loop: h = tanh(h @ W + xs[i]) (W an outer constant, xs an outer input), trip count M fed
    (`trips`; else none: the loop runs while the condition holds), the condition computed in the body
    (i + 1 < limit: stops early), every h a scan output."""
    w = (np.random.default_rng(0).standard_normal((h, h)) / np.sqrt(h)).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("Gather", ["xs", "i"], ["x_t"], axis=0),
         helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
         helper.make_node("Add", ["hw", "x_t"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("Add", ["i", "one"], ["i1"]),
         helper.make_node("Less", ["i1", "limit"], ["cond_out"]),
         helper.make_node("Identity", ["h_out"], ["y"])],
        "body", [vi("i", I64, []), vi("cond_in", BOOL, []), vi("h_in", F32, None)],
        [vi("cond_out", BOOL, []), vi("h_out", F32, None), vi("y", F32, None)],
        [numpy_helper.from_array(np.array(1, np.int64), "one")])
    nodes = [helper.make_node("Loop", ["M", "", "h0"] if trips else ["", "go", "h0"], ["h_final", "ys"], name="rnn",
                              body=body)]
    return make_model(nodes, [vi("M" if trips else "go", I64 if trips else BOOL, []), vi("limit", I64, []),
                              vi("h0", F32, ["n", h]), vi("xs", F32, ["t", "n", h])],
                  [vi("h_final", F32, None), vi("ys", F32, None)], [numpy_helper.from_array(w, "W")])


def _grow_loop() -> object:
    """A carried value that grows each iteration (Concat with the outer input x), an accumulator, a scan output."""
    body = grow_body()
    nodes = [helper.make_node("Loop", ["M", "c", "grow0", "x"], ["grow", "acc", "scan"], name="grow", body=body)]
    return make_model(nodes, [vi("M", I64, []), vi("c", BOOL, []), vi("x", F32, [1, "n"]),
                          vi("grow0", F32, ["g", "n"])],
                  [vi("grow", F32, None), vi("acc", F32, None), vi("scan", F32, None)])


def _scan(general: bool) -> object:
    """A cumulative op with two scan outputs; `general`: input 0 scanned along axis 1 backwards, output 0 written
    along axis 1 backwards (onnx's ReferenceEvaluator implements neither), else every axis 0, forwards."""
    body = helper.make_graph([helper.make_node("Add", ["s_in", "a_t"], ["s1"]),
                              helper.make_node("Mul", ["s1", "b_t"], ["s_out"]),
                              helper.make_node("Mul", ["s_out", "scale"], ["y_t"]),
                              helper.make_node("Neg", ["s_out"], ["z_t"])],
                             "body", [vi("s_in", F32, None), vi("a_t", F32, None), vi("b_t", F32, None)],
                             [vi("s_out", F32, None), vi("y_t", F32, None), vi("z_t", F32, None)])
    g = int(general)
    nodes = [helper.make_node("Scan", ["s0", "a", "b"], ["s", "ys", "zs"], name="cum", body=body, num_scan_inputs=2,
                              scan_input_axes=[g, 0], scan_input_directions=[g, 0], scan_output_axes=[g, 0],
                              scan_output_directions=[g, 0])]
    a = ["b", "T", "k"] if general else ["T", "b", "k"]
    return make_model(nodes, [vi("s0", F32, ["b", "k"]), vi("a", F32, a), vi("b", F32, ["T", "b", "k"]),
                          vi("scale", F32, ["k"])],
                  [vi("s", F32, None), vi("ys", F32, None), vi("zs", F32, None)])


def _check(model: object, feeds: list[dict], no_interpreter: pytest.MonkeyPatch,
           evaluator: bool = True) -> ds.Executable:
    """Compile once, run every feed with the interpreter forbidden, compare with onnxruntime, with onnx's
    ReferenceEvaluator (`evaluator`: its Loop fails on these models) and with the body interpreted."""
    exe = ds.compile(ds.load_onnx(model, default_min=0))
    assert [b["body"] for b in exe.explain_build()["bodies"]] == ["compiled"]
    interpreted = ds.compile(ds.load_onnx(model, default_min=0), compile_bodies=False)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    refs = [sess.run(None, feed) for feed in feeds]
    refs = [[*r, *(interpreted.run(feed)[n] for n in names)] for r, feed in zip(refs, feeds)]
    if evaluator:
        refs = [[*r, *ReferenceEvaluator(model).run(None, feed)] for r, feed in zip(refs, feeds)]
    with no_interpreter.context() as mp:
        mp.setattr(dynshape.ir.execute, "run_subgraph", _forbidden)
        for feed, ref in zip(feeds, refs):
            got = exe.run(feed)
            for k, r in enumerate(ref):
                name = names[k % len(names)]
                if got[name].size or r.size:  # zero trips: onnxruntime cannot tell the scan shape
                    assert got[name].shape == r.shape, name
                    assert_f32_close(got[name], r, err_msg=name)
    return exe


def _forbidden(*args: object) -> None:
    raise AssertionError("a compiled body ran on the interpreter")


def test_rnn_loop_with_trip_count_and_condition_runs_its_compiled_body(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)

    def feed(n: int, t: int, m: int, limit: int) -> dict:
        return {"M": np.array(m, np.int64), "limit": np.array(limit, np.int64),
                "h0": rng.standard_normal((n, 8)).astype(np.float32),
                "xs": rng.standard_normal((t, n, 8)).astype(np.float32)}

    # runs M times; stops early on the condition; M = 0
    _check(_rnn_loop(), [feed(2, 5, 5, 100), feed(3, 9, 9, 4), feed(1, 3, 0, 5)], monkeypatch, evaluator=False)


def test_loop_with_a_growing_carried_value_and_outer_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)

    def feed(m: int, n: int, g: int, c: bool = True) -> dict:
        return {"M": np.array(m, np.int64), "c": np.array(c), "x": rng.standard_normal((1, n)).astype(np.float32),
                "grow0": rng.standard_normal((g, n)).astype(np.float32)}

    model = _grow_loop()
    exe = _check(model, [feed(3, 4, 2), feed(1, 2, 0), feed(4, 3, 1, False)], monkeypatch, evaluator=False)
    out = exe.run(feed(3, 4, 2))
    assert out["grow"].shape == (2 + 3, 4) and out["scan"].shape == (3, 1, 4)


@pytest.mark.parametrize("general", [False, True])
def test_scan_with_axes_and_directions_runs_its_compiled_body(monkeypatch: pytest.MonkeyPatch, general: bool) -> None:
    rng = np.random.default_rng(3)

    def feed(b: int, t: int, k: int) -> dict:
        return {"s0": rng.standard_normal((b, k)).astype(np.float32),
                "a": rng.standard_normal((b, t, k) if general else (t, b, k)).astype(np.float32),
                "b": rng.uniform(0.5, 1.0, (t, b, k)).astype(np.float32),
                "scale": rng.standard_normal(k).astype(np.float32)}

    _check(_scan(general), [feed(2, 5, 3), feed(1, 7, 4), feed(3, 1, 2)], monkeypatch, evaluator=not general)


def test_a_body_that_cannot_compile_is_interpreted_and_explain_says_why() -> None:
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("RandomUniformLike", ["acc_in"], ["r"], seed=1.0),
                              helper.make_node("Add", ["acc_in", "r"], ["acc_out"])],
                             "body", [vi("i", I64, []), vi("cond_in", BOOL, []), vi("acc_in", F32, None)],
                             [vi("cond_out", BOOL, []), vi("acc_out", F32, None)])
    model = make_model([helper.make_node("Loop", ["M", "", "a0"], ["acc"], name="noisy", body=body)],
                   [vi("M", I64, []), vi("a0", F32, ["n"])], [vi("acc", F32, None)])
    exe = ds.compile(ds.load_onnx(model))
    (b,) = exe.explain_build()["bodies"]
    assert b["body"] == "interpreted" and "random" in b["why"]
    out = exe.run({"M": np.array(3, np.int64), "a0": np.zeros(4, np.float32)})["acc"]
    assert out.shape == (4,) and np.all((out >= 0) & (out <= 3))  # three draws in [0, 1) added
    off = ds.compile(ds.load_onnx(_rnn_loop()), compile_bodies=False).explain_build()["bodies"]
    assert off == [{"node": "node 'rnn' (Loop)", "op": "Loop", "body": "interpreted", "why": "compile_bodies=False"}]


def test_dynshape_explain_says_how_each_body_runs(tmp_path) -> None:
    import onnx
    from typer.testing import CliRunner

    from dynshape.cli.main import app

    path = tmp_path / "rnn.onnx"
    onnx.save(_rnn_loop(), str(path))
    r = CliRunner().invoke(app, ["explain", str(path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "Loop / Scan bodies (1) node 'rnn' (Loop): body compiled (body compiled once (" in text


def _settling_loop() -> object:
    """A carried value that grows by a row per iteration up to 3 rows, then keeps its shape (Slice of a Concat);
    no trip count: the condition (i + 1 < limit) stops it; an accumulator and a scan output read it."""
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for v, n in
              (([0], "zero"), ([3], "three"), ([0], "ax0"), (1, "one"))]
    consts.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    body = helper.make_graph(
        [helper.make_node("Concat", ["c_in", "x"], ["cat"], axis=0),
         helper.make_node("Slice", ["cat", "zero", "three", "ax0"], ["c_out"]),
         helper.make_node("ReduceSum", ["c_out", "ax0"], ["s"], keepdims=0),
         helper.make_node("Mul", ["acc_in", "half"], ["acc_half"]),
         helper.make_node("Add", ["acc_half", "s"], ["acc_out"]),
         helper.make_node("Mul", ["s", "half"], ["y"]),
         helper.make_node("Add", ["i", "one"], ["i1"]),
         helper.make_node("Less", ["i1", "limit"], ["cond_out"])],
        "body", [vi("i", I64, []), vi("cond_in", BOOL, []), vi("c_in", F32, None), vi("acc_in", F32, None)],
        [vi("cond_out", BOOL, []), vi("c_out", F32, None), vi("acc_out", F32, None), vi("y", F32, None)], consts)
    nodes = [helper.make_node("Loop", ["", "go", "c0", "acc0"], ["c", "acc", "ys"], name="settle", body=body)]
    return make_model(nodes, [vi("go", BOOL, []), vi("limit", I64, []), vi("x", F32, [1, "n"]),
                          vi("c0", F32, ["g", "n"]), vi("acc0", F32, ["n"])],
                  [vi("c", F32, None), vi("acc", F32, None), vi("ys", F32, None)])


def test_a_loop_whose_carried_shape_settles_runs_checked_then_lean(monkeypatch: pytest.MonkeyPatch) -> None:
    """Iterations whose carried rows change run the checked path; from the first whose carried inputs have its
    outputs' shapes on, the rest run lean (on its bound plan); scan rows past the first allocation grow; every
    output is the caller's own array (a later call does not overwrite it); the body's input slots are never
    reused by its values (the lean iterations do not copy the outer values in again)."""
    import dynshape.runtime.body_iterations as iterations

    lean = []
    real = iterations._lean
    monkeypatch.setattr(iterations, "_lean", lambda plan, roles, arrays, i, *a: lean.append(i) or
                        real(plan, roles, arrays, i, *a))
    rng = np.random.default_rng(4)

    def feed(limit: int, n: int, g: int) -> dict:
        return {"go": np.array(True), "limit": np.array(limit, np.int64),
                "x": rng.standard_normal((1, n)).astype(np.float32),
                "c0": rng.standard_normal((g, n)).astype(np.float32),
                "acc0": rng.standard_normal(n).astype(np.float32)}

    # 40 iterations (scan rows grown 16 -> 32 -> 64); 2 (never settled); 7 from 4 rows
    feeds = [feed(40, 5, 0), feed(2, 3, 1), feed(7, 4, 4)]
    exe = _check(_settling_loop(), feeds, monkeypatch, evaluator=False)
    assert lean == [3, 1]  # carried rows 0 -> 1 -> 2 -> 3 -> 3: lean from iteration 3; 4 -> 3 -> 3: from 1
    first = exe.run(feeds[0])
    kept = {k: v.copy() for k, v in first.items()}
    exe.run(feeds[2])
    exe.run(feeds[0] | {"x": np.ones((1, 5), np.float32)})
    for k, v in kept.items():
        np.testing.assert_array_equal(first[k], v, err_msg=k)
    (body,) = [b for b in exe._bodies._cache.values() if not isinstance(b, str)]
    pl = body.exe.generic.planner
    for v in body.exe.graph.inputs:  # every input's lifetime overlaps every other buffer's: no slot shared
        assert set(pl.overlaps[v.name]) == set(pl.buffers) - {v.name}, v.name


def test_a_scan_swapping_its_state_through_views_stays_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body whose carried outputs are views of the other carried input (a swap): copying one into its slot
    would clobber the other, so its iterations stay on the checked path and the values come out right."""
    body = helper.make_graph([helper.make_node("Identity", ["b_in"], ["a_out"]),
                              helper.make_node("Identity", ["a_in"], ["b_out"]),
                              helper.make_node("Add", ["a_in", "x_t"], ["y_t"])],
                             "body", [vi("a_in", F32, None), vi("b_in", F32, None), vi("x_t", F32, None)],
                             [vi("a_out", F32, None), vi("b_out", F32, None), vi("y_t", F32, None)])
    nodes = [helper.make_node("Scan", ["a0", "b0", "x"], ["a", "b", "ys"], name="swap", body=body, num_scan_inputs=1)]
    model = make_model(nodes, [vi("a0", F32, ["k"]), vi("b0", F32, ["k"]), vi("x", F32, ["T", "k"])],
                   [vi("a", F32, None), vi("b", F32, None), vi("ys", F32, None)])
    rng = np.random.default_rng(5)
    _check(model, [{"a0": rng.standard_normal(3).astype(np.float32), "b0": rng.standard_normal(3).astype(np.float32),
                    "x": rng.standard_normal((5, 3)).astype(np.float32)}], monkeypatch)


def _count_python_iterations(monkeypatch: pytest.MonkeyPatch) -> list:
    """Calls of a bound plan's Python loop (`execute`): none while the lean iterations run in ds_run_loop."""
    from dynshape.runtime.plan import BoundPlan

    calls: list = []
    real = BoundPlan.execute
    monkeypatch.setattr(BoundPlan, "execute", lambda plan: calls.append(1) or real(plan))
    return calls


def test_a_loop_stopped_by_its_condition_runs_its_iterations_in_one_native_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No trip count: the condition computed in the body stops it, read between the native iterations (40: the
    scan rows grown 16 -> 32 -> 64, the native loop resumed after each growth with the carried value copied
    first; 3; 1). Every iteration runs in ds_run_loop, its Gather of xs[i] in C: the plan's own steps never run."""
    rng = np.random.default_rng(6)

    def feed(n: int, t: int, limit: int) -> dict:
        return {"go": np.array(True), "limit": np.array(limit, np.int64),
                "h0": rng.standard_normal((n, 8)).astype(np.float32),
                "xs": rng.standard_normal((t, n, 8)).astype(np.float32)}

    feeds = [feed(2, 45, 40), feed(3, 9, 3), feed(1, 2, 1)]
    exe = _check(_rnn_loop(trips=False), feeds, monkeypatch, evaluator=False)
    python = _count_python_iterations(monkeypatch)
    out = exe.run(feeds[0])
    assert out["ys"].shape == (40, 2, 8) and not python


def test_an_index_out_of_range_in_a_native_loop_raises_naming_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """xs[i] past xs's rows at iteration 4 of 6: the C Gather stops the native loop and the iteration re-runs
    on the plan's own steps, which raise naming the node, as the first iterations' path does (M = 9, xs of 2)."""
    rng = np.random.default_rng(7)
    exe = ds.compile(ds.load_onnx(_rnn_loop(), default_min=0))
    ok = {"M": np.array(4, np.int64), "limit": np.array(100, np.int64),
          "h0": rng.standard_normal((2, 8)).astype(np.float32), "xs": rng.standard_normal((4, 2, 8)).astype(np.float32)}
    exe.run(ok)
    python = _count_python_iterations(monkeypatch)
    with pytest.raises(ds.ConstraintViolation, match=r"Gather.*out of bounds"):
        exe.run(ok | {"M": np.array(6, np.int64)})
    assert python == [1]  # the refused iteration only, re-run to raise
    with pytest.raises(ds.ConstraintViolation, match=r"Gather.*out of bounds"):
        exe.run(ok | {"M": np.array(9, np.int64), "xs": ok["xs"][:2]})
    got, ref = exe.run(ok), ort.InferenceSession(_rnn_loop().SerializeToString()).run(None, ok)
    assert_f32_close(got["ys"], ref[1])  # the status word was cleared: the next call runs all its iterations


def test_a_scan_input_shorter_than_the_trip_count_is_refused_not_read_past_its_end() -> None:
    """The native loop reads every scan input's rows up to the trip count (the first input's length): an input
    with fewer rows (the graph's inference unifies the lengths; the body's own call does not) stays on the Python
    path, which raises, instead of the C copies reading past its end."""
    body = helper.make_graph([helper.make_node("Add", ["s_in", "a_t"], ["s1"]),
                              helper.make_node("Mul", ["s1", "b_t"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["y_t"])],
                             "body", [vi("s_in", F32, None), vi("a_t", F32, None), vi("b_t", F32, None)],
                             [vi("s_out", F32, None), vi("y_t", F32, None)])
    model = make_model([helper.make_node("Scan", ["s0", "a", "b"], ["s", "ys"], name="cum", body=body,
                                         num_scan_inputs=2)],
                       [vi("s0", F32, ["k"]), vi("a", F32, ["T", "k"]), vi("b", F32, ["T", "k"])],
                       [vi("s", F32, None), vi("ys", F32, None)])
    exe = ds.compile(ds.load_onnx(model))
    ones = np.ones((40, 3), np.float32)
    assert_f32_close(exe.run({"s0": np.zeros(3, np.float32), "a": ones, "b": ones})["ys"][:, 0], np.arange(1, 41))
    (compiled,) = [b for b in exe._bodies._cache.values() if not isinstance(b, str)]
    with pytest.raises(IndexError, match="out of bounds"):
        compiled.run([np.zeros(3, np.float32), ones, ones[:4]])
