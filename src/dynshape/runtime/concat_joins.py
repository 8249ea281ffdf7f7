"""Concat by its producers writing straight into their slice: no copy, no buffer per branch.

A channels-last Concat on the last axis (SqueezeNet's fire modules, Inception's branches, DenseNet's growth,
a detector's FPN) copies every pixel's channels from each branch into the wider pixel. When each branch is the
only output of a kernel whose output rows are a key slot apart (`KernelStep.row_stride`: dense convolutions and
products) or of a native node that reads its output's strides (`NativeRule.strided`: Resize, a detector's FPN
upsampling), the plan instead points that step at its columns of the Concat's buffer (a kernel gets the Concat's
width as the stride); the Concat runs no step. The plan decides this per build, so the same kernel serves a dense
output (unplanned runs, per-key steps) and a slice.

A join needs, for an input of the Concat: a distinct value, made by a row-stride kernel step as its only
output, read by nothing else, not a graph output, not computed per key; and of the Concat: static channel
counts that add up to its own, the same leading dims as its output. Where only some inputs can be joined (a
UNet's skip connection is read by the next level's pool too), those are written in place and the Concat's step
copies the others only (ds_concat skips an input that already lies at its columns).
"""

from __future__ import annotations

from dataclasses import dataclass

from dynshape.ir.opdef import is_default_domain
from dynshape.passes.values import is_float32
from dynshape.runtime.build import Build, KernelStep, NodeStep


@dataclass(frozen=True)
class Join:
    """A value written as columns [col, col + its width) of `into`, a Concat's output (whose width the kernel
    then takes as its row stride)."""

    into: str
    col: int


def concat_joins(build: Build, per_key: set[int], graph_outputs: set[str]) -> tuple[dict[str, Join], set[int]]:
    """(value -> its Join, the indices of the Concat steps that no longer run)."""
    g, steps = build.graph, build.steps
    producer: dict[str, int] = {}
    readers: dict[str, int] = {}
    for i, s in enumerate(steps):
        for o in s.outputs:
            if o:
                producer[o] = i
        for x in s.inputs:
            if isinstance(x, str) and x:
                readers[x] = readers.get(x, 0) + 1
        if isinstance(s, NodeStep):
            for x in s.node.free_names():
                readers[x] = readers.get(x, 0) + 2  # read by a body: never joined
    joins: dict[str, Join] = {}
    skipped: set[int] = set()
    for i, s in enumerate(steps):
        if not (isinstance(s, NodeStep) and s.node.op_type == "Concat" and is_default_domain(s.node)) \
                or i in per_key or len(s.outputs) != 1:
            continue
        made = _join(s, i, g, steps, producer, readers, per_key, graph_outputs)
        if made is not None:
            found, whole = made
            joins.update(found)
            if whole:  # every input in place: the Concat runs no step (else it copies the others only)
                skipped.add(i)
    return joins, skipped


def _join(s: NodeStep, i: int, g, steps, producer: dict, readers: dict, per_key: set[int],
          graph_outputs: set[str]) -> tuple[dict[str, Join], bool] | None:
    """(the joins of the Concat at step i's inputs that can be written in place, whether that is all of them),
    None where none can."""
    out = s.outputs[0]
    t = g.types.get(out)
    if not is_float32(t) or len(t.shape) < 2 or not isinstance(t.shape[-1], int) or out in graph_outputs:
        return None
    rank = len(t.shape)
    if int(s.node.attrs.get("axis", 0)) % rank != rank - 1:
        return None
    xs = list(s.inputs)
    if len(xs) < 2 or len(set(xs)) != len(xs) or not all(xs):
        return None
    found: dict[str, Join] = {}
    col = 0
    for x in xs:
        xt = g.types.get(x)
        if not is_float32(xt) or len(xt.shape) != rank or not isinstance(xt.shape[-1], int):
            return None
        # a joined input has the Concat's leading dims as written (its rows are the Concat's); one it copies may
        # spell them otherwise (a UNet's skip map: H//2 where the Concat says 8*(H//16), equal by its guards)
        if tuple(xt.shape[:-1]) == tuple(t.shape[:-1]) \
                and _writes_its_columns(x, i, steps, producer, readers, per_key, graph_outputs):
            found[x] = Join(out, col)
        col += xt.shape[-1]
    return (found, len(found) == len(xs)) if col == t.shape[-1] and found else None


def _writes_its_columns(x: str, i: int, steps, producer: dict, readers: dict, per_key: set[int],
                        graph_outputs: set[str]) -> bool:
    """Whether input x of the Concat at step i can be written by its producer straight into its columns: the
    Concat is its only reader, it is not a graph output, and its producer (before i, not per key) has it as its
    only output and writes rows a stride apart (a row-stride kernel, or a native step that reads its output's
    strides)."""
    j = producer.get(x)
    if x in graph_outputs or readers.get(x) != 1 or j is None or j > i or j in per_key:
        return False
    p = steps[j]
    kernel = isinstance(p, KernelStep) and p.row_stride
    native = isinstance(p, NodeStep) and p.how == "native" and p.native is not None and p.native.strided(p.node)
    return bool((kernel or native) and p.outputs == (x,))
