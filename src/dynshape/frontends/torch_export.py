"""`ds.from_torch`: a PyTorch module as a dynshape Graph, through `torch.export`.

No Dynamo guards run per call afterwards: `ds.compile(graph)` gives an executable that `exe.run` (numpy in,
numpy out) serves for every admissible shape. The argument conventions are torch.export's own:
`dynamic_shapes` maps each input to `{axis: Dim(...)}`; a `Dim`'s name becomes the symbol's name and its range
the symbol's range. With `dynamic_shapes=None` every axis of every tensor input is `Dim.AUTO`: torch decides
which are dynamic, names are `<input>_<axis>`, and axes the trace found static (an example of size 1 is
specialised, as torch.export does) stay static; a warning names those. Tracing is size-oblivious, so an
example of size 1 may serve a dynamic `Dim`, unless the model bakes the size it saw into the program (transformers'
BERT does from its second layer on): such a dim is found at export (`_pinned`) and exported again with the
example repeated to size 2 there, or refused by name.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from typing import Any

from dynshape.errors import ModelError
from dynshape.frontends.aten import (
    Converter,
    PlaceholderSpec,
    SymbolTable,
    Unsupported,
    decompositions,
    finish,
    range_of,
)
from dynshape.ir.graph import Graph


def from_torch(model: Any, args: tuple = (), kwargs: Mapping[str, Any] | None = None,
               dynamic_shapes: Any = None, *, exact_safe_softmax: bool = False, strict: bool = False) -> Graph:
    """Export `model(*args, **kwargs)` with torch.export and convert it to a shape-inferred dynshape Graph.

    Parameters and buffers become initializers (copied: later changes to the model do not reach the graph).
    Graph inputs are the model's tensor arguments under their parameter names; outputs are named after the
    output structure (`output_0`, ... or the keys of a dict / ModelOutput). An ATen op dynshape cannot lower
    is reported, with every other one, in one `ModelError` with counts.
    """
    try:
        from torch.export import Dim
    except ImportError as e:
        raise ImportError(f"ds.from_torch needs PyTorch (pip install 'dynshape[torch]'): {e}") from e

    kwargs = dict(kwargs or {})
    if not isinstance(args, tuple):
        args = (args,)
    auto = dynamic_shapes is None
    if auto:
        dynamic_shapes = _auto_shapes(model, args, kwargs, Dim.AUTO)
    names = _dim_names(model, args, kwargs, dynamic_shapes)

    def export(a: tuple, kw: dict) -> Graph:
        was_training = getattr(model, "training", False)
        if was_training:
            model.eval()
        try:
            ep = _export(model, a, kw, dynamic_shapes, strict, oblivious=True)
        finally:
            if was_training:
                model.train()
        return convert_exported(ep, names, exact_safe_softmax)

    graph = export(args, kwargs)
    if auto:
        _warn_specialised(graph, model, args, kwargs)
    pinned = _pinned(graph, model, args, kwargs)
    widened = _widened(graph, model, args, kwargs, pinned) if pinned else None
    if widened is not None:  # traced again with those dims of size 2 (their values repeated)
        graph = export(*widened)
        if not _pinned(graph, model, *widened):
            warnings.warn("from_torch: torch.export baked the example's size 1 into the program for "
                          f"{', '.join(sorted(pinned))}; exported again with an example of size 2 there "
                          "(pass examples of size >= 2 along dynamic dims to skip the second export)", stacklevel=2)
            return graph
    if pinned:
        raise ModelError("from_torch: torch.export traced a program that holds only for the example's size of "
                         "a dim declared dynamic: " + "; ".join(dict.fromkeys(pinned.values())) + ". Pass an "
                         "example whose size there is at least 2 (torch specialises what it sees as 1), or declare "
                         "the dim static")
    return graph


def _export(model: Any, args: tuple, kwargs: dict, dynamic_shapes: Any, strict: bool, oblivious: bool) -> Any:
    """torch.export + decompositions. With `oblivious`, sizes are traced size-obliviously (torch's
    `backed_size_oblivious`): no 0/1 specialisation, so the program also holds for size-1 inputs, and an example
    of size 1 may be given for a dynamic Dim; a model that needs a size decided during tracing is then exported
    the ordinary way (Dim.AUTO sizes then start at 2)."""
    import torch

    def run() -> Any:
        with torch.no_grad():
            ep = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
            return ep.run_decompositions(decompositions())

    if oblivious:
        try:
            import torch.fx.experimental._config as fx_config

            with fx_config.patch(backed_size_oblivious=True):
                return run()
        except Exception as e:  # noqa: BLE001 - retried without; a genuine failure raises again below
            warnings.warn(f"from_torch: size-oblivious export failed ({type(e).__name__}); exporting with torch's "
                          "0/1 specialisation, so dynamic sizes start at 2", stacklevel=3)
    return run()


def convert_exported(ep: Any, dim_names: dict[tuple[str, int], str] | None = None,
                     exact_safe_softmax: bool = False) -> Graph:
    """An ExportedProgram (already decomposed) as a dynshape Graph; `dim_names[(input, axis)]` names symbols."""
    gm = ep.graph_module
    sig = ep.graph_signature
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    specs_by_name = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
    table = SymbolTable()
    ranges = {str(k): range_of(v) for k, v in ep.range_constraints.items()}
    names = dict(dim_names or {})
    used: set[str] = set()
    # symbols: named after the first user-input axis that carries each bare symbol
    for node in phs:
        spec = specs_by_name.get(node.name)
        if spec is None or spec.kind.name != "USER_INPUT":
            continue
        val = node.meta.get("val")
        for ax, d in enumerate(getattr(val, "shape", ())):
            expr = getattr(getattr(d, "node", None), "expr", None)
            if expr is None or not getattr(expr, "is_Symbol", False) or str(expr) in table.symbols:
                continue
            name = names.get((node.name, ax)) or f"{node.name}_{ax}"
            base, k = name, 1
            while name in used:
                k += 1
                name = f"{base}__{k}"
            used.add(name)
            lo, hi = ranges.get(str(expr), (0, None))
            # dynshape dims start at 1 (as load_onnx's): a size-oblivious export's 0 is narrowed, soundly
            table.declare(str(expr), name, max(lo, 1), hi, [f"{node.name}.size({ax})"], torch_range=(lo, hi))
    specs = []
    for node in phs:
        spec = specs_by_name.get(node.name)
        kind = spec.kind.name if spec is not None else "USER_INPUT"
        target = getattr(spec, "target", None)
        if kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
            value = ep.state_dict[target] if target in ep.state_dict else ep.constants[target]
            specs.append(PlaceholderSpec("const", name=str(target), value=value, key=("export", str(target))))
        elif kind == "USER_INPUT" and hasattr(node.meta.get("val"), "shape"):
            specs.append(PlaceholderSpec("input", name=node.name))
        elif kind == "USER_INPUT":
            specs.append(PlaceholderSpec("size"))
        else:
            raise Unsupported(f"exported input {node.name!r} of kind {kind} is not supported")
    out_names = _output_names(ep)
    conv = Converter(gm, table, specs, name=type(ep).__name__, exact_safe_softmax=exact_safe_softmax)
    result = conv.run(out_names)
    values = [v for kind, v in result.outputs if kind == "value"]
    if values:
        raise Unsupported(f"the model returns non-tensor values {values[:3]}; from_torch graphs return tensors")
    finish(result)
    return result.graph


def _forward_params(model: Any) -> list[str]:
    fn = model.forward if hasattr(model, "forward") else model
    try:
        return [p for p in inspect.signature(fn).parameters if p != "self"]
    except (TypeError, ValueError):
        return []


def _auto_shapes(model: Any, args: tuple, kwargs: dict, auto: Any) -> Any:
    """Dim.AUTO for every axis of every tensor argument, in torch.export's dict-by-parameter form."""
    import torch

    def spec(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return {i: auto for i in range(x.dim())} if x.dim() else None
        if isinstance(x, (list, tuple)):
            return type(x)(spec(y) for y in x)
        if isinstance(x, dict):
            return {k: spec(v) for k, v in x.items()}
        return None

    names = _forward_params(model)
    if len(names) >= len(args) and all(k in names for k in kwargs):
        out = {n: spec(a) for n, a in zip(names, args)}
        out.update({k: spec(v) for k, v in kwargs.items()})
        return out
    return tuple(spec(a) for a in args)


def _dim_names(model: Any, args: tuple, kwargs: dict, dynamic_shapes: Any) -> dict[tuple[str, int], str]:
    """(input name, axis) -> the name of the Dim the user gave it (AUTO and unnamed dims are skipped)."""
    out: dict[tuple[str, int], str] = {}
    if dynamic_shapes is None:
        return out
    names = _forward_params(model)
    if isinstance(dynamic_shapes, Mapping):
        items = list(dynamic_shapes.items())
    else:
        items = list(zip(names, dynamic_shapes))
    for name, spec in items:
        if isinstance(spec, Mapping):
            for ax, d in spec.items():
                dn = getattr(d, "__name__", None)
                if isinstance(dn, str) and dn and type(d).__name__ != "_DimHint":
                    out[(name, int(ax))] = dn
        elif isinstance(spec, (list, tuple)) and all(not isinstance(x, (Mapping, list, tuple)) for x in spec):
            for ax, d in enumerate(spec):
                dn = getattr(d, "__name__", None)
                if isinstance(dn, str) and dn and d is not None and type(d).__name__ != "_DimHint":
                    out[(name, ax)] = dn
    return out


def _output_names(ep: Any) -> list[str]:
    """Names from the output pytree: dict / ModelOutput keys, else output_<i>."""
    spec = getattr(getattr(ep, "call_spec", None), "out_spec", None)
    names: list[str] = []

    def walk(s: Any, prefix: str) -> None:
        kids = list(s.children()) if hasattr(s, "children") else list(getattr(s, "children_specs", []))
        if not kids:
            names.append(prefix or "output")
            return
        ctx = getattr(s, "context", None)
        keys = list(ctx) if isinstance(ctx, (list, tuple)) and len(ctx) == len(kids) else None
        for i, k in enumerate(kids):
            part = str(keys[i]) if keys is not None else f"{i}"
            walk(k, f"{prefix}_{part}" if prefix else (part if keys is not None else f"output_{i}"))

    if spec is not None:
        walk(spec, "")
    n = len([x for x in ep.graph_signature.output_specs if x.kind.name == "USER_OUTPUT"])
    if len(names) != n:
        return [f"output_{i}" for i in range(n)]
    seen: set[str] = set()
    out = []
    for nm in names:
        base, k = nm, 1
        while nm in seen:
            k += 1
            nm = f"{base}_{k}"
        seen.add(nm)
        out.append(nm)
    return out


def _warn_specialised(graph: Graph, model: Any, args: tuple, kwargs: dict) -> None:
    """Dim.AUTO keeps an axis whose example size is 0 or 1 static (torch's 0/1 specialisation): say which."""
    import torch

    given = _given(model, args, kwargs)
    fixed = []
    for v in graph.inputs:
        x = given.get(v.name)
        if not isinstance(x, torch.Tensor) or v.shape is None:
            continue
        for ax, (d, n) in enumerate(zip(v.shape, x.shape)):
            if isinstance(d, int) and n in (0, 1):
                fixed.append(f"{v.name} axis {ax} (= {n})")
    if fixed:
        warnings.warn(f"from_torch: torch.export kept {', '.join(fixed)} static because the example's size is "
                      "0 or 1; pass examples of size >= 2 there, or dynamic_shapes with a Dim, to make them "
                      "dynamic", stacklevel=3)


def _given(model: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The example's arguments by the forward parameter they fill."""
    return {**dict(zip(_forward_params(model), args)), **kwargs}


def _symbol_sizes(graph: Graph, given: dict) -> tuple[dict[str, int], dict[str, list[tuple[str, int]]]]:
    """Each declared symbol's size in the example, and every (input, axis) that carries it."""
    import torch

    env: dict[str, int] = {}
    where: dict[str, list[tuple[str, int]]] = {}
    for v in graph.inputs:
        x = given.get(v.name)
        if not isinstance(x, torch.Tensor) or v.shape is None:
            continue
        for ax, (d, n) in enumerate(zip(v.shape, x.shape)):
            name = None if isinstance(d, int) else str(d)  # a plain symbol prints as its name
            if name in graph.signature.symbols:
                env.setdefault(name, int(n))
                where.setdefault(name, []).append((v.name, ax))
    return env, where


def _pinned(graph: Graph, model: Any, args: tuple, kwargs: dict) -> dict[str, str]:
    """The dynamic dims the trace fixed to their example's size, each with why: symbol -> reason.

    Size-oblivious tracing skips torch's 0/1 specialisation, but a model may still bake its example's size into
    the program (transformers' BERT, traced with a batch of 1, views its activations as (1, seq, 256)): the
    graph then requires, say, 64*(4//batch) == 256, true only for batch = 1. Every requirement over the declared
    symbols is evaluated at the example's sizes and at other sizes in each symbol's range; a symbol for which
    one holds only at the example's size is pinned. Found here, it is re-exported or refused by name, not
    discovered at the first call of another size."""
    given = _given(model, args, kwargs)
    env, where = _symbol_sizes(graph, given)
    symbols = {n: graph.signature.symbols[n].atom() for n in env}
    pinned: dict[str, str] = {}
    for f in graph.signature.facts:
        c = f.check
        if f.kind != "require" or not hasattr(c, "evaluate") or not hasattr(c, "free_symbols"):
            continue
        names = set(c.free_symbols)
        if not names or not names <= set(env) or not c.evaluate(env):
            continue
        for name in sorted(names):
            others = _other_sizes(symbols.get(name), env[name])
            if name not in pinned and others and not any(c.evaluate({**env, name: o}) for o in others):
                inp, ax = where[name][0]
                pinned[name] = (f"{name} (from {inp!r} axis {ax}, example size {env[name]}): the traced program "
                                f"requires {f.text} ({f.origin}), which no other size tried "
                                f"({', '.join(map(str, others))}) meets")
    return pinned


def _widened(graph: Graph, model: Any, args: tuple, kwargs: dict, pinned: dict) -> tuple[tuple, dict] | None:
    """The example with every pinned dim of size 1 made 2 (its values repeated) on every input carrying it, when
    each pinned dim is of size 1 and its range admits 2; else None."""
    import torch

    given = _given(model, args, kwargs)
    env, where = _symbol_sizes(graph, given)
    for name in pinned:
        s = graph.signature.symbols[name].atom()
        if env.get(name) != 1 or (s.hi is not None and s.hi < 2) or s.mult not in (1, 2):
            return None
    new = dict(given)
    for name in pinned:
        for inp, ax in where[name]:
            x = new[inp]
            if x.shape[ax] == 1:
                new[inp] = torch.cat([x, x], dim=ax)
    params = _forward_params(model)
    a = tuple(new.get(p, x) for p, x in zip(params, args)) + tuple(args[len(params):])
    return a, {k: new.get(k, v) for k, v in kwargs.items()}


def _other_sizes(s: Any, size: int) -> list[int]:
    """A few sizes other than `size` in symbol `s`'s range (and multiple): the next two and the largest."""
    if s is None:
        return []
    lo, hi, mult = int(getattr(s, "lo", 0)), getattr(s, "hi", None), max(1, int(getattr(s, "mult", 1)))
    out = []
    for v in (size + mult, size + 2 * mult, hi, size - mult):
        if v is not None and v != size and v >= lo and (hi is None or v <= hi) and v % mult == 0 and v not in out:
            out.append(int(v))
    return out
