"""Native LSTM / GRU / RNN layers (csrc/ds_rnn.c): the library, which nodes it serves, and a Python binding.

Why native: the numpy reference pays a few microseconds of dispatch per op per time step (a VAD-sized LSTM step
is ~20 numpy calls on 128-wide rows); the C kernel does a step as one recurrent product on weights packed once
plus one fused pass over the gates, and the projection of every step as one product up front.

For the compiler (lowering registry, programs of native calls):
- `supported(op, attrs, dtype)` says whether a node can run here, else why not (a sentence);
- `bind(op, w, r, attrs)` packs W and R once and returns an `RnnKernel`: `kernel.entry` is the C entry
  point's address, `kernel.args(...)` builds its int64 argument block (layout in ds_rnn.c's header),
  `kernel.workspace_floats(seq, batch)` the scratch it needs (a formula over `int | Expr`, so a plan can size
  its arena symbolically);
- `lstm_f32` / `gru_f32` / `rnn_f32` run one node on numpy arrays (tests, benchmarks).
The library links against `packed_gemm.library()` (loaded first, symbols global).

An LSTM whose R is 8-bit integers times a scale (what onnxruntime's DynamicQuantizeLSTM ships; the frontend
dequantizes it and names the scale in the node's `_r_scale` attribute, frontends/onnx_contrib.py) runs its
recurrent product on those integers (csrc/ds_rnn_q8.h: a quarter of the bytes per step, three VPDPBUSD per 64
weights; on AVX2 without VNNI, VPMADDWD on two 12-bit digits): `bind` recovers them from the float R, checking
that the scale reproduces every weight exactly, so the float R stays the node's meaning and anything else (another
scale, a CPU without AVX2) runs the float kernel.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynshape.codegen import bf16, packed_gemm
from dynshape.codegen.clib import I64, P, declare
from dynshape.codegen.lowering import BindRequest, NativeCall, NativeRule, register_lowering
from dynshape.errors import ConstraintViolation, DynshapeError
from dynshape.ir import opdef
from dynshape.ir.graph import Graph, Node
from dynshape.ops.dims import ceil_div
from dynshape.ops.rnn import CELLS, RnnAttrs, parse_attrs
from dynshape.options import Options
from dynshape.passes.values import const_value

ENTRY = {"LSTM": "ds_lstm_f32", "GRU": "ds_gru_f32", "RNN": "ds_rnn_f32"}
OP_CODE = {"LSTM": 0, "GRU": 1, "RNN": 2}
DIR_CODE = {"forward": 0, "reverse": 1, "bidirectional": 2}
RNN_ACT_CODE = {"tanh": 0, "relu": 1, "sigmoid": 2}
DEFAULTS = {"LSTM": ("sigmoid", "tanh", "tanh"), "GRU": ("sigmoid", "tanh")}
N_ARGS = 20
Q8_MAX_HIDDEN = 65536  # the int8 product's per-digit int32 sums stay below 2^31 up to this depth
Q8_MODES = ("auto", "native", "portable", "off")

class NotSupported(DynshapeError):
    """The native kernel does not implement this node's attributes (the reference still does)."""


LIBRARY = declare("ds_rnn", "ds_rnn.c", {**{fn: (P,) for fn in ENTRY.values()},
                                          "ds_rnn_workspace": (I64, I64, I64, I64, I64),
                                          "ds_rnn_activation_f32": (P, P, I64, I64), "ds_rnn_q8_native": ()},
                  openmp=True, needs=(packed_gemm.LIBRARY, bf16.LIBRARY),
                  restypes={"ds_rnn_workspace": ctypes.c_int64, "ds_rnn_q8_native": ctypes.c_int})


def library() -> ctypes.CDLL:
    """The kernel library (built once per machine, cached on disk); the micro-kernels load first."""
    return LIBRARY.load()


def activation(x: np.ndarray, kind: str) -> np.ndarray:
    """The kernel's own sigmoid or tanh on a float32 array (to test their accuracy)."""
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    library().ds_rnn_activation_f32(x.ctypes.data, y.ctypes.data, x.size, {"sigmoid": 0, "tanh": 1}[kind])
    return y


def supported(op: str, attrs: dict, dtype: Any = np.float32) -> str | None:
    """None when the kernel runs a node with these attributes and dtype, else the reason it does not."""
    if op not in ENTRY:
        return f"{op} is not a recurrent op"
    if np.dtype(dtype) != np.float32:
        return f"the native {op} is float32 only (X is {np.dtype(dtype)}): the reference runs it"
    try:
        a = parse_attrs(op, attrs.get)
    except DynshapeError as e:
        return str(e)
    for d, acts in enumerate(a.acts):
        names = tuple(x.name for x in acts)
        if op == "RNN":
            if names[0] not in RNN_ACT_CODE:
                return f"RNN activation {acts[0].name!r} (direction {d}): the native RNN has tanh, relu, sigmoid"
        elif names != DEFAULTS[op]:
            return (f"{op} activations {list(names)} (direction {d}): the native {op} has only the defaults "
                    f"{list(DEFAULTS[op])}")
    return None


@functools.cache
def q8_native() -> bool:
    """Whether the int8 recurrent product runs vector instructions here: VPDPBUSD (AVX512-VNNI) or, without it,
    VPMADDWD on 12-bit digits (AVX2), the library compiled for them (ds_rnn_q8_native says which)."""
    return q8_method() != "portable"


@functools.cache
def q8_method() -> str:
    """"VPDPBUSD", "VPMADDWD" or "portable": how the int8 recurrent product runs here."""
    lib = LIBRARY.try_load()
    which = int(lib.ds_rnn_q8_native()) if lib is not None else 0
    flags = bf16.cpu_flags()
    if which == 1 and "avx512_vnni" in flags:
        return "VPDPBUSD"
    if which == 2 and "avx2" in flags:
        return "VPMADDWD"
    return "portable"


def q8_row_floats(hidden: Any) -> Any:
    """Scratch floats per batch row and direction of the int8 product (dsq_row_floats in ds_rnn_q8.h)."""
    return ceil_div(4 * ceil_div(hidden, 4), 16) * 16 + 16


def pack_q8_weights(r: np.ndarray, scale: Any) -> np.ndarray | str:
    """R [dirs, n, k] float32 as ds_rnn_q8.h's packed 8-bit form, or the reason it has none.

    `scale` is one value per direction or per direction and row of R; every weight must be exactly
    float32(s * d) for an integer d, and each row's d must span at most 255 (true of any 8-bit q - z)."""
    nd, n, k = r.shape
    s = np.asarray(scale, np.float32).reshape(-1)
    if s.size not in (nd, nd * n):
        return f"R's scale has {s.size} values; R {list(r.shape)} takes {nd} or {nd * n}"
    s = np.broadcast_to(s.reshape(nd, -1), (nd, n))
    if k > Q8_MAX_HIDDEN:
        return f"hidden size {k} > {Q8_MAX_HIDDEN}"
    if not (np.isfinite(s).all() and (s != 0).all()):
        return "R's scale has zeros or non-finite values"
    with np.errstate(all="ignore"):
        d = np.rint(r / s[..., None])
    if not np.isfinite(d).all() or not np.array_equal((d * s[..., None]).astype(np.float32), r):
        return "R is not its scale times integers"
    lo, hi = d.min(axis=2), d.max(axis=2)
    if (hi - lo > 255).any():
        return "a row of R spans more than 256 steps of its scale"
    z = lo + 128.0  # q' = d - z lies in -128..127
    q = (d - z[..., None]).astype(np.int8)
    panels, groups = -(-n // 32), -(-k // 4)
    qp = np.zeros((nd, panels * 32, groups * 4), np.int8)
    qp[:, :n, :k] = q
    body = qp.reshape(nd, panels, 32, groups, 4).transpose(0, 1, 3, 2, 4).reshape(nd, -1)
    cols = np.zeros((nd, 3, panels * 32), np.float64)
    cols[:, 0, :n] = 2.0 ** 23 * q.sum(axis=2, dtype=np.int64)
    cols[:, 1, :n] = z
    cols[:, 2, :n] = s
    out = packed_gemm.aligned(nd * (body.shape[1] + cols[0].nbytes), np.uint8)
    out.reshape(nd, -1)[:] = np.concatenate([body.view(np.uint8), cols.reshape(nd, -1).view(np.uint8)], axis=1)
    return out


def _float_bits(v: float) -> int:
    return struct.unpack("<i", struct.pack("<f", v))[0]


def workspace_floats(op: str, seq: Any, batch: Any, hidden: Any, num_directions: Any) -> Any:
    """Floats of scratch one call needs (the same formula as ds_rnn_workspace, over `int | Expr`): 16 to align
    its start, then every buffer rounded up to 16 floats."""
    g, nd = CELLS[op].gates, num_directions

    def r16(n: Any) -> Any:
        return ceil_div(n, 16) * 16

    per_dir = r16(batch * g * hidden) + 4 * r16(batch * hidden)
    return 16 + r16(seq * batch * nd * g * hidden) + nd * per_dir + r16(nd * g * hidden) + r16(nd * hidden) \
        + r16(3 * hidden)


@dataclass
class RnnKernel:
    """One node's weights packed for the kernel, and how to call it."""

    op: str
    attrs: RnnAttrs
    input_size: int
    hidden: int
    wp: np.ndarray
    rp: np.ndarray
    rq: np.ndarray | None = None  # R as 8-bit integers (pack_q8_weights), used instead of rp
    wq: np.ndarray | None = None  # W as 8-bit integers (one "direction" of dirs * gates * hidden rows), for wp
    portable: bool = False  # rq's and wq's products in plain C instead of VPDPBUSD (tests)
    wbf16: bool = False  # wp holds W as bf16 pairs (bf16.pack_b_bf16): the input projection on bf16 tiles
    rbf16: bool = False  # rp holds R as bf16 pairs: each step's recurrent product on them

    @property
    def entry(self) -> int:
        """Address of the C entry point (one argument: the address of the block `args` returns)."""
        return ctypes.cast(getattr(library(), ENTRY[self.op]), ctypes.c_void_p).value

    @property
    def flags(self) -> int:
        a = self.attrs
        f = DIR_CODE[a.direction] | (a.input_forget << 2) | (a.layout << 3) | (a.linear_before_reset << 4)
        if self.op == "RNN":
            for d, acts in enumerate(a.acts):
                f |= RNN_ACT_CODE[acts[0].name] << (8 + 2 * d)
        return f | (self.portable << 5) | (self.wbf16 << 6) | (self.rbf16 << 7)

    def workspace_floats(self, seq: Any, batch: Any) -> Any:
        nd = self.attrs.num_directions
        ws = workspace_floats(self.op, seq, batch, self.hidden, nd)
        if self.rq is not None:
            ws = ws + nd * batch * q8_row_floats(self.hidden)
        if self.wq is not None:
            ws = ws + seq * batch * q8_row_floats(self.input_size)
        return ws

    def args(self, *, x: int, seq: int, batch: int, ws: int, b: int = 0, seq_lens: int = 0, h0: int = 0, c0: int = 0,
             p: int = 0, y: int = 0, y_h: int = 0, y_c: int = 0) -> np.ndarray:
        """The int64 argument block for addresses (0 for an omitted input or output) and runtime extents.

        The block holds the addresses of this kernel's packed W and R: keep the kernel alive while it is used.
        `ws` needs `workspace_floats(seq, batch)` floats; sequence_lens values must already be known to lie in
        0..seq (the kernel clamps them, it cannot raise)."""
        clip = np.inf if self.attrs.clip is None else self.attrs.clip
        rp, rq = (self.rp.ctypes.data, 0) if self.rq is None else (0, self.rq.ctypes.data)
        wp, wq = (self.wp.ctypes.data, 0) if self.wq is None else (0, self.wq.ctypes.data)
        return np.array([x, wp, rp, b, seq_lens, h0, c0, p, y, y_h, y_c, ws, seq, batch, self.input_size,
                         self.hidden, self.flags, _float_bits(clip), rq, wq], dtype=np.int64)

    def __call__(self, x: np.ndarray, b: np.ndarray | None = None, seq_lens: np.ndarray | None = None,
                 h0: np.ndarray | None = None, c0: np.ndarray | None = None, p: np.ndarray | None = None,
                 outputs: tuple[bool, ...] = (True, True, True)) -> tuple:
        """Run on arrays (checked and made contiguous float32); (Y, Y_h, Y_c), None for what is not asked."""
        a, op, hid, nd = self.attrs, self.op, self.hidden, self.attrs.num_directions
        g = CELLS[op].gates
        x = _f32(x, "X", 3)
        seq, batch = (x.shape[0], x.shape[1]) if a.layout == 0 else (x.shape[1], x.shape[0])
        if x.shape[2] != self.input_size:
            raise ConstraintViolation(f"{op}: X has input size {x.shape[2]}, the weights take {self.input_size}")
        state = (nd, batch, hid) if a.layout == 0 else (batch, nd, hid)
        keep = [x]

        def arr(v: np.ndarray | None, name: str, shape: tuple) -> int:
            if v is None:
                return 0
            v = _f32(v, name, len(shape))
            if v.shape != shape:
                raise ConstraintViolation(f"{op}: {name} has shape {v.shape}, expected {shape}")
            keep.append(v)
            return v.ctypes.data

        lens = 0
        if seq_lens is not None:
            sl = np.ascontiguousarray(seq_lens, dtype=np.int32)
            if sl.shape != (batch,) or ((sl < 0) | (sl > seq)).any():
                raise ConstraintViolation(f"{op}: sequence_lens must be {batch} values in 0..{seq}, got {sl}")
            keep.append(sl)
            lens = sl.ctypes.data
        want = [w and (i < 2 or op == "LSTM") for i, w in enumerate(outputs)] + [False] * (3 - len(outputs))
        y_shape = (seq, nd, batch, hid) if a.layout == 0 else (batch, seq, nd, hid)
        outs = [np.empty(s, np.float32) if w else None for w, s in zip(want, (y_shape, state, state))]
        ws = packed_gemm.aligned(int(self.workspace_floats(seq, batch)))
        block = self.args(x=x.ctypes.data, seq=seq, batch=batch, ws=ws.ctypes.data,
                          b=arr(b, "B", (nd, 2 * g * hid)), seq_lens=lens, h0=arr(h0, "initial_h", state),
                          c0=arr(c0, "initial_c", state), p=arr(p, "P", (nd, 3 * hid)),
                          **{k: 0 if o is None else o.ctypes.data for k, o in zip(("y", "y_h", "y_c"), outs)})
        getattr(library(), ENTRY[op])(block.ctypes.data)
        return tuple(outs)


def _f32(v: np.ndarray, name: str, rank: int) -> np.ndarray:
    v = np.asarray(v)
    if v.dtype != np.float32 or v.ndim != rank:
        raise ConstraintViolation(f"{name} must be a float32 array of rank {rank}, got {v.dtype} of rank {v.ndim}")
    return np.ascontiguousarray(v)


def bind(op: str, w: np.ndarray, r: np.ndarray, attrs: dict, *, r_scale: Any = None, w_scale: Any = None,
         q8: str = "auto", low: bool = False, low_r_bytes: int | None = None) -> RnnKernel:
    """Pack a node's W and R for the kernel (once: at bind / compile time); NotSupported says why not.

    With `r_scale` (an LSTM's R is that scale times 8-bit integers: pack_q8_weights), `q8` says how its
    recurrent product runs: "auto" on the integers where VPDPBUSD runs, else in float; "native" / "portable"
    on the integers (VPDPBUSD / plain C; NotSupported when R has no 8-bit form or, native, the CPU no VNNI);
    "off" in float. `w_scale` does the same for W and the input projection (best effort: a W without an
    8-bit form runs in float). `low` (precision="bf16", a CPU with its native tiles): the input projection, a
    product by constant weights, takes W as bf16 pairs and X's rows rounded to bf16 (float32 sums), where W has no
    8-bit form. `low_r_bytes` (None: never): each step's recurrent product takes R as bf16 pairs too (the state's
    rows rounded as read) where one direction's R holds at least that many float32 bytes and has no 8-bit form;
    sums, gates, cell and state stay float32 (Options.bf16_min_recurrent_bytes says why the size)."""
    reason = supported(op, attrs, np.asarray(w).dtype)
    if reason is not None:
        raise NotSupported(reason)
    a = parse_attrs(op, attrs.get)
    w, r = np.asarray(w, np.float32), np.asarray(r, np.float32)
    nd, g = a.num_directions, CELLS[op].gates
    if w.ndim != 3 or r.ndim != 3 or w.shape[0] != nd or r.shape[0] != nd:
        raise ConstraintViolation(f"{op}: W {w.shape} and R {r.shape} must be [{nd}, {g}*hidden, ...] "
                                  f"for direction={a.direction!r}")
    hid = r.shape[2]
    if w.shape[1] != g * hid or r.shape[1] != g * hid or (a.hidden_size is not None and a.hidden_size != hid):
        raise ConstraintViolation(f"{op}: W {w.shape} / R {r.shape} do not hold {g} gates of hidden size {hid}")
    rq, wq = _q8_forms(op, w, r, nd * g * hid, r_scale, w_scale, q8)
    wide = w.reshape(nd * g * hid, w.shape[2])
    wbf16, rbf16 = low and wq is None, low_r_bytes is not None and rq is None and r[0].nbytes >= low_r_bytes
    wp = [] if wq is not None else bf16.pack_b_bf16(wide, trans=True).reshape(-1) if wbf16 else \
        packed_gemm.pack_b(wide, trans=True).reshape(-1)
    pack = bf16.pack_b_bf16 if rbf16 else packed_gemm.pack_b
    if rq is not None:
        rp: list = []
    elif op == "GRU":  # z and r together, h apart (its product waits for r unless linear_before_reset)
        rp = [pack(m, trans=True).reshape(-1) for d in range(nd) for m in (r[d, :2 * hid], r[d, 2 * hid:])]
    else:
        rp = [pack(r[d], trans=True).reshape(-1) for d in range(nd)]
    wa = packed_gemm.aligned(len(wp), np.uint16) if wbf16 else packed_gemm.aligned(len(wp))
    ra = packed_gemm.aligned(sum(p.size for p in rp), np.uint16 if rbf16 else np.float32)
    wa[:] = wp
    ra[:] = np.concatenate(rp) if rp else []
    return RnnKernel(op, a, int(w.shape[2]), int(hid), wa, ra, rq, wq, q8 == "portable", wbf16, rbf16)


def _q8_forms(op: str, w: np.ndarray, r: np.ndarray, rows: int, r_scale: Any, w_scale: Any,
              q8: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """R's and W's 8-bit forms as bind's `q8` asks (None: that product runs in float)."""
    if q8 not in Q8_MODES:
        raise ValueError(f"q8={q8!r}: one of {Q8_MODES}")
    if r_scale is None or op != "LSTM" or q8 == "off" or (q8 == "auto" and not q8_native()):
        return None, None
    if q8 == "native" and not q8_native():
        raise NotSupported("LSTM: the 8-bit recurrent product needs AVX512-VNNI or AVX2 (and a compiler targeting "
                           "it)")
    rq = pack_q8_weights(r, r_scale)
    if isinstance(rq, str):
        if q8 != "auto":
            raise NotSupported(f"LSTM: no 8-bit recurrent product: {rq}")
        return None, None
    if w_scale is None:
        return rq, None
    nd = w.shape[0]
    ws = np.broadcast_to(np.asarray(w_scale, np.float32).reshape(nd, -1), (nd, rows // nd)).reshape(1, rows)
    wq = pack_q8_weights(w.reshape(1, rows, w.shape[2]), ws)
    return rq, None if isinstance(wq, str) else wq


def _run(op: str, x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray | None, seq_lens: np.ndarray | None,
         h0: np.ndarray | None, c0: np.ndarray | None, p: np.ndarray | None, attrs: dict) -> tuple:
    return bind(op, w, r, attrs)(x, b, seq_lens, h0, c0, p)


def lstm_f32(x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray | None = None,
             seq_lens: np.ndarray | None = None, h0: np.ndarray | None = None, c0: np.ndarray | None = None,
             p: np.ndarray | None = None, attrs: dict | None = None) -> tuple:
    """ONNX LSTM on float32 arrays -> (Y, Y_h, Y_c). Packs the weights per call: bind() once for repeated calls."""
    return _run("LSTM", x, w, r, b, seq_lens, h0, c0, p, attrs or {})


def gru_f32(x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray | None = None,
            seq_lens: np.ndarray | None = None, h0: np.ndarray | None = None, attrs: dict | None = None) -> tuple:
    """ONNX GRU on float32 arrays -> (Y, Y_h)."""
    return _run("GRU", x, w, r, b, seq_lens, h0, None, None, attrs or {})[:2]


def rnn_f32(x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray | None = None,
            seq_lens: np.ndarray | None = None, h0: np.ndarray | None = None, attrs: dict | None = None) -> tuple:
    """ONNX RNN on float32 arrays -> (Y, Y_h)."""
    return _run("RNN", x, w, r, b, seq_lens, h0, None, None, attrs or {})[:2]


# ---- lowerings: LSTM / GRU / RNN nodes on this kernel ------------------------------------------------------
_bound: dict[tuple, tuple] = {}  # (op, id(W), id(R), attrs) -> (weakref W, weakref R, RnnKernel)


def _kernel_for(op: str, w: np.ndarray, r: np.ndarray, attrs: dict, low: bool = False,
                low_r_bytes: int | None = None) -> RnnKernel:
    """bind() once per node's weights (shared by every plan, key and variant), while the weights live; an
    `_r_scale` attribute (frontends/onnx_contrib.py) lets an LSTM's recurrent product run on 8-bit R."""
    params = {k: v for k, v in attrs.items() if not k.startswith("_")}
    r_scale, w_scale = attrs.get("_r_scale"), attrs.get("_w_scale")
    scales = tuple(None if v is None else tuple(v) for v in (r_scale, w_scale))
    key = (op, id(w), id(r), repr(sorted(params.items())), scales, low, low_r_bytes)
    hit = _bound.get(key)
    if hit is not None and hit[0]() is w and hit[1]() is r:
        return hit[2]
    k = bind(op, w, r, params, r_scale=r_scale, w_scale=w_scale, low=low, low_r_bytes=low_r_bytes)
    try:
        _bound[key] = (weakref.ref(w), weakref.ref(r), k)
    except TypeError:  # not weak-referenceable: no sharing
        pass
    return k


def _accepts(node: Node, graph: Graph) -> str | None:
    x = graph.types.get(node.inputs[0])
    reason = supported(node.op_type, node.attrs, getattr(x, "dtype", None) or np.float32)
    if reason is not None:
        return reason
    if getattr(x, "shape", None) is None or len(x.shape) != 3:
        return "X is not a rank-3 tensor"
    for name in node.inputs[1:3]:
        if const_value(name, graph) is None:
            return f"{name!r} (W or R) is not a constant: the native kernel packs the weights once"
    for i, name in enumerate(node.inputs[3:], start=3):
        t = graph.types.get(name) if name else None
        if name and (t is None or np.dtype(t.dtype) != (np.int32 if i == 4 else np.float32)):
            return f"input {i} ({name!r}) is {getattr(t, 'dtype', '?')}"
    return None


def _low(options: Options) -> bool:
    """Whether the input projection runs in bf16: precision="bf16" (native; the emulated precision keeps it
    float32, the tests' reference for the product kernels)."""
    return options.precision == "bf16"


def _lows(options: Options) -> dict:
    """_kernel_for's precision arguments under these options: the projection's (`_low`), and from what size of R
    the recurrent product takes bf16 too."""
    low = _low(options)
    return {"low": low, "low_r_bytes": options.bf16_min_recurrent_bytes if low else None}


def _describe(node: Node, graph: Graph, options: Options) -> str | None:
    """Which of the node's products run on 8-bit weights or in bf16 (what explain prints): 8-bit only where bind
    could pack them exactly, on a CPU with VPDPBUSD; under precision="bf16" the input projection in bf16 where W
    has no 8-bit form, and the recurrent product where R has none and is large enough; the rest in float32."""
    if not _low(options) and "_r_scale" not in node.attrs and "_w_scale" not in node.attrs:
        return None
    w, r = (const_value(x, graph) for x in node.inputs[1:3])
    try:
        k = _kernel_for(node.op_type, np.asarray(w, np.float32), np.asarray(r, np.float32), node.attrs,
                        **_lows(options))
    except NotSupported:
        return None
    if "_r_scale" not in node.attrs and "_w_scale" not in node.attrs:
        if k.rbf16:
            return "input projection and recurrent product in bf16 (bf16 operands, float32 sums); gates and state " \
                "in float32"
        return "input projection in bf16 (bf16 operands, float32 sums); the recurrent product in float32 (R under " \
            "bf16_min_recurrent_bytes)"
    int8 = [name for name, q in (("W", k.wq), ("R", k.rq)) if q is not None]
    said = f"{' and '.join(int8)} products on 8-bit weights ({q8_method()}, exact int32 sums)" if int8 else \
        "float32 (8-bit weights declared, but not exactly packable or no AVX512-VNNI / AVX2 here)"
    low_ones = [name for name, on in (("input projection", k.wbf16), ("recurrent product", k.rbf16)) if on]
    return f"{said}; {' and '.join(low_ones)} in bf16" if low_ones else said


def _check_lens(lens: np.ndarray, seq: int, label: str) -> None:
    if lens.size and (lens.min() < 0 or lens.max() > seq):
        raise ConstraintViolation(f"{label}: sequence_lens must lie in 0..{seq} (the sequence length), got "
                                  f"{lens.min()}..{lens.max()}")


def _bind_native(r: BindRequest) -> list:
    op, node = r.node.op_type, r.node
    ins = list(r.ins) + [None] * (8 - len(r.ins))
    outs = list(r.outs) + [None] * (3 - len(r.outs))
    k = _kernel_for(op, ins[1], ins[2], node.attrs, **_lows(r.options))
    x = ins[0]
    seq, batch = (x.shape[0], x.shape[1]) if k.attrs.layout == 0 else (x.shape[1], x.shape[0])
    floats = int(k.workspace_floats(seq, batch))
    # the plan's shared scratch (one per arena, grown to the largest key), else a buffer of this plan's own
    ws = r.scratch(4 * floats, f"rnn:{node.name}") if r.scratch is not None else packed_gemm.aligned(floats)
    addr = {i: r.addr(a) for i, a in enumerate(ins) if a is not None}
    block = k.args(x=addr[0], seq=seq, batch=batch, ws=ws.ctypes.data, b=addr.get(3, 0), seq_lens=addr.get(4, 0),
                   h0=addr.get(5, 0), c0=addr.get(6, 0), p=addr.get(7, 0),
                   **{n: 0 if o is None else r.addr(o) for n, o in zip(("y", "y_h", "y_c"), outs)})
    r.keep.extend((k, ws, block))
    calls: list = []
    if ins[4] is not None and node.inputs[4] not in r.fixed:  # data: checked per call (the kernel cannot raise)
        calls.append(functools.partial(_check_lens, ins[4], seq, node.label()))
    elif ins[4] is not None:
        _check_lens(ins[4], seq, node.label())
    calls.append(NativeCall(getattr(library(), ENTRY[op]), (block.ctypes.data,)))
    return calls


def _numpy_for(op: str):
    """The unplanned path's lowering: the same kernel on arrays (weights packed once per node); a node the
    kernel does not implement, or another dtype, runs the reference."""

    def make(attrs: dict, options: Options):
        params = {k: v for k, v in attrs.items() if not k.startswith("_")}
        n_out = attrs.get("_num_outputs", 3 if op == "LSTM" else 2)
        reference = opdef.lookup(op).reference

        def fn(args: list) -> list:
            x, w, r = args[0], args[1], args[2]
            if x.dtype != np.float32 or supported(op, params, x.dtype) is not None:
                return reference(args, attrs)
            b, lens, h0, c0, p = (list(args[3:]) + [None] * 5)[:5]
            k = _kernel_for(op, w, r, attrs, **_lows(options))
            if lens is not None:
                lens = np.asarray(lens)
                _check_lens(lens, x.shape[0] if k.attrs.layout == 0 else x.shape[1], op)
            outs = k(x, b, lens, h0, c0 if op == "LSTM" else None, p if op == "LSTM" else None,
                     outputs=tuple(i < n_out for i in range(3)))
            return list(outs[:n_out])

        return fn

    return make


for _op in ENTRY:
    register_lowering(_op, "native", NativeRule(_accepts, _bind_native, describe=_describe))
    register_lowering(_op, "numpy", _numpy_for(_op))
