"""precision="bf16" on recurrent layers (csrc/ds_rnn.c, flags bits 6 and 7): both products by constant weights take
them as bf16 pairs with float32 sums: the input projection (X's rows rounded to bf16) and each step's recurrent
product (the state's rows rounded as they are read); the gates, the cell and the state stay float32. So a layer in
bf16 equals a float32 reference that rounds X, W, R and the state before each product, up to float32
accumulation, on both native paths (AMX tiles and VDPBF16PS), for LSTM, GRU and RNN, both layouts, every
direction, sequence_lens. One step from a given initial state is one recurrent product, compared at float32's
tolerance (and shown not to be the float32 product); longer sequences carry the state through many roundings,
where a last-bit difference in a state value may round it the other way, so they are compared more loosely (R is
contracting, so such a flip fades)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen import bf16

pytestmark = pytest.mark.skipif(not bf16.native_available(),
                                reason="this CPU has no AVX512-BF16: precision='bf16' is refused here")
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _model(op: str, inp: int, hid: int, direction: str, layout: int, w: np.ndarray, r: np.ndarray, b: np.ndarray,
           lens: bool, lbr: int = 0) -> onnx.ModelProto:
    outs = ["y", "yh", "yc"] if op == "LSTM" else ["y", "yh"]
    extra = {"linear_before_reset": lbr} if op == "GRU" else {}
    nodes = [helper.make_node(op, ["x", "W", "R", "B", "lens" if lens else "", "h0"], outs, hidden_size=hid,
                              direction=direction, layout=layout, **extra)]
    state = ["nd", "b", hid] if layout == 0 else ["b", "nd", hid]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", "b", inp] if layout == 0 else ["b", "s", inp]),
           *([helper.make_tensor_value_info("lens", TensorProto.INT32, ["b"])] if lens else []),
           helper.make_tensor_value_info("h0", TensorProto.FLOAT, state)]
    graph = helper.make_graph(nodes, "rnn", ins, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                  for o in outs],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R"),
                               numpy_helper.from_array(b, "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


class _RoundingR:
    """R for the numpy reference (ops/rnn.py's run_direction): `state @ R.T` rounds the state to bf16 first, as
    the kernel rounds the state's rows it reads (R itself is given rounded)."""

    __array_ufunc__ = None  # numpy defers `state @ this` to __rmatmul__

    def __init__(self, m: np.ndarray, transposed: bool = False):
        self.m, self.transposed = m, transposed

    @property
    def shape(self) -> tuple:
        return self.m.T.shape if self.transposed else self.m.shape

    @property
    def T(self) -> _RoundingR:  # noqa: N802 - numpy's name
        return _RoundingR(self.m, not self.transposed)

    def __getitem__(self, idx: object) -> _RoundingR:
        return _RoundingR(self.m[idx])

    def __rmatmul__(self, state: np.ndarray) -> np.ndarray:
        return bf16.rounded(np.ascontiguousarray(state, np.float32)) @ (self.m.T if self.transposed else self.m)


def _reference(op: str, hid: int, direction: str, layout: int, w: np.ndarray, r: np.ndarray, b: np.ndarray,
               feed: dict, lbr: int = 0, rounding: bool = True) -> dict:
    """The layer in numpy float32 on X, W and R rounded to bf16 and (`rounding`) the state rounded before each
    recurrent product: what precision="bf16" computes. Without `rounding`: R and the state in float32 (the input
    projection still rounded)."""
    from dynshape.ops.rnn import parse_attrs, run_direction

    attrs = {"hidden_size": hid, "direction": direction, "layout": layout}
    if op == "GRU":
        attrs["linear_before_reset"] = lbr
    a = parse_attrs(op, attrs.get)
    x, h0 = bf16.rounded(feed["x"]), feed["h0"]
    if layout == 1:
        x, h0 = x.swapaxes(0, 1), h0.swapaxes(0, 1)
    seq, batch, _ = x.shape
    lens = feed["lens"].astype(np.int64) if "lens" in feed else np.full(batch, seq, np.int64)
    ys, hs, cs = [], [], []
    for d in range(a.num_directions):
        rd = _RoundingR(bf16.rounded(r[d])) if rounding else r[d]
        reverse = direction == "reverse" or d == 1
        c0 = np.zeros((batch, hid), np.float32) if op == "LSTM" else None
        y, h, c = run_direction(a, d, x, bf16.rounded(w[d]), rd, b[d], h0[d], c0, None, lens, reverse)
        ys.append(y)
        hs.append(h)
        cs.append(c)
    y, yh = np.stack(ys, 1), np.stack(hs)
    out = {"y": y.transpose(2, 0, 1, 3) if layout == 1 else y, "yh": yh.swapaxes(0, 1) if layout == 1 else yh}
    if op == "LSTM":
        yc = np.stack(cs)
        out["yc"] = yc.swapaxes(0, 1) if layout == 1 else yc
    return out


@pytest.mark.parametrize("amx", [1, 0])
@pytest.mark.parametrize("op,inp,hid,direction,layout,lens,lbr", [
    ("LSTM", 256, 96, "bidirectional", 0, False, 0), ("LSTM", 33, 16, "reverse", 1, True, 0),
    ("GRU", 40, 24, "forward", 0, True, 0), ("GRU", 40, 40, "bidirectional", 1, False, 1),
    ("RNN", 70, 32, "bidirectional", 1, False, 0)])
def test_a_bf16_layer_is_the_float32_layer_of_rounded_operands(tile_path, amx: int, op: str, inp: int, hid: int,
                                                               direction: str, layout: int, lens: bool,
                                                               lbr: int) -> None:
    tile_path(amx)
    rng = np.random.default_rng(inp + hid)
    nd, g = (2 if direction == "bidirectional" else 1), GATES[op]
    w = (rng.standard_normal((nd, g * hid, inp)) * 0.1).astype(np.float32)
    r = (rng.standard_normal((nd, g * hid, hid)) * (0.5 / hid ** 0.5)).astype(np.float32)  # contracting: a flip fades
    b = (rng.standard_normal((nd, 2 * g * hid)) * 0.1).astype(np.float32)
    low = ds.compile(ds.load_onnx(_model(op, inp, hid, direction, layout, w, r, b, lens, lbr)), precision="bf16",
                     bf16_min_recurrent_bytes=0)  # (these R are small: by default they stay float32, below)
    for seq, batch in ((1, 4), (1, 1), (40, 4), (3, 1), (70, 2)):
        x = rng.standard_normal((seq, batch, inp) if layout == 0 else (batch, seq, inp)).astype(np.float32)
        h0 = rng.uniform(-1, 1, (nd, batch, hid) if layout == 0 else (batch, nd, hid)).astype(np.float32)
        feed = {"x": x, "h0": h0}
        if lens:
            feed["lens"] = (rng.integers(0, seq + 1, batch) if seq > 1 else np.ones(batch)).astype(np.int32)
        got = low.run(feed)
        want = _reference(op, hid, direction, layout, w, r, b, feed, lbr)
        # one recurrent product: float32 sums; many: a state value a last bit apart may round the other way (such
        # flips moved the outputs by 5e-5..6e-4 here; a wrong step, state or direction moves them by 1e-1)
        tol = 1e-5 if seq == 1 else 1e-3
        for name, v in want.items():
            assert got[name].shape == v.shape, (name, got[name].shape, v.shape)
            assert np.abs(got[name] - v).max() <= tol * (np.abs(v).max() + 1), (op, name, seq, batch)
        if seq == 1:  # and the step's product did take R and the state in bf16
            plain = _reference(op, hid, direction, layout, w, r, b, feed, lbr, rounding=False)
            assert max(float(np.abs(got[k] - plain[k]).max()) for k in want) > 1e-4


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_the_recurrent_product_takes_bf16_from_bf16_min_recurrent_bytes(op: str) -> None:
    """One direction's R of at least bf16_min_recurrent_bytes (float32 bytes) runs its per-step product in bf16;
    one byte under, it stays float32 (the projection is bf16 either way): each build equals its own reference at
    float32's tolerance, and the two differ."""
    rng = np.random.default_rng(11)
    hid, inp, g = 32, 20, GATES[op]
    w = (rng.standard_normal((1, g * hid, inp)) * 0.1).astype(np.float32)
    r = (rng.standard_normal((1, g * hid, hid)) * (0.5 / hid ** 0.5)).astype(np.float32)
    b = (rng.standard_normal((1, 2 * g * hid)) * 0.1).astype(np.float32)
    graph = ds.load_onnx(_model(op, inp, hid, "forward", 0, w, r, b, False))
    feed = {"x": rng.standard_normal((1, 3, inp)).astype(np.float32),
            "h0": rng.uniform(-1, 1, (1, 3, hid)).astype(np.float32)}
    got = {}
    for rounding, at in ((True, r[0].nbytes), (False, r[0].nbytes + 1)):
        got[rounding] = ds.compile(graph, precision="bf16", bf16_min_recurrent_bytes=at).run(feed)
        want = _reference(op, hid, "forward", 0, w, r, b, feed, rounding=rounding)
        for name, v in want.items():
            assert np.abs(got[rounding][name] - v).max() <= 1e-5 * (np.abs(v).max() + 1), (rounding, name)
    assert np.abs(got[True]["y"] - got[False]["y"]).max() > 1e-4


def test_explain_says_which_products_run_in_bf16(tmp_path) -> None:
    """explain's library steps name the bf16 products under precision="bf16" (the recurrent one where R is large
    enough), and nothing of it in float32."""
    from dynshape.cli.explain_cmd import report

    rng = np.random.default_rng(2)
    w = (rng.standard_normal((1, 64, 24)) * 0.1).astype(np.float32)
    r = (rng.standard_normal((1, 64, 16)) * 0.1).astype(np.float32)
    b = np.zeros((1, 128), np.float32)
    graph = ds.load_onnx(_model("LSTM", 24, 16, "forward", 0, w, r, b, False))
    low = report(ds.compile(graph, precision="bf16"), tmp_path, "test")["library_steps"]
    assert any(k.startswith("LSTM (native: input projection in bf16") and "recurrent product in float32" in k
               for k in low), low
    both = report(ds.compile(graph, precision="bf16", bf16_min_recurrent_bytes=0), tmp_path, "test")["library_steps"]
    assert any(k.startswith("LSTM (native: input projection and recurrent product in bf16") for k in both), both
    plain = report(ds.compile(graph), tmp_path, "test")["library_steps"]
    assert plain and not any("bf16" in k for k in plain), plain
