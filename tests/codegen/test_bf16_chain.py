"""A 1x1 conv into a depthwise one (the ConvChain kernel, csrc ds_pwdw_rows_t) under a bf16 precision.

The chain's 1x1 multiplies bf16 operands with float32 accumulation; its depthwise stays float32. So the float32
build of the same model with the 1x1's weights rounded to bf16, fed the input rounded to bf16, computes the same
values up to float32's accumulation order: an independent reference (the float32 kernels) that fails if the chain
dropped the rounding of either operand, read the weights in another packing, or reused one chunk's rounded rows
for another's.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen import bf16
from dynshape.runtime.build import KernelStep

NATIVE = bf16.native_available()
needs_native = pytest.mark.skipif(not NATIVE, reason="this CPU has no AVX512-BF16 (the emulated path is tested)")


def _pw_dw(cin: int, cexp: int, k: int, s: int, w1: np.ndarray | None = None, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    drawn = (rng.standard_normal((cexp, cin, 1, 1)) * 0.3).astype(np.float32)  # (drawn always: the same others)
    inits = {"w1": drawn if w1 is None else w1, "b1": rng.standard_normal(cexp).astype(np.float32),
             "w2": (rng.standard_normal((cexp, 1, k, k)) * 0.3).astype(np.float32),
             "b2": rng.standard_normal(cexp).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]), helper.make_node("Relu", ["c1"], ["a1"]),
             helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], group=cexp, strides=[s, s], pads=[k // 2] * 4),
             helper.make_node("HardSwish", ["c2"], ["y"])]
    graph = helper.make_graph(
        nodes, "pw_dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", cin, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k_) for k_, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _chain_steps(exe) -> list:
    return [s for s in exe.generic.steps if isinstance(s, KernelStep) and s.kind == "conv_chain"]


@pytest.mark.parametrize("precision", ["bf16-emulated", pytest.param("bf16", marks=needs_native)])
@pytest.mark.parametrize("cin,cexp,k,s", [(32, 64, 3, 1), (24, 96, 5, 2), (40, 72, 3, 2)])
def test_a_bf16_chain_multiplies_its_1x1_in_bf16(precision: str, cin: int, cexp: int, k: int, s: int) -> None:
    model = _pw_dw(cin, cexp, k, s)
    exe = ds.compile(ds.load_onnx(model), precision=precision)
    chains = _chain_steps(exe)
    assert len(chains) == 1 and "bf16 operands" in chains[0].method
    w1 = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "w1"))
    reference = ds.compile(ds.load_onnx(_pw_dw(cin, cexp, k, s, w1=bf16.rounded(w1))))
    assert len(_chain_steps(reference)) == 1  # (the float32 chain: the same structure)
    fp32 = ds.compile(ds.load_onnx(model))
    rng = np.random.default_rng(1)
    # a map of more rows than a chunk holds (several chunks a call, on one thread), two images, a short one twice
    # in a row with other values (one chunk at the same address: the rows the last call rounded are stale)
    for shape in ((1, cin, 150, 160), (2, cin, 9, 13), (1, cin, 1, 7), (1, cin, 1, 7)):
        x = rng.standard_normal(shape).astype(np.float32)
        got = exe.run({"x": x})["y"]
        want = reference.run({"x": bf16.rounded(x)})["y"]
        scale = float(np.abs(want).max())
        assert np.abs(got - want).max() <= 1e-5 * scale, shape
        # and it is bf16, not float32: its error against the float32 build is bf16's size
        exact = fp32.run({"x": x})["y"]
        assert 1e-5 * scale < np.abs(got - exact).max() <= 0.05 * scale, shape


def test_a_chain_whose_1x1_is_too_narrow_for_bf16_stays_float32() -> None:
    """An 8 -> 32 expansion (256 multiply-adds a pixel, under bf16_min_conv_macs): the chain's 1x1 keeps float32,
    as a lone conv of that size would, and the bf16 build answers as the float32 one does."""
    model = _pw_dw(8, 32, 3, 1)
    exe = ds.compile(ds.load_onnx(model), precision="bf16-emulated")
    chains = _chain_steps(exe)
    assert len(chains) == 1 and "bf16" not in chains[0].method
    x = np.random.default_rng(2).standard_normal((1, 8, 120, 90)).astype(np.float32)
    np.testing.assert_array_equal(exe.run({"x": x})["y"], ds.compile(ds.load_onnx(model)).run({"x": x})["y"])
