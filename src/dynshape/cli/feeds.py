"""Input arrays for a graph: loaded from .npy files or generated, seeded, from symbol values.

Generated data follows shared/bench/common.py `make_inputs` so timings compare with the peers benchmark:
one `default_rng(seed)` per request, inputs drawn in graph order, floats standard normal (float32), token ids
uniform over the embedding table the ids index (so `bert_small` gets [0, 30522) exactly as there), masks all
ones. Integer inputs that index no table stay in [0, 100): a random int64 is never a valid token id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dynshape.cli.args import RandomSpec
from dynshape.cli.common import CliInputError
from dynshape.ir.types import TensorType

DEFAULT_INT_RANGE = (0, 100)


def symbol_names(graph: Any) -> list[str]:
    return list(graph.signature.symbols)


def env_from_values(graph: Any, values: tuple[int, ...]) -> dict[str, int]:
    """Positional symbol values (`2x16` -> batch=2, seq=16, in signature order)."""
    names = symbol_names(graph)
    if len(values) != len(names):
        order = "x".join(names) or "(none: every input is static)"
        raise CliInputError(f"the shape {'x'.join(map(str, values))} gives {len(values)} value(s), but the model has "
                            f"{len(names)} symbol(s); give them in this order: {order}")
    return dict(zip(names, values))


def concrete_shape(shape: tuple, env: dict[str, int], what: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) if isinstance(d, (int, np.integer)) else int(d.evaluate(env)) for d in shape)
    except Exception as e:
        raise CliInputError(f"cannot size {what} from {env}: {e}") from None


def int_range(graph: Any, name: str) -> tuple[int, int]:
    """[low, high) for generated integers of input `name` (see the module docstring)."""
    if "mask" in name.lower():
        return (1, 2)
    rows = []
    for n in graph.nodes:
        if n.op_type == "Gather" and len(n.inputs) > 1 and n.inputs[1] == name and n.attrs.get("axis", 0) == 0:
            table = graph.initializers.get(n.inputs[0])
            if table is not None and table.ndim >= 1:
                rows.append(int(table.shape[0]))
    return (0, min(rows)) if rows else DEFAULT_INT_RANGE


def draw(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...], low: float | None,
         high: float | None, default_int: tuple[int, int]) -> np.ndarray:
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        lo, hi = (int(low), int(high)) if low is not None and high is not None else default_int
        return rng.integers(lo, hi, size=shape, dtype=dtype)
    if np.issubdtype(dtype, np.floating) and dtype in (np.float32, np.float64):
        if low is not None and high is not None:
            return rng.uniform(low, high, size=shape).astype(dtype)
        return rng.standard_normal(shape, dtype=dtype)
    try:
        return rng.standard_normal(shape).astype(dtype)
    except (TypeError, ValueError):
        raise CliInputError(f"cannot generate random data of dtype {dtype}; pass --input NAME=FILE.npy") from None


def generated_feed(graph: Any, env: dict[str, int], seed: int = 0, skip: set[str] | None = None
                   ) -> dict[str, np.ndarray]:
    """Every graph input (except `skip`) sized from `env` and filled like bench/common.py make_inputs."""
    rng = np.random.default_rng(seed)
    feed = {}
    for v in graph.inputs:
        if skip and v.name in skip:
            continue
        t = graph.types.get(v.name) or v.type
        if not isinstance(t, TensorType):
            raise CliInputError(f"input {v.name!r} is not a tensor; dynshape cannot generate it")
        shape = concrete_shape(t.shape, env, f"input {v.name!r}")
        feed[v.name] = draw(rng, np.dtype(t.dtype), shape, None, None, int_range(graph, v.name))
    return feed


def random_feed(graph: Any, randoms: dict[str, RandomSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """Arrays for `--random name=SHAPE[:LOW:HIGH]`, with the dtype the model declares for `name`."""
    rng = np.random.default_rng(seed)
    dtypes = {v.name: np.dtype(v.dtype) for v in graph.inputs}
    feed = {}
    for name, spec in randoms.items():
        check_input_name(graph, name, "--random")
        check_bounds(name, dtypes[name], spec)
        feed[name] = draw(rng, dtypes[name], spec.shape, spec.low, spec.high, int_range(graph, name))
    return feed


def file_feed(graph: Any, files: dict[str, Path]) -> dict[str, np.ndarray]:
    feed = {}
    for name, path in files.items():
        check_input_name(graph, name, "--input")
        try:
            arr = np.load(path, allow_pickle=False)
        except Exception as e:
            raise CliInputError(f"cannot read {str(path)!r} for input {name!r}: {type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''} (expected a .npy file written by "
                                "numpy.save)") from None
        if not isinstance(arr, np.ndarray):
            raise CliInputError(f"{str(path)!r} holds several arrays (.npz); save one array per input with numpy.save")
        feed[name] = arr
    return feed


def check_input_name(graph: Any, name: str, option: str) -> None:
    names = [v.name for v in graph.inputs]
    if name not in names:
        raise CliInputError(f"{option} {name!r}: the model has no input of that name; its inputs are "
                            f"{', '.join(names)}")


# ---- checks before any data is generated -----------------------------------------------------------------
def random_shapes(graph: Any, randoms: dict[str, RandomSpec]) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """dtype and shape of each `--random` input, its bounds checked against the dtype (nothing drawn yet)."""
    dtypes = {v.name: np.dtype(v.dtype) for v in graph.inputs}
    out = {}
    for name, spec in randoms.items():
        check_input_name(graph, name, "--random")
        check_bounds(name, dtypes[name], spec)
        out[name] = (dtypes[name], spec.shape)
    return out


def generated_shapes(graph: Any, env: dict[str, int], skip: set[str]) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """dtype and shape of every input `generated_feed` would make from `env` (nothing drawn yet)."""
    out = {}
    for v in graph.inputs:
        if v.name in skip:
            continue
        t = graph.types.get(v.name) or v.type
        if not isinstance(t, TensorType):
            raise CliInputError(f"input {v.name!r} is not a tensor; dynshape cannot generate it")
        out[v.name] = (np.dtype(t.dtype), concrete_shape(t.shape, env, f"input {v.name!r}"))
    return out


def check_bounds(name: str, dtype: np.dtype, spec: RandomSpec) -> None:
    """`--random NAME=SHAPE:LOW:HIGH` bounds the dtype can draw from: integers for integer inputs, in range."""
    if spec.low is None or spec.high is None or dtype == np.bool_:
        return
    if np.issubdtype(dtype, np.integer):
        if not (float(spec.low).is_integer() and float(spec.high).is_integer()):
            raise CliInputError(f"--random {name}: input {name!r} is {dtype}, so LOW and HIGH must be integers "
                                f"(got {spec.low:g}:{spec.high:g})")
        info = np.iinfo(dtype)
        if spec.low < info.min or spec.high - 1 > info.max:
            raise CliInputError(f"--random {name}: [{spec.low:g}, {spec.high:g}) does not fit {dtype} "
                                f"([{info.min}, {info.max}])")


def preflight(graph: Any, given: dict[str, np.ndarray], planned: dict[str, tuple[np.dtype, tuple[int, ...]]]
              ) -> dict[str, int]:
    """Check a feed against the signature, and its memory against the machine, before generating any data.

    `planned` inputs are stood in for by zero-strided views (no memory), so `--shape 1x1000000000` is refused
    at once by the rank / range / fact that it breaks, or by the memory its largest node needs, instead of
    after gigabytes of random data. Returns the symbol values."""
    from dynshape.ir.execute import AssumptionFailed, bind_inputs

    probe = dict(given)
    for name, (dtype, shape) in planned.items():
        probe[name] = np.broadcast_to(np.zeros((), dtype), shape)
    try:
        env = bind_inputs(graph, probe)
    except AssumptionFailed as e:  # valid inputs the generic graph runs specialised
        env = dict(e.env)
    check_footprint(graph, env)
    return env


def check_footprint(graph: Any, env: dict[str, int]) -> None:
    """Refuse symbol values at which one node's inputs and outputs alone exceed this machine's memory: a lower
    bound on what any executor needs, so the refusal is never wrong."""
    from dynshape.runtime.budget import fmt_bytes
    from dynshape.runtime.memory import machine_bytes

    have = machine_bytes()
    if have is None:
        return
    size: dict[str, int] = {}
    for name, t in graph.types.items():
        if not isinstance(t, TensorType):
            continue
        n = 1
        for d in t.shape:
            if isinstance(d, (int, np.integer)):
                n *= int(d)
            elif getattr(d, "free_symbols", None) is not None and d.free_symbols <= env.keys():
                n *= int(d.evaluate(env))
            else:
                break
        else:
            size[name] = n * np.dtype(t.dtype).itemsize
    worst, where = sum(size.get(v.name, 0) for v in graph.inputs), "the inputs"
    for node in graph.nodes:
        need = sum(size.get(x, 0) for x in {*node.inputs, *node.outputs} if x)
        if need > worst:
            worst, where = need, f"node {node.name!r} ({node.op_type})"
    if worst > have:
        at = ", ".join(f"{k}={v}" for k, v in env.items()) or "the static shapes"
        raise CliInputError(f"at {at}, {where} alone needs {fmt_bytes(worst)} for its inputs and outputs, more than "
                            f"this machine's {fmt_bytes(have)}: choose smaller values (or declare a max with "
                            "--dim NAME=MIN:MAX)")


def default_requests(graph: Any, per_symbol: int = 3, cap: int = 128) -> list[dict[str, int]]:
    """Shapes spread over the declared ranges, for `bench` without --shapes/--stream: the lowest, a geometric
    middle and the highest admissible value of every symbol (at least 1; unbounded ones stop at `cap`), taken
    together, keeping those the signature and the machine accept."""
    from dynshape.errors import DynshapeError

    syms = [e.atom() for e in graph.signature.symbols.values()]
    if not syms:
        return [{}]
    columns = []
    for s in syms:
        m = max(1, s.mult)
        lo = -(-max(s.lo, 1) // m) * m
        hi = max(lo, (s.hi if s.hi is not None else max(cap, lo)) // m * m)
        mid = int(round((lo * hi) ** 0.5 / m)) * m
        columns.append(sorted({lo, min(max(mid, lo), hi), hi})[:per_symbol])
    out = []
    for i in range(max(len(c) for c in columns)):
        env = {s.name: c[min(i, len(c) - 1)] for s, c in zip(syms, columns)}
        try:
            preflight(graph, {}, generated_shapes(graph, env, set()))
        except (DynshapeError, CliInputError):
            continue
        if env not in out:
            out.append(env)
    return out
