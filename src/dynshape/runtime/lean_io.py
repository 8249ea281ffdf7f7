"""A lean move's inputs and outputs as one generated function of the key (rekey.py's `_move`, `_lean_puts`).

Why: a move that changes only words (a decode loop's next past length: no step bound again, no per-key value
new) still made every input's and output's view for the key in a loop over the bucket's values, then the in-place
entries' byte counts, the large outputs to return in new arrays (`fresh_outputs`) and the out= shapes and copies
(`BoundPlan.views_changed`), each a pass of dict lookups and shape products, on every token of a first generation.
Here that is one function compiled once per bucket plan and set of changed symbols, whose body has each shape, byte
count and offset written out; a view is a slice of a flat view of the arena, shaped (~0.4 us against ~0.8 for
np.ndarray(buffer=...)), and the views of values whose shapes read no changed symbol are the last key's, when it
left them. GPT-2's step: its move 66-108 -> 52-83 us (medians over first generations, AMD EPYC Zen 3).

It computes exactly what the loop did: the same views (shape, dtype, arena offset), the same byte counts
(`math.prod(shape) * itemsize`), the same `fresh` order and threshold; `make_lean_io` returns None where a value
is not a plain view of the arena or a constant (a Concat's columns), and the loop serves that move.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.runtime.per_key import shape_py
from dynshape.runtime.plan import IN_PLACE_BYTES
from dynshape.sym import Expr
from dynshape.sym.pysource import key_names, to_py


def make_lean_io(pl: Any, arena: np.ndarray, io: tuple, n_inputs: int, fixed_names: frozenset,
                 changed: frozenset) -> Any:
    """`lean_io(key, old, fixed, writable)` for a bucket plan on `arena` whose graph inputs and outputs are `io`
    (BucketState.io: (name, dtype or None, arena offset or None) each, the `n_inputs` inputs first), moving by
    a change of the symbols in `changed`. It returns (inputs, outputs, views, want, copy_in, in_bytes,
    out_bytes, fresh): `old` is the last key's views by name (reused where the shape reads no changed symbol),
    `fixed` the constants and per-key values by name, `writable` the names of the outputs written in place.
    None: an input or output is neither a plain view of the arena nor in `fixed_names`."""
    types = pl.graph.types
    names = key_names(pl.symbol_names)
    var: dict[str, str] = {}  # value name -> its local
    body: list[str] = []
    nbytes: dict[str, str] = {}  # value name -> its bytes' source (plain views only)
    scope: dict[str, Any] = {"_LIMIT": IN_PLACE_BYTES}
    for x, dtype, off in io:
        if off is None or x in var:
            continue
        v = var[x] = f"v{len(var)}"
        if dtype is None:
            if x not in fixed_names:
                return None  # (a Concat's columns, a joined view: the loop makes it)
            body.append(f"{v} = fixed[{x!r}]")
            continue
        shape = types[x].shape
        size = np.dtype(dtype).itemsize
        # (the arena from the value's offset on, as its dtype: a key's view is its first elements, shaped; a
        # shape past the arena's end fails to assign, and the move gives up as any failing move does)
        scope[f"f_{v}"] = arena[int(off):int(off) + (arena.size - int(off)) // size * size].view(dtype)
        count = "*".join([f"({to_py(d, names)})" for d in shape] or ["1"])
        make = [f"{v} = f_{v}[:{count}]", f"{v}.shape = {shape_py(shape, names)}"]
        if any(isinstance(d, Expr) and not d.free_symbols.isdisjoint(changed) for d in shape):
            body += make
        else:  # (its shape is the last key's: its view is too, unless a recall emptied `old`)
            body += [f"{v} = old.get({x!r})", f"if {v} is None:", *("    " + m for m in make)]
        nbytes[x] = f"{count}*{size}"
    if any(x not in nbytes for x in (*pl.in_place, *pl.out_place)):
        return None  # (an in-place slot that is not a plain view: never made so, but the loop would say why)
    ins, outs = io[:n_inputs], io[n_inputs:]

    def item(x: str, off: Any) -> str:
        return "None" if off is None else var[x]

    inputs = ", ".join(item(x, off) for x, _, off in ins)
    outputs = ", ".join(f"({x!r}, {item(x, off)})" for x, _, off in outs)
    views = ", ".join(f"{x!r}: {var[x]}" for x, v in var.items() if x in nbytes)
    want = ", ".join(f"{x!r}: ({item(x, off)}.shape, {item(x, off)}.dtype)" for x, _, off in outs)
    copy_in = "".join(f"({k}, {var[x]}), " for k, (x, _, off) in enumerate(ins) if off is not None)
    in_bytes = "".join(nbytes.get(x, "-1") + ", " for x, _, _ in ins)
    out_names = [x for x, _, _ in outs if x in nbytes]
    body += [f"ob_{var[x]} = {nbytes[x]}" for x in out_names]
    out_bytes = ", ".join(f"{x!r}: ob_{var[x]}" for x in out_names)
    fresh = "".join(f"((({x!r}, {var[x]}.shape, {var[x]}.dtype),) if {x!r} in writable and ob_{var[x]} >= _LIMIT "
                    f"else ()) + " for x in out_names) + "()"
    body.append(f"return ([{inputs}], [{outputs}], {{{views}}}, {{{want}}}, ({copy_in}), ({in_bytes}), "
                f"{{{out_bytes}}}, {fresh})")
    unpack = "".join(f"{names[s]}, " for s in pl.symbol_names)
    src = "def lean_io(key, old, fixed, writable):\n" + (f"    ({unpack}) = key\n" if unpack else "") \
        + "".join(f"    {line}\n" for line in body)
    exec(compile(src, "<dynshape lean_io>", "exec"), scope)  # noqa: S102 - our own source, from canonical dims
    return scope["lean_io"]
