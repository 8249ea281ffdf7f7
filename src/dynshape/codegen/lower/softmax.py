"""A `Softmax` item as one kernel: producer group -> last-axis softmax -> consumer group, one row at a time.

Three passes over a row buffer that stays in cache: the producer's expression and the row maximum; exp and
sum; normalisation and the consumer's expression on the way out (masking + softmax + NaN clean-up in one pass
over memory). `softmax_passes` is shared with the attention kernel, whose rows come from a product instead.
"""

from __future__ import annotations

from collections.abc import Callable

from dynshape.codegen import kir
from dynshape.codegen.lower.elementwise import emit_nodes
from dynshape.codegen.lower.operands import (
    computable,
    dtype_of,
    flat_index,
    levels,
    operands,
    prod,
    strided_index,
    strides,
)
from dynshape.codegen.lowering import LowerCtx, Lowered, register_lowering
from dynshape.ir.graph import Graph
from dynshape.passes.items import Softmax
from dynshape.passes.values import scalar_const

# load(nodes, extra, index) -> (statements loading, at row position `index`, the operands `nodes` (and `extra`)
# read; value -> IR expression)
Load = Callable[[tuple, tuple, kir.Var], tuple[list[kir.Stmt], dict[str, kir.Expr]]]
# first: values the first pass reads from elsewhere, as functions of the row position (attention: the scores row)
First = dict[str, Callable[[kir.Var], kir.Expr]]


def _f(x: float) -> kir.Const:
    return kir.Const(x, kir.F32)


def softmax_passes(sm: Softmax, graph: Graph, body: list[kir.Stmt], hint: str, extent: kir.Expr,
                   row: kir.Buffer, load: Load, first: First,
                   store: Callable[[kir.Var, dict[str, kir.Expr]], list[kir.Stmt]],
                   defer: tuple[kir.Buffer, kir.Expr] | None = None, native_exp: bool = False,
                   exp_sum: str = "ds_softmax_exp_sum") -> None:
    """The passes over `row` (index < `extent`), appended to `body`. `first` seeds the first pass's operands;
    `store(index, env)` gives the last pass's stores. `defer` = (buffer, index): receives the row's scale
    instead of the third pass (the caller scales the product of this row instead; see `deferrable`).
    `native_exp`: the exp-and-sum pass is the packed-GEMM library's ds_softmax_exp_sum (csrc/ds_softmax_row.h:
    masked tail, lanes summed as a tree) instead of a generated loop; the kernel must need "packed_gemm". `exp_sum`:
    that pass's entry (a bf16 attention's: ds_softmax_exp_sum_bf16, whose exps it rounds to bf16 anyway)."""
    x, y = sm.node.inputs[0], sm.node.outputs[0]
    mx, s, inv = kir.Var("mx", kir.F32), kir.Var("s", kir.F32), kir.Var("inv", kir.F32)
    # pass 1: the producer group, into the row, and its maximum
    v = kir.Var(hint)
    stmts, env = load(sm.pre.nodes if sm.pre else (), () if sm.pre or x in first else (x,), v)
    env = {**env, **{k: f(v) for k, f in first.items()}}
    if sm.pre:
        emit_nodes(sm.pre.nodes, env, graph, stmts, "p")
    ex = env[x]
    stmts += [kir.Store(row, v, ex), kir.Assign(mx, kir.Select(kir.Bin(">", ex, mx), ex, mx))]
    body += [kir.Decl(mx, kir.Const(float("-inf"), kir.F32)),
             kir.For(v, extent, tuple(stmts), omp=kir.Omp(simd=True, schedule=None, reduction=("max", mx)))]
    # pass 2: exp and sum
    if native_exp:
        body.append(kir.Decl(s, kir.Call(exp_sum, (kir.Addr(row), extent, mx), kir.F32)))
    else:
        v, e = kir.Var(hint), kir.Var("e", kir.F32)
        body += [kir.Decl(s, _f(0.0)),
                 kir.For(v, extent, (kir.Let(e, kir.Call("ds_expf_nonpos", (kir.Bin("-", kir.Load(row, v), mx),))),
                                     kir.Store(row, v, e), kir.Assign(s, kir.Bin("+", s, e))),
                         omp=kir.Omp(simd=True, schedule=None, reduction=("+", s)))]
    body.append(kir.Let(inv, kir.Bin("/", _f(1.0), s)))
    if defer is not None:
        buf, at = defer
        if sm.post is not None:  # the NaN clean-up: a row with a NaN is all NaN, hence all zeros after it
            v = kir.Var(hint)
            body.append(kir.If(kir.Bin("!=", s, s),
                               (kir.For(v, extent, (kir.Store(row, v, _f(0.0)),)), kir.Store(buf, at, _f(1.0))),
                               (kir.Store(buf, at, inv),)))
        else:
            body.append(kir.Store(buf, at, inv))
        return
    # pass 3: normalise, the consumer group, store
    v = kir.Var(hint)
    stmts, env = load(sm.post.nodes if sm.post else (), (), v)
    out = kir.Var("sm", kir.F32)
    stmts.append(kir.Let(out, kir.Bin("*", kir.Load(row, v), inv)))
    env[y] = out
    if sm.post:
        emit_nodes(sm.post.nodes, env, graph, stmts, "q")
    body.append(kir.For(v, extent, tuple(stmts + store(v, env))))


SHORT_ROW = 16  # a softmax axis of at most this many (static) values runs as one flat loop over rows (short_rows)


def short_rows(sm: Softmax, graph: Graph, body: list[kir.Stmt], n: int, load: Load,
               store: Callable[[kir.Var, dict[str, kir.Expr]], list[kir.Stmt]]) -> None:
    """A row of `n` (static, at most SHORT_ROW) values, appended to `body` as straight-line code: the producer at
    each position into registers, their maximum, exp and sum, then the normalised values through the consumer.
    Why: the three passes over a row buffer (`softmax_passes`) cost a few loops' setup and a vector reduction each,
    per row: a detector's two-class softmax over a channels-last map (mtcnn_pnet at 480x640: 74,025 rows of 2) took
    2.5 ms, 15% of the call. The same arithmetic as the passes: the maximum ignores a NaN (a NaN in the row makes
    its exps and sum NaN, so every output), exp(x - max) by ds_expf_nonpos, one reciprocal of the sum."""
    x, y = sm.node.inputs[0], sm.node.outputs[0]
    mx, s, inv = kir.Var("mx", kir.F32), kir.Var("s", kir.F32), kir.Var("inv", kir.F32)
    vals = []
    for j in range(n):
        at = kir.Const(j, kir.I64)
        stmts, env = load(sm.pre.nodes if sm.pre else (), () if sm.pre else (x,), at)
        if sm.pre:
            emit_nodes(sm.pre.nodes, env, graph, stmts, f"p{j}_")
        v = kir.Var(f"x{j}", kir.F32)
        body += [*stmts, kir.Let(v, env[x])]
        vals.append(v)
    body.append(kir.Decl(mx, kir.Const(float("-inf"), kir.F32)))
    for v in vals:
        body.append(kir.Assign(mx, kir.Select(kir.Bin(">", v, mx), v, mx)))
    exps = [kir.Var(f"e{j}", kir.F32) for j in range(n)]
    body += [kir.Let(e, kir.Call("ds_expf_nonpos", (kir.Bin("-", v, mx),))) for e, v in zip(exps, vals)]
    total: kir.Expr = exps[0]
    for e in exps[1:]:
        total = kir.Bin("+", total, e)
    body += [kir.Let(s, total), kir.Let(inv, kir.Bin("/", _f(1.0), s))]
    for j, e in enumerate(exps):
        at = kir.Const(j, kir.I64)
        stmts, env = load(sm.post.nodes if sm.post else (), (), at)
        out = kir.Var(f"sm{j}", kir.F32)
        stmts.append(kir.Let(out, kir.Bin("*", e, inv)))
        env[y] = out
        if sm.post:
            emit_nodes(sm.post.nodes, env, graph, stmts, f"q{j}_")
        body += [*stmts, *store(at, env)]


def deferrable(sm: Softmax, graph: Graph) -> bool:
    """The softmax's consumer is nothing, or only the exporters' NaN clean-up Where(IsNaN(p), 0, p): then
    P @ V = (E @ V) * (1 / sum E) row by row, and the normalising pass can ride on the product."""
    if sm.post is None:
        return True
    nodes, y = sm.post.nodes, sm.node.outputs[0]
    if len(nodes) != 2 or [n.op_type for n in nodes] != ["IsNaN", "Where"] or sm.outputs != (nodes[1].outputs[0],):
        return False
    isnan, where = nodes
    return isnan.inputs == [y] and where.inputs[0] == isnan.outputs[0] and where.inputs[2] == y \
        and scalar_const(where.inputs[1], graph) == 0.0


def lower_softmax(sm: Softmax, ctx: LowerCtx) -> Lowered:
    g, shape = ctx.graph, tuple(sm.shape)
    computable(shape, ctx.key_names)
    ops = operands(sm.inputs, shape, g)
    rank = len(shape)
    lv = levels(ops.patterns, range(rank - 1)) + [[rank - 1]]
    ext = [prod(shape, level) for level in lv]
    L = [kir.Extent(i) for i in range(len(ext))]
    n = len(L)  # level n-1 is the row
    spans = [[p[level[0]] for level in lv] for p in ops.patterns]
    body: list[kir.Stmt] = []
    lets, table = strides(spans, L)
    body += lets
    outs = [kir.Buffer(f"o{k}", dtype_of(g, o), const=False) for k, o in enumerate(sm.outputs)]
    idx = [kir.Var(f"a{i}") for i in range(n - 1)]
    row = kir.Buffer("row", kir.F32, const=False)
    ob = kir.Var("ob")
    rows: list[kir.Stmt] = [kir.Let(ob, kir.Bin("*", flat_index(idx, L[:n - 1]) if idx else kir.Const(0, kir.I64),
                                                L[n - 1]))]
    base = [strided_index(idx, table[j][:n - 1]) if idx else kir.Const(0, kir.I64) for j in range(len(ops.ptrs))]

    def load(nodes: tuple, extra: tuple, r: kir.Var) -> tuple[list[kir.Stmt], dict[str, kir.Expr]]:
        env: dict[str, kir.Expr] = dict(ops.scalars)
        used = {x for nd in nodes for x in nd.inputs} | set(extra)
        stmts: list[kir.Stmt] = []
        for j, x in enumerate(ops.ptrs):
            if x in used:
                v = kir.Var(f"v{j}", ops.buffers[j].dtype)
                at = kir.Bin("+", base[j], kir.Bin("*", r, table[j][n - 1]))
                stmts.append(kir.Let(v, kir.Load(ops.buffers[j], at)))
                env[x] = v
        return stmts, env

    def store(r: kir.Var, env: dict[str, kir.Expr]) -> list[kir.Stmt]:
        return [kir.Store(buf, kir.Bin("+", ob, r), env[o]) for buf, o in zip(outs, sm.outputs)]

    short = isinstance(shape[-1], int) and 0 < shape[-1] <= SHORT_ROW
    native_exp = ctx.options.fast_math and not short
    if short:
        short_rows(sm, g, rows, shape[-1], load, store)
    else:
        softmax_passes(sm, g, rows, "r", L[n - 1], row, load, {}, store, native_exp=native_exp)
    nest: kir.Stmt | None = None
    for i in reversed(range(n - 1)):
        stmts = tuple(rows) if nest is None else (nest,)
        nest = kir.For(idx[i], L[i], stmts, omp=kir.Omp(shared=True, collapse=n - 1) if i == 0 else None)
    work = kir.Bin(">=", kir.product(L), kir.Const(ctx.options.par_min_elements, kir.I64))
    region = [nest] if nest is not None else rows
    if not short:  # (the passes' row buffer)
        region = [kir.Alloc(row, L[n - 1]), *region, kir.Free(row)]
    if n > 1:
        body.append(kir.Region(tuple(region), if_=work))
    else:  # one row: nothing to share out
        body += region
    kernel = kir.Kernel(ctx.name, tuple(ext), tuple(outs), tuple(ops.buffers), tuple(body), ctx.symbols)
    return Lowered(kernel, sm.outputs, tuple(ops.ptrs), needs=("packed_gemm",) if native_exp else ())


register_lowering("softmax", "kernel", lower_softmax)
