"""Loop and Scan bodies compiled once per executable and called per iteration, instead of interpreted.

Why: a `Loop` / `Scan` node runs its body graph once per iteration. Run by the reference executor, every
iteration re-checks every body value's type, walks a ChainMap scope and calls each op's numpy reference (an
RNN written as a Loop: tens of microseconds per op, per iteration, per call). Here the body becomes a graph of
its own (its inputs: the iteration number, the condition and the carried values for a Loop, the carried values
and the scan slices for a Scan, then every name it reads from the enclosing graphs; the enclosing constants
become its initializers), inferred with the body's symbolic types (dims that change per iteration are symbols
already: `ops.control` makes them fresh), and compiled by dynshape's own compiler once: one build serves every
iteration and every call, at every shape. The step then calls it once per iteration; the loop itself (trip
count, condition, concatenating the scan outputs, axes and directions) stays the few lines below, exactly the
ONNX semantics of `ops.control`'s references.

An `If` on a condition computed from the data has its two branches compiled the same way (if_branches.py).

A body that cannot compile stays on the interpreter, and the step says why (`explain`): a rank that depends
on values, sequence / optional values, a random op (its draws must differ per iteration and per call), Scan
before opset 9 (batch semantics), or anything the compiler refuses.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from dynshape.codegen.lowering import BindRequest
from dynshape.ir.graph import Graph, Node, Value
from dynshape.ir.opdef import is_default_domain, lookup
from dynshape.ir.types import TensorType
from dynshape.runtime.body_iterations import Roles, Stacks, iterate, own, scalar
from dynshape.runtime.if_branches import BRANCHES, CompiledIf, bindable, branch_graph, if_refusal, standalone
from dynshape.sym import Expr

__all__ = ["BODY_OPS", "Bodies", "CompiledBody"]

BODY_OPS = ("Loop", "Scan", "If")  # an If's two branches: if_branches.py


class CompiledBody:
    """A node's body compiled: `run(args)` runs the whole Loop / Scan node (its inputs, then the outer values
    the body reads, in `outer` order) and returns its outputs; `why` says what it is, for explain."""

    def __init__(self, node: Node, exe: Any, outer: tuple[str, ...]):
        self.node, self.exe, self.outer = node, exe, outer
        body = node.attrs["body"]
        self.names = [v.name for v in body.inputs]
        self.out_names = [v.name for v in body.outputs]
        self.kernels = len(exe.explain_build().get("kernels", []))
        self.symbols = [s.name for s in exe.symbols]
        self.run = self._loop if node.op_type == "Loop" else self._scan
        self.roles = _roles(node, self.names, self.out_names, self.outer)
        self.memo: list = [None]  # the last plan's Lean (body_iterations.py): made once per plan
        if node.op_type == "Scan":  # the attributes with their defaults, once
            a, k, nys = node.attrs, node.attrs["num_scan_inputs"], len(self.roles.ys_out)
            self.scan_attrs = (k, a.get("scan_input_axes", [0] * k), a.get("scan_input_directions", [0] * k),
                               a.get("scan_output_axes", [0] * nys), [bool(d) for d in
                                                                    a.get("scan_output_directions", [0] * nys)])
        self.why = (f"body compiled once ({self.kernels} kernel{'s' if self.kernels != 1 else ''}), called once "
                    "per iteration")

    def bind(self, r: BindRequest) -> list:
        """The node's step in a planned call: its results written straight into the plan's buffers (the carried
        values copied out of the body's arena into them, a Scan's rows written into them as the iterations run),
        instead of into new arrays that the step then copies into the buffers."""
        run, ins, outs = self.run, r.ins, r.outs

        def call() -> None:
            for view, res in zip(outs, run(list(ins), outs)):
                if view is not None and res is not view:
                    view[...] = res

        return [call]

    # ---- Loop ------------------------------------------------------------------------------------------------
    def _loop(self, args: list, outs: list | None = None) -> list:
        """The Loop's outputs; `outs` (optional): arrays to write them into, per output (None: a new array)."""
        names = self.names
        n = len(names) - 2
        m, cond, carried, outer = args[0], args[1], list(args[2:2 + n]), args[2 + n:]
        trips = None if m is None else int(scalar(m, "trip count M"))
        go = True if cond is None else bool(scalar(cond, "condition"))
        feed = dict(zip(self.outer, outer))
        feed[names[1]] = np.array(True)  # an iteration runs only while the condition holds
        ys = Stacks(self.roles.ys_out, trips, [False] * len(self.roles.ys_out))
        steps = 0
        into = None if outs is None else outs[:n]
        if go and (trips is None or trips > 0):
            with self.exe.held() as bind:
                carried, steps = iterate(bind, self.exe.run, self.roles, feed, carried, [], trips, ys, self.memo)
                carried = own(carried, into)
        else:
            carried = own(carried, into)
        if not steps:
            feed[names[0]] = np.array(0, np.int64)
            feed.update(zip(names[2:], carried))
        return carried + [ys.result(j, steps, outs is None) if steps else self._empty(1 + n + j, feed)
                          for j in range(len(self.roles.ys_out))]

    # ---- Scan (opset 9 and later) ------------------------------------------------------------------------------
    def _scan(self, args: list, outs: list | None = None) -> list:
        """The Scan's outputs; `outs` (optional): arrays to write them into, per output (None: a new array)."""
        names = self.names
        k, in_axes, in_dirs, out_axes, out_dirs = self.scan_attrs
        ns = len(names) - k
        nys = len(out_axes)
        state, xs, outer = list(args[:ns]), args[ns:ns + k], args[ns + k:]
        xs = [_to_front(x, a, d) for x, a, d in zip(xs, in_axes, in_dirs)]
        steps = xs[0].shape[0] if xs else 0
        feed = dict(zip(self.outer, outer))
        into = None if outs is None else [_rows(o, a, steps) for o, a in zip(outs[ns:], out_axes)]
        ys = Stacks(self.roles.ys_out, steps, out_dirs, exact=True, into=into)
        if steps:
            with self.exe.held() as bind:
                state, _ = iterate(bind, self.exe.run, self.roles, feed, state, xs, steps, ys, self.memo)
                state = own(state, None if outs is None else outs[:ns])
        else:
            state = own(state, None if outs is None else outs[:ns])
            feed.update(zip(names[:ns], state))
            feed.update((x, np.zeros(a.shape[1:], a.dtype)) for x, a in zip(names[ns:], xs))
        res_out = []
        for j in range(nys):
            if into is not None and into[j] is not None and steps:
                res_out.append(outs[ns + j])  # written in place, row by row
                continue
            y = ys.result(j, steps) if steps else self._empty(ns + j, feed)
            res_out.append(_from_front(y, out_axes[j]))
        return state + res_out

    def _empty(self, index: int, feed: dict) -> np.ndarray:
        """A scan output when no iteration ran: an empty tensor of the body output's shape at the symbols the
        loop's first inputs bind (a dim they do not determine is 0, as the reference makes it)."""
        t = self.exe.graph.types[self.out_names[index]]
        try:
            env = dict(zip(self.symbols, self.exe.binder(feed)[1]))
        except Exception:  # noqa: BLE001 - inputs the body would refuse: no iteration ran, so nothing refuses them
            env = {}
        shape = [d if isinstance(d, int) else d.evaluate(env) if d.free_symbols <= env.keys() else 0
                 for d in t.shape]
        return np.zeros((0, *shape), t.dtype)


class Bodies:
    """One per executable: each Loop / Scan body compiled on first build, kept for every later build whose body
    and outer types are the same (static variants built later reuse it). `make(graph)`: the compiler (an
    executable serving every shape)."""

    def __init__(self, make: Callable[[Graph], Any]):
        self._make = make
        self._cache: dict[tuple, CompiledBody | CompiledIf | str] = {}
        self._lock = threading.Lock()

    def __call__(self, node: Node, graph: Graph) -> CompiledBody | CompiledIf | str:
        """The node's compiled body (an If's two branches), or why it stays on the interpreter."""
        why = refusal(node, graph)
        if why:
            return why
        outer = _outer(node, graph)
        if node.op_type == "If":  # its branches, keyed by the types of the node's outputs
            head, compile_ = tuple(str(graph.types.get(x)) for x in node.outputs), self._compile_if
        else:  # a Loop / Scan body, keyed by the types of its own inputs
            body = node.attrs["body"]
            head, compile_ = tuple(str(body.types.get(v.name)) for v in body.inputs), self._compile
        key = (node.name, node.op_type, head, tuple((x, str(graph.types.get(x))) for x in outer))
        with self._lock:
            got = self._cache.get(key)
            if got is None:
                got = self._cache[key] = compile_(node, graph, outer)
            return got

    def _compile_if(self, node: Node, graph: Graph, outer: tuple[str, ...]) -> CompiledIf | str:
        exes = []
        for which in BRANCHES:
            try:
                g = branch_graph(node, which, graph, outer)
            except Exception as e:  # noqa: BLE001 - inference of the branch on its own failed: interpret it
                return f"its {which} does not infer on its own ({_first_line(e)})"
            if g.rank_symbols or g.dynamic:
                return f"a rank in its {which} depends on values ({g.dynamic or ', '.join(g.rank_symbols)})"
            if not all(isinstance(g.types.get(v.name), TensorType) for v in (*g.inputs, *g.outputs)):
                return f"its {which} takes or gives sequence / optional values"
            try:
                exes.append(self._make(g))
            except Exception as e:  # noqa: BLE001 - the compiler refused the branch: interpret it
                return f"the compiler refused its {which} ({_first_line(e)})"
        return CompiledIf(node, (exes[0], exes[1]), outer)

    def _compile(self, node: Node, graph: Graph, outer: tuple[str, ...]) -> CompiledBody | str:
        try:
            g = body_graph(node, graph, outer)
        except Exception as e:  # noqa: BLE001 - inference of the body on its own failed: interpret it
            return f"its body does not infer on its own ({_first_line(e)})"
        if g.rank_symbols or g.dynamic:
            return f"a rank in its body depends on values ({g.dynamic or ', '.join(g.rank_symbols)})"
        if not all(isinstance(g.types.get(v.name), TensorType) for v in (*g.inputs, *g.outputs)):
            return "its body takes or gives sequence / optional values"
        try:
            exe = self._make(g)
        except Exception as e:  # noqa: BLE001 - the compiler refused the body: interpret it
            return f"the compiler refused its body ({_first_line(e)})"
        return CompiledBody(node, exe, tuple(v.name for v in g.inputs[len(node.attrs["body"].inputs):]))


def refusal(node: Node, graph: Graph) -> str:
    """Why this Loop / Scan node's body (an If's branches) cannot be compiled on its own, or '' when it may be."""
    if not is_default_domain(node) or node.op_type not in BODY_OPS:
        return f"{node.op_type} has no body to compile"
    if node.op_type == "If":
        return if_refusal(node, graph, _random)
    if node.op_type == "Scan" and graph.opset < 9:
        return "Scan before opset 9 (a batch axis, sequence_lens)"
    body = node.attrs.get("body")
    if not isinstance(body, Graph) or not body.types:
        return "its body has no inferred types (a rank depends on values)"
    ins = [body.types.get(v.name) for v in body.inputs]
    if not all(isinstance(t, TensorType) for t in ins):
        return "its carried / scanned values are sequences or optionals"
    if any(not isinstance(graph.types.get(x), TensorType) for x in node.free_names()):
        return "its body reads sequence / optional values of the enclosing graph"
    if _random(body):
        return "its body draws random numbers (each iteration and call must draw anew)"
    return ""


def _random(g: Graph) -> bool:
    for n in g.nodes:
        op = lookup(n.op_type, n.domain)
        if (op is not None and op.random) or any(_random(s) for s in n.subgraphs()):
            return True
    return False


def _outer(node: Node, graph: Graph) -> tuple[str, ...]:
    """The enclosing values the body reads that are not constants: extra inputs of the compiled body."""
    consts = graph.constants()
    return tuple(x for x in sorted(node.free_names()) if x not in consts)


def body_graph(node: Node, graph: Graph, outer: tuple[str, ...]) -> Graph:
    """The node's body as a graph of its own, inferred: the body's inputs typed as inference saw them across
    iterations (data-dependent sizes renamed to plain symbols), then the outer values in `outer`; the constants
    of the enclosing graph it reads become initializers."""
    body = node.attrs["body"]
    rename: dict[str, Expr] = {}
    prefix = "".join(c if c.isalnum() else "_" for c in (node.name or node.op_type))
    inputs = [Value.of(v.name, bindable(body.types[v.name], prefix, v.name, rename)) for v in body.inputs]
    inputs += [Value.of(x, bindable(graph.types[x], prefix, x, rename)) for x in outer]
    return standalone(graph, node, body, "body", inputs, node.free_names())


def _to_front(x: Any, axis: int, reverse: int) -> np.ndarray:
    """A scan input (or a Scan's output) with its scanned axis first (a view; np.moveaxis costs ~3 us, a transpose
    ~0.3), reversed."""
    x = np.asarray(x)
    a = axis % x.ndim
    if a:
        x = x.transpose(_perm(a, x.ndim, True))
    return x[::-1] if reverse else x


def _rows(out: np.ndarray | None, axis: int, steps: int) -> np.ndarray | None:
    """A Scan's planned output with its scan axis first (a view), when it has a row per iteration (else None:
    the rows go into an array of their own, copied into it at the end)."""
    if out is None or not out.ndim:
        return None
    rows = _to_front(out, axis, 0)
    return rows if rows.shape[0] == steps else None


def _from_front(y: np.ndarray, axis: int) -> np.ndarray:
    """A Scan's stacked output (rows first) with its rows moved to `axis` (a view)."""
    a = axis % y.ndim
    return y.transpose(_perm(a, y.ndim, False)) if a else y


@functools.lru_cache(maxsize=256)
def _perm(axis: int, ndim: int, to_front: bool) -> tuple[int, ...]:
    """The transpose moving `axis` first (`to_front`), or moving the first axis to `axis`."""
    if to_front:
        return (axis, *range(axis), *range(axis + 1, ndim))
    return (*range(1, axis + 1), 0, *range(axis + 1, ndim))


def _roles(node: Node, names: list[str], out_names: list[str], outer: tuple[str, ...]) -> Roles:
    """What each input and output of the compiled body is to the loop (its inputs: the body's, then `outer`)."""
    everything = tuple(names) + outer
    kept = range(len(names), len(everything))
    if node.op_type == "Loop":
        n = len(names) - 2
        return Roles(everything, 0, tuple(range(2, 2 + n)), tuple(out_names[1:1 + n]), (), out_names[0],
                     tuple(out_names[1 + n:]), frozenset((1, *kept)))
    ns = len(names) - node.attrs["num_scan_inputs"]
    return Roles(everything, None, tuple(range(ns)), tuple(out_names[:ns]), tuple(range(ns, len(names))), None,
                 tuple(out_names[ns:]), frozenset(kept))


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
