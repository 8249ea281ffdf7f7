"""Shape inference: walks a graph, calls each op's rule through an `InferCtx`, and keeps what it learns.

What the engine adds on top of the op rules:
- facts go into the graph's `ConstraintStore` with the node that required them: equalities merge symbols,
  conditions on a bare symbol refine its declaration, the rest become run-time checks;
- constant folding: an op whose inputs are all small numeric constants runs its numpy reference;
- a contradiction becomes one `ShapeError` naming the node, its op, its input shapes, the clashing facts
  and a fix;
- at the end every stored shape is re-resolved through the store and simplified, so the graph never shows
  a symbol that was later refined or merged away.
"""

from __future__ import annotations

import warnings
from collections import ChainMap
from typing import Any, NoReturn

import numpy as np

from dynshape.errors import DynshapeError, ModelError, ShapeError
from dynshape.ir import opdef
from dynshape.ir.graph import Fact, Graph, Node, Value, format_type
from dynshape.ir.types import OptionalType, SequenceType, TensorType, ValueType
from dynshape.shape import ConstraintStore, broadcast_shapes
from dynshape.sym import Cond, Expr, Symbol, eq, max_, min_, ne, prove, simplify, sym

FOLD_LIMIT = 1 << 16  # fold an op only when its constant inputs hold at most this many elements in all


# ---- facts ----------------------------------------------------------------------------------------------
class RankDependsOnInput(ShapeError):
    """A rule needs a dim as a static number (a rank, a number of axes) and it is an input symbol.

    Raised through the rules; `infer_graph` catches it at the top and leaves the graph partially inferred
    with `graph.rank_symbols` set, so the caller specialises on those symbols' values (`ir.specialize`)."""


class RankDependsOnData(ShapeError):
    """An output rank depends on tensor values (a data-dependent size decides it): `infer_graph` keeps the
    types inferred so far and marks the graph `dynamic`; the reference executor runs the rest op by op."""


class Facts:
    """The graph's `ConstraintStore`, plus what it does not keep: data-dependent symbols, derived dims, and
    run-time checks that are not one condition (an undecided broadcast: equal, or one side is 1)."""

    def __init__(self) -> None:
        self.store = ConstraintStore()
        self.fresh_names: list[str] = []
        self.checks: list[Fact] = []
        self.derived_dims: dict[Any, str] = {}
        self.rank_symbols: dict[str, str] = {}  # input symbol whose value fixes a rank -> why (node, what)
        self.data_rank: str | None = None  # why a rank depends on tensor values (node, what), if one does
        self.assumptions: list[tuple[Cond, str]] = []  # conditions a rule assumed, not required (see assume)

    def declare(self, d: Any, origin: str) -> None:
        if isinstance(d, Expr):
            for s in d.syms:
                if s.name not in self.store.symbols and s.name not in self.store.bindings:
                    self.store.declare(s, origin)

    def fresh(self, hint: str, origin: str) -> Expr:
        base = "".join(c if c.isalnum() else "_" for c in hint) or "u"
        e = sym(f"?{base}{len(self.fresh_names)}", min=0)  # '?': the store merges these away first
        self.store.declare(e, f"{origin}: data-dependent size")
        self.fresh_names.append(e.atom().name)
        return e

    def resolve(self, d: Any) -> Any:
        if isinstance(d, Expr):
            return self.store.resolve(d)
        return int(d) if isinstance(d, np.integer) else d

    def resolve_type(self, t: Any) -> Any:
        if isinstance(t, TensorType):
            shape = tuple(self.resolve(d) for d in t.shape)
            value = t.value
            if value is not None and value.dtype == object:
                flat = [self.resolve(v) for v in value.reshape(-1).tolist()]
                value = np.empty(len(flat), dtype=object)
                value[:] = flat
                value = value.reshape(t.value.shape)
            elif all(a is b for a, b in zip(shape, t.shape)):
                return t
            return TensorType(np.dtype(t.dtype), shape, value)
        if isinstance(t, SequenceType) and t.shape is not None:
            return SequenceType(t.dtype, tuple(self.resolve(d) for d in t.shape))
        if isinstance(t, OptionalType):
            return OptionalType(self.resolve_type(t.elem))
        return t

    def derived(self, d: Any, origin: str) -> None:
        if isinstance(d, Expr) and d not in self.derived_dims and not _bare(d):
            self.derived_dims[d] = origin

    def signature_facts(self, inputs: set[str], simp: dict) -> list[Fact]:
        """Everything learnt, resolved. Only conditions over the input symbols carry a run-time `check`:
        the others involve data-dependent sizes, which the executor checks on the tensors themselves."""
        st = self.store
        out: list[Fact] = []
        for hist in st.history.values():
            out += [Fact("range", f.text, f.origin) for f in hist[1:]]  # hist[0] is the declaration
        out += [Fact("eq", f.text, f.origin) for f in st.equalities]
        for cond, origin in st.residual_facts():
            out.append(Fact("require", cond.text, origin, cond if cond.free_symbols <= inputs else None))
        for f in self.checks:
            check = _BroadcastCheck(self.resolve(f.check.a), self.resolve(f.check.b), f.text)
            if check.decided() is None:
                out.append(Fact(f.kind, f.text, f.origin, check if check.free_symbols <= inputs else None))
        for cond, origin in self.assumptions:
            cond = Cond(cond.kind, self.resolve(cond.expr), cond.text, cond.k)
            if prove(cond) is not True:
                out.append(Fact("assume", cond.text, origin, cond if cond.free_symbols <= inputs else None))
        out += [Fact("fresh", f"{n}: data-dependent size", st.history[n][0].origin)
                for n in self.fresh_names if n in st.symbols]
        seen: set = set()
        for d, origin in self.derived_dims.items():
            d = _simp(self.resolve(d), simp)
            if isinstance(d, Expr) and not _bare(d) and d not in seen:
                seen.add(d)
                out.append(Fact("derived", str(d), origin))
        return out


class _BroadcastCheck:
    """Run-time check for an undecided broadcast pair: equal, or one of them is 1."""

    def __init__(self, a: Any, b: Any, text: str):
        self.a, self.b, self.text = a, b, text

    def __call__(self, env: dict) -> bool:
        a = self.a.evaluate(env) if isinstance(self.a, Expr) else self.a
        b = self.b.evaluate(env) if isinstance(self.b, Expr) else self.b
        return a == b or a == 1 or b == 1

    def decided(self) -> bool | None:
        if prove(eq(self.a, self.b)) or prove(eq(self.a, 1)) or prove(eq(self.b, 1)):
            return True
        return None

    @property
    def free_symbols(self) -> frozenset:
        return frozenset().union(*(x.free_symbols for x in (self.a, self.b) if isinstance(x, Expr)))


def _bare(d: Expr) -> bool:
    return d.is_atom() and isinstance(d.atom(), Symbol)


def _simp(d: Any, memo: dict) -> Any:
    if not isinstance(d, Expr):
        return d
    r = memo.get(d)
    if r is None:
        r = memo[d] = simplify(d)
    return r


# ---- the context handed to op rules -----------------------------------------------------------------------
class InferCtx:
    """What an op's shape rule sees of the engine: its inputs, attributes, and the fact store.

    Every rule (`OpDef.infer`) takes one; `inputs` holds the node's input types, resolved through the fact
    store, with None for an omitted optional input."""

    def __init__(self, engine: _Engine, graph: Graph, node: Node, inputs: list[ValueType | None]):
        self.engine, self.graph, self.node = engine, graph, node
        self.inputs: list[Any] = inputs  # Any: a rule reads `.shape` / `.dtype` of the types its op admits

    @property
    def op_type(self) -> str:
        return self.node.op_type

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def opset(self) -> int:
        return self.graph.opset_imports.get(self.node.domain, self.graph.opset)

    @property
    def num_outputs(self) -> int:
        """How many outputs the node declares (Split, MaxPool's indices, optional outputs)."""
        return len(self.node.outputs)

    @property
    def origin(self) -> str:
        return self.node.label()

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attrs.get(name, default)

    def unify(self, a: Any, b: Any) -> Any:
        """Record a == b and return the merged dim."""
        a, b = _int(a), _int(b)
        if isinstance(a, int) and isinstance(b, int):
            if a != b:
                self.error(f"dims disagree: {a} != {b}")
            return a
        try:
            return self.engine.facts.store.equate(a, b, self.origin)
        except ShapeError as e:
            self.error(str(e))

    def require(self, cond: Any, fix: str | None = None) -> None:
        """Record a condition the inputs must meet; error when it is provably false."""
        if isinstance(cond, (bool, np.bool_)):
            if not cond:
                self.error("a condition the op needs is false", fix)
            return
        if not isinstance(cond, Cond):
            raise ShapeError(f"{self.origin}: require() takes a condition, got {type(cond).__name__} {cond!r}")
        try:
            self.engine.facts.store.require(cond, self.origin)
        except ShapeError as e:
            self.error(str(e), fix)

    def assume(self, cond: Any, why: str) -> None:
        """Record a condition a rule *assumes* to keep one symbolic shape, though the op also allows inputs that
        break it (a symbolic Reshape entry that is 0 means "copy the input dim"). Unlike `require`, it is not
        a fact the symbols satisfy: inputs that break it are valid, and `graph.run` runs them on a graph
        specialised to their static shapes, where the rule decides exactly. Provably false: the rule must not
        have assumed it (an error)."""
        if isinstance(cond, (bool, np.bool_)):
            if not cond:
                self.error(f"assumed {why}, which is false")
            return
        r = prove(cond)
        if r is False:
            self.error(f"assumed {why}, which is false")
        if r is None:
            self.engine.facts.assumptions.append((cond, f"{self.origin}: {why}"))

    def broadcast(self, *shapes: Any) -> tuple:
        """numpy broadcasting over symbolic shapes.

        Dims that are provably not 1 must agree (they are unified). Where a dim may be 1, the result is the
        exact `max(a, b) * min(a, b, 1)` (just `max(a, b)` when both are >= 1) and the run-time check
        "a == b or one of them is 1" is recorded: nothing is assumed that numpy would not also accept.
        """
        facts = self.engine.facts
        shapes = tuple(tuple(facts.resolve(_int(d)) for d in s) for s in shapes)
        try:
            return broadcast_shapes(*shapes, unify=self._merge)
        except ShapeError as e:
            if str(e).startswith(self.origin):
                raise
            self.error(str(e), "fix the model or the input declarations so these dims agree or one is 1")

    def _merge(self, a: Any, b: Any) -> Any:
        if prove(ne(a, 1)) and prove(ne(b, 1)):
            return self.unify(a, b)
        text = f"{a} == {b} or one of them is 1 (broadcast)"
        self.engine.facts.checks.append(Fact("require", text, self.origin, _BroadcastCheck(a, b, text)))
        if prove(ne(a, 1)):
            return a
        if prove(ne(b, 1)):
            return b
        return max_(a, b) * min_(a, b, 1)

    def resolve(self, t: Any) -> Any:
        """A type (or dim) re-expressed over the current symbols: after a body refined or merged one, types
        computed before it still hold the old declaration."""
        facts = self.engine.facts
        if isinstance(t, (TensorType, SequenceType, OptionalType)):
            return facts.resolve_type(t)
        return facts.resolve(t)

    def static(self, d: Any, what: str) -> int:
        """`d` as a Python int, for a rule that needs a number to build a shape from (a rank, a count of axes,
        the length of a shape tensor); otherwise the rank depends on `d` (see `rank_depends_on`)."""
        d = self.engine.facts.resolve(_int(d))
        if isinstance(d, int):
            return d
        self.rank_depends_on([d], f"{what} is {d}")

    def rank_depends_on(self, dims: list, why: str) -> NoReturn:
        """Stop inference: an output rank is a function of these dims' values.

        Over input symbols only, the symbols are recorded (`graph.rank_symbols`) and the graph is specialised
        on their values when it runs (`RankDependsOnInput`). When a data-dependent size is involved no input
        shape fixes the rank: the graph keeps the types inferred so far and runs the rest op by op
        (`RankDependsOnData`). Either way the load succeeds, and `graph.signature` says why.
        """
        facts = self.engine.facts
        names = sorted(set().union(*(facts.resolve(d).free_symbols for d in dims if isinstance(d, Expr))))
        if any(n in facts.fresh_names or n.startswith("?") for n in names) or not names:
            facts.data_rank = facts.data_rank or f"{why} ({self.origin})"
            raise RankDependsOnData(_node_message(self.node, self.inputs, f"{why}: the output rank depends on "
                                                  "tensor values", None))
        for n in names:
            facts.rank_symbols.setdefault(n, f"{why} ({self.origin})")
        raise RankDependsOnInput(_node_message(
            self.node, self.inputs, f"{why}: the output rank depends on the input dim(s) {', '.join(names)}, "
            "so the graph is specialised on their values at call time", None))

    def fresh(self, hint: str = "u") -> Expr:
        """A fresh data-dependent dim (>= 0, unbounded)."""
        return self.engine.facts.fresh(hint, self.origin)

    def mark(self) -> int:
        """A marker for `is_local`: how many fresh symbols exist so far."""
        return len(self.engine.facts.fresh_names)

    def is_local(self, d: Any, mark: int) -> bool:
        """Whether dim `d` uses a fresh symbol created after `mark` (e.g. inside a loop body)."""
        if not isinstance(d, Expr):
            return False
        return not d.free_symbols.isdisjoint(self.engine.facts.fresh_names[mark:])

    def error(self, msg: str, fix: str | None = None) -> NoReturn:
        """Raise a ShapeError naming this node, its op and its input shapes."""
        raise ShapeError(_node_message(self.node, self.inputs, msg, fix))

    def snapshot(self) -> tuple:
        """What inference knows now (the constraint store and the run-time checks), to `restore` after inferring a
        branch whose requirements hold only when that branch runs."""
        f = self.engine.facts
        return (_copy_state(f), _copy_state(f.store))

    def restore(self, snap: tuple) -> None:
        f = self.engine.facts
        vars(f).update(snap[0])
        vars(f.store).update(snap[1])

    def outer_facts_changed(self, snap: tuple) -> bool:
        """Whether anything known of the symbols before `snap` changed since: a symbol eliminated or narrowed, an
        equality, a run-time check or an assumption added (fresh data-dependent symbols do not count)."""
        f, st = self.engine.facts, self.engine.facts.store
        was_f, was_st = snap
        if any(name in st.bindings or st.symbols.get(name) != s for name, s in was_st["symbols"].items()):
            return True
        return (len(st.residual), len(st.equalities), len(f.checks), len(f.assumptions)) != (
            len(was_st["residual"]), len(was_st["equalities"]), len(was_f["checks"]), len(was_f["assumptions"]))

    def infer_subgraph(self, graph: Graph, input_types: list) -> list:
        """Infer a body graph (If branch, Loop/Scan body) with this graph's values in scope.

        The input types are re-resolved first: a rule that iterates (Loop/Scan carried values) may hand
        back types from before the body refined one of their symbols."""
        if len(input_types) != len(graph.inputs):  # (a fuzzed Loop with one more carried value than its body takes
            # ran on the body's first inputs: compiled and reference builds disagreed, where onnxruntime refuses)
            self.error(f"its body graph {graph.name or '(unnamed)'!r} takes {len(graph.inputs)} inputs, but the node "
                       f"gives it {len(input_types)}")
        facts = self.engine.facts
        return self.engine.run(graph, [None if t is None else facts.resolve_type(t) for t in input_types])


def _copy_state(obj: object) -> dict:
    """A copy of an object's containers (their items are immutable: symbols, expressions, facts), not of the
    objects they hold; nested objects (Facts' store) are left to their own copy."""
    out = {}
    for k, v in vars(obj).items():
        if isinstance(v, dict):
            out[k] = {a: list(b) if isinstance(b, list) else b for a, b in v.items()}
        elif isinstance(v, (list, set)):
            out[k] = type(v)(v)
        elif not isinstance(v, (Facts, ConstraintStore)):
            out[k] = v
    return out


def _int(d: Any) -> Any:
    return int(d) if isinstance(d, np.integer) else d


def _node_message(node: Node, inputs: list, msg: str, fix: str | None) -> str:
    ins = ", ".join(f"{n or '<omitted>'}: {format_type(t)}" for n, t in zip(node.inputs, inputs)) or "none"
    first, _, rest = msg.partition("\n")
    out = f"{node.label()}: {first}\n  input shapes: {ins}" + (f"\n{rest}" if rest else "")
    if fix:
        out += f"\nfix: {fix}"
    return out


# ---- the engine --------------------------------------------------------------------------------------------
class _Engine:
    def __init__(self) -> None:
        self.facts = Facts()
        self.scopes: list[ChainMap] = []
        self.failed_at: Node | None = None

    def run(self, graph: Graph, input_types: list | None = None) -> list:
        """Infer every node of `graph` (names of enclosing graphs in scope); returns its output types."""
        graph.types = {}
        scope = ChainMap(graph.types, *(self.scopes[-1].maps if self.scopes else ()))
        self.scopes.append(scope)
        try:
            return self._run(graph, scope, input_types)
        finally:
            self.scopes.pop()

    def _run(self, graph: Graph, scope: ChainMap, input_types: list | None) -> list:
        top = len(self.scopes) == 1
        for i, v in enumerate(graph.inputs):
            t = input_types[i] if input_types is not None and i < len(input_types) else None
            if t is None and (v.kind != "tensor" or _complete(v.shape)):
                t = v.type
            if t is None:
                continue
            if top and isinstance(t, TensorType):
                for axis, d in enumerate(t.shape):
                    self.facts.declare(d, f"input {v.name!r} axis {axis}")
            graph.types[v.name] = t
        for name, arr in graph.initializers.items():
            graph.types[name] = TensorType(arr.dtype, tuple(int(d) for d in arr.shape), arr)
        for node in graph.nodes:
            if top:
                self.failed_at = node  # the top-level node being inferred, for a partial graph
            self._node(graph, node, scope)
        outs = []
        for v in graph.outputs:
            if v.name not in scope:
                raise ModelError(f"graph {graph.name!r}: output {v.name!r} has no type after inference")
            outs.append(self.facts.resolve_type(scope[v.name]))
        return outs

    def _node(self, graph: Graph, node: Node, scope: ChainMap) -> None:
        op = opdef.require(node.op_type, node.domain, node.label())
        ins = []
        for x in node.inputs:
            if not x:
                ins.append(None)
            elif x in scope:
                ins.append(self.facts.resolve_type(scope[x]))
            else:
                raise ModelError(f"{node.label()}: input {x!r} has no type (no producer before this node)")
        ctx = InferCtx(self, graph, node, ins)
        outs = None
        if op.infer is not None:
            try:
                outs = list(op.infer(ctx))
            except DynshapeError as e:
                if str(e).startswith(node.label()):
                    raise
                raise type(e)(_node_message(node, ins, str(e), None)) from e
            except Exception as e:  # a rule tripping over a malformed model: report it as this node's error
                what = str(e) if type(e) is ValueError else f"{type(e).__name__}: {e}"  # rules' own checks
                raise ShapeError(_node_message(node, ins, what, None)) from e
        folded = self._fold(op, node, ins, graph, outs)
        if folded is not None:
            outs = self._merge_folded(ctx, outs, folded)
        if outs is None:
            ctx.error(f"no shape rule for {node.op_type} and its inputs are not all constants")
        if len(outs) < len([o for o in node.outputs if o]):
            ctx.error(f"shape rule returned {len(outs)} types for {len(node.outputs)} outputs (shape-rule bug)")
        for name, t in zip(node.outputs, outs):
            if not name:
                continue
            if t is None:
                ctx.error(f"shape rule gave no type for output {name!r} (shape-rule bug)")
            if isinstance(t, TensorType):
                t = TensorType(np.dtype(t.dtype), tuple(_int(d) for d in t.shape), t.value)
                if any(isinstance(d, int) and d < 0 for d in t.shape):  # a rule let a malformed model through
                    ctx.error(f"output {name!r} would have a negative dim {list(t.shape)}")
                if _static_numel_nonzero(t.shape) > _MAX_ELEMENTS:  # no array can have it (numpy, C: int64)
                    ctx.error(f"output {name!r} would have shape {list(t.shape)}, more than 2**63 elements")
                for d in t.shape:
                    self.facts.derived(d, node.label())
            graph.types[name] = t

    def _fold(self, op: opdef.OpDef, node: Node, ins: list, graph: Graph, outs: list | None = None) -> list | None:
        """The node's outputs computed now, when its inputs are small constants and so are its outputs.

        The outputs' size is bounded by the shape rule's types before anything runs: a 139-byte model with
        `ConstantOfShape([30000, 30000])` must not cost 3.6 GB at load (the node stays for run time, where the
        memory checks see it)."""
        if op.random or node.subgraphs():
            return None
        for t in outs or ():
            if isinstance(t, TensorType) and _static_numel(t.shape) > FOLD_LIMIT:
                return None
        total = 0
        for t in ins:
            if t is None:
                continue
            if not isinstance(t, TensorType) or t.value is None or t.value.dtype == object:
                return None
            total += t.value.size
        if total > FOLD_LIMIT:
            return None
        attrs = {**node.attrs, "_opset": graph.opset, "_num_outputs": len(node.outputs)}
        try:
            res = op.reference([None if t is None else t.value for t in ins], attrs)
        except Exception:
            return None  # the executor reports it with full context if the model really runs this
        return [np.asarray(r) if isinstance(r, (np.ndarray, np.generic)) else r for r in res]

    def _merge_folded(self, ctx: InferCtx, outs: list | None, folded: list) -> list:
        merged = []
        for i, r in enumerate(folded):
            t = outs[i] if outs is not None and i < len(outs) else None
            if not isinstance(r, np.ndarray):
                merged.append(t)
                continue
            if isinstance(t, TensorType):
                bad = np.dtype(t.dtype) != r.dtype or len(t.shape) != r.ndim
                for d, n in zip(t.shape, r.shape) if not bad else ():
                    if isinstance(_int(d), int):
                        bad = bad or d != n
                    else:
                        ctx.unify(d, int(n))
                if bad:
                    ctx.error(f"shape rule says {format_type(t)} but folding gives {r.dtype}{list(r.shape)} "
                              "(shape-rule bug)")
            merged.append(TensorType(r.dtype, tuple(int(n) for n in r.shape), r if r.size <= FOLD_LIMIT else None))
        return merged


_MAX_ELEMENTS = int(np.iinfo(np.intp).max)


def _static_numel_nonzero(shape: tuple) -> int:
    """Product of the static non-zero dims: numpy refuses a shape whose product overflows even with a 0 in it."""
    n = 1
    for d in shape:
        if isinstance(d, int) and d > 0:
            n *= d
    return n


def _static_numel(shape: tuple) -> int:
    """Element count of a shape's static dims (a data-dependent dim, whose size the small constant inputs bound,
    counts as 1): what folding would at least allocate."""
    n = 1
    for d in shape:
        d = _int(d)
        n *= d if isinstance(d, int) else 1
    return n


def _complete(shape: tuple | None) -> bool:
    return shape is not None and not any(d is None or isinstance(d, str) for d in shape)


# ---- entry point --------------------------------------------------------------------------------------------
def infer_graph(graph: Graph) -> Graph:
    """Infer a type for every value of `graph` (in place) and fill its signature; returns the graph.

    When some rank depends on an input dim's value (`InferCtx.static`), the graph is returned partially
    inferred with `graph.rank_symbols` naming those symbols: `graph.run` then specialises it per call
    (`dynshape.ir.specialize`), and so can a compiler.
    """
    engine = _Engine()
    graph.rank_symbols, graph.dynamic = {}, None
    try:
        engine.run(graph)
    except (RankDependsOnInput, RankDependsOnData) as e:
        _partial(graph, engine, isinstance(e, RankDependsOnData))
        return graph
    facts = engine.facts
    simp: dict = {}
    _finish_types(facts, graph, simp)
    declared = list(graph.outputs)
    graph.outputs = []
    for v in declared:
        t = graph.types[v.name]
        wrong = _declared_mismatch(v, t)
        if wrong:
            # onnxruntime warns and returns the computed shape; a file shipped with a stale annotation
            # (ddddocr's OCR model declares rank 2 for a rank-3 output) must load, and the ops' rules win.
            warnings.warn(f"{graph.name}: {wrong}; the inferred shape is used", stacklevel=3)
        graph.outputs.append(Value.of(v.name, t))
    graph.inputs = [Value.of(v.name, graph.types[v.name]) if v.name in graph.types else v for v in graph.inputs]
    symbols: dict[str, Any] = {}
    for v in graph.inputs:
        t = graph.types.get(v.name)
        for d in (t.shape if isinstance(t, TensorType) else ()):
            if isinstance(d, Expr):
                for s in sorted(d.syms, key=lambda s: s.name):
                    symbols.setdefault(s.name, Expr.from_atom(s))
    graph.signature.symbols = symbols
    graph.signature.facts = facts.signature_facts(set(symbols), simp) + _stated(graph, set(symbols))
    return graph


def _stated(graph: Graph, inputs: set[str]) -> list[Fact]:
    """The frontend's stated requirements (`graph.requires`) still open after inference: those it proves are
    dropped; one over sizes no input carries cannot be checked per call and is refused (the frontend decides
    what to do with such conditions before stating them)."""
    out = []
    for f in graph.requires:
        cond = f.check
        if not isinstance(cond, Cond) or f.kind != "require":
            raise ModelError(f"graph.requires: {f.text} [{f.origin}] is not a require fact with a condition")
        if not cond.free_symbols <= inputs:
            raise ModelError(f"graph.requires: {f.text} [{f.origin}] uses sizes no input carries "
                             f"({', '.join(sorted(cond.free_symbols - inputs))}); it cannot be checked per call")
        if prove(cond) is not True:
            out.append(f)
    return out


def _partial(graph: Graph, engine: _Engine, data: bool) -> None:
    """What is known of a graph whose rest needs values: the declared inputs, the types inferred before the
    node that stopped inference, and a fact saying why.

    A rank fixed by input dims (`rank_symbols`) is specialised per value by `graph.run`. A rank fixed by
    tensor values makes the graph `dynamic`: the types of that node and everything after it are dropped
    (including its bodies' partial types), so the executor checks what is known and runs the rest unchecked.
    """
    facts = engine.facts
    if data:
        graph.dynamic = facts.data_rank or "an output rank depends on tensor values"
        started = False
        for node in graph.nodes:
            started = started or node is engine.failed_at
            if started:
                for o in node.outputs:
                    graph.types.pop(o, None)
                for sub in node.subgraphs():
                    _clear_types(sub)
    _finish_types(facts, graph, {})
    if not data:
        graph.rank_symbols = dict(facts.rank_symbols)
    symbols: dict[str, Any] = {}
    for v in graph.inputs:
        for d in (v.shape if v.kind == "tensor" and v.shape is not None else ()):
            if isinstance(d, Expr):
                for s in sorted(d.syms, key=lambda s: s.name):
                    symbols.setdefault(s.name, Expr.from_atom(s))
    graph.signature.symbols = symbols
    if data:
        graph.signature.facts = [Fact("dynamic", "from here on, ranks depend on tensor values: the reference "
                                      "executor runs these nodes unchecked", graph.dynamic)]
    else:
        graph.signature.facts = [Fact("rank", f"{n}: its value fixes a rank; the graph is specialised per value",
                                      why) for n, why in graph.rank_symbols.items()]


def _clear_types(graph: Graph) -> None:
    graph.types = {}
    for node in graph.nodes:
        for sub in node.subgraphs():
            _clear_types(sub)


def _finish_types(facts: Facts, graph: Graph, simp: dict) -> None:
    for name, t in list(graph.types.items()):
        t = facts.resolve_type(t)
        if isinstance(t, TensorType):
            t = TensorType(t.dtype, tuple(_simp(d, simp) for d in t.shape), t.value)
        elif isinstance(t, SequenceType) and t.shape is not None:
            t = SequenceType(t.dtype, tuple(_simp(d, simp) for d in t.shape))
        graph.types[name] = t
    for node in graph.nodes:
        for sub in node.subgraphs():
            _finish_types(facts, sub, simp)


def _declared_mismatch(v: Value, t: Any) -> str | None:
    """A declared output shape that provably differs from the inferred one: a model bug worth reporting.

    Only reported, not refused: the declaration is an annotation the exporter wrote, while the inferred type
    follows each op's specification (what every runtime computes)."""
    if v.kind != "tensor" or v.shape is None or not isinstance(t, TensorType):
        return None
    if len(v.shape) != len(t.shape):
        return f"output {v.name!r} is declared with rank {len(v.shape)} but inference gives {format_type(t)}"
    for axis, (d, e) in enumerate(zip(v.shape, t.shape)):
        if isinstance(d, int) and (e != d if isinstance(e, int) else prove(eq(e, d)) is False):
            return f"output {v.name!r} axis {axis} is declared {d} but inference gives {e} ({format_type(t)})"
    return None
