"""Elementwise ops as scalar expressions, and the loop nest an `Elementwise` item becomes.

Each compiled elementwise op is one `expr_rule(op, build)` line below: `build(node, operands, graph)` returns
the kernel-IR expression of one output element from its operands' (loads, literals or earlier results); the
optional `accepts(node, graph)` says why a node is not taken (its dtype, a non-constant exponent). Fusion
groups exactly the ops that have a rule here, and every fused kernel that applies an elementwise chain (an
elementwise group, a softmax's producer and consumer, a product's epilogue) prints it through `emit_nodes`.

Division by a constant is emitted as a product with its float32 reciprocal (at most 1 ulp apart, as XLA and
onnxruntime do): a vector division costs as much as ten fused multiply-adds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from dynshape.codegen import kir
from dynshape.codegen.lower.operands import computable, dtype_of, flat_index, levels, operands, prod, strided_index
from dynshape.codegen.lower.operands import strides as stride_table
from dynshape.codegen.lowering import LowerCtx, Lowered, Unsupported, get_lowering, register_lowering
from dynshape.ir.graph import Graph, Node
from dynshape.ir.types import TensorType
from dynshape.passes.items import Elementwise
from dynshape.passes.values import is_float32, scalar_const

Build = Callable[[Node, list[kir.Expr], Graph], kir.Expr]
Accepts = Callable[[Node, Graph], "str | None"]


def _float32_values(names: list[str], graph: Graph) -> str | None:
    for x in names:
        if not is_float32(graph.types.get(x)):
            return f"{x!r} is {getattr(graph.types.get(x), 'dtype', '?')}, the kernel computes float32"
    return None


def float32_only(node: Node, graph: Graph) -> str | None:
    """The default: every input and the output are float32."""
    return _float32_values([*node.inputs, *node.outputs], graph)


@dataclass(frozen=True)
class ScalarRule:
    build: Build
    accepts: Accepts = float32_only


def expr_rule(op: str, build: Build, accepts: Accepts = float32_only, domain: str = "") -> None:
    register_lowering(op, "expr", ScalarRule(build, accepts), domain=domain)


def _f(x: float) -> kir.Const:
    return kir.Const(x, kir.F32)


def _call(fn: str, *args: kir.Expr) -> kir.Call:
    return kir.Call(fn, tuple(args), kir.F32)


def _div(node: Node, a: list[kir.Expr], graph: Graph) -> kir.Expr:
    c = scalar_const(node.inputs[1], graph)
    if c not in (None, 0.0) and math.isfinite(c):
        return kir.Bin("*", a[0], _f(1.0 / np.float32(c)))  # a vdivps costs ~10 FMAs; <= 1 ulp apart
    return kir.Bin("/", a[0], a[1])


def _pow(node: Node, a: list[kir.Expr], graph: Graph) -> kir.Expr:
    p = scalar_const(node.inputs[1], graph)
    x = a[0]
    if p == 1.0:
        return x
    if p == 2.0:
        return kir.Bin("*", x, x)
    if p == 3.0:
        return kir.Bin("*", kir.Bin("*", x, x), x)
    if p == 0.5:
        return _call("sqrtf", x)
    return _call("powf", x, _f(p))


def _pow_accepts(node: Node, graph: Graph) -> str | None:
    if len(node.inputs) != 2 or scalar_const(node.inputs[1], graph) is None:
        return "the exponent is not a one-element constant"
    ok = is_float32(graph.types.get(node.inputs[0])) and is_float32(graph.types.get(node.outputs[0]))
    return None if ok else "the base is not float32"


def _where_accepts(node: Node, graph: Graph) -> str | None:
    """A bool condition choosing between two values of the output's dtype: float32, int64 / int32 (a masked_fill
    of token ids: BART's decoder inputs) or bool (a select copies the element, whatever its type)."""
    if np.dtype(graph.types[node.inputs[0]].dtype) != np.bool_:
        return "the condition is not bool"
    types = {_dtype(x, graph) for x in (*node.inputs[1:], *node.outputs)}
    if len(types) == 1 and types <= {*_NUMERIC, kir.BOOL}:
        return None
    return f"values {sorted(map(str, types))}, the kernel selects one of {', '.join((*_NUMERIC, kir.BOOL))}"


def _isnan_accepts(node: Node, graph: Graph) -> str | None:
    ok = is_float32(graph.types.get(node.inputs[0])) and np.dtype(graph.types[node.outputs[0]].dtype) == np.bool_
    return None if ok else "IsNaN of a non-float32 input"


def _sigmoid(x: kir.Expr) -> kir.Expr:
    return _call("ds_sigmoidf", x)


def _softplus(x: kir.Expr) -> kir.Expr:
    """ln(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow for large x, exact for very negative x."""
    return kir.Bin("+", kir.Select(kir.Bin("<", x, _f(0.0)), _f(0.0), x),
                   _call("log1pf", _call("ds_expf", kir.Un("-", _call("fabsf", x)))))


def _dtype(x: str, graph: Graph) -> str | None:
    t = graph.types.get(x)
    return np.dtype(t.dtype).name if getattr(t, "dtype", None) is not None else None


_WRAP = {kir.I64: "uint64", kir.I32: "uint32"}  # the unsigned type an integer sum or product is computed in


def _arith(op: str) -> Build:
    """float32 as is; int64/int32 through the unsigned type and back, so an overflow wraps as numpy's does
    (signed overflow is undefined in C, and gcc assumes it never happens)."""
    def build(node: Node, a: list[kir.Expr], graph: Graph) -> kir.Expr:
        t = _dtype(node.outputs[0], graph)
        if t not in _WRAP:
            return kir.Bin(op, a[0], a[1])
        u = _WRAP[t]
        return kir.Cast(kir.Bin(op, kir.Cast(a[0], u), kir.Cast(a[1], u)), t)
    return build


def _arith_accepts(node: Node, graph: Graph) -> str | None:
    """float32, or every operand and the result the same int64 / int32 (int64 position ids: roberta)."""
    types = {_dtype(x, graph) for x in (*node.inputs, *node.outputs)}
    if len(types) == 1 and types <= set(_WRAP):
        return None
    return float32_only(node, graph)


_NUMERIC = (kir.F32, kir.I64, kir.I32)


def _compare_accepts(kinds: tuple[str, ...]) -> Accepts:
    """Operands of one dtype among `kinds`, the result bool."""
    def accepts(node: Node, graph: Graph) -> str | None:
        types = {_dtype(x, graph) for x in node.inputs}
        if len(types) != 1 or not types <= set(kinds):
            return f"operands {sorted(map(str, types))}, the kernel compares one of {', '.join(kinds)}"
        return None if _dtype(node.outputs[0], graph) == kir.BOOL else "the result is not bool"
    return accepts


def _bool_accepts(node: Node, graph: Graph) -> str | None:
    ok = all(_dtype(x, graph) == kir.BOOL for x in (*node.inputs, *node.outputs))
    return None if ok else "not every operand is bool"


expr_rule("Add", _arith("+"), _arith_accepts)
expr_rule("Sub", _arith("-"), _arith_accepts)
expr_rule("Mul", _arith("*"), _arith_accepts)
# comparisons as C's: IEEE, so a NaN compares false (unequal) as in numpy; the result is 0 or 1, numpy's bool byte
for _op, _c in (("Equal", "=="), ("Less", "<"), ("Greater", ">"), ("LessOrEqual", "<="), ("GreaterOrEqual", ">=")):
    expr_rule(_op, lambda n, a, g, c=_c: kir.Bin(c, a[0], a[1]),
              _compare_accepts((*_NUMERIC, kir.BOOL) if _op == "Equal" else _NUMERIC))
# logical ops read any nonzero byte as true and write 0 or 1
expr_rule("And", lambda n, a, g: kir.Bin("&&", a[0], a[1]), _bool_accepts)
expr_rule("Or", lambda n, a, g: kir.Bin("||", a[0], a[1]), _bool_accepts)
expr_rule("Xor", lambda n, a, g: kir.Bin("!=", kir.Un("!", a[0]), kir.Un("!", a[1])), _bool_accepts)
expr_rule("Not", lambda n, a, g: kir.Un("!", a[0]), _bool_accepts)
expr_rule("Div", _div)
expr_rule("Pow", _pow, _pow_accepts)
expr_rule("Where", lambda n, a, g: kir.Select(a[0], a[1], a[2]), _where_accepts)
expr_rule("Neg", lambda n, a, g: kir.Un("-", a[0]))
expr_rule("Abs", lambda n, a, g: _call("fabsf", a[0]))
expr_rule("Sqrt", lambda n, a, g: _call("sqrtf", a[0]))
expr_rule("Reciprocal", lambda n, a, g: kir.Bin("/", _f(1.0), a[0]))
expr_rule("Exp", lambda n, a, g: _call("ds_expf", a[0]))
expr_rule("Log", lambda n, a, g: _call("ds_logf", a[0]))
expr_rule("Erf", lambda n, a, g: _call("ds_erff", a[0]))
expr_rule("Tanh", lambda n, a, g: _call("ds_tanhf", a[0]))
# libm's, within an ulp at any argument (glibc reduces large ones exactly): a rotary embedding's cos / sin of the
# positions, computed per call where a bucket plan runs its per-key steps in the arena (runtime/per_key.py)
expr_rule("Cos", lambda n, a, g: _call("cosf", a[0]))
expr_rule("Sin", lambda n, a, g: _call("sinf", a[0]))
expr_rule("Sigmoid", lambda n, a, g: _sigmoid(a[0]))
expr_rule("Relu", lambda n, a, g: kir.Select(kir.Bin("<", a[0], _f(0.0)), _f(0.0), a[0]))
expr_rule("Identity", lambda n, a, g: a[0])
expr_rule("IsNaN", lambda n, a, g: kir.Cast(kir.Bin("!=", a[0], a[0]), kir.BOOL), _isnan_accepts)
expr_rule("Softplus", lambda n, a, g: _softplus(a[0]))


def _attr(n: Node, name: str, default: float) -> kir.Const:
    return _f(float(n.attrs.get(name, default)))


def _clamp01(x: kir.Expr) -> kir.Expr:
    """min(max(x, 0), 1), NaN staying NaN (as numpy's clip)."""
    lo = kir.Select(kir.Bin("<", x, _f(0.0)), _f(0.0), x)
    return kir.Select(kir.Bin(">", lo, _f(1.0)), _f(1.0), lo)


def _nan_max(a: kir.Expr, b: kir.Expr) -> kir.Expr:
    """numpy's maximum: a NaN on either side is the result (C's fmaxf would drop it)."""
    return kir.Select(kir.Bin("||", kir.Bin("!=", a, a), kir.Bin(">", a, b)), a, b)


def _nan_min(a: kir.Expr, b: kir.Expr) -> kir.Expr:
    return kir.Select(kir.Bin("||", kir.Bin("!=", a, a), kir.Bin("<", a, b)), a, b)


def _fold(f, args: list[kir.Expr]) -> kir.Expr:
    out = args[0]
    for x in args[1:]:
        out = f(out, x)
    return out


def _clip(n: Node, a: list[kir.Expr], g: Graph) -> kir.Expr:
    """numpy's clip: maximum with the lower bound, then minimum with the upper. A constant bound is a literal; a
    bound computed at run time (a log spectrogram floored at its maximum - 80 dB) is loaded, NaN propagating from
    either side as numpy's maximum / minimum."""
    x = a[0]
    for k, bound, past in ((1, _nan_max, "<"), (2, _nan_min, ">")):
        if len(n.inputs) > k and n.inputs[k]:
            c = scalar_const(n.inputs[k], g)
            x = bound(x, a[k]) if c is None else kir.Select(kir.Bin(past, x, _f(c)), _f(c), x)
    return x


def _clip_accepts(n: Node, g: Graph) -> str | None:
    if g.opset < 11:
        return "opset < 11 Clip (bounds as attributes)"
    for x in n.inputs[1:]:
        t = g.types.get(x) if x else None
        if x and scalar_const(x, g) is None and not (isinstance(t, TensorType) and t.shape is not None and all(
                d == 1 for d in t.shape) and np.dtype(t.dtype) == np.float32):
            return "a bound that is not one float32 element"
    return _float32_values([n.inputs[0], *n.outputs], g)


def _gelu(n: Node, a: list[kir.Expr], g: Graph) -> kir.Expr:
    x = a[0]
    if n.attrs.get("approximate", "none") == "tanh":
        inner = kir.Bin("*", _f(0.7978845608028654), kir.Bin("+", x, kir.Bin("*", _f(0.044715),
                                                                              kir.Bin("*", kir.Bin("*", x, x), x))))
        return kir.Bin("*", kir.Bin("*", _f(0.5), x), kir.Bin("+", _f(1.0), _call("ds_tanhf", inner)))
    return kir.Bin("*", kir.Bin("*", _f(0.5), x),
                   kir.Bin("+", _f(1.0), _call("ds_erff", kir.Bin("*", x, _f(0.7071067811865476)))))


expr_rule("HardSigmoid", lambda n, a, g: _clamp01(kir.Bin("+", kir.Bin("*", _attr(n, "alpha", 0.2), a[0]),
                                                          _attr(n, "beta", 0.5))))
expr_rule("HardSwish", lambda n, a, g: kir.Bin("*", a[0], _clamp01(kir.Bin("+", kir.Bin(
    "*", a[0], _f(1.0 / np.float32(6.0))), _f(0.5)))))  # x / 6 as a product: <= 1 ulp, as for Div
expr_rule("LeakyRelu", lambda n, a, g: kir.Select(kir.Bin("<", a[0], _f(0.0)),
                                                  kir.Bin("*", _attr(n, "alpha", 0.01), a[0]), a[0]))
expr_rule("PRelu", lambda n, a, g: kir.Select(kir.Bin("<", a[0], _f(0.0)), kir.Bin("*", a[0], a[1]), a[0]))
expr_rule("Clip", _clip, _clip_accepts)
expr_rule("Sum", lambda n, a, g: _fold(lambda x, y: kir.Bin("+", x, y), a))
expr_rule("Max", lambda n, a, g: _fold(_nan_max, a))
expr_rule("Min", lambda n, a, g: _fold(_nan_min, a))
expr_rule("Mish", lambda n, a, g: kir.Bin("*", a[0], _call("ds_tanhf", _softplus(a[0]))))
expr_rule("Gelu", _gelu)


def _qdq(n: Node, a: list[kir.Expr], g: Graph) -> kir.Expr:
    """DequantizeLinear(QuantizeLinear(x)) per tensor (ops/qstatic.py): x / s divided (as QuantizeLinear does, not
    multiplied by a reciprocal), rounded half to even, shifted, saturated, shifted back, scaled. NaN stays NaN."""
    s, z = _f(scalar_const(n.inputs[1], g)), _f(scalar_const(n.inputs[2], g))
    lo, hi = (-128.0, 127.0) if g.types[n.inputs[2]].dtype == np.int8 else (0.0, 255.0)
    v = kir.Bin("+", _call("rintf", kir.Bin("/", a[0], s)), z)
    v = kir.Select(kir.Bin("<", v, _f(lo)), _f(lo), kir.Select(kir.Bin(">", v, _f(hi)), _f(hi), v))
    return kir.Bin("*", kir.Bin("-", v, z), s)


def _qdq_accepts(n: Node, g: Graph) -> str | None:
    if scalar_const(n.inputs[1], g) is None or scalar_const(n.inputs[2], g) is None:
        return "a scale or zero point that is not a one-element constant"
    return _float32_values([n.inputs[0], *n.outputs], g)


expr_rule("QuantizeDequantize", _qdq, _qdq_accepts, domain="dynshape")


def fusible(node: Node, graph: Graph) -> bool:
    """Whether fusion may put `node` in an elementwise group: its op has a rule here that accepts it."""
    rule = get_lowering(node.op_type, "expr", node.domain)
    return rule is not None and rule.rule.accepts(node, graph) is None


def renamed_calls(e: kir.Expr, fns: Mapping[str, str]) -> kir.Expr:
    """`e` with every call to a function named in `fns` calling its replacement instead (same arguments)."""
    if isinstance(e, kir.Call):
        return kir.Call(fns.get(e.fn, e.fn), tuple(renamed_calls(a, fns) for a in e.args), e.dtype)
    if isinstance(e, kir.Bin):
        return kir.Bin(e.op, renamed_calls(e.a, fns), renamed_calls(e.b, fns))
    if isinstance(e, kir.Un):
        return kir.Un(e.op, renamed_calls(e.a, fns))
    if isinstance(e, kir.Select):
        return kir.Select(renamed_calls(e.cond, fns), renamed_calls(e.a, fns), renamed_calls(e.b, fns))
    if isinstance(e, kir.Cast):
        return kir.Cast(renamed_calls(e.a, fns), e.dtype)
    return e  # constants, variables, loads: an expression rule calls nothing inside them


def emit_nodes(nodes: tuple[Node, ...], env: dict[str, kir.Expr], graph: Graph, body: list[kir.Stmt],
               tag: str, fns: Mapping[str, str] | None = None) -> None:
    """One `const T t = expr;` per node, in order; `env` maps value names to IR expressions (updated). `fns`: math
    functions replaced in every node's expression (a bf16 product's epilogue: codegen/bf16.epilogue_math)."""
    for k, node in enumerate(nodes):
        rule = get_lowering(node.op_type, "expr", node.domain)
        if rule is None:
            raise Unsupported(f"{node.op_type} has no expression rule")
        value = rule.rule.build(node, [env[x] for x in node.inputs], graph)
        if fns:
            value = renamed_calls(value, fns)
        var = kir.Var(f"t{tag}{k}", dtype_of(graph, node.outputs[0]))
        body.append(kir.Let(var, value))
        env[node.outputs[0]] = var


def lower_elementwise(item: Elementwise, ctx: LowerCtx) -> Lowered:
    """One loop nest: the group's iteration shape coalesced into levels, every output stored once."""
    g = ctx.graph
    out_shape = tuple(item.shape) or (1,)
    computable(out_shape, ctx.key_names)
    ops = operands(item.inputs, tuple(item.shape), g)
    lv = levels(ops.patterns, range(len(out_shape)))
    ext = [prod(out_shape, level) for level in lv]
    L = [kir.Extent(i) for i in range(len(ext))]
    spans = [[p[level[0]] for level in lv] for p in ops.patterns]
    body: list[kir.Stmt] = []
    lets, table = stride_table(spans, L)
    body += lets
    n = len(L)
    idx = [kir.Var(f"a{i}") for i in range(n)]
    outs = [kir.Buffer(f"o{k}", dtype_of(g, o), const=False) for k, o in enumerate(item.outputs)]
    inner: list[kir.Stmt] = []
    o = kir.Var("o")
    inner.append(kir.Let(o, flat_index(idx, L)))
    env: dict[str, kir.Expr] = dict(ops.scalars)
    for j, (x, buf) in enumerate(zip(ops.ptrs, ops.buffers)):
        v = kir.Var(f"v{j}", buf.dtype)
        inner.append(kir.Let(v, kir.Load(buf, strided_index(idx, table[j]))))
        env[x] = v
    emit_nodes(item.group, env, g, inner, "")
    inner += [kir.Store(buf, o, env[name]) for buf, name in zip(outs, item.outputs)]
    omp = kir.Omp(parallel=True, simd=n == 1, collapse=max(n - 1, 1),
                  if_=kir.Bin(">=", kir.product(L), kir.Const(ctx.options.par_min_elements, kir.I64)))
    loop: kir.Stmt | None = None
    for i in reversed(range(n)):
        stmts = tuple(inner) if loop is None else (loop,)
        loop = kir.For(idx[i], L[i], stmts, omp=omp if i == 0 else None)
    body.append(loop)
    kernel = kir.Kernel(ctx.name, tuple(ext), tuple(outs), tuple(ops.buffers), tuple(body), ctx.symbols)
    return Lowered(kernel, item.outputs, tuple(ops.ptrs))


register_lowering("elementwise", "kernel", lower_elementwise)
