"""Property (issue 15): `exe.run` over random bad feeds (ranks, dtypes, strides, sizes, lists, scalars, None, extra and
missing names, feeds that are not dicts) gives a `DynshapeError` or a result equal to the reference executor's on
the same values; never another exception.

Four executables cover the binder's paths: the MLP (planned, one symbol), attention (two inputs that share
symbols, an int mask), a conv (a per-call requirement and a refined range) and a Loop (unplanned: the
interpreter's path). `CASES` examples each, drawn by hypothesis; shrinking reports the smallest failing feed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import dynshape as ds
from dynshape.runtime.binder import InputSpec, as_input_array

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import fuzz_seeds  # noqa: E402
from tolerance import assert_f32_close

CASES = 500  # per executable: 2,000 in all (the figure issue 15 asks for)
SEEDS = {s.name: s for s in fuzz_seeds.SEEDS}
MODELS = ["mlp", "attention", "conv_pool", "loop_scan"]
DTYPES = [np.float32, np.float64, np.int64, np.int32, np.bool_, np.float16, np.uint8, ">f4"]


@pytest.fixture(scope="module", autouse=True)
def _small_machine():
    """A 256 MiB machine: a feed of 10**9 rows is refused by the memory check, never copied (the machine is
    shared; tests/hardening/test_bad_feeds.py checks the real limit's message)."""
    from dynshape.runtime import memory

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(memory, "machine_bytes", lambda: 256 << 20)
        yield


@pytest.fixture(scope="module", params=MODELS)
def compiled(request):
    seed = SEEDS[request.param]
    graph = ds.load_onnx(seed.build())
    return seed, graph, ds.compile(graph)


def _array(draw, shape: tuple, dtype) -> np.ndarray:
    kind = draw(st.sampled_from(["plain", "strided", "transposed", "broadcast", "fortran", "readonly"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    base = (rng.standard_normal(shape) * 3).astype(dtype) if np.dtype(dtype).kind != "b" else rng.random(shape) < .5
    if np.dtype(dtype).kind in "iu":
        base = np.clip(base, 0, 1).astype(dtype)  # valid indices / mask values: the feed, not the data, is bad
    if kind == "strided" and base.ndim:
        big = np.repeat(base, 2, axis=-1)
        return big[..., ::2]
    if kind == "transposed" and base.ndim >= 2:
        return np.ascontiguousarray(np.swapaxes(base, 0, 1)).swapaxes(0, 1)
    if kind == "broadcast" and base.ndim and base.size:
        return np.broadcast_to(base[(0,) * base.ndim], shape)
    if kind == "fortran":
        return np.asfortranarray(base)
    if kind == "readonly":
        base.setflags(write=False)
    return base


@st.composite
def values(draw, spec: InputSpec, env: dict[str, int]):
    """A value for one input: often right, often wrong in one way (rank, dtype, dim, container)."""
    good = tuple(d if isinstance(d, int) else int(d.evaluate(env)) for d in spec.shape)
    what = draw(st.sampled_from(["good"] * 8 + ["dtype", "rank", "dim", "zero", "huge", "list", "list", "scalar",
                                               "none", "object", "string", "ragged"]))
    dtype = spec.dtype
    shape = good
    if what == "dtype":
        dtype = draw(st.sampled_from(DTYPES))
    elif what == "rank":
        shape = draw(st.sampled_from([good[:-1], (*good, 1), (), (1, *good)]))
    elif what in ("dim", "zero") and good:
        ax = draw(st.integers(0, len(good) - 1))
        n = 0 if what == "zero" else draw(st.sampled_from([1, 2, 3, 5, 17, 64]))
        shape = good[:ax] + (n,) + good[ax + 1:]
    elif what == "huge" and good:
        return np.broadcast_to(np.zeros((), dtype), (10**9, *good[1:]))
    elif what == "list":
        return _array(draw, good, dtype).tolist()
    elif what == "scalar":
        return draw(st.sampled_from([0, 1.5, True, np.float32(2)]))
    elif what == "none":
        return None
    elif what == "object":
        return draw(st.sampled_from([object(), {"a": 1}, {1, 2}, b"bytes"]))
    elif what == "string":
        return np.array(["a"] * int(np.prod(good)), dtype=object).reshape(good)
    elif what == "ragged" and good:
        rows = _array(draw, good, np.float32).tolist()
        return [rows[0], rows[0][:-1]] if isinstance(rows, list) and len(rows) and isinstance(rows[0], list) \
            else [[1.0], [1.0, 2.0]]
    return _array(draw, shape, dtype)


@st.composite
def feeds(draw, specs: list[InputSpec], env: dict[str, int]):
    kind = draw(st.sampled_from(["dict"] * 8 + ["none", "list", "tuple", "str", "int"]))
    if kind != "dict":
        return {"none": None, "list": [np.zeros(2)], "tuple": (1,), "str": "x", "int": 3}[kind]
    feed = {s.name: draw(values(s, env)) for s in specs}
    if specs and draw(st.booleans()) and draw(st.booleans()):
        del feed[draw(st.sampled_from([s.name for s in specs]))]
    if draw(st.integers(0, 5)) == 0:
        feed[draw(st.sampled_from(["extra", "x2", ""]))] = np.zeros(2, np.float32)
    return feed


def _specs(graph) -> list[InputSpec]:
    return [InputSpec(v.name, np.dtype(v.dtype), tuple(graph.types[v.name].shape)) for v in graph.inputs]


def _reference(graph, feed: dict, specs: list[InputSpec]) -> dict:
    """The reference executor on the values the binder accepted (lists converted the same way)."""
    arrays = {s.name: np.array(as_input_array(feed[s.name], s), order="C") for s in specs}
    return graph.run(arrays)


@settings(max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                     HealthCheck.function_scoped_fixture,
                                                                     HealthCheck.data_too_large])
@given(data=st.data())
def test_run_on_bad_feeds_is_a_clean_error_or_the_reference_result(compiled, data):
    seed, graph, exe = compiled
    specs = _specs(graph)
    env = dict(seed.env)
    env.update({k: data.draw(st.integers(1, 4), label=k) for k in env if data.draw(st.booleans(), label=f"vary {k}")})
    feed = data.draw(feeds(specs, env), label="feed")
    try:
        out = exe.run(feed)
    except ds.DynshapeError as e:
        event(f"refused: {type(e).__name__}")  # --hypothesis-show-statistics shows the split
        return
    event("ran")
    ref = _reference(graph, feed, specs)  # what ran must be a valid feed: the reference runs it too
    for name, v in ref.items():
        assert out[name].shape == v.shape and out[name].dtype == v.dtype
        assert_f32_close(out[name], v, rtol=1e-4, scale=1e-5)
