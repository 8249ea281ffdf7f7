"""`If`s whose condition is computed from the data run their branches compiled (runtime/if_branches.py): both
branches compiled once, the step picks one per call, the graph around them stays planned. Against the reference
(graph.run) with both branches taken, on shapes one build serves; the cases that stay on the interpreter say why."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from tolerance import assert_f32_close

F = TensorProto.FLOAT
RNG = np.random.default_rng(4)


def _wake_word_graph(then_nodes: list, then_out: str, else_nodes: list, else_out: str):
    """A detector's score gates a second network (openWakeWord's hey_jarvis.onnx: its verifier runs when the
    score passes 0.5): score = mean(x @ w1) per row; If(score[0] >= 0.5) then_branch else else_branch."""
    w1 = (RNG.standard_normal((16, 8)) * 0.5).astype(np.float32)
    w2 = (RNG.standard_normal((8, 8)) * 0.5).astype(np.float32)
    then = helper.make_graph(then_nodes, "then", [], [helper.make_tensor_value_info(then_out, F, None)])
    other = helper.make_graph(else_nodes, "else", [], [helper.make_tensor_value_info(else_out, F, None)])
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["score"], axes=[0, 1], keepdims=0),
             helper.make_node("GreaterOrEqual", ["score", "half"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["n", 16])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
                           numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                           *(numpy_helper.from_array(np.array([v], np.int64), k)
                             for k, v in (("zero", 0), ("four", 4), ("one", 1)))])
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def _verifier() -> tuple[list, str]:
    return [helper.make_node("MatMul", ["h", "w2"], ["v"]), helper.make_node("Relu", ["v"], ["r"]),
            helper.make_node("Sigmoid", ["r"], ["t"])], "t"


def _feeds(shapes) -> list[dict]:
    """Both branches at each shape: x and its opposite scaled up, so their scores land on either side of 0.5."""
    out = []
    for n in shapes:
        x = RNG.standard_normal((n, 16)).astype(np.float32)
        out += [{"x": x}, {"x": x * np.float32(40)}, {"x": x * np.float32(-40)}]
    return out


def test_branches_on_a_computed_condition_compile_and_stay_planned():
    nodes, name = _verifier()
    graph = _wake_word_graph(nodes, name, [helper.make_node("Identity", ["h"], ["e"])], "e")
    exe = ds.compile(graph)
    bodies = exe.explain_build()["bodies"]
    assert [b["op"] for b in bodies] == ["If"] and bodies[0]["body"] == "compiled", bodies
    assert exe.generic.planner is not None  # the If no longer makes the graph unplannable
    taken = set()
    for feed in _feeds([1, 3, 7]):
        want = graph.run(feed)["y"]
        score = float(np.mean(feed["x"] @ graph.initializers["w1"]))
        taken.add(score >= 0.5)
        assert_f32_close(exe.run(feed)["y"], want, rtol=1e-5, scale=1e-6)
    assert taken == {True, False}  # both branches ran


def test_branches_of_different_sizes_stay_on_the_interpreter_and_say_why():
    """then gives (n, 8), else its first 4 rows (min(n, 4), 8): the If's output size is known only once the
    condition is."""
    nodes, name = _verifier()
    graph = _wake_word_graph(nodes, name, [helper.make_node("Slice", ["h", "zero", "four", "one"], ["e"])], "e")
    exe = ds.compile(graph)
    why = [u["why"] for u in exe.explain_build()["uncompiled"] if u["op"] == "If"]
    body = [b["body"] for b in exe.explain_build()["bodies"] if b["op"] == "If"]
    assert why and body == ["interpreted"], (why, body)
    for feed in _feeds([2]):
        np.testing.assert_allclose(exe.run(feed)["y"], graph.run(feed)["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compile_bodies", [True, False])
def test_the_option_turns_it_off(compile_bodies):
    nodes, name = _verifier()
    exe = ds.compile(_wake_word_graph(nodes, name, [helper.make_node("Identity", ["h"], ["e"])], "e"),
                     compile_bodies=compile_bodies)
    assert [b["body"] for b in exe.explain_build()["bodies"]] == ["compiled" if compile_bodies else "interpreted"]



def test_a_branch_reading_a_value_of_derived_size():
    """The branch reads hh, ((n + 1) // 2, 8), made outside it (every other row of h): its own binder, which could
    not solve for n from (n + 1) // 2, gets a plain symbol for it (if_branches.bindable), and the results match at
    every n."""
    w1 = (RNG.standard_normal((16, 8)) * 0.5).astype(np.float32)
    then = helper.make_graph([helper.make_node("ReduceMean", ["hh"], ["t"], axes=[0], keepdims=1)], "then", [],
                             [helper.make_tensor_value_info("t", F, None)])
    other = helper.make_graph([helper.make_node("ReduceMax", ["hh"], ["e"], axes=[0], keepdims=1)], "else", [],
                              [helper.make_tensor_value_info("e", F, None)])
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Slice", ["h", "zero", "big", "zero", "two"], ["hh"]),
             helper.make_node("ReduceMean", ["h"], ["score"], axes=[0, 1], keepdims=0),
             helper.make_node("GreaterOrEqual", ["score", "half"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["n", 16])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(w1, "w1"),
                           numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                           *(numpy_helper.from_array(np.array([v], np.int64), k)
                             for k, v in (("zero", 0), ("big", 1 << 30), ("two", 2)))])
    graph = ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    exe = ds.compile(graph)
    assert [b["body"] for b in exe.explain_build()["bodies"]] == ["compiled"]
    for feed in _feeds([1, 2, 5]):
        assert_f32_close(exe.run(feed)["y"], graph.run(feed)["y"], rtol=1e-5, scale=1e-5)
