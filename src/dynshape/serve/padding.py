"""Pad-and-join for sequences of different lengths, where the model masks padding (`--pad seq=attention_mask`).

Why: Triton joins only requests of equal shape, so text of mixed lengths is never batched (its users pad on the
client). A dynshape executable runs every length from one build, so the batcher may pad a group of sequences to
the longest one and run them as one call, but only where that is exact and pays:

- exact: the named mask input zeroes the padded positions, every input and output has the symbol as a plain axis
  (outputs are sliced back), and `check_exact` runs the model on random requests alone and padded-and-joined
  before serving and refuses the flag if any output differs (tolerance 1e-4 of the output's magnitude);
- pays: `CostModel` predicts a call's time from the graph's symbolic work at its shape (the executable's
  FLOP and byte counts, expressions of the symbols, evaluated at the call's rows and length), `t = a +
  b * flops + c * bytes`, with the three constants fitted to measured call times (probe calls at load, then
  every call served); a request joins a padded batch only when the joined call is predicted cheaper than running
  the groups apart. Each decision, and the padding waste of each padded call (in elements and in FLOPs), goes to
  the metrics.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dynshape.serve.signature import ModelSignature


def _axis_of(dims: tuple, name: str) -> int | None | bool:
    """The axis whose dim is the bare symbol; None when absent; False when it appears inside an expression."""
    axis = None
    for i, d in enumerate(dims):
        if isinstance(d, int):
            continue
        if hasattr(d, "is_atom") and d.is_atom() and d.atom().name == name:
            if axis is not None:
                return False
            axis = i
        elif name in getattr(d, "free_symbols", ()):
            return False
    return axis


class PadPlan:
    """Where the padded symbol sits in each input and output, and how to pad and unpad along it."""

    def __init__(self, sig: ModelSignature, pad: dict[str, str]):
        if len(pad) != 1:
            raise ValueError(f"--pad takes one SYMBOL=MASK_INPUT, got {pad}")
        (self.symbol, self.mask), = pad.items()
        if self.symbol not in sig.symbols:
            raise ValueError(f"--pad {self.symbol}: the model has no symbol {self.symbol!r} ({sorted(sig.symbols)})")
        if self.symbol == sig.batch:
            raise ValueError(f"--pad {self.symbol}: that is the batch symbol")
        names = {t.name for t in sig.inputs}
        if self.mask not in names:
            raise ValueError(f"--pad {self.symbol}={self.mask}: the model has no input {self.mask!r} ({sorted(names)})")
        self.inputs: dict[str, int] = {}
        self.outputs: dict[str, int | None] = {}
        for t in sig.inputs + sig.outputs:
            ax = _axis_of(t.dims, self.symbol)
            if ax is False:
                raise ValueError(f"--pad {self.symbol}: {t.name!r} [{', '.join(t.dim_names())}] uses it inside an "
                                 "expression, so padding cannot be sliced back")
            (self.inputs if t in sig.inputs else self.outputs)[t.name] = ax
        if self.inputs.get(self.mask) is None:
            raise ValueError(f"--pad {self.symbol}={self.mask}: the mask input has no {self.symbol} axis")
        self.inputs = {k: v for k, v in self.inputs.items() if v is not None}
        self.sig = sig

    def loose_key(self, key: tuple) -> tuple:
        """The group key with the padded axis left out: requests that differ only there may be padded together."""
        out = []
        for name, shape in key:
            ax = self.inputs.get(name)
            if ax is not None:
                j = ax - 1 if self.sig.batch else ax  # the key holds the dims after the batch dim
                shape = shape[:j] + (-1,) + shape[j + 1:]
            out.append((name, shape))
        return tuple(out)

    def length(self, feed: dict[str, np.ndarray]) -> int:
        return int(feed[self.mask].shape[self.inputs[self.mask]])

    def pad(self, feed: dict[str, np.ndarray], to: int) -> dict[str, np.ndarray]:
        """Zeros after each padded axis's end (token 0, mask 0)."""
        out = {}
        for name, a in feed.items():
            ax = self.inputs.get(name)
            if ax is None or a.shape[ax] == to:
                out[name] = a
                continue
            widths = [(0, 0)] * a.ndim
            widths[ax] = (0, to - a.shape[ax])
            out[name] = np.pad(a, widths)
        return out

    def unpad(self, outputs: dict[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
        out = {}
        for name, a in outputs.items():
            ax = self.outputs.get(name)
            out[name] = a if ax is None else a[(slice(None),) * ax + (slice(0, length),)]
        return out


class CostModel:
    """Predicted seconds of one call from the graph's work at its shape: `t = a + b * flops + c * bytes`.

    `work(values)` gives the call's {'flops', 'bytes'} at a binding of the symbols (the executable's public
    `work`, an expression of the symbols evaluated there: products count M*N*K, attention rows*len^2*heads*dim,
    elementwise nodes their elements), so the model knows how work grows with each symbol and has only three
    machine constants to learn: per-call overhead, time per FLOP and time per byte. Those are fitted by
    non-negative least squares on relative error (a 1 ms call's misfit matters as much as a 100 ms one's: the
    short calls are where joining saves the overhead) over the most recent measured calls (probe calls at load,
    then every call served), refitted every 16 new samples.
    """

    def __init__(self, work: Callable[[dict[str, int]], Mapping[str, int]], window: int = 512):
        self.work = work
        self.samples: deque[tuple[float, float, float]] = deque(maxlen=window)  # (flops, bytes, seconds)
        self.coef: np.ndarray | None = None
        self._new = 0
        self._lock = threading.Lock()
        self._memo: dict[tuple, tuple[float, float]] = {}

    def counts(self, values: dict[str, int]) -> tuple[float, float]:
        """(flops, bytes) at `values`, memoised (a bounded memo: shapes seen long ago are evaluated again)."""
        key = tuple(sorted(values.items()))
        got = self._memo.get(key)
        if got is None:
            if len(self._memo) >= 4096:
                self._memo.clear()
            w = self.work(values)
            got = self._memo[key] = (float(w["flops"]), float(w["bytes"]))
        return got

    def record(self, values: dict[str, int], seconds: float) -> None:
        flops, nbytes = self.counts(values)
        with self._lock:
            self.samples.append((flops, nbytes, seconds))
            self._new += 1
            if self.coef is None or self._new >= 16:
                self._fit()

    def _fit(self) -> None:
        s = np.array(self.samples, dtype=np.float64)
        if len({(f, b) for f, b, _ in self.samples}) < 3:
            return
        t = np.maximum(s[:, 2], 1e-7)
        x = np.column_stack([np.ones(len(s)), s[:, 0], s[:, 1]])
        scale = np.maximum(np.abs(x).max(axis=0), 1e-30)  # columns of like magnitude for the solver
        coef = nnls((x / scale) / t[:, None], np.ones_like(t)) / scale  # relative error: rows divided by t
        self.coef = coef
        self._new = 0

    @property
    def calibrated(self) -> bool:
        return self.coef is not None

    def predict(self, values: dict[str, int]) -> float:
        assert self.coef is not None
        flops, nbytes = self.counts(values)
        return float(self.coef[0] + self.coef[1] * flops + self.coef[2] * nbytes)


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns: the best unconstrained fit over every subset of columns
    whose coefficients are all >= 0 (exact for the handful of features here; 2^n - 1 small solves). Why not
    clip an unconstrained fit: with flops and bytes nearly collinear, one coefficient goes negative and the
    clipped rest no longer fit; a call never gets cheaper with more work."""
    n = x.shape[1]
    best: tuple[float, np.ndarray] | None = None
    for mask in range(1, 1 << n):
        cols = [i for i in range(n) if mask >> i & 1]
        c, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if (c < 0).any():
            continue
        r = float(np.sum((x[:, cols] @ c - y) ** 2))
        if best is None or r < best[0]:
            full = np.zeros(n)
            full[cols] = c
            best = (r, full)
    return best[1] if best is not None else np.zeros(n)


def work_of(exe: Any, sig: ModelSignature) -> Callable[[dict[str, int]], Mapping[str, int]]:
    """The cost model's work function: the executable's own (`exe.work(values)`, the public runtime API), or,
    for an executable that has none (a wrapper), the elements of the inputs at those values as both counts."""
    work = getattr(exe, "work", None)
    if callable(work):
        return work

    def elements(values: dict[str, int]) -> dict[str, int]:
        n = 0
        for t in sig.inputs:
            k = 1
            for d in t.dims:
                k *= d if isinstance(d, int) else int(d.evaluate(values))
            n += k
        return {"flops": n, "bytes": n}
    return elements


def find_pad(sig: ModelSignature) -> dict[str, str]:
    """`--pad auto`: an integer or boolean input named like a mask, of dims (batch, S) with S a plain symbol other
    than the batch one, gives {S: its name}; {} when the graph has none."""
    if not sig.batch:
        return {}
    for t in sig.inputs:
        if "mask" in t.name.lower() and t.dtype.kind in "iub" and len(t.dims) == 2:
            d = t.dims[1]
            if hasattr(d, "is_atom") and d.is_atom() and d.atom().name not in (sig.batch,):
                return {d.atom().name: t.name}
    return {}


def random_feed(sig: ModelSignature, shape_of: dict[str, tuple], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs for probes: integers 0/1 (valid token ids and mask values), floats standard normal, masks ones."""
    feed = {}
    for t in sig.inputs:
        shape = shape_of[t.name]
        if t.dtype.kind in "iu":
            feed[t.name] = rng.integers(0, 2, shape).astype(t.dtype)
        elif t.dtype.kind == "b":
            feed[t.name] = np.ones(shape, t.dtype)
        else:
            feed[t.name] = rng.standard_normal(shape).astype(t.dtype)
    return feed


def probe_shapes(sig: ModelSignature, plan: PadPlan, rows: int, length: int) -> dict[str, tuple]:
    """Every input's shape at (rows, length): the batch and padded symbols set, other symbols at their minimum
    (at least 1), static dims as declared."""
    values = {name: max(info.min, 1) for name, info in sig.symbols.items()}
    if sig.batch:
        values[sig.batch] = rows
    values[plan.symbol] = length
    out = {}
    for t in sig.inputs:
        out[t.name] = tuple(d if isinstance(d, int) else int(d.evaluate(values)) for d in t.dims)
    return out


def check_exact(exe: Any, sig: ModelSignature, plan: PadPlan, lengths: tuple[int, int]) -> None:
    """Refuse padding unless a request of the shorter length, padded and joined with one of the longer, gives the
    same outputs as alone (ValueError naming the output and the difference)."""
    short, long_ = lengths
    rng = np.random.default_rng(0)
    a = random_feed(sig, probe_shapes(sig, plan, 1, short), rng)
    b = random_feed(sig, probe_shapes(sig, plan, 1, long_), rng)
    alone = exe.run(a)
    padded = plan.pad(a, long_)
    joined = {n: np.concatenate([padded[n], b[n]], axis=0) if sig.batch else padded[n] for n in padded}
    out = exe.run(joined)
    got = plan.unpad({k: v[:1] if sig.batch else v for k, v in out.items()}, short)
    for name, ref in alone.items():
        ref, g = np.asarray(ref), np.asarray(got[name])
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        diff = float(np.max(np.abs(ref.astype(np.float64) - g.astype(np.float64)))) if ref.size else 0.0
        if g.shape != ref.shape or diff > 1e-4 * max(scale, 1e-6) + 1e-6:
            raise ValueError(f"--pad {plan.symbol}={plan.mask} is not exact for this model: output {name!r} of a "
                             f"{plan.symbol}={short} request padded to {long_} differs by {diff:.3g} (magnitude "
                             f"{scale:.3g}); serve without --pad")
