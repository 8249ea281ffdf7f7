"""Recurrent ops: LSTM, GRU and RNN. numpy references + shape rules over symbolic seq_length and batch.

One layer each, as ONNX defines them (gates in the spec's order: LSTM `iofc`, GRU `zrh`), with every attribute:
direction forward / reverse / bidirectional, `activations` with `activation_alpha` / `activation_beta`, `clip`,
`layout`, `hidden_size`, LSTM's `input_forget` and peepholes, GRU's `linear_before_reset`; optional inputs
`B`, `sequence_lens`, `initial_h`, `initial_c`, `P` and optional outputs `Y`, `Y_h`, `Y_c`.

Where the spec leaves a detail open, the references do what onnxruntime does (the runtime these models are
deployed on, and what our tests compare with):
- `clip` bounds the inputs of the gate activations (after the bias and peepholes are added), not the cell state;
- `activation_alpha` / `activation_beta` are consumed in activation order by the activations that take the
  parameter (LeakyRelu, ThresholdedRelu, Elu take alpha; Affine, ScaledTanh, HardSigmoid take both); an
  activation left without a value gets its ONNX operator's default (LeakyRelu 0.01, HardSigmoid 0.2 / 0.5,
  Elu 1, ThresholdedRelu 1, Affine 1 / 0, ScaledTanh 1 / 1); names match case-insensitively;
- `input_forget=1` couples the gates as f = 1 - i;
- with `sequence_lens`, a reverse pass starts at each entry's own last valid step, outputs past an entry's
  length are zero, Y_h / Y_c hold its last valid step, and an entry of length 0 has zero Y_h / Y_c.

The input projection of every time step is one product up front (X @ Wᵀ for all gates at once); only the
recurrent product and the gate arithmetic run per step. float16 / bfloat16 are computed in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynshape.errors import ConstraintViolation, ModelError
from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType
from dynshape.ops import dtypes as dt
from dynshape.ops.dims import is_static, norm


@dataclass(frozen=True)
class Cell:
    """What distinguishes the three ops: gates per direction, activations per direction, input slots."""

    gates: int
    default_acts: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


CELLS: dict[str, Cell] = {
    "LSTM": Cell(4, ("Sigmoid", "Tanh", "Tanh"),
                 ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"), ("Y", "Y_h", "Y_c")),
    "GRU": Cell(3, ("Sigmoid", "Tanh"), ("X", "W", "R", "B", "sequence_lens", "initial_h"), ("Y", "Y_h")),
    "RNN": Cell(1, ("Tanh",), ("X", "W", "R", "B", "sequence_lens", "initial_h"), ("Y", "Y_h")),
}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


# ---------------------------------------------------------------------------------------------------------
# activations
# ---------------------------------------------------------------------------------------------------------
def _sigmoid(x: np.ndarray, a: float, b: float) -> np.ndarray:
    """1 / (1 + e^-x) without overflow warnings for large |x|: 0.5 * (1 + tanh(x / 2)) is the same function."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _elu(x: np.ndarray, a: float, b: float) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0)))


# name (lower case) -> (takes alpha, takes beta, default alpha, default beta, f(x, alpha, beta))
ACTIVATIONS: dict[str, tuple[bool, bool, float, float, Callable[[np.ndarray, float, float], np.ndarray]]] = {
    "relu": (False, False, 0.0, 0.0, lambda x, a, b: np.maximum(x, 0)),
    "tanh": (False, False, 0.0, 0.0, lambda x, a, b: np.tanh(x)),
    "sigmoid": (False, False, 0.0, 0.0, _sigmoid),
    "affine": (True, True, 1.0, 0.0, lambda x, a, b: a * x + b),
    "leakyrelu": (True, False, 0.01, 0.0, lambda x, a, b: np.where(x >= 0, x, a * x)),
    "thresholdedrelu": (True, False, 1.0, 0.0, lambda x, a, b: np.where(x > a, x, 0)),
    "scaledtanh": (True, True, 1.0, 1.0, lambda x, a, b: a * np.tanh(b * x)),
    "hardsigmoid": (True, True, 0.2, 0.5, lambda x, a, b: np.clip(a * x + b, 0, 1)),
    "elu": (True, False, 1.0, 0.0, _elu),
    "softsign": (False, False, 0.0, 0.0, lambda x, a, b: x / (1 + np.abs(x))),
    "softplus": (False, False, 0.0, 0.0, lambda x, a, b: np.logaddexp(0, x)),
}
SPEC_NAMES = ("Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid",
              "Elu", "Softsign", "Softplus")


@dataclass(frozen=True)
class Activation:
    name: str  # lower case
    alpha: float
    beta: float

    def __call__(self, x: np.ndarray) -> np.ndarray:
        fn = ACTIVATIONS[self.name][4]
        return fn(x, np.asarray(self.alpha, x.dtype), np.asarray(self.beta, x.dtype)).astype(x.dtype, copy=False)


@dataclass(frozen=True)
class RnnAttrs:
    """A node's attributes, checked and decoded: what both the references and the native kernels read."""

    op: str
    direction: str
    num_directions: int
    acts: tuple[tuple[Activation, ...], ...]  # per direction
    clip: float | None
    layout: int
    hidden_size: int | None
    input_forget: bool
    linear_before_reset: bool

    @property
    def cell(self) -> Cell:
        return CELLS[self.op]


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def parse_attrs(op: str, get: Callable[[str, Any], Any]) -> RnnAttrs:
    """Decode and check the attributes of an `op` node (`get(name, default)`); a bad value is a ModelError
    saying which attribute and what it accepts."""
    cell = CELLS[op]
    direction = _text(get("direction", "forward") or "forward")
    if direction not in DIRECTIONS:
        raise ModelError(f"direction={direction!r}: expected one of {', '.join(DIRECTIONS)}")
    nd = DIRECTIONS[direction]
    per = len(cell.default_acts)
    names = [_text(a) for a in (get("activations", None) or [])] or list(cell.default_acts) * nd
    if op == "RNN" and nd == 1 and len(names) == 2:
        names = names[:1]  # opset-1 RNN's default was [Tanh, Tanh]; onnxruntime takes the first too
    if len(names) != per * nd:
        raise ModelError(f"activations has {len(names)} entries ({names}); {op} with direction={direction!r} "
                         f"takes {per * nd} ({per} per direction: {', '.join(cell.default_acts)} by default)")
    alphas = [float(a) for a in (get("activation_alpha", None) or [])]
    betas = [float(b) for b in (get("activation_beta", None) or [])]
    acts = []
    for name in names:
        key = name.lower()
        if key not in ACTIVATIONS:
            raise ModelError(f"activation {name!r} is not one ONNX defines for {op}: {', '.join(SPEC_NAMES)}")
        takes_a, takes_b, da, db, _ = ACTIVATIONS[key]
        a = alphas.pop(0) if takes_a and alphas else da
        b = betas.pop(0) if takes_b and betas else db
        acts.append(Activation(key, a, b))
    clip = get("clip", None)
    if clip is not None:
        clip = float(clip)
        if not clip > 0:
            raise ModelError(f"clip={clip}: the cell clip threshold must be positive")
    layout = int(get("layout", 0) or 0)
    if layout not in (0, 1):
        raise ModelError(f"layout={layout}: expected 0 (seq_length first) or 1 (batch first)")
    hidden = get("hidden_size", None)
    if hidden is not None and int(hidden) < 1:
        raise ModelError(f"hidden_size={hidden}: must be at least 1")
    input_forget = int(get("input_forget", 0) or 0) if op == "LSTM" else 0
    lbr = int(get("linear_before_reset", 0) or 0) if op == "GRU" else 0
    return RnnAttrs(op, direction, nd, tuple(tuple(acts[d * per:(d + 1) * per]) for d in range(nd)), clip, layout,
                    None if hidden is None else int(hidden), bool(input_forget), bool(lbr))


# ---------------------------------------------------------------------------------------------------------
# references
# ---------------------------------------------------------------------------------------------------------
def _seq_lens(lens: np.ndarray | None, seq: int, batch: int, op: str) -> np.ndarray:
    if lens is None:
        return np.full(batch, seq, np.int64)
    lens = np.asarray(lens).astype(np.int64).reshape(-1)
    if lens.shape != (batch,):
        raise ConstraintViolation(f"{op}: sequence_lens has {lens.size} entries but the batch is {batch}")
    bad = np.flatnonzero((lens < 0) | (lens > seq))
    if bad.size:
        i = int(bad[0])
        raise ConstraintViolation(f"{op}: sequence_lens[{i}] = {int(lens[i])} but every length must be in "
                                  f"0..seq_length ({seq})")
    return lens


def _time_index(lens: np.ndarray, seq: int) -> np.ndarray:
    """[t, b] -> the time step a reverse pass handles at its t-th step: lens[b] - 1 - t while t < lens[b]
    (each entry reversed within its own length), t itself past it (those steps are masked out)."""
    t = np.arange(seq)[:, None]
    return np.where(t < lens[None, :], lens[None, :] - 1 - t, t)


def _clip(x: np.ndarray, clip: float | None) -> np.ndarray:
    return x if clip is None else np.clip(x, -clip, clip)


def _lstm_step(a: RnnAttrs, acts: tuple, gx: np.ndarray, h: np.ndarray, c: np.ndarray, r: np.ndarray,
               p: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    f, g, hact = acts
    gates = gx + h @ r.T
    gi, go, gf, gc = np.split(gates, 4, axis=-1)
    pi, po, pf = (None, None, None) if p is None else np.split(p, 3)
    i = f(_clip(gi if pi is None else gi + pi * c, a.clip))
    if a.input_forget:
        fg = 1 - i
    else:
        fg = f(_clip(gf if pf is None else gf + pf * c, a.clip))
    c_new = fg * c + i * g(_clip(gc, a.clip))
    o = f(_clip(go if po is None else go + po * c_new, a.clip))
    return o * hact(c_new), c_new


def _gru_step(a: RnnAttrs, acts: tuple, gx: np.ndarray, h: np.ndarray, r: np.ndarray,
              rb_h: np.ndarray) -> np.ndarray:
    """gx holds X Wᵀ + Wb for z, r, h plus Rb for z and r (Rb_h is added where linear_before_reset says)."""
    f, g = acts
    hid = h.shape[-1]
    zr = gx[..., :2 * hid] + h @ r[:2 * hid].T
    z = f(_clip(zr[..., :hid], a.clip))
    rt = f(_clip(zr[..., hid:], a.clip))
    rh = r[2 * hid:]
    if a.linear_before_reset:
        pre = gx[..., 2 * hid:] + rt * (h @ rh.T + rb_h)
    else:
        pre = gx[..., 2 * hid:] + (rt * h) @ rh.T + rb_h
    return (1 - z) * g(_clip(pre, a.clip)) + z * h


def run_direction(a: RnnAttrs, d: int, x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray | None,
                  h0: np.ndarray, c0: np.ndarray | None, p: np.ndarray | None, lens: np.ndarray,
                  reverse: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One direction over (seq, batch, input) in the compute dtype: (Y (seq, batch, hidden), H_last, C_last)."""
    seq, batch, _ = x.shape
    hid = r.shape[-1]
    gates = a.cell.gates
    full = bool(np.all(lens == seq))
    cols = np.arange(batch)[None, :]
    tidx = None
    if reverse:
        tidx = np.arange(seq - 1, -1, -1)[:, None].repeat(batch, 1) if full else _time_index(lens, seq)
        x = x[tidx, cols]
    wb = np.zeros(gates * hid, x.dtype) if b is None else b[:gates * hid]
    rb = np.zeros(gates * hid, x.dtype) if b is None else b[gates * hid:]
    bias = wb + rb
    rb_h = None
    if a.op == "GRU":  # Rb_h stays out of the up-front sum: linear_before_reset puts it inside r * (...)
        bias = np.concatenate([wb[:2 * hid] + rb[:2 * hid], wb[2 * hid:]])
        rb_h = rb[2 * hid:]
    gx = x @ w.T + bias  # (seq, batch, gates * hidden): every step's input projection in one product
    acts = a.acts[d]
    y = np.zeros((seq, batch, hid), x.dtype)
    h, c = h0, c0
    steps = int(lens.max()) if lens.size else 0
    for t in range(steps):
        if a.op == "LSTM":
            h_new, c_new = _lstm_step(a, acts, gx[t], h, c, r, p)
        elif a.op == "GRU":
            h_new, c_new = _gru_step(a, acts, gx[t], h, r, rb_h), None
        else:
            h_new, c_new = acts[0](_clip(gx[t] + h @ r.T, a.clip)), None
        if full:
            h, c = h_new, c_new
            y[t] = h_new
            continue
        valid = (t < lens)[:, None]
        h = np.where(valid, h_new, h)
        c = None if c is None else np.where(valid, c_new, c)
        y[t] = np.where(valid, h_new, 0)
    if reverse:
        y = y[tidx, cols]  # the index is its own inverse on the valid steps; the rest of y is zero
    empty = (lens == 0)[:, None]
    if empty.any():
        h = np.where(empty, 0, h)
        c = None if c is None else np.where(empty, 0, c)
    return y, h, c


def _reference(op: str) -> Callable[[list, dict], list]:
    cell = CELLS[op]

    def ref(inputs: list, attrs: dict) -> list:
        a = parse_attrs(op, attrs.get)
        ins = list(inputs) + [None] * (len(cell.inputs) - len(inputs))
        x, w, r, b, lens, h0 = ins[:6]
        c0, p = (ins[6], ins[7]) if op == "LSTM" else (None, None)
        dtype = x.dtype
        work = dt.compute_dtype(dtype)

        def f(v: np.ndarray | None) -> np.ndarray | None:
            return None if v is None else np.asarray(v).astype(work, copy=False)

        x, w, r, b, h0, c0, p = map(f, (x, w, r, b, h0, c0, p))
        if a.layout == 1:
            x = x.swapaxes(0, 1)
            h0 = None if h0 is None else h0.swapaxes(0, 1)
            c0 = None if c0 is None else c0.swapaxes(0, 1)
        seq, batch, _ = x.shape
        hid = r.shape[-1]
        nd = a.num_directions
        if w.shape[0] != nd:
            raise ModelError(f"{op}: W has {w.shape[0]} directions but direction={a.direction!r} takes {nd}")
        lens = _seq_lens(lens, seq, batch, op)
        zeros = np.zeros((nd, batch, hid), work)
        h0 = zeros if h0 is None else h0
        c0 = zeros if c0 is None and op == "LSTM" else c0
        ys, hs, cs = [], [], []
        for d in range(nd):
            y, h, c = run_direction(a, d, x, w[d], r[d], None if b is None else b[d], h0[d],
                                    None if c0 is None else c0[d], None if p is None else p[d], lens,
                                    reverse=a.direction == "reverse" or d == 1)
            ys.append(y)
            hs.append(h)
            cs.append(c)
        y = np.stack(ys, axis=1)  # (seq, num_directions, batch, hidden)
        y_h = np.stack(hs)
        outs = [y, y_h] + ([np.stack(cs)] if op == "LSTM" else [])
        if a.layout == 1:
            outs = [outs[0].transpose(2, 0, 1, 3)] + [o.swapaxes(0, 1) for o in outs[1:]]
        n = attrs.get("_num_outputs", len(outs))
        return [np.ascontiguousarray(o).astype(dtype, copy=False) for o in outs[:n]]

    return ref


# ---------------------------------------------------------------------------------------------------------
# shape rules
# ---------------------------------------------------------------------------------------------------------
def _rule(ctx: InferCtx) -> list[TensorType]:
    """Shapes from X, R and the attributes; every other input must agree, symbol by symbol.

    seq_length and batch come from X (the layout says which axis is which), hidden_size from R's last axis
    (unified with the attribute when present), num_directions from `direction`. Where a dim is a symbol the
    equalities are recorded, so a state whose batch only differs at run time is refused before the call.
    """
    op = ctx.op_type
    cell = CELLS[op]
    try:
        a = parse_attrs(op, ctx.attr)
    except ModelError as e:
        ctx.error(str(e))
    ins = list(ctx.inputs) + [None] * (len(cell.inputs) - len(ctx.inputs))
    named = dict(zip(cell.inputs, ins))
    x, w, r = named["X"], named["W"], named["R"]
    if x is None or w is None or r is None:
        ctx.error("X, W and R are required inputs")
    for name, t in named.items():
        if t is None:
            continue
        rank = {"B": 2, "sequence_lens": 1, "P": 2}.get(name, 3)
        if len(t.shape) != rank:
            ctx.error(f"input {name} must have rank {rank}, got shape {tuple(t.shape)}")
        if name == "sequence_lens":
            if np.dtype(t.dtype) != np.int32:
                ctx.error(f"sequence_lens must be int32, got {np.dtype(t.dtype)}")
        elif np.dtype(t.dtype) != np.dtype(x.dtype):
            ctx.error(f"input {name} is {np.dtype(t.dtype)} but X is {np.dtype(x.dtype)} (they share type T)")
    if not dt.is_float(x.dtype) or np.dtype(x.dtype).itemsize > 8:
        ctx.error(f"X is {np.dtype(x.dtype)}; {op} takes float16, bfloat16, float32 or float64")

    def same(what: str, got: Any, want: Any, want_what: str) -> Any:
        got, want = norm(got), norm(want)
        if is_static(got) and is_static(want) and got != want:
            ctx.error(f"{what} is {got} but {want_what} is {want}",
                      "make the tensors agree (or fix the attribute)")
        return ctx.unify(got, want)

    if a.layout == 0:
        seq, batch, inp = x.shape
        batch_what = "X's batch (axis 1)"
    else:
        batch, seq, inp = x.shape
        batch_what = "X's batch (axis 0, layout=1)"
    nd = a.num_directions
    nd_what = f"num_directions (direction={a.direction!r})"
    hid = r.shape[2]
    if a.hidden_size is not None:
        hid = same("R's hidden size (axis 2)", hid, a.hidden_size, "the hidden_size attribute")
    g = cell.gates
    same("W's axis 0", w.shape[0], nd, nd_what)
    same(f"W's axis 1 ({g} gates x hidden)", w.shape[1], g * hid, f"{g} x hidden_size")
    same("W's input size (axis 2)", w.shape[2], inp, "X's input size (axis 2)")
    same("R's axis 0", r.shape[0], nd, nd_what)
    same(f"R's axis 1 ({g} gates x hidden)", r.shape[1], g * hid, f"{g} x hidden_size")
    if named["B"] is not None:
        bt = named["B"]
        same("B's axis 0", bt.shape[0], nd, nd_what)
        same(f"B's axis 1 (2 x {g} gates x hidden)", bt.shape[1], 2 * g * hid, f"{2 * g} x hidden_size")
    if named["sequence_lens"] is not None:
        batch = same("sequence_lens' length", named["sequence_lens"].shape[0], batch, batch_what)
    for name in ("initial_h", "initial_c"):
        t = named.get(name)
        if t is None:
            continue
        d_ax, b_ax = (0, 1) if a.layout == 0 else (1, 0)
        same(f"{name}'s num_directions (axis {d_ax})", t.shape[d_ax], nd, nd_what)
        batch = same(f"{name}'s batch (axis {b_ax})", t.shape[b_ax], batch, batch_what)
        same(f"{name}'s hidden size (axis 2)", t.shape[2], hid, "hidden_size")
    if named.get("P") is not None:
        pt = named["P"]
        same("P's axis 0", pt.shape[0], nd, nd_what)
        same("P's axis 1 (3 peepholes x hidden)", pt.shape[1], 3 * hid, "3 x hidden_size")
    y = (seq, nd, batch, hid) if a.layout == 0 else (batch, seq, nd, hid)
    state = (nd, batch, hid) if a.layout == 0 else (batch, nd, hid)
    outs = [TensorType(x.dtype, y)] + [TensorType(x.dtype, state)] * (len(cell.outputs) - 1)
    return outs[:max(ctx.num_outputs, 1)]


for _op in CELLS:
    register(_op, reference=_reference(_op), infer=_rule)
