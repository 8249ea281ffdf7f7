"""bf16 storage between bf16 convolutions (codegen/lower/conv_storage.py, Options.bf16_storage).

A conv output that only bf16 convs read (as their input or their residual) is stored as bf16. A reading conv rounds
its input anyway, so where no residual is read the results equal the float32-storage build bit for bit; a residual
read as bf16 is the float32 sum rounded once, so those results differ from it by about bf16's rounding of the
residual. Checked on the native path (AMX tiles, direct and gathered; the kernel's own fallback without tiles) and
on the emulated path (float32 values rounded where stored), and which values are stored so.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen import bf16

NATIVE = bf16.native_available()
native = pytest.mark.skipif(not NATIVE, reason="no AVX512-BF16 here: the native path is refused")
# Winograd, which 3x3 stride-1 convs take under bf16 where there are no AMX tiles (AMD Zen 4), stores float32: off
# here, so that which values are stored is the same on either instruction path
OPTS = {"winograd": False}


@pytest.fixture(params=["tiles", "vector"])
def path(request):
    """Each test on AMX tiles where this CPU has them, and on the VDPBF16PS path (the tiles refused: what a CPU
    without AMX compiles and runs)."""
    if not NATIVE:
        yield request.param
        return
    lib = bf16.LIBRARY.load()
    had = bool(lib.ds_bf16_use_amx(-1))
    if request.param == "tiles" and not had:
        pytest.skip("no AMX tiles here")
    lib.ds_bf16_use_amx(int(had and request.param == "tiles"))
    try:
        yield request.param
    finally:
        lib.ds_bf16_use_amx(int(had))
C = 64  # channels: a multiple of 16 (the 3x3 convs take the direct AMX tiles where there are tiles), and enough
# multiply-adds a pixel that the 1x1 convs take bf16 (Options.bf16_min_conv_macs)
CI = 64  # the input's channels (a 1x1 first conv on them takes bf16 too)


def _conv(rng, name: str, x: str, ci: int, co: int, k: int, stride: int = 1) -> tuple[onnx.NodeProto, list]:
    w = (rng.standard_normal((co, ci, k, k)) / np.sqrt(ci * k * k)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32) * 0.1
    node = helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], kernel_shape=[k, k], strides=[stride] * 2,
                            pads=[k // 2] * 4, name=name)
    return node, [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]


def _model(residual: bool = True, tail: str = "pool", k: int = 3) -> onnx.ModelProto:
    """x -> c0 (k x k) -> relu a0 -> c1 (1x1) -> relu a1 -> c2 (k x k) -> relu a2 -> c3 (1x1) [+ a0] -> relu a3
    -> c4 (1x1, stride 2: gathered patches) -> relu a4 -> `tail`: "pool" (GlobalAveragePool: a4 stays float32),
    "output" (a4 is the graph's output), "concat" (Concat(a4, a4): float32). k 1: every conv on gathered patches
    (3x3 ones take Winograd off AMX, which stores float32)."""
    rng = np.random.default_rng(7)
    nodes, inits = [], []
    for name, x, ci, co, kk, s in (("c0", "x", CI, C, k, 1), ("c1", "a0", C, C, 1, 1), ("c2", "a1", C, C, k, 1),
                                   ("c3", "a2", C, C, 1, 1), ("c4", "a3", C, C, 1, 2)):
        node, made = _conv(rng, name, x, ci, co, kk, s)
        nodes.append(node)
        inits += made
        src = name
        if name == "c3" and residual:
            nodes.append(helper.make_node("Add", ["c3", "a0"], ["s3"]))
            src = "s3"
        nodes.append(helper.make_node("Relu", [src], ["a" + name[1]]))
    if tail == "pool":
        nodes.append(helper.make_node("GlobalAveragePool", ["a4"], ["y"]))
    elif tail == "concat":
        nodes.append(helper.make_node("Concat", ["a4", "a4"], ["y"], axis=1))
    else:
        nodes.append(helper.make_node("Identity", ["a4"], ["y"]))
    graph = helper.make_graph(nodes, "storage", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              ["n", CI, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _stored(exe) -> dict[str, str]:
    """Each conv kernel's first node -> what it stores as bf16 ("" where nothing)."""
    out = {}
    for s in exe.generic.steps:
        method = getattr(s, "method", "")
        if getattr(s, "kind", "") == "conv":
            out[s.nodes[0].name] = method.split("bf16 storage: ")[1].split(";")[0] if "bf16 storage" in method \
                else ""
    return out


def _feed(n: int = 2, h: int = 12, w: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((n, CI, h, w)).astype(np.float32)}


@native
def test_values_only_bf16_convs_read_are_stored_as_bf16(path):
    exe = ds.compile(ds.load_onnx(_model()), precision="bf16", **OPTS)
    assert _stored(exe) == {"c0": "output", "c1": "input, output", "c2": "input, output",
                            "c3": "input, output, residual", "c4": "input"}
    # a graph output, and a value a Concat reads, stay float32 (their writer stores float32)
    for tail in ("output", "concat"):
        assert _stored(ds.compile(ds.load_onnx(_model(tail=tail)), precision="bf16", **OPTS))["c4"] == "input"
    off = ds.compile(ds.load_onnx(_model()), precision="bf16", **OPTS, bf16_storage=False)
    assert not any(_stored(off).values())
    assert not any(_stored(ds.compile(ds.load_onnx(_model()), **OPTS)).values())  # float32: never


@native
@pytest.mark.parametrize("tail", ["pool", "output"])
def test_without_a_residual_bf16_storage_changes_no_bit(tail, path):
    model = _model(residual=False, tail=tail)
    on = ds.compile(ds.load_onnx(model), precision="bf16", **OPTS)
    off = ds.compile(ds.load_onnx(model), precision="bf16", **OPTS, bf16_storage=False)
    assert "input, output" in _stored(on).values()
    for n, h, w in ((1, 12, 10), (2, 7, 9), (3, 16, 16)):
        feed = _feed(n, h, w, seed=n)
        np.testing.assert_array_equal(on.run(feed)["y"], off.run(feed)["y"])


def _residual_reference(feed: dict) -> tuple[np.ndarray, np.ndarray, float]:
    """(the float32 build's output, the float32-storage bf16 build's, the bf16 build's error scale)."""
    model = _model()
    ref = ds.compile(ds.load_onnx(model), **OPTS).run(feed)["y"]
    off = ds.compile(ds.load_onnx(model), precision="bf16", **OPTS, bf16_storage=False).run(feed)["y"]
    return ref, off, float(np.abs(off - ref).max())


@native
def test_a_residual_read_as_bf16_stays_within_bf16s_error(path):
    feed = _feed()
    ref, off, err = _residual_reference(feed)
    on = ds.compile(ds.load_onnx(_model()), precision="bf16", **OPTS).run(feed)["y"]
    assert not np.array_equal(on, off)  # the residual is rounded where it is stored
    # the stored residual's rounding (a relative 2**-9 of a0) is of the order of the products' own bf16 error
    assert np.abs(on - ref).max() <= 2 * err + 1e-6 * np.abs(ref).max()
    assert np.abs(on - off).max() <= 2 * err + 1e-6 * np.abs(ref).max()


@native
def test_the_kernels_fallback_without_tiles_reads_and_writes_the_same_bf16_maps():
    lib = bf16.LIBRARY.load()
    amx = bool(lib.ds_bf16_use_amx(-1))
    exe = ds.compile(ds.load_onnx(_model()), precision="bf16", **OPTS)
    feed = _feed(2, 14, 11)
    tiles = exe.run(feed)["y"]
    try:
        lib.ds_bf16_use_amx(0)  # the VDPBF16PS micro-tiles on the gathered patches
        vector = exe.run(feed)["y"]
    finally:
        lib.ds_bf16_use_amx(int(amx))
    # the same bf16 operands and float32 sums in another order
    np.testing.assert_allclose(vector, tiles, rtol=0, atol=2e-5 * np.abs(tiles).max())


def test_the_emulated_path_stores_the_same_values():
    """bf16-emulated keeps float32 maps rounded to bf16 where they are stored: the native storage's values."""
    feed = _feed()
    model = _model(k=1)
    emulated = ds.compile(ds.load_onnx(model), precision="bf16-emulated", **OPTS)
    got = emulated.run(feed)["y"]
    off = ds.compile(ds.load_onnx(model), precision="bf16-emulated", **OPTS, bf16_storage=False).run(feed)["y"]
    assert _stored(emulated) == {"c0": "output", "c1": "input, output", "c2": "input, output",
                                 "c3": "input, output, residual", "c4": "input"}
    assert not np.array_equal(got, off)  # the residual rounded where stored
    no_residual = _model(residual=False, k=1)
    stored = ds.compile(ds.load_onnx(no_residual), precision="bf16-emulated", **OPTS).run(feed)["y"]
    plain = ds.compile(ds.load_onnx(no_residual), precision="bf16-emulated", **OPTS, bf16_storage=False).run(feed)
    np.testing.assert_array_equal(stored, plain["y"])
    if NATIVE:
        native_out = ds.compile(ds.load_onnx(model), precision="bf16", **OPTS).run(feed)["y"]
        np.testing.assert_allclose(got, native_out, rtol=0, atol=2e-5 * np.abs(native_out).max())


def _pair(c: int, attrs: dict, residual: bool) -> onnx.ModelProto:
    """x -> a (3x3 conv + Relu, c channels) -> b: Conv(a) with `attrs` (+ a where `residual`) -> Relu -> pool."""
    rng = np.random.default_rng(3)
    k, g = attrs["kernel_shape"][0], attrs.get("group", 1)
    wa = (rng.standard_normal((c, CI, 3, 3)) / 24).astype(np.float32)
    wb = (rng.standard_normal((c, c // g, k, k)) / np.sqrt(c // g * k * k)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["ca"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="a"),
             helper.make_node("Relu", ["ca"], ["a"]),
             helper.make_node("Conv", ["a", "wb"], ["cb"], name="b", **attrs)]
    if residual:
        nodes.append(helper.make_node("Add", ["cb", "a"], ["sb"]))
    nodes += [helper.make_node("Relu", ["sb" if residual else "cb"], ["rb"]),
              helper.make_node("GlobalAveragePool", ["rb"], ["y"])]
    graph = helper.make_graph(nodes, "pair", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                           ["n", CI, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(wa, "wa"), numpy_helper.from_array(wb, "wb")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@native
@pytest.mark.parametrize("c, attrs", [
    (24, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),  # 24 channels: the direct tiles on a copy padded to 32
    (64, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 2}),  # grouped: gathered patches
    (64, {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2], "dilations": [2, 2]}),  # dilated: gathered tap by tap
    (64, {"kernel_shape": [3, 3], "pads": [0, 1, 2, 1], "strides": [2, 2]}),  # strided, uneven pads
])
def test_every_reading_path_takes_the_stored_input_as_it_was_rounded(c, attrs, path):
    model = _pair(c, attrs, residual=False)
    on = ds.compile(ds.load_onnx(model), precision="bf16", **OPTS)
    off = ds.compile(ds.load_onnx(model), precision="bf16", **OPTS, bf16_storage=False)
    assert _stored(on) == {"a": "output", "b": "input"}
    for n, h, w in ((1, 9, 13), (2, 16, 16)):
        feed = _feed(n, h, w, seed=h)
        np.testing.assert_array_equal(on.run(feed)["y"], off.run(feed)["y"])


@native
def test_a_value_read_as_both_input_and_residual(path):
    model = _pair(C, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, residual=True)
    on = ds.compile(ds.load_onnx(model), precision="bf16", **OPTS)
    assert _stored(on) == {"a": "output", "b": "input, residual"}
    feed = _feed(2, 11, 12)
    ref = ds.compile(ds.load_onnx(model), **OPTS).run(feed)["y"]
    off = ds.compile(ds.load_onnx(model), precision="bf16", **OPTS, bf16_storage=False).run(feed)["y"]
    got = on.run(feed)["y"]
    err = float(np.abs(off - ref).max())
    assert np.abs(got - ref).max() <= 2 * err + 1e-6 * np.abs(ref).max()
