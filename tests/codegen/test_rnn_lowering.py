"""LSTM / GRU / RNN in a compiled executable: bound natively to the plan (weights packed once), equal to the
reference, with per-call checks of data the kernel cannot check itself."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.runtime.build import NodeStep
from tolerance import assert_f32_close

F, I32 = TensorProto.FLOAT, TensorProto.INT32


def _model(op: str, hidden: int = 16, inp: int = 8, direction: str = "bidirectional", lens: bool = False):
    rng = np.random.default_rng(0)
    g = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    nd = 2 if direction == "bidirectional" else 1
    inits = [numpy_helper.from_array((rng.standard_normal((nd, g * hidden, inp)) * 0.3).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((nd, g * hidden, hidden)) * 0.3).astype(np.float32), "R"),
             numpy_helper.from_array((rng.standard_normal((nd, 2 * g * hidden)) * 0.1).astype(np.float32), "B")]
    ins = ["x", "W", "R", "B", "lens" if lens else ""]
    outs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, ins, outs, hidden_size=hidden, direction=direction, name=f"the_{op.lower()}")
    inputs = [helper.make_tensor_value_info("x", F, ["seq", "batch", inp])]
    if lens:
        inputs.append(helper.make_tensor_value_info("lens", I32, ["batch"]))
    graph = helper.make_graph([node], "rnn", inputs, [helper.make_tensor_value_info(o, F, None) for o in outs],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_recurrent_ops_run_natively_and_match_the_reference(op):
    g = ds.load_onnx(_model(op), dims={"seq": (1, 100), "batch": (1, 16)})
    exe = ds.compile(g)
    (step,) = exe.generic.steps
    assert isinstance(step, NodeStep) and step.how == "native", step
    rng = np.random.default_rng(1)
    for seq, batch in [(1, 1), (7, 3), (100, 16)]:
        x = rng.standard_normal((seq, batch, 8)).astype(np.float32)
        want, got = g.run({"x": x}), exe.run({"x": x})
        for name in want:
            assert_f32_close(got[name], want[name], rtol=1e-4, scale=1e-5)


def test_sequence_lens_out_of_range_is_refused_naming_the_node():
    g = ds.load_onnx(_model("LSTM", lens=True), dims={"seq": (1, 50), "batch": (1, 4)})
    exe = ds.compile(g)
    x = np.ones((5, 2, 8), np.float32)
    ok = exe.run({"x": x, "lens": np.array([5, 3], np.int32)})
    assert_f32_close(ok["y"], g.run({"x": x, "lens": np.array([5, 3], np.int32)})["y"], rtol=1e-4,
                     scale=1e-5)
    with pytest.raises(ds.DynshapeError, match="the_lstm.*sequence_lens must lie in 0..5"):
        exe.run({"x": x, "lens": np.array([6, 1], np.int32)})
    np.testing.assert_array_equal(exe.run({"x": x, "lens": np.array([5, 3], np.int32)})["y"], ok["y"])


def test_plans_of_one_arena_share_the_recurrent_workspace():
    """Each key's plan binds the LSTM to its arena's shared scratch (grown for a longer sequence), not a buffer
    of its own: 40 cached plans at 40 lengths hold at most a few workspaces, and every result stays right."""
    import dynshape.runtime.plan as plan_mod

    g = ds.load_onnx(_model("LSTM"), dims={"seq": (1, 100), "batch": (1, 4)})
    exe = ds.compile(g, arenas=1, bucket_plans=False)  # each key its own plan
    rng = np.random.default_rng(2)
    for seq in [30, *range(1, 41)]:  # a longer one grows the scratch once, then both sizes interleave
        x = rng.standard_normal((seq, 2, 8)).astype(np.float32)
        want, got = g.run({"x": x}), exe.run({"x": x})
        assert_f32_close(got["y"], want["y"], rtol=1e-4, scale=1e-5)
    (arena,) = exe.arenas
    assert len(arena.plans) == 40
    shared = plan_mod._SCRATCH[id(arena.buf)]
    assert list(shared) == ["rnn:the_lstm"]
    held = {id(a) for p in arena.plans.values() for a in p.keep if isinstance(a, np.ndarray) and a.nbytes >= 4096}
    assert len(held) <= 3  # the scratch buffers, however many keys


@pytest.mark.parametrize("op, direction", [("LSTM", "forward"), ("GRU", "forward"), ("LSTM", "bidirectional")])
def test_a_one_token_step_with_large_weights_splits_over_the_threads_exactly(op, direction):
    """A decoder's one-token step whose weights exceed what one core's L2 keeps (hidden 200, input 384: 640 KB of
    R and 1.2 MB of W an LSTM direction, 25 panels of 32 columns, the last one short) splits its input
    projection's column blocks and its recurrent product's panels over the threads (ds_rnn.c's DSR_PAR_BYTES),
    whatever its few multiply-adds: at 2 and 3 threads (blocks of 7, 7, 7, 4 and 9, 9, 7 panels) the same bits as
    on one thread, each output column computed by one thread, and the reference's values; a short sequence and a
    batch of 3 too."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    g = ds.load_onnx(_model(op, hidden=200, inp=384, direction=direction), dims={"seq": (1, 8), "batch": (1, 4)})
    exe = ds.compile(g)
    rng = np.random.default_rng(3)
    for seq, batch in [(1, 1), (3, 1), (1, 3)]:
        x = rng.standard_normal((seq, batch, 384)).astype(np.float32)
        want = g.run({"x": x})
        outs = []
        for threads in (1, 2, 3):
            with threadpoolctl.threadpool_limits(threads, user_api="openmp"):
                outs.append(exe.run({"x": x}))
        for name in want:
            assert_f32_close(outs[0][name], want[name], rtol=1e-4, scale=1e-5)
            for other in outs[1:]:
                np.testing.assert_array_equal(other[name], outs[0][name])
