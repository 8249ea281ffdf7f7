"""`If` nodes whose condition is known only at run time, from the data (a wake-word model runs its verifier only
when the detector's score passes a threshold), with both branches compiled once and the taken one called.

Why: such an `If` cannot be specialised away (`ir.branches` inlines the ones decided by a small input or by the
shapes): its condition changes per call. Run as written, the interpreter walks the taken branch op by op every
call (openWakeWord's hey_jarvis: 0.32 ms a call, onnxruntime 0.04). Here each branch becomes a graph of its own
(its inputs: the enclosing values either branch reads, in one order for both; the enclosing constants it reads
become its initializers) compiled by dynshape's own compiler once, and the step reads the condition and calls the
branch it picks with those values. The node's outputs keep the types inference gave them (dims both branches
agree on); a branch whose result disagrees with them at run time is refused by name, never written truncated.

An `If` whose outputs take a fresh dim (the branches disagree on a size) or a rank that depends on values, whose
branches give or read sequences / optionals, draw random numbers, or do not compile, stays on the interpreter and
the step says why (`explain`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dynshape.codegen.lowering import BindRequest
from dynshape.errors import ConstraintViolation
from dynshape.ir.graph import Graph, Node, Value
from dynshape.ir.infer import infer_graph
from dynshape.ir.specialize import clone_structure
from dynshape.ir.types import TensorType
from dynshape.runtime.body_iterations import scalar
from dynshape.sym import Expr, Symbol, sym

__all__ = ["CompiledIf", "bindable", "branch_graph", "if_refusal", "standalone"]

BRANCHES = ("then_branch", "else_branch")


class CompiledIf:
    """An `If` with both branches compiled: `run(args)` takes the condition, then the enclosing values in
    `outer` order, and returns the taken branch's outputs; `why` says what it is, for explain."""

    def __init__(self, node: Node, exes: tuple[Any, Any], outer: tuple[str, ...]):
        self.node, self.exes, self.outer = node, exes, outer
        self.out_names = tuple([v.name for v in node.attrs[b].outputs] for b in BRANCHES)
        self.in_names = tuple([v.name for v in e.graph.inputs] for e in exes)
        kernels = sum(len(e.explain_build().get("kernels", [])) for e in exes)
        self.why = (f"both branches compiled once ({kernels} kernel{'s' if kernels != 1 else ''}), the one the "
                    "condition picks called per call")

    def run(self, args: list) -> list:
        k = 0 if bool(scalar(args[0], "condition")) else 1
        feed = dict(zip(self.outer, args[1:]))
        res = self.exes[k].run({x: feed[x] for x in self.in_names[k]})
        return [res[x] for x in self.out_names[k]]

    def bind(self, r: BindRequest) -> list:
        """The node's step in a planned call: the taken branch's outputs copied into the plan's buffers, each
        checked against the buffer's shape first (inference's merged type: the branches agreed on it)."""
        run, ins, outs, label = self.run, r.ins, r.outs, self.node.label()

        def call() -> None:
            got = run(list(ins))
            for i, (view, res) in enumerate(zip(outs, got)):
                if view is None:
                    continue
                res = np.asarray(res)
                if res.shape != view.shape:
                    raise ConstraintViolation(f"{label}: its taken branch gave output {i} of shape "
                                              f"{tuple(res.shape)} where the model's types say {tuple(view.shape)}")
                view[...] = res

        return [call]


def if_refusal(node: Node, graph: Graph, random: Callable[[Graph], bool]) -> str:
    """Why this If's branches cannot be compiled on their own, or '' when they may be."""
    outs = [graph.types.get(x) for x in node.outputs if x]
    if not all(isinstance(t, TensorType) and t.shape is not None for t in outs):
        return "its outputs are sequences / optionals, or their ranks depend on the condition"
    if any(isinstance(d, Expr) and any(s.startswith("?") for s in d.free_symbols) for t in outs for d in t.shape):
        return "its branches give outputs of different sizes (a size known only once the condition is)"
    if any(not isinstance(graph.types.get(x), TensorType) for x in node.free_names()):
        return "its branches read sequence / optional values of the enclosing graph"
    for b in BRANCHES:
        g = node.attrs.get(b)
        if not isinstance(g, Graph):
            return f"its {b} is missing"
        if random(g):
            return "a branch draws random numbers (each call must draw anew)"
        made = {o for n in g.nodes for o in n.outputs}
        if any(v.name not in made for v in g.outputs):
            return "a branch gives an enclosing value or a constant as it is (no node of its own makes it)"
    return ""


def branch_graph(node: Node, which: str, graph: Graph, outer: tuple[str, ...]) -> Graph:
    """One branch as a graph of its own, inferred: its inputs the enclosing values of `outer` it reads (typed as
    the enclosing graph has them), the constants of the enclosing graph it reads its initializers."""
    branch = node.attrs[which]
    reads = Node(node.op_type, node.domain, node.name, {which: branch}, [], []).free_names()
    prefix, rename = "".join(c if c.isalnum() else "_" for c in f"{node.name or node.op_type}_{which}"), {}
    inputs = [Value.of(x, bindable(graph.types[x], prefix, x, rename)) for x in outer if x in reads]
    return standalone(graph, node, branch, which, inputs, reads)


def standalone(graph: Graph, node: Node, sub: Graph, what: str, inputs: list[Value], reads: set[str]) -> Graph:
    """`sub` (a Loop / Scan body or an If branch of `node`) as a graph of its own, inferred: `inputs` its inputs,
    the constants of the enclosing graph it `reads` its initializers, its outputs left for inference to type."""
    consts = graph.constants()
    g = clone_structure(sub)
    g.name = f"{graph.name or 'graph'}/{node.name or node.op_type} {what}"
    g.inputs = inputs
    g.initializers.update({x: consts[x] for x in sorted(reads) if x in consts and x not in g.initializers})
    g.outputs = [Value(v.name, v.dtype, None, v.kind) for v in sub.outputs]
    g.opset_imports = dict(graph.opset_imports)
    return infer_graph(g)


def bindable(t: TensorType, prefix: str, name: str, rename: dict[str, Expr]) -> TensorType:
    """A subgraph input's type (a Loop / Scan body's, an If branch's) whose dims its own binder can read off the
    shapes it is fed: a data-dependent size (a fresh `?` symbol) becomes a plain symbol (one per fresh symbol, in
    `rename`), and so does a size derived from the enclosing graph's symbols (d2 // 4: the binder could not solve
    for d2 from it; the linear-attention functions' Scans), whose facts inference of the subgraph then checks."""
    shape = []
    for axis, d in enumerate(t.shape):
        if isinstance(d, Expr) and any(s.startswith("?") for s in d.free_symbols):
            if d.is_atom() and isinstance(d.atom(), Symbol):
                d = rename.setdefault(d.atom().name, sym(f"{prefix}_{len(rename)}", min=0))
            else:  # a size derived from a fresh one: a symbol of its own
                d = sym(f"{prefix}_{name}_{axis}", min=0)
        elif isinstance(d, Expr) and not (d.is_atom() and isinstance(d.atom(), Symbol)):
            d = sym(f"{prefix}_{name}_{axis}", min=0)
        shape.append(d)
    return TensorType(t.dtype, tuple(shape))
