"""Issue 15, defects 1-4 and 9: bad feeds to `exe.run` get one clean error, checked on shapes before any copy or
allocation; every run-time failure names its node, whatever path runs it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.models.mlp import build_mlp
from dynshape.runtime import memory

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


@pytest.fixture(scope="module")
def mlp():
    """The bench MLP, batch declared <= 8."""
    model = build_mlp()
    return model, ds.compile(ds.load_onnx(model, dims={"batch": (1, 8)}))


@pytest.fixture(scope="module")
def mlp_unbounded():
    return ds.compile(ds.load_onnx(build_mlp()))


def test_nested_list_is_converted_with_the_model_dtype(mlp):
    model, exe = mlp
    rows = [[0.5] * 64] * 3
    out = exe.run({"x": rows})
    ref = exe.run({"x": np.asarray(rows, np.float32)})
    np.testing.assert_array_equal(out["y"], ref["y"])


@pytest.mark.parametrize(("value", "pattern"), [
    ([[0.5] * 63] + [[0.5] * 64] * 2, r"input 'x': cannot convert this list"),
    ([["a"] * 64] * 2, r"input 'x': a list of <U1 values, but the model takes float32"),
    ([[1e300] * 64] * 2, r"input 'x': the list's values do not fit float32"),
    ([[0.5] * 65] * 2, r"input 'x' axis 1"),
    (None, r"input 'x' is None; the model takes an array of float32 \(batch, 64\)"),
    (object(), r"input 'x' is a object; the model takes a numpy array"),
])
def test_bad_list_or_object_input_is_refused_by_name(mlp, value, pattern):
    _, exe = mlp
    with pytest.raises(ds.ConstraintViolation, match=pattern):
        exe.run({"x": value})


def test_int_list_for_an_int_input_that_would_wrap_is_refused():
    x = helper.make_tensor_value_info("x", TensorProto.INT32, ["n"])
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "t", [x],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, ["n"])])
    exe = ds.compile(ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])))
    assert exe.run({"x": [1, 2]})["y"].tolist() == [-1, -2]
    with pytest.raises(ds.ConstraintViolation, match="do not fit int32"):
        exe.run({"x": [2**40]})
    with pytest.raises(ds.ConstraintViolation, match="float64 values, but the model takes int32"):
        exe.run({"x": [0.5]})


@pytest.mark.parametrize("feed", [None, [np.zeros((2, 64), np.float32)], "x", 3, {("x",): 1}])
def test_feed_that_is_not_a_dict_is_refused(mlp, feed):
    _, exe = mlp
    with pytest.raises(ds.ConstraintViolation, match="inputs must be a dict|missing"):
        exe.run(feed)


def test_broadcast_view_outside_the_range_is_refused_before_any_copy(mlp):
    _, exe = mlp
    huge = np.broadcast_to(np.zeros(64, np.float32), (10**9, 64))  # 238 GiB if copied
    with pytest.raises(ds.ConstraintViolation, match=r"batch = 1000000000 is outside its range \[1, 8\]"):
        exe.run({"x": huge})


def test_strided_input_is_read_correctly_without_a_binder_copy(mlp):
    _, exe = mlp
    base = np.random.default_rng(0).standard_normal((8, 128)).astype(np.float32)
    view = base[::2, ::2]
    arrays, key = exe.binder({"x": view})
    assert key == (4,) and arrays[0].base is not None  # handed on as the caller's view
    np.testing.assert_allclose(exe.run({"x": view})["y"], exe.run({"x": view.copy()})["y"], rtol=1e-6)


def test_unbounded_call_beyond_the_machine_is_refused_naming_input_symbol_bytes_and_fix(mlp_unbounded):
    huge = np.broadcast_to(np.zeros(64, np.float32), (10**9, 64))
    with pytest.raises(ds.DynshapeError) as e:
        mlp_unbounded.run({"x": huge})
    msg = str(e.value)
    for part in ("needs", "bytes", "batch = 1000000000", "input 'x' axis 0", "unbounded", "dims={'batch': (1, N)}",
                 "memory_budget"):
        assert part in msg, msg


def test_allocation_the_os_refuses_is_a_dynshape_error(mlp_unbounded, monkeypatch):
    from dynshape.runtime import bucket_dispatch, executable

    def refuse(arena, total):
        raise MemoryError(f"Unable to allocate {total} bytes")

    monkeypatch.setattr(executable, "grow", refuse)  # a key's own plan
    monkeypatch.setattr(bucket_dispatch, "grow", refuse)  # a bucket plan
    monkeypatch.setattr(memory, "machine_bytes", lambda: None)
    with pytest.raises(ds.DynshapeError, match=r"batch = 5000 .*dims=\{'batch': \(1, N\)\}"):
        mlp_unbounded.run({"x": np.zeros((5000, 64), np.float32)})


def test_outputs_the_os_refuses_to_allocate_are_a_dynshape_error(monkeypatch):
    """Fuzzer case 22947 (seed 777): the arrays a call's outputs are written straight into were allocated outside
    any check, and a MemoryError escaped raw; the call is refused naming the bytes, and runs once memory is back."""
    from dynshape.runtime import plan

    x, y = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 1024]), \
        helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    exe = ds.compile(ds.load_onnx(m))
    feed = {"x": -np.ones((64, 1024), np.float32)}
    assert not exe.run(feed)["y"].any()

    class Refusing:  # numpy, but the operating system refuses every new array
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def empty(*args, **kwargs):
            raise MemoryError("Unable to allocate")

    monkeypatch.setattr(plan, "np", Refusing())
    with pytest.raises(ds.DynshapeError, match=r"the call's outputs need 262144 bytes, which the operating system "
                                               r"refused"):
        exe.run(feed)
    monkeypatch.undo()
    assert not exe.run(feed)["y"].any()


def test_unplanned_path_refuses_a_contiguous_copy_beyond_the_machine(monkeypatch):
    """An interpreted Loop keeps the executable unplanned: the input copy itself is checked before it is made."""
    exe = ds.compile(ds.load_onnx(_loop_gather_model(index=0)), compile_bodies=False)
    monkeypatch.setattr(memory, "machine_bytes", lambda: 1 << 20)
    with pytest.raises(ds.DynshapeError, match=r"contiguous copy of input 'x'.*n = 1000000"):
        exe.run({"x": np.broadcast_to(np.zeros((), np.float32), (10**6,)), "m": np.array(1)})


def _loop_gather_model(index: int):
    body = helper.make_graph(
        [helper.make_node("Identity", ["v"], ["vo"]), helper.make_node("Identity", ["c"], ["co"])], "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", F32, ["n"])],
        [helper.make_tensor_value_info("co", TensorProto.BOOL, []), helper.make_tensor_value_info("vo", F32, ["n"])])
    nodes = [helper.make_node("Loop", ["m", "", "x"], ["lx"], body=body, name="loop"),
             helper.make_node("Gather", ["lx", "idx"], ["y"], axis=0, name="gather")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", F32, ["n"]),
                                       helper.make_tensor_value_info("m", I64, [])],
                          [helper.make_tensor_value_info("y", F32, [])],
                          [numpy_helper.from_array(np.array(index), "idx")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("with_loop", [True, False])
def test_run_time_failure_names_its_node_on_every_path(with_loop):
    if with_loop:
        model = _loop_gather_model(index=7)
        feed = {"x": np.ones(4, np.float32), "m": np.array(2)}
    else:
        g = helper.make_graph([helper.make_node("Gather", ["x", "idx"], ["y"], axis=0, name="gather")], "t",
                              [helper.make_tensor_value_info("x", F32, ["n"])],
                              [helper.make_tensor_value_info("y", F32, [])],
                              [numpy_helper.from_array(np.array(7), "idx")])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
        feed = {"x": np.ones(4, np.float32)}
    graph = ds.load_onnx(model)
    for run in (ds.compile(graph).run, graph.run):
        with pytest.raises(ds.ConstraintViolation, match=r"node 'gather' \(Gather\).*index 7 is out of bounds"):
            run(feed)


def test_failure_while_binding_a_plan_names_its_node():
    """A step that reads only constants and the shape runs once when the plan is bound: Gather(table, Shape(x))
    with n past the table fails there, and says which node, as the run-time paths do."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["t", "s"], ["g"], axis=0, name="gather"),
             helper.make_node("Mul", ["x", "g"], ["y"], name="mul")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", F32, ["n"])],
                          [helper.make_tensor_value_info("y", F32, ["n"])],
                          [numpy_helper.from_array(np.arange(4, dtype=np.float32), "t")])
    exe = ds.compile(ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])))
    np.testing.assert_array_equal(exe.run({"x": np.ones(3, np.float32)})["y"], [3, 3, 3])
    with pytest.raises(ds.ConstraintViolation, match=r"node 'gather' \(Gather\) failed for this shape: .*index 5"):
        exe.run({"x": np.ones(5, np.float32)})
