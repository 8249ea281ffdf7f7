"""`torch.compile(model, backend="dynshape")`: Dynamo's graphs compiled once by dynshape for every shape.

For each graph Dynamo hands over:
1. aot_autograd traces it to ATen with torch's core decompositions, inference only (`torch.no_grad`);
2. `dynshape.frontends.torch_fx` converts it: sizes become named symbols with torch's ranges, parameters and
   buffers become constants, guards and runtime asserts become facts;
3. if an earlier build computes the same graph with some symbol fixed (Dynamo's batch-1 graph after a batch-B
   one; or a recompile for a reason that did not change the graph), that build serves it, bound to the
   constant; otherwise `ds.compile` builds it, once, for every admissible shape;
4. each call binds the tensors Dynamo passes as zero-copy numpy views (SymInt arguments are implied by the
   shapes) and returns the outputs as torch tensors over dynshape's result arrays.

A graph with an ATen op dynshape cannot lower runs eagerly instead, after one warning naming the ops.

Conventions, so nothing surprising happens silently:
- weights are read at compile time (products pack their own copy; other weights are read in place, as
  read-only views); each call checks that every parameter and buffer is the same tensor at the same version
  (`_version`), and rebuilds (with a warning) when one changed (`check_weights=False` skips the check, ~50 ns
  per parameter, and is a promise that the weights do not change);
- inference only: outputs carry no autograd history (a warning says so when grad mode is on and an input
  requires grad);
- CPU tensors only; a non-contiguous input is copied once by dynshape's binder; other devices are refused.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynshape.errors import DynshapeError
from dynshape.torch import explain as _explain

FRONTEND_OPTIONS = ("exact_safe_softmax", "check_weights", "fallback", "specialize_module_floats")
_LOCK = threading.RLock()
MAX_BUILDS = 64


@dataclass
class _Build:
    """One dynshape build and what is needed to recognise a later graph as a specialisation of it."""

    index: int
    exe: Any
    fw_gm: Any
    inputs: list  # DynamoInput
    shape_env: Any
    conversion: Any  # FxConversion
    options_key: Any
    input_names: list[str]
    compile_s: float
    record: Any
    calls: list = field(default_factory=list)  # installers of the per-call functions this build serves
    retired: bool = False  # replaced by a later, more general build that now serves its graphs


_BUILDS: list[_Build] = []


def reset() -> None:
    """Forget every build and explain() record (torch._dynamo.reset() also drops Dynamo's caches)."""
    with _LOCK:
        _BUILDS.clear()
        _explain.RECORDS.clear()


@dataclass
class _Options:
    compile: dict = field(default_factory=dict)
    exact_safe_softmax: bool = False
    check_weights: bool = True
    fallback: str = "eager"  # or "error"
    specialize_module_floats: bool = True

    @property
    def key(self) -> Any:
        return (tuple(sorted((k, repr(v)) for k, v in self.compile.items())), self.exact_safe_softmax)


def compile_keywords() -> set[str]:
    """Every keyword `ds.compile` takes: its named parameters and, passed through `**knobs`, the fields of
    `dynshape.options.Options`."""
    import dataclasses
    import inspect

    from dynshape.runtime.executable import compile as ds_compile

    params = inspect.signature(ds_compile).parameters
    names = {n for n, p in params.items() if n != "graph" and p.kind != inspect.Parameter.VAR_KEYWORD}
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        from dynshape.options import Options

        names |= {f.name for f in dataclasses.fields(Options)}
    return names


def _parse_options(options: dict | None) -> _Options:
    opts = dict(options or {})
    out = _Options()
    for k in FRONTEND_OPTIONS:
        if k in opts:
            setattr(out, k, opts.pop(k))
    allowed = compile_keywords()
    unknown = sorted(set(opts) - allowed)
    if unknown:
        raise DynshapeError(f"torch.compile(backend='dynshape', options=...): unknown option(s) {unknown}; "
                            f"ds.compile takes {sorted(allowed)}, the backend also {list(FRONTEND_OPTIONS)}")
    out.compile = opts
    if out.fallback not in ("eager", "error"):
        raise DynshapeError(f"options['fallback'] = {out.fallback!r}: use 'eager' or 'error'")
    return out


def dynshape_backend(gm: Any, example_inputs: Sequence[Any], options: dict | None = None) -> Callable:
    """The Dynamo backend (entry point `dynshape` of the `torch_dynamo_backends` group).

    `options` (from `torch.compile(..., options={...})`): any `ds.compile` keyword (strategy, memory_budget,
    specialize, ...) plus `exact_safe_softmax` (see frontends/aten/ops_math.py), `check_weights` (default True),
    `fallback` ("eager": run unsupported graphs eagerly with a warning; "error": raise) and
    `specialize_module_floats` (default True: floats read from module attributes, such as a LayerNorm's eps,
    become constants before aot_autograd runs instead of after it, which saves Dynamo a second trace).
    """
    opts = _parse_options(options)
    _warm_libraries(gm)
    if opts.specialize_module_floats:
        dropped = _specialise_module_floats(gm)
        example_inputs = [x for i, x in enumerate(example_inputs) if i not in dropped]
    record = _explain.new_record(gm, example_inputs)
    from dynshape.frontends.torch_fx import dynamo_inputs

    inputs = dynamo_inputs(gm, example_inputs)
    state: dict[str, Any] = {}

    def fw_compiler(fw_gm: Any, fw_inputs: Sequence[Any]) -> Callable:
        from functorch.compile import make_boxed_func
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        try:
            with unset_fake_temporarily():  # real weights are read and folded here, not traced
                state["call"] = _compile_graph(fw_gm, inputs, opts, record)
        except Exception as e:  # noqa: BLE001 - any failure: eager (or the caller's error) with the reason
            state["error"] = e
            return make_boxed_func(fw_gm.forward)
        state["bypass"] = _plain(fw_gm, gm)
        return make_boxed_func(state["call"])

    import torch

    try:
        with torch.no_grad():
            compiled = _aot(gm, example_inputs, fw_compiler)
    except Exception as e:  # noqa: BLE001
        if type(e).__name__.endswith("RestartAnalysis"):
            _explain.drop(record)  # Dynamo traces again and hands the graph over anew
            raise
        state["error"] = e
        compiled = None
    if "error" in state:
        return _fallback(gm, state["error"], record, opts)
    if torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in example_inputs):
        warnings.warn("dynshape backend is inference-only: its outputs carry no autograd history (run the model "
                      "under torch.no_grad() or torch.inference_mode() to silence this)", stacklevel=2)
    if state.get("bypass") and "call" in state:
        return state["call"]
    return compiled


def _aot(gm: Any, example_inputs: Sequence[Any], fw_compiler: Callable) -> Callable:
    """aot_autograd's trace (inference only) with dynshape's decomposition table.

    Called as `aot_module_simplified` itself rather than through Dynamo's `aot_autograd` backend wrapper: the
    wrapper only adds backward-compiler wrapping (inference has none) and a logging context whose import loads
    much of inductor (about 0.2 s of the first call). Inputs holding lists or dicts go through the wrapper,
    which flattens them."""
    import torch
    from torch._functorch.aot_autograd import aot_module_simplified

    from dynshape.frontends.aten import decompositions

    if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(fw_compiler=fw_compiler, decompositions=decompositions())(gm, example_inputs)
    cg = aot_module_simplified(gm, example_inputs, fw_compiler=fw_compiler, bw_compiler=fw_compiler,
                               inference_compiler=fw_compiler, decompositions=decompositions())
    return torch._dynamo.disable(cg, reason="do not trace the graph dynshape compiled")


def _warm_libraries(gm: Any) -> None:
    """Start compiling (or fetching) the native helper libraries this graph's build will load, on another core,
    while aot_autograd traces it (about a second on the bench BERT): from a cold cache they are ready, not
    queued, when dynshape compiles the graph. Guessed from Dynamo's call targets; a wrong guess costs a
    background compile, never a result."""
    from dynshape.codegen import clib
    from dynshape.codegen.cc import cache_dir
    from dynshape.runtime.executable import EVERY_BUILD_HELPERS  # importing it declares every library

    text = " ".join(str(n.target).lower() for n in gm.graph.nodes if n.op.startswith("call_"))
    first = [name for name, words in (("conv", ("conv",)), ("ds_rnn", ("lstm", "gru", "rnn")),
                                      ("resize", ("interpolate", "upsample")))
             if any(w in text for w in words)]
    clib.warm([*first, "packed_gemm", *EVERY_BUILD_HELPERS], cache_dir())


def _fallback(gm: Any, err: BaseException, record: Any, opts: _Options) -> Callable:
    from dynshape.frontends.aten import Unsupported

    if opts.fallback == "error":
        raise err
    what = str(err) if isinstance(err, (Unsupported, DynshapeError)) else f"{type(err).__name__}: {err}"
    record.outcome = f"eager fallback: {what}"
    warnings.warn(f"dynshape backend: graph {record.compile_id} runs eagerly: {what}", stacklevel=3)
    return gm.forward


def _specialise_module_floats(gm: Any) -> set[int]:
    """Floats read from module attributes (a LayerNorm's eps, a dropout p, a scaling) become constants in Dynamo's
    graph before aot_autograd traces it; returns the positions of the graph inputs this removed.

    With `dynamic=True` Dynamo passes such floats as 0-d tensor inputs read back with `.item()`; aot_autograd's
    tensorify pass later finds they must be constants and restarts Dynamo after a full trace (about 1 s on the
    bench BERT). This does here what Dynamo does on that restart (`OutputGraph.remove_tensorify_specialized_graph
    args`): each `.item()` of such an input is replaced by `guard_scalar` of its symbol, which records the guard
    `attribute == value` in the ShapeEnv (Dynamo's guards, built after the backend returns, include it), the
    symbol is marked specialised in `TensorifyState`, as the restart would have it, and the input is removed
    through Dynamo's own tracer (`remove_node`): the graph it received is Dynamo's, and the call Dynamo generates
    after the backend returns passes the placeholders left, so no 0-d tensor is made per call for these floats
    (about 24 on the bench BERT). Where Dynamo's tracer is not reachable the input stays, unused. Floats passed
    by the caller stay runtime inputs. Private torch API: any mismatch leaves the graph as it is (torch then
    restarts itself)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator, TensorifyState
        from torch.fx.experimental.symbolic_shapes import guard_scalar
    except Exception:  # pragma: no cover - another torch version
        return set()
    from dynshape.frontends.torch_fx import source_text

    try:
        output = getattr(InstructionTranslator.current_tx(), "output", None)
    except Exception:  # noqa: BLE001 - not inside Dynamo's trace (the backend called directly): keep the inputs
        output = None
    dynamo_graph = getattr(output, "graph", None) is gm.graph
    changed = False
    dropped: set[int] = set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for index, node in enumerate(placeholders):
        memo = getattr(node.meta.get("example_value"), "item_memo", None)
        expr = getattr(getattr(memo, "node", None), "_expr", None)
        env = getattr(getattr(memo, "node", None), "shape_env", None)
        sym = getattr(expr, "name", None)
        if sym is None or env is None or not str(sym).startswith("zf") or not node.users:
            continue
        srcs = (getattr(env, "var_to_sources", {}) or {}).get(expr, [])
        if not srcs or not all(source_text(x).startswith("L['self']") for x in srcs):
            continue
        if not all(u.op == "call_method" and u.target == "item" for u in node.users):
            continue
        for u in list(node.users):
            u.replace_all_uses_with(guard_scalar(memo))
            gm.graph.erase_node(u)
        TensorifyState.specialize(str(sym))  # what the tensorify pass checks before it would restart
        if dynamo_graph:
            output.remove_node(node)
            dropped.add(index)
        changed = True
    if changed:
        gm.recompile()
    return dropped


def _plain(fw_gm: Any, gm: Any) -> bool:
    """Whether aot_autograd's runtime wrapper has nothing to do (no input mutations, no outputs aliasing inputs
    or each other, the same inputs as Dynamo's graph), so the backend can return its own call directly."""
    try:
        from torch._guards import TracingContext

        md = TracingContext.try_get().fw_metadata
        if md is None or md.num_mutated_inp_runtime_indices or md.num_intermediate_bases:
            return False
        if any(o.output_type.name != "non_alias" for o in md.output_info):
            return False
        if getattr(md, "is_rng_op_functionalized", False) or getattr(md, "tokens", None):
            return False
    except Exception:  # noqa: BLE001
        return False
    n_fw = sum(1 for n in fw_gm.graph.nodes if n.op == "placeholder")
    n_dyn = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    return n_fw == n_dyn


# ---- compiling one graph --------------------------------------------------------------------------------------
def _shape_env() -> Any:
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    return ctx.fake_mode.shape_env if ctx is not None and ctx.fake_mode is not None else None


def _compile_graph(fw_gm: Any, inputs: list, opts: _Options, record: Any) -> Callable:
    env = _shape_env()
    build, conv = _build_for(fw_gm, inputs, env, opts, record)
    return _make_call(fw_gm, env, build, conv, inputs, opts)


def _build_for(fw_gm: Any, inputs: list, env: Any, opts: _Options, record: Any,
               allow_reuse: bool = True) -> tuple[_Build, Any]:
    """Convert the graph; serve it with an earlier build when one computes it, else compile it."""
    from dynshape.frontends.torch_fx import convert_aot

    t0 = time.perf_counter()
    fx = convert_aot(fw_gm, inputs, env, relax_lower=True, exact_safe_softmax=opts.exact_safe_softmax,
                     name=f"dynamo_{record.compile_id.replace('/', '_')}")
    conv = fx.conversion
    _check_outputs(conv)
    record.describe(fx)
    with _LOCK:
        reuse = _find_reuse(fx, opts) if allow_reuse else None
    if reuse is not None:
        build, subs = reuse
        fixed = ", ".join(f"{k} = {v}" for k, v in subs.items() if isinstance(v, int))
        record.outcome = f"reuses build {build.index} (graph {build.record.compile_id})" + \
            (f" with {fixed}" if fixed else ": the same graph")
        record.build, record.exe, record.convert_s = build.index, build.exe, time.perf_counter() - t0
        return build, conv
    import dynshape as ds

    exe = ds.compile(conv.graph, **opts.compile)
    dt = time.perf_counter() - t0
    with _LOCK:
        build = _Build(len(_BUILDS), exe, fw_gm, inputs, env, fx, opts.key,
                       [v.name for v in conv.graph.inputs], dt, record)
        _BUILDS.append(build)
        del _BUILDS[:-MAX_BUILDS]
    record.outcome = f"built (build {build.index}, {dt:.2f} s)"
    record.build, record.exe, record.convert_s = build.index, exe, dt
    if allow_reuse:
        with _LOCK:
            _absorb_specialised(build, opts)
    return build, conv


def _absorb_specialised(build: _Build, opts: _Options) -> None:
    """Earlier builds whose graph is this one with symbols fixed (the batch-1 graph Dynamo compiled first, when
    the first call had batch 1) are retired: their calls are re-pointed at this build, bound to the constants,
    so one executable (one plan cache, one set of hot-shape variants) serves every shape."""
    from dynshape.frontends.torch_fx import convert_aot

    g = build.conversion.conversion.graph
    for old in list(_BUILDS):
        if old is build or old.retired or old.options_key != opts.key or len(old.input_names) != len(g.inputs):
            continue
        subs = _subs(g, old.conversion.conversion.graph)
        if not subs or not _admits(build, subs):
            continue
        try:
            again = convert_aot(build.fw_gm, build.inputs, build.shape_env, relax_lower=True, subs=subs,
                                exact_safe_softmax=opts.exact_safe_softmax, name=g.name, infer=False)
        except Exception:  # noqa: BLE001 - not a specialisation of this graph
            continue
        if again.conversion.stream != old.conversion.conversion.stream:
            continue
        for install in old.calls:
            install(build)
        build.calls.extend(old.calls)
        old.calls, old.retired, old.exe = [], True, None
        fixed = ", ".join(f"{k} = {v}" for k, v in subs.items() if isinstance(v, int))
        old.record.outcome += f"; since graph {build.record.compile_id}, served by build {build.index} with {fixed}"
        old.record.build, old.record.exe = build.index, build.exe


def _admits(build: _Build, subs: dict) -> bool:
    """Whether the build's symbols admit the fixed values and the ranges of the symbols they are renamed to (its
    binder then accepts every input the other graph admits)."""
    syms = {s.name: s for s in build.exe.symbols}
    for n, v in subs.items():
        s = syms.get(n)
        if s is None:
            return False
        if isinstance(v, int):
            if v < s.lo or (s.hi is not None and v > s.hi):
                return False
            continue
        t = v.atom()
        if t.lo < s.lo or (s.hi is not None and (t.hi is None or t.hi > s.hi)) or t.mult % s.mult:
            return False
    return True


def _check_outputs(conv: Any) -> None:
    from dynshape.frontends.aten import Unsupported
    from dynshape.sym import is_expr

    for kind, v in conv.outputs:
        if kind == "value" and is_expr(v):
            raise Unsupported(f"the graph returns the size {v} (a SymInt output)")


def _find_reuse(fx: Any, opts: _Options) -> tuple[_Build, dict] | None:
    """An earlier build computing this graph with some of its symbols fixed: equal structure streams after
    converting the earlier graph with those symbols substituted (or the same stream, no substitution)."""
    from dynshape.frontends.torch_fx import convert_aot

    g = fx.conversion.graph
    for b in reversed(_BUILDS):
        if b.retired or b.options_key != opts.key or len(b.input_names) != len(g.inputs):
            continue
        old = b.conversion.conversion.graph
        subs = _subs(old, g)
        if subs is None:
            continue
        if not subs:
            if b.conversion.conversion.stream == fx.conversion.stream:
                return b, {}
            continue
        if not _admits(b, subs):
            continue
        try:
            again = convert_aot(b.fw_gm, b.inputs, b.shape_env, relax_lower=True, subs=subs,
                                exact_safe_softmax=opts.exact_safe_softmax, name=old.name, infer=False)
        except Exception:  # noqa: BLE001 - the earlier graph does not convert this way: no reuse
            continue
        if again.conversion.stream == fx.conversion.stream:
            return b, subs
    return None


def _subs(old: Any, new: Any) -> dict | None:
    """Symbol name -> int (a fixed size) or bare symbol of the new graph (a renamed one: Dynamo names a
    recompiled graph's symbols after whichever source it met first) making the old graph's input shapes the new
    ones; None when they cannot match."""
    from dynshape.sym import is_expr

    subs: dict[str, Any] = {}
    for a, b in zip(old.inputs, new.inputs):
        if a.dtype != b.dtype or a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
            return None
        for d, e in zip(a.shape, b.shape):
            if d == e:
                continue
            if not (is_expr(d) and d.is_atom() and hasattr(d.atom(), "lo")):
                return None
            if not (isinstance(e, int) or (is_expr(e) and e.is_atom() and hasattr(e.atom(), "lo"))):
                return None
            name = d.atom().name
            if name in subs and subs[name] != e:
                return None
            subs[name] = e
    return {k: v for k, v in subs.items() if not (is_expr(v) and v.atom().name == k and v == old_sym(old, k))}


def old_sym(graph: Any, name: str) -> Any:
    return graph.signature.symbols.get(name)


# ---- the per-call function ------------------------------------------------------------------------------------
def _make_call(fw_gm: Any, env: Any, build: _Build, conv: Any, inputs: list, opts: _Options) -> Callable:
    """Generate `call(*args)`: weight checks, zero-copy numpy views, exe.run, outputs as torch tensors.

    What can change (the executable, its input and output names: after a weight change, or when a more general
    build takes this graph over) is one global tuple `_S`, swapped whole, so a concurrent call sees either the
    old state or the new one; the frozen weights and their versions are globals read by the checks."""
    import torch

    scope: dict[str, Any] = {"_fn": torch.from_numpy}
    params = [k for k, inp in enumerate(inputs) if inp.is_param]
    n_in = len(conv.input_positions)
    tensor_outs = [i for i, (kind, _) in enumerate(conv.outputs) if kind == "tensor"]
    unpack = ", ".join(["run"] + [f"n{i}" for i in range(n_in)] + [f"o{i}" for i in tensor_outs])
    lines = ["def call(*args):"]
    if opts.check_weights and params:
        checks = [f"args[{k}] is not _p{k} or _p{k}._version != _ver{k}" for k in params]
        lines += ["    if " + " or ".join(checks) + ":", "        _rebuild(args)"]
    lines.append(f"    {unpack}, = _S" if n_in + len(tensor_outs) == 0 else f"    {unpack} = _S")
    feed = ", ".join(f"n{i}: args[{p}].numpy()" for i, p in enumerate(conv.input_positions))
    lines += ["    try:", f"        feed = {{{feed}}}", "    except Exception:", "        feed = _slow(args)",
              "    out = run(feed)"]
    outs = []
    for i, (kind, v) in enumerate(conv.outputs):
        if kind == "tensor":
            outs.append(f"_fn(out[o{i}])")
        else:
            scope[f"_v{i}"] = v
            outs.append(f"_v{i}")
    lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    src = "\n".join(lines)
    mine = [v.name for v in conv.graph.outputs]
    current = {"inputs": inputs, "build": build}

    def install(b: _Build, ins: list | None = None) -> None:
        """Serve this graph with build b (whose graph computes it: equal structure streams, same order)."""
        served = [v.name for v in b.conversion.conversion.graph.outputs]
        outs_now = [served[mine.index(conv.outputs[i][1])] for i in tensor_outs]
        ins = ins if ins is not None else current["inputs"]
        for k in params:
            scope[f"_p{k}"], scope[f"_ver{k}"] = ins[k].value, ins[k].value._version
        scope["_names"] = list(b.input_names)
        scope["_S"] = (b.exe.run, *b.input_names, *outs_now)
        current["inputs"], current["build"] = ins, b

    def rebuild(args: Sequence[Any]) -> None:
        with _LOCK:
            ins = current["inputs"]
            if not any(args[k] is not ins[k].value or args[k]._version != scope[f"_ver{k}"] for k in params):
                return  # another thread rebuilt already
            changed = [ins[k].source for k in params
                       if args[k] is not ins[k].value or args[k]._version != scope[f"_ver{k}"]]
            warnings.warn(f"dynshape backend: {len(changed)} weight(s) changed since graph "
                          f"{build.record.compile_id} was compiled (e.g. {changed[:2]}); rebuilding with the new "
                          "values", stacklevel=3)
            from dynshape.frontends.torch_fx import DynamoInput

            fresh = [DynamoInput(inp.source, args[k] if inp.is_param else inp.value, inp.is_param)
                     for k, inp in enumerate(inputs)]
            with torch.no_grad():
                b, _ = _build_for(fw_gm, fresh, env, opts, build.record, allow_reuse=False)
            old = current["build"]
            if install in old.calls:
                old.calls.remove(install)
            b.calls.append(install)
            install(b, fresh)

    install(build, inputs)
    build.calls.append(install)
    scope["_slow"] = lambda args: _slow_feed(args, scope["_names"], conv.input_positions)
    scope["_rebuild"] = rebuild
    exec(compile(src, f"<dynshape torch call {build.index}>", "exec"), scope)  # noqa: S102 - our own source
    call = scope["call"]
    call.source = src
    call.scope = scope
    call.input_positions = list(conv.input_positions)
    return call


def _slow_feed(args: Sequence[Any], names: list[str], positions: list[int]) -> dict:
    """Inputs `.numpy()` refused: grad-requiring tensors are detached, bfloat16 read by bit pattern, tensors
    on another device refused (dynshape runs on the CPU)."""
    import torch

    from dynshape.frontends.aten import to_numpy

    feed = {}
    for name, p in zip(names, positions):
        t = args[p]
        if not isinstance(t, torch.Tensor):
            raise DynshapeError(f"input {name!r}: expected a tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise DynshapeError(f"input {name!r} is on {t.device}: the dynshape backend runs on the CPU; move the "
                                "model and its inputs with .cpu()")
        t = t.detach()
        feed[name] = to_numpy(t) if t.dtype == torch.bfloat16 else t.numpy()
    return feed
