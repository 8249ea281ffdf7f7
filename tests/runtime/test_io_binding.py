"""exe.run(feed, out={...}): outputs written into the caller's arrays (io-binding), checked before anything runs."""

import numpy as np
import pytest

import dynshape as ds
from dynshape.frontends.onnx import load_onnx
from dynshape.models.mlp import build_mlp


def _exe():
    g = load_onnx(build_mlp(), dims={"batch": (1, 64)})
    return g, ds.compile(g)


def test_out_arrays_are_filled_in_place_and_returned():
    g, exe = _exe()
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    want = exe.run({"x": x})["y"]
    buf = np.full((5, 64), np.nan, np.float32)
    got = exe.run({"x": x}, out={"y": buf})
    assert got["y"] is buf
    np.testing.assert_array_equal(buf, want)  # the same plan: bit for bit
    x2 = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    exe.run({"x": x2}, out={"y": buf})  # reused across calls, as a decode loop does
    np.testing.assert_array_equal(buf, exe.run({"x": x2})["y"])


@pytest.mark.parametrize("bad, match", [
    (np.zeros((4, 64), np.float32), r"float32\[4, 64\], but this call's output 'y' is float32\[5, 64\]"),
    (np.zeros((5, 64), np.float64), r"float64\[5, 64\], but this call's output 'y' is float32"),
    (np.zeros((64, 5), np.float32).T, "C-contiguous"),
    ([[0.0] * 64] * 5, "not a numpy array"),
])
def test_a_bad_out_array_is_refused_before_anything_runs(bad, match):
    g, exe = _exe()
    x = np.ones((5, 64), np.float32)
    calls = exe.stats_.calls
    with pytest.raises(ds.ConstraintViolation, match=match):
        exe.run({"x": x}, out={"y": bad})
    assert exe.stats_.calls == calls  # nothing ran
    if isinstance(bad, np.ndarray):
        assert not bad.any()  # nothing written
    with pytest.raises(ds.ConstraintViolation, match="not an output"):
        exe.run({"x": x}, out={"z": np.zeros((5, 64), np.float32)})
    readonly = np.zeros((5, 64), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ds.ConstraintViolation, match="writeable"):
        exe.run({"x": x}, out={"y": readonly})
    np.testing.assert_allclose(exe.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-5, atol=1e-3)


def test_out_on_the_unplanned_path_and_for_an_empty_key():
    g = load_onnx(build_mlp())
    exe = ds.compile(g, planned=False)
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    buf = np.empty((3, 64), np.float32)
    assert exe.run({"x": x}, out={"y": buf})["y"] is buf
    np.testing.assert_array_equal(buf, exe.run({"x": x})["y"])
    with pytest.raises(ds.ConstraintViolation, match="float32\\[2, 64\\]"):
        exe.run({"x": x}, out={"y": np.empty((2, 64), np.float32)})
    empty = np.empty((0, 64), np.float32)
    assert ds.compile(g).run({"x": np.zeros((0, 64), np.float32)}, out={"y": empty})["y"] is empty


def _decoder_step(d=64, heads=4):
    """One decoder step: Q, K, V of the new token, past K / V concatenated with them (the present outputs),
    attention over the whole, an output projection: the graph a decode loop calls with its KV cache."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    hd = d // heads
    inits = {**{f"w{n}": (rng.standard_normal((d, d)) * 0.1).astype(np.float32) for n in "qkvo"},
             "shape4": np.array([0, 1, heads, hd], np.int64), "shape2": np.array([0, 1, d], np.int64)}
    nodes = []
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}p"]),
                  helper.make_node("Reshape", [f"{n}p", "shape4"], [f"{n}r"]),
                  helper.make_node("Transpose", [f"{n}r"], [f"{n}t"], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Concat", ["past_k", "kt"], ["present_k"], axis=2),
              helper.make_node("Concat", ["past_v", "vt"], ["present_v"], axis=2),
              helper.make_node("Transpose", ["present_k"], ["kT"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qt", "kT"], ["s"]),
              helper.make_node("Softmax", ["s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "present_v"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "shape2"], ["o2"]),
              helper.make_node("MatMul", ["o2", "wo"], ["y"])]
    kv = ["b", heads, "past", hd]
    graph = helper.make_graph(nodes, "step", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1, d]),
                                              helper.make_tensor_value_info("past_k", TensorProto.FLOAT, kv),
                                              helper.make_tensor_value_info("past_v", TensorProto.FLOAT, kv)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                               for o in ("y", "present_k", "present_v")],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _plans(exe, length: int) -> list:
    """The plans at present length `length`: the keys' own plans and the bucket plans at such a key (a key called
    again in a row stays on the bucket plan made at it: runtime/key_states.py)."""
    return [p for a in exe.arenas for p in (*a.buckets.values(), *a.plans.values())  # (own plans last: bound later)
            if dict(p.outputs)["present_k"].shape[2] == length]


def test_a_kv_cache_is_read_and_written_where_the_caller_keeps_it():
    """Large inputs that only kernels and native steps read are read where the caller's array lies, and out=
    arrays of outputs only they write are written directly: the same answer, bit for bit, as copying."""
    g = _decoder_step()
    fast, copying = ds.compile(g, strategy="generic"), ds.compile(g, strategy="generic", inputs_in_place=False)
    pl = fast.generic.planner
    assert {"past_k", "past_v"} <= set(pl.in_place) and {"present_k", "present_v"} <= set(pl.out_place)
    assert copying.generic.planner.in_place == [] == copying.generic.planner.out_place
    rng = np.random.default_rng(1)
    for past in (1, 7, 64):
        feed = {"x": rng.standard_normal((2, 1, 64)).astype(np.float32),
                **{k: rng.standard_normal((2, 4, past, 16)).astype(np.float32) for k in ("past_k", "past_v")}}
        bufs = [{k: np.empty((2, 4, past + 1, 16), np.float32) for k in ("present_k", "present_v")} for _ in range(2)]
        for step in range(4):  # double-buffered out= as a decode loop does, the caller changing its arrays
            out = bufs[step % 2]
            got, want = fast.run(feed, out=out), copying.run(feed)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
            assert got["present_k"] is out["present_k"]
            feed["past_k"] *= 1.5  # in place: the next call must see it
        # the plan that served these calls: the bucket plan made at this key (a key called again in a row stays on
        # it: runtime/key_states.py), or the key's own
        (plan,) = _plans(fast, past + 1)[-1:]
        assert feed["past_v"].ctypes.data in plan.current  # read where it lies, not copied
        assert out["present_v"].ctypes.data in plan.out_current
        strided = dict(feed, past_v=np.asfortranarray(feed["past_v"]))  # not C-contiguous: copied as before
        for k, v in fast.run(strided).items():
            np.testing.assert_array_equal(v, copying.run(feed)[k])


def test_an_input_a_native_step_reads_at_an_offset_is_copied_not_patched():
    """A Gather of one row of an input binds an address inside the input's slot, not at its start: patching the
    start would leave the second row reading the arena. Such an input is copied for that plan (found on Silero
    VAD's state input, whose two rows are the LSTM's h and c): the answer is the copying build's, bit for bit."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["state", "zero"], ["h"], axis=0),
             helper.make_node("Gather", ["state", "one"], ["c"], axis=0),
             helper.make_node("MatMul", ["h", "w"], ["hw"]), helper.make_node("MatMul", ["c", "w"], ["cw"]),
             helper.make_node("Sub", ["hw", "cw"], ["y"])]
    graph = helper.make_graph(nodes, "split", [helper.make_tensor_value_info("state", TensorProto.FLOAT,
                                                                             [2, "b", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0), "zero"),
                               numpy_helper.from_array(np.array(1), "one")])
    g = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    fast, copying = ds.compile(g, strategy="generic"), ds.compile(g, strategy="generic", inputs_in_place=False)
    for b in (1, 300):
        state = np.random.default_rng(b).standard_normal((2, b, 64)).astype(np.float32)
        np.testing.assert_array_equal(fast.run({"state": state})["y"], copying.run({"state": state})["y"])
        state[1] += 1.0  # the caller changes its array: the next call sees it
        np.testing.assert_array_equal(fast.run({"state": state})["y"], copying.run({"state": state})["y"])


def test_large_outputs_are_written_into_fresh_arrays_without_a_copy():
    """Without out=, an output of at least IN_PLACE_BYTES that the programs can write where it lies is written
    into a new array (no copy out of the arena): each call's result is its own, and equals the copying path's
    bit for bit, at every past length."""
    from dynshape.runtime.plan import IN_PLACE_BYTES

    g = _decoder_step()
    fast, copying = ds.compile(g, strategy="generic"), ds.compile(g, strategy="generic", inputs_in_place=False)
    rng = np.random.default_rng(3)
    for past in (1, 300, 700):
        feed = {"x": rng.standard_normal((2, 1, 64)).astype(np.float32),
                **{k: rng.standard_normal((2, 4, past, 16)).astype(np.float32) for k in ("past_k", "past_v")}}
        first = fast.run(feed)
        keep = {k: v.copy() for k, v in first.items()}
        second = fast.run({**feed, "x": feed["x"] * 2, "past_k": feed["past_k"] + 1})
        want = copying.run(feed)
        for k in want:
            np.testing.assert_array_equal(first[k], want[k])  # bit for bit
            np.testing.assert_array_equal(first[k], keep[k])  # a later call did not write into it
            assert not np.shares_memory(first[k], second[k])
        big = first["present_k"].nbytes >= IN_PLACE_BYTES
        assert big == (past >= 300)
        plans = _plans(fast, past + 1)
        written = {a for p in plans for a in (p.out_current or [])}
        # the programs wrote the last call's large outputs where they lie: no copy out of the arena
        assert (second["present_k"].ctypes.data in written) == big


def test_an_input_overlapping_an_out_array_is_copied_before_the_kernels_write():
    """A decode loop may keep past and present in one buffer (past a view of its start, out= the longer view):
    read where it lies, the Concat writing present_k would overwrite past_k's later heads before reading them.
    Such an input is copied into the arena for that call; the next call without the overlap reads in place."""
    g = _decoder_step()
    fast, copying = ds.compile(g, strategy="generic"), ds.compile(g, strategy="generic", inputs_in_place=False)
    rng = np.random.default_rng(4)
    past = 8
    buf = np.empty(2 * 4 * (past + 1) * 16, np.float32)
    for rows in (0, 5):  # at the start of present_k's bytes, and 5 rows of 16 floats into them
        past_k = np.ndarray((2, 4, past, 16), np.float32, buffer=buf, offset=rows * 16 * 4)
        past_k[...] = rng.standard_normal(past_k.shape)
        feed = {"x": rng.standard_normal((2, 1, 64)).astype(np.float32), "past_k": past_k,
                "past_v": rng.standard_normal((2, 4, past, 16)).astype(np.float32)}
        want = copying.run({k: v.copy() for k, v in feed.items()})
        got = fast.run(feed, out={"present_k": np.ndarray((2, 4, past + 1, 16), np.float32, buffer=buf)})
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    assert np.shares_memory(past_k, got["present_k"])
    feed["past_k"] = past_k.copy()  # no overlap now: read where it lies again
    fast.run(feed, out={"present_k": np.empty((2, 4, past + 1, 16), np.float32)})
    (plan,) = _plans(fast, past + 1)
    assert feed["past_k"].ctypes.data in plan.current


def test_array_addresses_are_read_as_numpy_reports_them():
    """`pointers.address` (the struct read that replaces a.ctypes.data on the request path) agrees with numpy on
    owning arrays, views at offsets, transposes, 0-d and foreign buffers."""
    from dynshape.runtime.pointers import address

    base = np.arange(120, dtype=np.float64).reshape(10, 12)
    for a in (base, base[3:, 2:], base.T, base[::2], np.array(3.0), base[4, 5:].view(np.uint8),
              np.frombuffer(bytearray(64), np.int32)[3:]):
        assert address(a) == a.ctypes.data
