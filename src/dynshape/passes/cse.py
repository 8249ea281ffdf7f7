"""Common-subexpression elimination: a node that repeats an earlier one (same op, inputs and attributes) is
dropped and its outputs read the earlier node's.

Exporters repeat work per layer (masks rebuilt from the same shapes, the same Cast of the attention mask);
symbolic shape expressions need no such pass: they are canonical, so equal expressions are equal objects.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dynshape.ir.graph import Node
from dynshape.ir.opdef import is_random


def _attr_key(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return ("nd", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        return tuple(_attr_key(x) for x in v)
    if isinstance(v, (int, float, str, bytes, bool)) or v is None:
        return v
    raise TypeError  # graphs and other objects: not compared, the node is kept


def eliminate_common(nodes: list[Node], keep: set[str]) -> list[Node]:
    """`nodes` in order without repeats; `keep`: names that must stay produced (graph outputs)."""
    seen: dict[tuple, list[str]] = {}
    rename: dict[str, str] = {}
    out: list[Node] = []
    for n in nodes:
        ins = [rename.get(x, x) for x in n.inputs]
        if ins != n.inputs:
            n = dataclasses.replace(n, inputs=ins)
        if n.subgraphs() or is_random(n) or any(o in keep for o in n.outputs):
            out.append(n)
            continue
        try:
            key = (n.op_type, n.domain, tuple(ins), tuple(sorted((k, _attr_key(v)) for k, v in n.attrs.items())))
        except TypeError:
            out.append(n)
            continue
        first = seen.get(key)
        if first is not None and len(first) == len(n.outputs) and all(f or not o for o, f in zip(n.outputs, first)):
            rename.update({o: f for o, f in zip(n.outputs, first) if o})
            continue
        seen[key] = list(n.outputs)
        out.append(n)
    return out
