"""The fusion rules, as data: each one a `Rule(name, option, match)` the driver applies in order.

A rule's `match(schedule, slot, item)` looks at one item and returns the bigger item it becomes (and the
neighbouring slots that one absorbs), or None. Matches only read the schedule; the driver applies them.
"""

from __future__ import annotations

import numpy as np

from dynshape.ir import opdef
from dynshape.ir.graph import Graph, Node
from dynshape.ir.opdef import PoolKind, is_default_domain
from dynshape.ir.types import TensorType
from dynshape.passes.items import Attention, Conv, ConvChain, Elementwise, Item, Pool, Product, Single, Softmax
from dynshape.passes.qproduct import match_qproduct
from dynshape.passes.schedule import Match, Rule, Schedule, tile_epilogue
from dynshape.passes.values import const_value, is_float32, reduction_axes

_HEADS_PERM = [0, 2, 1, 3]


def _dedup(*parts: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(x for p in parts for x in p))


# ---- softmax ------------------------------------------------------------------------------------------------
def _softmax_node(item: Item, s: Schedule) -> Node | None:
    if not isinstance(item, Single) or item.node.op_type != "Softmax" or not is_default_domain(item.node):
        return None
    n = item.node
    t = s.type(n.outputs[0]) if n.outputs else None
    if not is_float32(t) or not t.shape:
        return None
    if s.graph.opset >= 13:
        return n if int(n.attrs.get("axis", -1)) in (-1, len(t.shape) - 1) else None
    # opset < 13 flattens from `axis` (default 1) on: the same rows when every axis but the last of those is 1
    # (a classifier's (batch, 1, 1, classes) after a channels-last global pool)
    axis = int(n.attrs.get("axis", 1)) % len(t.shape)
    return n if all(d == 1 for d in t.shape[axis:-1]) else None


def match_softmax(s: Schedule, i: int, item: Item) -> Match | None:
    """A last-axis Softmax absorbs the elementwise group that alone feeds it and the one that consumes it."""
    node = _softmax_node(item, s)
    if node is None:
        return None
    x, y = node.inputs[0], node.outputs[0]
    shape = tuple(s.type(y).shape)
    pre_i = s.slot_of.get(x)
    pre = s.items[pre_i] if pre_i is not None else None
    if not (isinstance(pre, Elementwise) and pre.outputs == (x,) and pre.shape == shape
            and all(c is node for c in s.consumers.get(x, []))):
        pre, pre_i = None, None
    at = pre_i if pre_i is not None else i
    post_i = s.item_reading(y)
    post = s.items[post_i] if post_i is not None else None
    if not (isinstance(post, Elementwise) and post.shape == shape and y not in s.graph_outputs
            and s.read_only_by(y, post_i) and all(s.slot_of.get(z, -1) < at for z in post.inputs if z != y)):
        post, post_i = None, None
    inputs = _dedup(pre.inputs if pre else (x,), [z for z in (post.inputs if post else ()) if z != y])
    outputs = post.outputs if post else (y,)
    return Match(Softmax(inputs, outputs, node, pre, post, shape), at,
                 frozenset(j for j in (i, pre_i, post_i) if j is not None))


# ---- products by constant matrices ------------------------------------------------------------------------
def product_operands(n: Node, s: Schedule) -> tuple[str, bool] | None:
    """(weight, transB) when n is a float32 product by a constant matrix that a Product item can run."""
    if not is_default_domain(n) or len(n.outputs) != 1 or len(n.inputs) < 2 or "" in n.inputs[:2]:
        return None
    a, b, y = (s.type(x) for x in (n.inputs[0], n.inputs[1], n.outputs[0]))
    if not (is_float32(a) and is_float32(y) and is_float32(b) and a.shape and len(b.shape) == 2):
        return None
    w = const_value(n.inputs[1], s.graph)
    if w is None or w.dtype != np.float32 or not all(isinstance(d, int) and d > 0 for d in b.shape):
        return None
    if n.op_type == "MatMul":
        return n.inputs[1], False
    if n.op_type == "Gemm" and not n.attrs.get("transA", 0) and len(a.shape) == 2:
        if len(n.inputs) > 2 and n.inputs[2] and not is_float32(s.type(n.inputs[2])):
            return None
        return n.inputs[1], bool(n.attrs.get("transB", 0))
    return None


def match_product(s: Schedule, i: int, item: Item) -> Match | None:
    """A product by a constant matrix takes, as its epilogue, the elementwise group that alone reads it."""
    if not isinstance(item, Single) or (ok := product_operands(item.node, s)) is None:
        return None
    node = item.node
    y = node.outputs[0]
    shape = tuple(s.type(y).shape)
    epi, j = tile_epilogue(s, y, shape)

    def make(epi: Elementwise | None) -> Product:
        # A, then the epilogue's operands (A again when the epilogue reads it: a residual of the input)
        inputs = (node.inputs[0], *_dedup([z for z in node.inputs[2:3] if z],
                                          [z for z in (epi.inputs if epi else ()) if z != y]))
        return Product(inputs, epi.outputs if epi else (y,), node, ok[0], ok[1], epi, shape)

    alone = Match(make(None), i, frozenset((i,)))
    return Match(make(epi), j, frozenset((i, j)), alone) if epi is not None else alone


def match_layernorm(s: Schedule, i: int, item: Item) -> Match | None:
    """A product whose result only a last-axis LayerNormalization reads (constant scale and bias over the whole
    last axis) normalises each block of rows while it is in cache: the residual add + LayerNorm that closes
    every transformer sub-layer."""
    if not isinstance(item, Product) or len(item.outputs) != 1 or not item.shape or item.layernorm is not None:
        return None
    y = item.outputs[0]
    ln = s.sole_reader(y)
    if ln is None or ln.op_type != "LayerNormalization" or ln.inputs[0] != y or len(ln.inputs) < 2 \
            or any(o for o in ln.outputs[1:]) or ln.attrs.get("axis", -1) not in (-1, len(item.shape) - 1):
        return None
    n = item.shape[-1]
    params = [const_value(x, s.graph) for x in ln.inputs[1:3] if x]
    if not all(c is not None and c.dtype == np.float32 and c.shape in ((n,), (1, n)) for c in params):
        return None
    if not is_float32(s.type(ln.outputs[0])):
        return None
    new = Product(item.inputs + tuple(x for x in ln.inputs[1:3] if x), (ln.outputs[0],), item.node, item.weight,
                  item.trans_b, item.epilogue, item.shape, item.folded, item.heads, ln)
    return Match(new, i, frozenset((i, s.slot_of[ln.outputs[0]])))


def match_product_softmax(s: Schedule, i: int, item: Item) -> Match | None:
    """A product whose result only a last-axis Softmax item reads (a classifier or CTC head: MatMul, + bias,
    Softmax over thousands of classes) takes it: each block of rows is normalised while in cache, instead of
    the product writing its result out and the softmax reading it back (text recognition's 320 x 6625 head:
    8.5 MB each way). The softmax's other operands must be one value or a row vector, made before the product."""
    if not isinstance(item, Product) or len(item.outputs) != 1 or not item.shape or item.layernorm is not None \
            or item.folded or item.softmax is not None:
        return None
    y = item.outputs[0]
    j = s.item_reading(y)
    sm = s.items[j] if j is not None else None
    if not isinstance(sm, Softmax) or y in s.graph_outputs or not s.read_only_by(y, j) or len(sm.outputs) != 1 \
            or tuple(sm.shape) != tuple(item.shape) or (sm.post is not None and y in sm.post.inputs):
        return None  # (the post group reading the product itself: the row holds the softmax by then)
    n = item.shape[-1]
    extra = [z for z in sm.inputs if z != y]
    for z in extra:
        t = s.type(z)
        dims = tuple(t.shape) if t is not None else ()
        if t is None or not is_float32(t) or s.slot_of.get(z, -1) >= i or len(dims) > len(item.shape) \
                or not all(isinstance(d, int) for d in dims) or any(d != 1 for d in dims[:-1]) \
                or (dims and dims[-1] not in (1, n)):
            return None
    new = Product(item.inputs + tuple(z for z in dict.fromkeys(extra) if z not in item.inputs), sm.outputs,
                  item.node, item.weight, item.trans_b, item.epilogue, item.shape, softmax=sm)
    return Match(new, i, frozenset((i, j)))


# ---- convolutions ---------------------------------------------------------------------------------------------
def _channels_last(item: Item, op: str) -> Node | None:
    if isinstance(item, Single) and item.node.op_type == "ChannelsLast" and item.node.domain == "dynshape" \
            and item.node.attrs.get("op") == op:
        return item.node
    return None


def match_conv(s: Schedule, i: int, item: Item) -> Match | None:
    """A channels-last float32 Conv or ConvTranspose with constant weights (and bias) takes its epilogue. 1x1
    convolutions too: the conv kernel's 6 x 64 micro-tiles beat the product kernel's 12 x 32 on them (ResNet-50's
    64 -> 256 on 56x56 and 128 -> 512 on 28x28 went from 0.91-0.95 to 0.98-1.00 of onnxruntime's time)."""
    node = _channels_last(item, "Conv") or _channels_last(item, "ConvTranspose")
    if node is None or len(node.inputs) < 2:
        return None
    x, w, y = (s.type(v) for v in (node.inputs[0], node.inputs[1], node.outputs[0]))
    wv = const_value(node.inputs[1], s.graph)
    if not (is_float32(x) and is_float32(y) and wv is not None and wv.dtype == np.float32 and len(x.shape) in (3, 4)):
        return None
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    if bias is not None and not is_float32(s.type(bias)):
        return None
    shape = tuple(y.shape)
    epi, j = tile_epilogue(s, node.outputs[0], shape)
    at = j if j is not None else i
    absorbed = frozenset(k for k in (i, j) if k is not None)
    def make(epi: Elementwise | None) -> Item:
        ins = (node.inputs[0], *_dedup([bias] if bias else [],
                                       [z for z in (epi.inputs if epi else ()) if z != node.outputs[0]]))
        outs = epi.outputs if epi else (node.outputs[0],)
        return Conv(ins, outs, node, node.inputs[1], epi, shape)

    alone = Match(make(None), i, frozenset((i,)))
    return Match(make(epi), at, absorbed, alone) if epi is not None else alone


# the activations conv tiles apply in registers (codegen/lower/conv.py); Relu6 is Clip(y, 0, 6)
FINISHING_ACTS = ("Relu", "HardSwish", "SiLU", "Relu6")


def finishing_act(group: tuple | list, y: str, graph: Graph | None = None) -> str | None:
    """Which of FINISHING_ACTS an epilogue group is, applied to the conv's output `y` and ending the group: one
    Relu or HardSwish of y, or SiLU written as Sigmoid(y) then Mul of y and it (either order); with the `graph`
    (its constants), HardSwish also written out as y * Clip(y + 3, 0, 6) / 6 (Paddle's exports: every conv of
    PP-OCR's MobileNetV3) or y * HardSigmoid(y) (alpha 1/6, beta 1/2); else None."""
    if not group or any(not is_default_domain(n) for n in group):
        return None
    if len(group) == 1 and group[0].op_type in ("Relu", "HardSwish") and list(group[0].inputs) == [y]:
        return group[0].op_type
    if len(group) == 1 and graph is not None and group[0].op_type == "Clip" and list(group[0].inputs[:1]) == [y] \
            and _clip_bounds(group[0], graph) == (0.0, 6.0):
        return "Relu6"
    if len(group) == 2:
        sig, mul = group
        if sig.op_type == "Sigmoid" and list(sig.inputs) == [y] and mul.op_type == "Mul" \
                and sorted(mul.inputs) == sorted([y, sig.outputs[0]]) and y != sig.outputs[0]:
            return "SiLU"
    if graph is not None and _hardswish_written_out(group, y, graph):
        return "HardSwish"
    return None


def _clip_bounds(clip: Node, graph: Graph) -> tuple[float, float] | None:
    """A Clip's (min, max) when both are given as constants (inputs from opset 11, attributes before), else None."""
    if "min" in clip.attrs or "max" in clip.attrs or len(clip.inputs) < 2:
        lo, hi = clip.attrs.get("min"), clip.attrs.get("max")
        return None if lo is None or hi is None else (float(lo), float(hi))
    values = [const_value(x, graph) if x else None for x in (list(clip.inputs[1:3]) + [""])[:2]]
    if any(v is None or np.size(v) != 1 for v in values):
        return None
    return float(np.asarray(values[0]).reshape(-1)[0]), float(np.asarray(values[1]).reshape(-1)[0])


def _hardswish_written_out(group: tuple | list, y: str, graph: Graph) -> bool:
    """y * Clip(y + 3, 0, 6) / 6 (Add, Clip, Mul, Div; Mul and Div either way round) or Mul(y, HardSigmoid(y)) at
    alpha 1/6, beta 1/2: HardSwish of y, as ONNX defines it (y * max(0, min(1, y / 6 + 1 / 2)))."""

    def is_const(x: str, value: float) -> bool:
        v = const_value(x, graph) if x else None
        return v is not None and np.size(v) == 1 and float(np.asarray(v).reshape(-1)[0]) == value

    def other(node: Node, x: str) -> str | None:
        ins = list(node.inputs)
        return ins[1 - ins.index(x)] if len(ins) == 2 and x in ins and ins[0] != ins[1] else None

    if len(group) == 2:
        hs, mul = group
        return hs.op_type == "HardSigmoid" and list(hs.inputs) == [y] and mul.op_type == "Mul" \
            and other(mul, y) == hs.outputs[0] and np.float32(hs.attrs.get("alpha", 0.2)) == np.float32(1 / 6) \
            and np.float32(hs.attrs.get("beta", 0.5)) == np.float32(0.5)
    if len(group) != 4 or [n.op_type for n in group[:2]] != ["Add", "Clip"]:
        return False
    add, clip, a, b = group
    if not is_const(other(add, y) or "", 3.0) or list(clip.inputs[:1]) != [add.outputs[0]]:
        return False
    if _clip_bounds(clip, graph) != (0.0, 6.0):
        return False
    c = clip.outputs[0]
    if a.op_type == "Mul" and b.op_type == "Div":  # (y * c) / 6
        return other(a, y) == c and len(b.inputs) == 2 and b.inputs[0] == a.outputs[0] and is_const(b.inputs[1], 6.0)
    if a.op_type == "Div" and b.op_type == "Mul":  # y * (c / 6)
        return list(a.inputs[:1]) == [c] and is_const(a.inputs[1], 6.0) and other(b, y) == a.outputs[0]
    return False


def _conv_geometry(item: Conv, s: Schedule) -> tuple[np.ndarray, dict] | None:
    node = item.node
    w = const_value(node.inputs[1], s.graph)
    x = s.type(node.inputs[0])
    if node.attrs.get("op") != "Conv" or w is None or w.ndim != 4 or x is None or len(x.shape) != 4 \
            or not isinstance(x.shape[-1], int) or not isinstance(item.shape[-1], int):
        return None
    return w, node.attrs


def _finishes_in_tiles(item: Conv, s: Schedule) -> bool:
    """The conv's epilogue is nothing or one of FINISHING_ACTS of it, its bias (if any) a constant vector: what
    the conv tiles apply in registers, so the conv writes finished values wherever it writes."""
    node = item.node
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    if bias is not None and const_value(bias, s.graph) is None:
        return False
    group = item.epilogue.group if item.epilogue else ()
    return not group or finishing_act(group, node.outputs[0], s.graph) is not None


def match_pw_dw(s: Schedule, i: int, item: Item) -> Match | None:
    """A 1x1 stride-1 unpadded ungrouped conv (finished in its tiles) whose result only a depthwise conv reads
    becomes one ConvChain: the expansion of a MobileNet block is computed a few rows at a time into scratch
    that the depthwise reads in cache (text detection's 8 -> 32 expansion on 240x320 wrote and read back 9.8 MB)."""
    if not isinstance(item, Conv) or len(item.outputs) != 1 or (geo := _conv_geometry(item, s)) is None:
        return None
    w, a = geo
    if w.shape[2:] != (1, 1) or int(a.get("group", 1)) != 1 or any(a.get("pads", [0] * 4)) \
            or any(st != 1 for st in a.get("strides", [1, 1])) \
            or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or not _finishes_in_tiles(item, s):
        return None
    y = item.outputs[0]
    j = s.item_reading(y)
    dw = s.items[j] if j is not None else None
    if not isinstance(dw, Conv) or y in s.graph_outputs or not s.read_only_by(y, j) or dw.node.inputs[0] != y \
            or (dgeo := _conv_geometry(dw, s)) is None:
        return None
    wd, ad = dgeo
    c = item.shape[-1]
    if wd.shape[:2] != (c, 1) or int(ad.get("group", 1)) != c or dw.shape[-1] != c or y in dw.inputs[1:]:
        return None
    inputs = _dedup(item.inputs, [z for z in dw.inputs if z != y])
    return Match(ConvChain(inputs, dw.outputs, item, dw), j, frozenset((i, j)))


PROLOGUE_OPS = ("Mul", "Add", "Relu")  # the prologue's steps, in this order, each at most once


def prologue_of(group: tuple[Node, ...] | list[Node], x: str, channels: int, graph: Graph) -> dict[str, str] | None:
    """{"x": its input, "Mul": scale, "Add": shift, "Relu": ""} (the steps present) where an elementwise `group`
    computes Relu(x * scale + shift) of a channels-last `x`, scale and shift constants of one value a channel
    (`channels` of them), any of the three absent but one; else None."""
    steps: dict[str, str] = {}
    cur = None
    order = list(PROLOGUE_OPS)
    for n in group:
        if not is_default_domain(n) or n.op_type not in order or len(n.outputs) != 1:
            return None
        order = order[order.index(n.op_type) + 1:]
        if n.op_type == "Relu":
            if cur is None or list(n.inputs) != [cur]:
                return None
            steps["Relu"] = ""
        else:
            ins = list(n.inputs)
            if len(ins) != 2:
                return None
            if cur is not None and cur in ins:
                c = ins[1 - ins.index(cur)]
            elif cur is None:
                known = [z for z in ins if const_value(z, graph) is not None]
                if len(known) != 1:
                    return None
                c = known[0]
                steps["x"] = ins[1 - ins.index(c)]
            else:
                return None
            cv = const_value(c, graph)
            if cv is None or cv.dtype != np.float32 or cv.size != channels or cv.shape[-1] != channels:
                return None
            steps[n.op_type] = c
        cur = n.outputs[0]
    if cur != x or "x" not in steps:
        return None
    # the input itself is the conv's input's shape (no broadcast: the kernel reads it as the conv's rows)
    tx, ty = graph.types.get(steps["x"]), graph.types.get(x)
    same = is_float32(tx) and is_float32(ty) and tuple(tx.shape) == tuple(ty.shape)
    return steps if same else None


def match_conv_prologue(s: Schedule, i: int, item: Item) -> Match | None:
    """bf16: a 1x1 stride-1 unpadded ungrouped conv on at least 32 channels that runs in bf16 (not under
    bf16_min_conv_macs) takes the elementwise group that alone made its input, where that group is a
    per-channel scale, shift and Relu (prologue_of): the kernel applies it to each input row as it rounds the row
    to bf16 (csrc/ds_gemm_bf16.c), and the map it would have written and the conv read back is never made.
    DenseNet: every layer's BatchNormalization + Relu of the growing concatenation."""
    o = s.options
    if o is None or o.precision not in ("bf16", "bf16-emulated") or not isinstance(item, Conv) \
            or item.prologue is not None or (geo := _conv_geometry(item, s)) is None:
        return None
    w, a = geo
    x = item.node.inputs[0]
    if w.shape[2:] != (1, 1) or int(a.get("group", 1)) != 1 or any(a.get("pads", [0] * 4)) \
            or any(st != 1 for st in a.get("strides", [1, 1])) or w.shape[1] < 32 \
            or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") \
            or w.shape[0] * w.shape[1] < o.bf16_min_conv_macs or x in s.graph_outputs:
        return None
    j = s.slot_of.get(x)
    pro = s.items[j] if j is not None else None
    if not isinstance(pro, Elementwise) or pro.outputs != (x,) or not s.read_only_by(x, i):
        return None
    steps = prologue_of(pro.group, x, int(w.shape[1]), s.graph)
    if steps is None:
        return None
    ops = [steps[k] for k in ("Mul", "Add") if k in steps]
    if set(ops) & set(item.inputs[1:]):  # a constant of both: the epilogue's operands are the conv's own
        return None
    inputs = _dedup([steps["x"]], list(item.inputs[1:]), ops)
    new = Conv(inputs, item.outputs, item.node, item.weight, item.epilogue, item.shape, pro)
    return Match(new, i, frozenset((i, j)))


# the pool kinds codegen/lower/pool.py's kernel computes (an Lp pool stays the wrapped op's own lowering)
_KERNEL_POOLS = frozenset({PoolKind.MAX, PoolKind.AVERAGE})


def _kernel_pool(op_type: object) -> bool:
    op = opdef.lookup(op_type) if isinstance(op_type, str) else None
    return op is not None and op.pool in _KERNEL_POOLS


def spatial_reduction(n: Node, graph: Graph) -> PoolKind | None:
    """AVERAGE / MAX when n is a ReduceMean / ReduceMax over every spatial axis (1 .. r-2) of a channels-last
    tensor (the SE block's pool, once the layout pass moved it to channels last; a classifier's global pool
    over a length, dims dropped: (N, C) is (N, 1, C)'s memory)."""
    if n.op_type not in ("ReduceMean", "ReduceMax") or not is_default_domain(n):
        return None
    x = graph.types.get(n.inputs[0])
    if not isinstance(x, TensorType) or len(x.shape) < 3:
        return None
    axes = reduction_axes(n, lambda name: const_value(name, graph))
    r = len(x.shape)
    if axes is None or sorted(a % r for a in axes) != list(range(1, r - 1)):
        return None
    return PoolKind.AVERAGE if n.op_type == "ReduceMean" else PoolKind.MAX


def match_pool(s: Schedule, i: int, item: Item) -> Match | None:
    """A channels-last float32 pooling, or a global reduction of a channels-last tensor, runs its own kernel."""
    if not isinstance(item, Single):
        return None
    n = item.node
    cl = n.op_type == "ChannelsLast" and n.domain == "dynshape" and _kernel_pool(n.attrs.get("op"))
    if not (cl or spatial_reduction(n, s.graph)) or not is_float32(s.type(n.inputs[0])) \
            or len([o for o in n.outputs if o]) != 1 or not is_float32(s.type(n.outputs[0])):
        return None
    return Match(Pool((n.inputs[0],), (n.outputs[0],), n, tuple(s.type(n.outputs[0]).shape)), i, frozenset((i,)))


# ---- attention ------------------------------------------------------------------------------------------------
def _batched_matmul(item: Item, s: Schedule) -> tuple | None:
    """(a, b, y) types of a float32 MatMul of two matrix stacks with the same batch dims, else None."""
    if not isinstance(item, Single):
        return None
    n = item.node
    if n.op_type != "MatMul" or not is_default_domain(n) or len(n.outputs) != 1:
        return None
    a, b, y = (s.type(x) for x in (*n.inputs[:2], n.outputs[0]))
    if not (is_float32(a) and is_float32(b) and is_float32(y)) or len(a.shape) < 2 or len(a.shape) != len(b.shape):
        return None
    if tuple(a.shape[:-2]) != tuple(b.shape[:-2]) or const_value(n.inputs[1], s.graph) is not None:
        return None
    return a, b, y


def transposed_rows(kt: str, s: Schedule) -> tuple[str, list[Node]] | None:
    """(K, movement nodes) when the only use of the chain is to make `kt` = K with its last two axes swapped,
    K a stack of row-major matrices: a Transpose (..., 2, 1), or torch's Reshape (b*h, s, d) -> Transpose
    (0, 2, 1) -> Reshape (b, h, d, s). Each value on the way has one reader."""
    chain: list[Node] = []
    x = kt
    for _ in range(3):
        m = s.producer.get(x)
        if m is None or m.op_type not in ("Reshape", "Transpose") or len(s.consumers.get(x, [])) != 1 \
                or x in s.graph_outputs or not is_float32(s.type(m.inputs[0])):
            break
        chain.insert(0, m)
        x = m.inputs[0]
        shapes = [tuple(s.type(v).shape) for v in (x, *(c.outputs[0] for c in chain))]
        perms = [list(c.attrs.get("perm", [])) if c.op_type == "Transpose" else None for c in chain]
        r = len(shapes[0])
        if len(chain) == 1 and perms[0] == [*range(r - 2), r - 1, r - 2] and r >= 3:
            return x, chain
        if len(chain) == 3 and [c.op_type for c in chain] == ["Reshape", "Transpose", "Reshape"] \
                and perms[1] == [0, 2, 1] and r == 4:
            (b, h, sq, d), merged, swapped, out = shapes
            if merged == (h * b, sq, d) and swapped == (h * b, d, sq) and out == (b, h, d, sq):
                return x, chain
    return None


def match_attention(s: Schedule, i: int, item: Item) -> Match | None:
    """MatMul -> Softmax item -> MatMul, each result with one reader, becomes one Attention item."""
    if (t1 := _batched_matmul(item, s)) is None:
        return None
    scores = item.node
    sc = scores.outputs[0]
    j = s.item_reading(sc)
    sm = s.items[j] if j is not None else None
    if not isinstance(sm, Softmax) or sc in s.graph_outputs or len(sm.outputs) != 1 \
            or tuple(sm.shape) != tuple(t1[2].shape) or not s.read_only_by(sc, j):
        return None
    if sm.post is not None and sc in sm.post.inputs:
        return None
    p = sm.outputs[0]
    users = s.consumers.get(p, [])
    if len(users) != 1 or p in s.graph_outputs or users[0].inputs[0] != p or p in users[0].inputs[1:]:
        return None
    k = s.slot_of.get(users[0].outputs[0])
    t2 = _batched_matmul(s.items[k], s) if k is not None else None
    if t2 is None or tuple(t2[1].shape[:-2]) != tuple(t1[2].shape[:-2]):
        return None
    values = s.items[k].node
    q, kt = scores.inputs[:2]
    k_rows: tuple[Node, ...] = ()
    rows = transposed_rows(kt, s)
    if rows is not None and all(m.outputs[0] in s.slot_of and isinstance(s.items[s.slot_of[m.outputs[0]]], Single)
                                for m in rows[1]):
        kt, k_rows = rows[0], tuple(rows[1])
    inputs = (q, kt, values.inputs[1], *(z for z in sm.inputs if z != sc))
    if len(set(inputs)) != len(inputs):
        return None
    new = Attention(inputs, (values.outputs[0],), scores, sm, values, (), k_rows)
    return Match(new, k, frozenset((i, j, k, *(s.slot_of[m.outputs[0]] for m in k_rows))))


# ---- head transposes ------------------------------------------------------------------------------------------
def match_heads(s: Schedule, i: int, item: Item) -> Match | None:
    """The copies attention layers make between (batch, seq, heads, d) and (batch, heads, seq, d) disappear: a
    product whose result is only reshaped to heads and transposed writes the transposed layout itself, and
    attention whose result is only transposed back writes (batch, seq, heads, d)."""
    if isinstance(item, Product) and len(item.outputs) == 1 and len(item.shape) == 3 and not item.layernorm \
            and not item.folded:
        y = item.outputs[0]
        rs = s.sole_reader(y)
        if rs is None or rs.op_type != "Reshape" or rs.inputs[0] != y:
            return None
        t4 = s.type(rs.outputs[0])
        tr = s.sole_reader(rs.outputs[0])
        if tr is None or tr.op_type != "Transpose" or list(tr.attrs.get("perm", [])) != _HEADS_PERM \
                or not isinstance(t4, TensorType) or len(t4.shape) != 4:
            return None
        b, sq, h, d = t4.shape
        n = item.shape[-1]
        if (b, sq) != tuple(item.shape[:2]) or not (isinstance(h, int) and isinstance(d, int) and h * d == n
                                                    and d % 32 == 0):
            return None
        new = Product(item.inputs, (tr.outputs[0],), item.node, item.weight, item.trans_b, item.epilogue, item.shape,
                      (rs, tr), h, None)
        return Match(new, i, frozenset((i, s.slot_of[rs.outputs[0]], s.slot_of[tr.outputs[0]])))
    if isinstance(item, Attention) and len(item.outputs) == 1 and not item.folded:
        o = item.outputs[0]
        tr = s.sole_reader(o)
        to = s.type(o)
        if tr is None or tr.op_type != "Transpose" or list(tr.attrs.get("perm", [])) != _HEADS_PERM \
                or to is None or len(to.shape) != 4:
            return None
        new = Attention(item.inputs, (tr.outputs[0],), item.scores, item.softmax, item.values, (tr,), item.k_rows)
        return Match(new, i, frozenset((i, s.slot_of[tr.outputs[0]])))
    return None


RULES: tuple[Rule, ...] = (
    Rule("softmax with its producer and consumer groups", "fused_softmax", match_softmax),
    Rule("attention without materialised scores", "fused_attention", match_attention),
    Rule("products by constant matrices with their epilogues", "packed_gemm", match_product),
    Rule("int8 products (quantized models) with their epilogues", "packed_gemm", match_qproduct),
    Rule("convolutions with their epilogues", "packed_gemm", match_conv),
    Rule("a 1x1 conv into the depthwise conv that alone reads it", "fused_pw_dw", match_pw_dw),
    Rule("a per-channel scale, shift and Relu into the bf16 1x1 conv that alone reads it", "conv_prologue",
         match_conv_prologue),
    Rule("pools and global reductions of channels-last tensors", "channels_last", match_pool),
    Rule("layer norm on a product's blocks of rows", "fused_layernorm", match_layernorm),
    Rule("softmax on a product's blocks of rows", "fused_product_softmax", match_product_softmax),
    Rule("head transposes written by the kernel", "fold_transposes", match_heads),
)
