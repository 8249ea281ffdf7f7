"""The reference executor: runs a graph with each op's numpy reference, checking shapes all the way.

Before anything is computed, the inputs are checked against the signature: names, ranks, dtypes, the values
of the symbols (bound with `solve`, each observation labelled "input 'x' axis 1") and every recorded fact.
While running, every produced tensor must match its inferred type evaluated at the bound symbols: a mismatch
is a bug in a shape rule (or a reference), reported with the node's name. Data-dependent (fresh) symbols are
bound the first time a tensor shows their value.
"""

from __future__ import annotations

import re
from collections import ChainMap
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from dynshape.errors import ConstraintViolation, DynshapeError, ShapeError
from dynshape.ir import opdef
from dynshape.ir.graph import Graph, MemoryBound, Node, format_type, upper_bound
from dynshape.ir.types import OptionalType, SequenceType, TensorType
from dynshape.sym import Expr, Symbol, solve, substitute


class AssumptionFailed(ConstraintViolation):
    """Valid inputs that break an assumption of the generic graph (`InferCtx.assume`); `env` holds the
    symbol values they bind, for a specialisation to static shapes."""

    def __init__(self, msg: str, env: dict[str, int]):
        super().__init__(msg)
        self.env = env


def run_graph(graph: Graph, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Check `inputs` against the graph's signature, run it, return {output name: array}.

    Inputs that break an assumption of the generic graph run on its specialisation to their static shapes
    (built once per shape, `ir.specialize.static_variant`)."""
    try:
        env = bind_inputs(graph, inputs)
    except AssumptionFailed as e:
        from dynshape.ir.specialize import static_variant

        return run_graph(static_variant(graph, e.env), inputs)
    values: dict[str, Any] = dict(graph.initializers)
    values.update({v.name: _as_value(inputs[v.name], v.kind) for v in graph.inputs})
    _execute(graph, ChainMap(values), env)
    return {v.name: values[v.name] for v in graph.outputs}


def run_subgraph(graph: Graph, inputs: list, scope: Mapping[str, Any], env: dict[str, int]) -> list:
    """Run a body graph (If branch, Loop/Scan body) with the enclosing values in scope; returns its outputs.

    Symbols are bound in a copy of `env`: sizes that change per iteration are re-bound each time.
    """
    env = dict(env)
    local: dict[str, Any] = dict(graph.initializers)
    for v, x in zip(graph.inputs, inputs):
        local[v.name] = x
        t = graph.types.get(v.name)
        if t is not None:
            _check_value(None, v.name, x, t, env, what="body input")
    values = ChainMap(local, *(scope.maps if isinstance(scope, ChainMap) else (scope,)))
    _execute(graph, values, env)
    return [values[v.name] for v in graph.outputs]


def _as_value(x: Any, kind: str) -> Any:
    """A feed as the references expect it: arrays for tensors, lists for sequences, None for empty optionals."""
    if x is None or isinstance(x, np.ndarray) or (kind != "tensor" and isinstance(x, list)):
        return x
    return np.asarray(x)


# ---- input binding -------------------------------------------------------------------------------------------
def bind_inputs(graph: Graph, inputs: Mapping[str, Any]) -> dict[str, int]:
    """Validate inputs and return the symbol values they imply; ConstraintViolation on any mismatch."""
    if not isinstance(inputs, Mapping):
        raise ConstraintViolation(f"inputs must be a dict name -> array, got {type(inputs).__name__}")
    declared = {v.name: v for v in graph.inputs}
    extra = [k for k in inputs if k not in declared]
    if extra:
        raise ConstraintViolation(f"unknown input {extra[0]!r}; the model's inputs are: "
                                  + ", ".join(f"{v.name}: {format_type(graph.types.get(v.name), v.dtype)}"
                                              for v in graph.inputs))
    missing = [v for v in graph.inputs if v.name not in inputs]
    if missing:
        raise ConstraintViolation("missing input(s): " + ", ".join(
            f"{v.name!r} ({format_type(graph.types.get(v.name), v.dtype)})" for v in missing))
    obs: list = []
    first_seen: dict[str, str] = {}
    for v in graph.inputs:
        t = graph.types.get(v.name, v.type)
        x = inputs[v.name]
        _check_input(v.name, x, t, obs, first_seen)
    try:
        env = solve(obs)
    except ConstraintViolation as e:
        raise ConstraintViolation(_with_facts(str(e), graph)) from None
    for f in graph.signature.facts:
        check = f.check
        if check is None or not check.free_symbols <= env.keys():
            continue
        if not _holds(check, env):
            if f.kind == "assume":
                raise AssumptionFailed(f"inputs break {f.text!r}, which {f.origin} (the inputs are valid: "
                                       "run them on a graph specialised to their shapes)", env)
            syms = sorted(check.free_symbols)
            at = "; ".join(f"{s} = {env[s]} (from {first_seen.get(s, 'a derived dim')})" for s in syms)
            raise ConstraintViolation(f"inputs break {f.text!r}, required by {f.origin}: {at}")
    return env


def _check_input(name: str, x: Any, t: Any, obs: list, first_seen: dict) -> None:
    what = f"input {name!r}"
    if isinstance(t, OptionalType):
        if x is None:
            return
        t = t.elem
    if isinstance(t, SequenceType):
        if not isinstance(x, list):
            raise ConstraintViolation(f"{what} must be a list of arrays (a sequence), got {type(x).__name__}")
        for i, el in enumerate(x):
            el = np.asarray(el)
            if el.dtype != t.dtype:
                raise ConstraintViolation(f"{what} element {i} has dtype {el.dtype}, expected {t.dtype}")
        return
    if x is None:
        raise ConstraintViolation(f"{what} is None; expected {format_type(t)}")
    if not isinstance(x, np.ndarray):
        if isinstance(x, (np.generic, int, float, bool, list, tuple)):
            x = np.asarray(x)
        else:
            raise ConstraintViolation(f"{what} must be a numpy array, got {type(x).__name__}")
    if x.dtype != t.dtype:
        raise ConstraintViolation(f"{what} has dtype {x.dtype}, expected {t.dtype} ({format_type(t)}); "
                                  f"convert it with .astype('{t.dtype}')")
    if x.ndim != len(t.shape):
        raise ConstraintViolation(f"{what} has rank {x.ndim} (shape {x.shape}), expected rank {len(t.shape)}: "
                                  f"{format_type(t)}")
    for axis, (d, n) in enumerate(zip(t.shape, x.shape)):
        label = f"input {name!r} axis {axis}"
        if isinstance(d, Expr):
            obs.append((d, int(n), label))
            for s in d.free_symbols:
                first_seen.setdefault(s, label)
        elif d != n:
            raise ConstraintViolation(f"{label} is {n}, expected {d} ({format_type(t)})")


def _holds(check: Any, env: dict) -> bool:
    return bool(check(env)) if callable(check) else bool(check.evaluate(env))


def _with_facts(msg: str, graph: Graph) -> str:
    """Append the facts that mention the symbols named in a solver message (why a range is what it is)."""
    names = {n for n in graph.signature.symbols if re.search(rf"\b{re.escape(n)}\b", msg)}
    related = [f for f in graph.signature.facts if f.kind in ("range", "eq", "require")
               and any(re.search(rf"\b{re.escape(n)}\b", f.text) for n in names)]
    if not related:
        return msg
    return msg + "; because: " + "; ".join(f"{f.text} ({f.origin})" for f in related[:4])


# ---- execution -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scope:
    """What a step may look at besides its arguments: every visible value (subgraph bodies read their enclosing
    graphs' values), the bound symbols, and the call's key (compiled kernels compute their extents from it)."""

    values: Mapping[str, Any]
    env: dict[str, int]
    key: tuple = ()


class Step(Protocol):
    """One unit of execution: a node run by its reference, or a compiled kernel / lowering (the runtime's)."""

    label: str
    inputs: tuple[str, ...]  # '' marks an omitted optional input
    outputs: tuple[str, ...]

    def run(self, args: list, scope: Scope) -> list: ...


@dataclass(frozen=True)
class ReferenceStep:
    """A node run by its op's numpy reference."""

    node: Node
    attrs: dict
    reference: Any
    label: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @staticmethod
    def of(node: Node, opset: int) -> ReferenceStep:
        op = opdef.require(node.op_type, node.domain, node.label())
        attrs = {**node.attrs, "_opset": opset, "_num_outputs": len(node.outputs)}
        return ReferenceStep(node, attrs, op.reference, node.label(), tuple(node.inputs), tuple(node.outputs))

    def run(self, args: list, scope: Scope) -> list:
        if self.node.subgraphs():
            return self.reference(args, {**self.attrs, "_scope": scope.values, "_env": scope.env})
        return self.reference(args, self.attrs)


def interpret(steps: Iterable[Step], values: MutableMapping[str, Any], scope: Scope,
              check: Callable[[Step, str, Any], None] | None = None) -> None:
    """Run `steps` in order over `values` (read and written in place): the one loop behind the reference executor
    and the compiled executable's unplanned path. A failure inside a step is a DynshapeError naming it."""
    for step in steps:
        args = []
        for x in step.inputs:
            if not x:
                args.append(None)
            elif x in values:
                args.append(values[x])
            else:
                raise ShapeError(f"{step.label}: input {x!r} has no value (graph not in topological order?)")
        try:
            outs = step.run(args, scope)
        except DynshapeError:
            raise
        except MemoryError as e:  # a size the inputs' values or shapes make too large for this machine
            ins = ", ".join(_describe(a) for a in args)
            raise DynshapeError(f"{step.label} needs more memory than the operating system gives ({e}); its inputs: "
                                f"{ins}. Bound the model's symbols (dims=...) or feed smaller inputs") from None
        except Exception as e:  # the values fed make the op fail (a bad index, a shape value that does not fit)
            ins = ", ".join(_describe(a) for a in args)
            raise ConstraintViolation(f"{step.label} cannot run on these inputs ({ins}): "
                                      f"{type(e).__name__}: {e}") from e
        if len(outs) < len([o for o in step.outputs if o]):
            raise ShapeError(f"{step.label}: returned {len(outs)} outputs for {len(step.outputs)}")
        for name, out in zip(step.outputs, outs):
            if not name:
                continue
            if isinstance(out, np.generic):  # numpy ufuncs turn 0-d results into scalars
                out = np.asarray(out)
            if check is not None:
                check(step, name, out)
            values[name] = out


def _execute(graph: Graph, values: ChainMap, env: dict[str, int]) -> None:
    steps = [ReferenceStep.of(node, graph.opset) for node in graph.nodes]

    def check(step: Step, name: str, out: Any) -> None:
        t = graph.types.get(name)
        if t is not None:
            _check_value(step.node, name, out, t, env)

    interpret(steps, values, Scope(values, env), check)


def _describe(x: Any) -> str:
    if x is None:
        return "omitted"
    if isinstance(x, np.ndarray):
        return f"{x.dtype}{list(x.shape)}" + (f" = {x.reshape(-1).tolist()}" if 0 < x.size <= 8 else "")
    if isinstance(x, list):
        return f"sequence of {len(x)}"
    return type(x).__name__


def _check_value(node: Node | None, name: str, x: Any, t: Any, env: dict, what: str = "output") -> None:
    """x must have type t at the bound symbols; binds symbols seen for the first time."""
    where = node.label() if node is not None else "subgraph"
    if isinstance(t, OptionalType):
        if x is None:
            return
        t = t.elem
    if isinstance(t, SequenceType):
        if not isinstance(x, list):
            raise ShapeError(f"{where}: {what} {name!r} should be a sequence, got {type(x).__name__}")
        for el in x:
            if np.asarray(el).dtype != t.dtype:
                raise ShapeError(f"{where}: {what} {name!r} holds {np.asarray(el).dtype}, inferred {t.dtype}")
        return
    if not isinstance(x, np.ndarray):
        raise ShapeError(f"{where}: {what} {name!r} is a {type(x).__name__}, not an array (reference bug)")
    if x.dtype != t.dtype or x.ndim != len(t.shape):
        _mismatch(where, what, name, x, t, env)
    pending = []
    for d, n in zip(t.shape, x.shape):
        if isinstance(d, Expr):
            if d.free_symbols <= env.keys():
                if d.evaluate(env) != n:
                    _mismatch(where, what, name, x, t, env)
            else:
                pending.append((d, int(n)))
        elif d != n:
            _mismatch(where, what, name, x, t, env)
    for d, n in pending:  # data-dependent sizes: bind on first sight where the dim says how
        r = substitute(d, {s: env[s] for s in d.free_symbols if s in env})
        if isinstance(r, int):
            if r != n:
                _mismatch(where, what, name, x, t, env)
        elif _linear_one(r):
            try:
                env.update(solve([(r, n, f"{what} {name!r}")]))
            except ConstraintViolation:
                _mismatch(where, what, name, x, t, env)


def _linear_one(e: Expr) -> bool:
    return len(e.terms) == 1 and len(e.terms[0][0]) == 1 and isinstance(e.terms[0][0][0], Symbol)


def _mismatch(where: str, what: str, name: str, x: np.ndarray, t: TensorType, env: dict) -> None:
    at = [d.evaluate(env) if isinstance(d, Expr) and d.free_symbols <= env.keys() else d for d in t.shape]
    raise ShapeError(f"{where}: {what} {name!r} is {x.dtype}{list(x.shape)}, but its inferred type is "
                     f"{format_type(t)} = {t.dtype}{at} here; the op's shape rule and reference disagree "
                     "(a dynshape bug: please report it with this model)")


# ---- memory bound --------------------------------------------------------------------------------------------
def memory_bound(graph: Graph) -> MemoryBound:
    """Peak of the summed upper bounds of live tensors over the node schedule (initializers always live)."""
    last: dict[str, int] = {}
    for i, n in enumerate(graph.nodes):
        for x in (*n.inputs, *n.free_names()):
            if x:
                last[x] = i
    end = len(graph.nodes)
    for v in graph.outputs:
        last[v.name] = end
    unbounded: dict[str, list[str]] = {}

    def size(name: str) -> int:
        t = graph.types.get(name)
        if not isinstance(t, TensorType):
            return 0
        ub = upper_bound(graph.numel(name))
        if ub is None:
            for s in sorted(graph.numel(name).syms, key=lambda s: s.name):
                if s.hi is None:
                    unbounded.setdefault(s.name, []).append(name)
            return 0
        return ub * np.dtype(t.dtype).itemsize

    base = sum(size(k) for k in graph.initializers)
    live = {v.name: size(v.name) for v in graph.inputs}
    current = sum(live.values())
    peak, peak_node = current, "the inputs"
    for i, n in enumerate(graph.nodes):
        for o in n.outputs:
            if o and o not in live:
                live[o] = size(o)
                current += live[o]
        if current > peak:
            peak, peak_node = current, n.label()
        for x in {*n.inputs, *n.outputs}:
            if x in live and last.get(x, i) <= i:
                current -= live.pop(x)
    if unbounded:
        return MemoryBound(None, None, unbounded)
    return MemoryBound(base + peak, peak_node, {})
