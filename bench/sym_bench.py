"""Benchmark of the symbolic layer against sympy on typical shape workloads. Not a test.

    python bench/sym_bench.py [--quick] [--facts N] [--seed S]

Workloads, each done by dynshape and by sympy in the same run on the same generated inputs:
  cnn        the conv/pool output formula chained through 50-layer CNNs on symbolic H and W, simplified per layer
  reshape    reshape(-1) / flatten products over symbolic and constant dims, simplified
  attention  per-layer shapes of transformer attention over batch/heads/seq/past, simplified, plus the
             equalities shape inference has to prove (matmul inner dims, head split)
  prove      N typical shape facts (default 10,000): conv/pool outputs, padding, divisibility, products,
             ranges, min/max, false facts and undecidable ones

The fair sympy equivalent: a dimension `x` with min m, multiple of k is the sympy expression k*x_ + m' with
x_ a nonnegative integer Symbol (m' the least admissible value), so sympy knows the lower bound and the
divisibility; sympy has no way to state an upper bound. Floor division is floor(a/b), modulo Mod, ceil_div
ceiling(a/b), min/max Min/Max; expressions are put through sympy.simplify. A fact is decided by sympy's
relational auto-evaluation, falling back to sympy.simplify of the difference and its assumption queries
(is_nonnegative, is_zero, ...), the strongest cheap pipeline sympy offers.

Every workload uses fresh symbols per repetition on both sides, so neither side's caches carry results from
one repetition to the next. Reports per-workload times, speedups (goal >= 50x), the facts where dynshape was
weaker than sympy (sympy decided, dynshape returned None), and any disagreement.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import signal
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import sympy as sp

import dynshape as ds

GOAL = 50.0

# ---------------------------------------------------------------------------------------------------------
# Two backends behind one small interface
# ---------------------------------------------------------------------------------------------------------


class Timeout(Exception):
    pass


@contextmanager
def time_limit(seconds: float | None):
    """Abort a runaway sympy call (SIGALRM; main thread only)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def handler(signum, frame):
        raise Timeout

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class DS:
    name = "dynshape"

    def __init__(self, tag: str):
        self.tag = tag

    def sym(self, name, min=1, max=None, multiple_of=1):
        return ds.sym(f"{name}_{self.tag}", min=min, max=max, multiple_of=multiple_of)

    fdiv = staticmethod(lambda a, b: a // b)
    mod = staticmethod(lambda a, b: a % b)
    ceil_div = staticmethod(ds.ceil_div)
    min_ = staticmethod(ds.min_)
    max_ = staticmethod(ds.max_)
    simplify = staticmethod(ds.simplify)

    @staticmethod
    def decide(kind, a, b):
        cond = {
            "lt": lambda: a < b,
            "le": lambda: a <= b,
            "gt": lambda: a > b,
            "ge": lambda: a >= b,
            "eq": lambda: ds.eq(a, b),
            "ne": lambda: ds.ne(a, b),
            "divides": lambda: ds.divides(a, b),
        }[kind]()
        return ds.prove(cond)


class SP:
    name = "sympy"

    def __init__(self, tag: str):
        self.tag = tag
        self.symbols: dict = {}

    def sym(self, name, min=1, max=None, multiple_of=1):
        first = -(-min // multiple_of) * multiple_of
        x = sp.Symbol(f"{name}_{self.tag}", integer=True, nonnegative=True)
        return multiple_of * x + first

    fdiv = staticmethod(lambda a, b: sp.floor(sp.Rational(1, 1) * a / b))
    mod = staticmethod(sp.Mod)
    ceil_div = staticmethod(lambda a, b: sp.ceiling(sp.Rational(1, 1) * a / b))
    min_ = staticmethod(sp.Min)
    max_ = staticmethod(sp.Max)
    simplify = staticmethod(sp.simplify)

    @staticmethod
    def decide(kind, a, b):
        if kind == "divides":
            r = sp.Mod(b, a)
            for step in (lambda x: x, sp.simplify):
                r = step(r)
                if r == 0:
                    return True
                if r.is_zero is False:
                    return False
            return None
        if kind in ("eq", "ne"):
            d = sp.sympify(a - b)
            for step in (lambda x: x, sp.simplify):
                d = step(d)
                z = True if d == 0 else d.is_zero
                if z is not None:
                    return z if kind == "eq" else not z
            return None
        rel = {"lt": sp.Lt, "le": sp.Le, "gt": sp.Gt, "ge": sp.Ge}[kind]
        r = rel(a, b)
        if r in (sp.true, sp.false):
            return bool(r)
        d = sp.simplify(a - b)
        query = {
            "lt": (lambda x: x.is_negative, lambda x: x.is_nonnegative),
            "le": (lambda x: x.is_nonpositive, lambda x: x.is_positive),
            "gt": (lambda x: x.is_positive, lambda x: x.is_nonpositive),
            "ge": (lambda x: x.is_nonnegative, lambda x: x.is_negative),
        }[kind]
        if query[0](d):
            return True
        if query[1](d):
            return False
        return None


# ---------------------------------------------------------------------------------------------------------
# Workloads: functions of a backend returning a list of results (expressions or answers)
# ---------------------------------------------------------------------------------------------------------


def cnn_layers(seed: int, n: int = 50) -> list[tuple[int, int, int, int]]:
    """(kernel, stride, pad, dilation) for n layers: a stem, a pool, then residual-style stages."""
    rng = random.Random(seed)
    layers = [(7, 2, 3, 1), (3, 2, 1, 1)]
    while len(layers) < n:
        i = len(layers)
        if i % 12 == 0:
            layers.append(rng.choice([(3, 2, 1, 1), (1, 2, 0, 1), (2, 2, 0, 1)]))
        else:
            layers.append(rng.choice([(3, 1, 1, 1), (1, 1, 0, 1), (3, 1, 2, 2), (5, 1, 2, 1)]))
    return layers


def w_cnn(B, models):
    out = []
    for layers in models:
        H = B.sym("H", min=224)
        W = B.sym("W", min=32, multiple_of=32)
        for dim in (H, W):
            h = dim
            for k, s, p, d in layers:
                h = B.simplify(B.fdiv(h + 2 * p - d * (k - 1) - 1, s) + 1)
            out.append(h)
    return out


def reshape_cases(seed: int, n: int):
    """Source shapes as tokens: a symbol name or a constant; and a grouping of them into a target."""
    rng = random.Random(seed)
    names = ["b", "s", "c", "h", "w", "n"]
    consts = [1, 2, 3, 4, 8, 12, 16, 64, 768]
    cases = []
    for _ in range(n):
        rank = rng.randint(2, 5)
        src = [rng.choice(names) if rng.random() < 0.6 else rng.choice(consts) for _ in range(rank)]
        cut = sorted(rng.sample(range(1, rank), rng.randint(0, rank - 1))) if rank > 1 else []
        groups = [src[a:b] for a, b in zip([0, *cut], [*cut, rank])]
        minus_one = rng.randrange(len(groups))
        axis = rng.randint(0, rank)
        cases.append((src, groups, minus_one, axis))
    return cases


def w_reshape(B, cases):
    out = []
    for src, groups, minus_one, axis in cases:
        env = {n: B.sym(n) for n in "bschwn"}
        dims = [env[t] if isinstance(t, str) else t for t in src]
        numel = 1
        for d in dims:
            numel = numel * d
        known = 1
        for i, g in enumerate(groups):
            if i != minus_one:
                for t in g:
                    known = known * (env[t] if isinstance(t, str) else t)
        out.append(B.simplify(B.fdiv(numel, known)))  # reshape with -1
        lead = 1
        for d in dims[:axis]:
            lead = lead * d
        out.append(B.simplify(B.fdiv(numel, lead)))  # flatten(axis): second output dim
    return out


def w_attention(B, layers: int):
    """Shapes of `layers` attention blocks, and the facts their shape inference must establish."""
    out, facts = [], []
    b = B.sym("batch")
    s = B.sym("seq", max=4096)
    past = B.sym("past", min=0, max=8192)
    nh = B.sym("heads")
    hd = B.sym("head_dim", multiple_of=8)
    hidden = nh * hd
    for i in range(layers):
        total = past + s
        q = (b, s, hidden)
        split = (b, s, nh, B.fdiv(q[2], nh))  # reshape to heads
        qh = (split[0], split[2], split[1], split[3])  # transpose
        kv = (b, nh, total, B.fdiv(hidden, nh))
        scores = (qh[0], qh[1], qh[2], kv[2])
        padded = B.ceil_div(total, 64) * 64
        blocks = B.ceil_div(total, 128)
        window = B.min_(total, 4096)
        merged = (b, s, B.fdiv(b * s * nh * hd, b * s))
        flat = (B.fdiv(b * nh * s * total, total), total)
        rot = B.fdiv(hd, 2) * 2
        mlp = (b * s, 4 * hidden, B.fdiv(4 * hidden * b * s, b * s * 4))
        exprs = [*split, *qh, *kv, *scores, padded, blocks, window, *merged, *flat, rot, *mlp]
        out.extend(B.simplify(e) for e in exprs)
        facts += [
            ("eq", qh[3], kv[3]),  # q @ k^T inner dims
            ("eq", scores[3], total),
            ("eq", merged[2], hidden),
            ("eq", rot, hd),
            ("eq", mlp[2], hidden),
            ("ge", padded, total),
            ("lt", padded, total + 64),
            ("le", window, total),
            ("divides", 8, split[3] * (i + 1)),
            ("ge", blocks * 128, total),
        ]
    for kind, a, c in facts:
        out.append(B.decide(kind, a, c))
    return out


# ---------------------------------------------------------------------------------------------------------
# 10,000 typical facts
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Fact:
    template: str
    kind: str
    lhs: object
    rhs: object
    expected: bool | None  # the true answer: True / False / None (holds somewhere and fails somewhere)


def fact_templates(B, rng: random.Random):
    """One instance of each template over fresh symbols; returns list[Fact] (lhs/rhs built by B)."""
    k = rng.choice([1, 3, 5, 7])
    s_ = rng.choice([1, 2, 3])
    p = rng.choice([0, (k - 1) // 2])
    m = rng.choice([2, 4, 8, 16, 32, 64, 128])
    c = rng.randint(1, 9)
    M = rng.choice([64, 128, 512, 4096])
    mult = rng.choice([1, 2, 4, 8])
    fact_mult = rng.choice([1, 2, 3, 4, 8])
    H = B.sym("H", min=max(1, k - 2 * p))
    x = B.sym("x")
    y = B.sym("y")
    z = B.sym("z", min=0)
    xm = B.sym("xm", multiple_of=mult)
    seq = B.sym("seq", max=M)
    conv = B.fdiv(H + 2 * p - k, s_) + 1
    F = Fact
    return [
        F("conv>=1", "ge", conv, 1, True),
        F("conv<=H+2p", "le", conv, H + 2 * p, True),
        F("conv==ceil", "eq", conv, B.ceil_div(H + 2 * p - k + 1, s_), True),
        F("pad>=x", "ge", B.fdiv(x + m - 1, m) * m, x, True),
        F("pad<x+m", "lt", B.fdiv(x + m - 1, m) * m, x + m, True),
        F("ceil_div*m>=x", "ge", B.ceil_div(x, m) * m, x, True),
        F("divides c*xm", "divides", m, fact_mult * xm, True if (fact_mult * mult) % m == 0 else None),
        F("divides odd", "divides", 2, 2 * x + 1, False),
        F("divides padded", "divides", m, B.fdiv(x + m - 1, m) * m, True),
        F("x*y>=x", "ge", x * y, x, True),
        F("x*y>=x+y", "ge", x * y, x + y, None),
        F("x*y*z>=0", "ge", x * y * z, 0, True),
        F("reshape eq", "eq", B.fdiv(x * y * c, x * c), y, True),
        F("product eq", "eq", x * (y + c), x * y + c * x, True),
        F("seq<=M", "le", seq, M, True),
        F("seq>M", "gt", seq, M, False),
        F("seq==M+c", "eq", seq, M + c, False),
        F("seq<=M-1", "le", seq, M - 1, None),
        F("mod<m", "lt", B.mod(x, m), m, True),
        F("mod>=m", "ge", B.mod(x, m), m, False),
        F("x//m<=x", "le", B.fdiv(x, m), x, True),
        F("x//m*m<=x", "le", B.fdiv(x, m) * m, x, True),
        F("x-x//m*m<m", "lt", x - B.fdiv(x, m) * m, m, True),
        F("x<y", "lt", x, y, None),
        F("x==y", "eq", x, y, None),
        F("x+c>x", "gt", x + c, x, True),
        F("z>0", "gt", z, 0, None),
        F("min<=x", "le", B.min_(x, y), x, True),
        F("max>=min", "ge", B.max_(x, y), B.min_(x, y), True),
        F("c*x>x", "gt", (c + 1) * x, x, True),
        F("x*x>=x", "ge", x * x, x, True),
        F("xm%mult==0", "eq", B.mod(xm, mult), 0, True),
        F("x==x+c", "eq", x, x + c, False),
    ]


def make_facts(B, n: int, seed: int, group: int = 100) -> list[Fact]:
    """n facts in groups that share symbols (as one model's facts do)."""
    rng = random.Random(seed)
    facts: list[Fact] = []
    base_tag = B.tag
    g = 0
    while len(facts) < n:
        B.tag = f"{base_tag}g{g}"
        g += 1
        batch: list[Fact] = []
        while len(batch) < group and len(facts) + len(batch) < n:
            batch.extend(fact_templates(B, rng))
        facts.extend(batch[: min(group, n - len(facts))])
    B.tag = base_tag
    return facts


def w_prove(B, facts: list[Fact], per_fact_timeout: float | None = None):
    out = []
    for f in facts:
        try:
            with time_limit(per_fact_timeout):
                out.append(B.decide(f.kind, f.lhs, f.rhs))
        except Timeout:
            out.append("timeout")
    return out


# ---------------------------------------------------------------------------------------------------------
# Runner
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    ds_times: list[float] = field(default_factory=list)
    sp_times: list[float] = field(default_factory=list)
    units: int = 0
    note: str = ""

    @property
    def ds_t(self) -> float:
        return min(self.ds_times)

    @property
    def sp_t(self) -> float:
        return min(self.sp_times)


def timed(fn):
    gc.collect()
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


_rep = itertools.count()


def run_side_by_side(name, units, ds_fn, sp_fn, ds_reps: int, sp_reps: int) -> tuple[Result, list, list]:
    res = Result(name, units=units)
    ds_out = sp_out = None
    for _ in range(ds_reps):
        t, ds_out = timed(lambda: ds_fn(DS(f"r{next(_rep)}")))
        res.ds_times.append(t)
    for _ in range(sp_reps):
        t, sp_out = timed(lambda: sp_fn(SP(f"r{next(_rep)}")))
        res.sp_times.append(t)
    return res, ds_out, sp_out


def ds_value(e, env):
    return e if isinstance(e, int) else e.evaluate(env)


def check_cnn_agreement(models, rng) -> int:
    """Evaluate final H/W both ways at random sizes; return the number of mismatches."""
    bad = 0
    D, S = DS("chk"), SP("chk")
    ds_out, sp_out = w_cnn(D, models[:1]), w_cnn(S, models[:1])
    for (de, se), (lo, mult) in zip(zip(ds_out, sp_out), [(224, 1), (32, 32)]):
        for _ in range(20):
            v = rng.randrange(lo, 4000) // mult * mult
            v = max(v, lo)
            env = {name: v for name in de.free_symbols} if not isinstance(de, int) else {}
            sym_ = next(iter(se.free_symbols), None)
            sv = int(se.subs(sym_, (v - lo) // mult)) if sym_ is not None else int(se)
            if ds_value(de, env) != sv:
                bad += 1
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    ap.add_argument("--facts", type=int, default=None, help="number of facts to prove (default 10000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=40, help="print at most this many weaker/disagreeing facts")
    args = ap.parse_args(argv)
    quick = args.quick
    n_facts = args.facts or (1000 if quick else 10000)
    n_models = 1 if quick else 4
    n_reshape = 60 if quick else 300
    n_attn = 4 if quick else 24
    ds_reps, sp_reps = (3, 1) if quick else (5, 1)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    rng = random.Random(args.seed)

    print(f"dynshape {ds.__version__}  sympy {sp.__version__}  python {sys.version.split()[0]}")
    print(f"mode: {'quick' if quick else 'full'}; dynshape best of {ds_reps}, sympy best of {sp_reps}\n")

    results = []
    models = [cnn_layers(args.seed + i) for i in range(n_models)]
    r, ds_out, sp_out = run_side_by_side(
        "cnn", 2 * 50 * n_models, lambda B: w_cnn(B, models), lambda B: w_cnn(B, models), ds_reps, sp_reps
    )
    mism = check_cnn_agreement(models, rng)
    r.note = f"final H: dynshape {ds_out[0]}  |  sympy {sp_out[0]}; value mismatches: {mism}"
    results.append(r)

    cases = reshape_cases(args.seed, n_reshape)
    r, ds_out, sp_out = run_side_by_side(
        "reshape", 2 * n_reshape, lambda B: w_reshape(B, cases), lambda B: w_reshape(B, cases), ds_reps, sp_reps
    )
    non_poly = sum(1 for e in ds_out if not isinstance(e, int) and "//" in str(e))
    r.note = f"dynshape results still containing a floor division: {non_poly} of {len(ds_out)}"
    results.append(r)

    r, ds_out, sp_out = run_side_by_side(
        "attention", n_attn, lambda B: w_attention(B, n_attn), lambda B: w_attention(B, n_attn), ds_reps, sp_reps
    )
    n_f = 10 * n_attn
    ds_ans, sp_ans = ds_out[-n_f:], sp_out[-n_f:]
    r.note = (
        f"facts proved: dynshape {sum(a is True for a in ds_ans)}/{n_f}, sympy {sum(a is True for a in sp_ans)}/{n_f}"
    )
    results.append(r)

    # Facts: built (fresh symbols per repetition) and decided, both timed.
    def prove_run(B, timeout):
        facts = make_facts(B, n_facts, args.seed)
        return facts, w_prove(type(B), facts, per_fact_timeout=timeout)

    r = Result("prove", units=n_facts)
    for _ in range(ds_reps):
        t, (ds_facts, ds_ans) = timed(lambda: prove_run(DS(f"f{next(_rep)}"), None))
        r.ds_times.append(t)
    t, (sp_facts, sp_ans) = timed(lambda: prove_run(SP(f"f{next(_rep)}"), 5.0))
    r.sp_times.append(t)
    results.append(r)

    # ---- report ----
    print(f"{'workload':<10} {'units':>7} {'dynshape s':>11} {'per unit':>10} {'sympy s':>10} {'per unit':>10} "
          f"{'speedup':>9}")
    tot_ds = tot_sp = 0.0
    for r in results:
        tot_ds += r.ds_t
        tot_sp += r.sp_t
        sp_ratio = r.sp_t / r.ds_t if r.ds_t > 0 else float("inf")
        print(
            f"{r.name:<10} {r.units:>7} {r.ds_t:>11.4f} {r.ds_t / r.units * 1e6:>8.1f}us {r.sp_t:>10.3f} "
            f"{r.sp_t / r.units * 1e3:>8.2f}ms {sp_ratio:>8.1f}x {'ok' if sp_ratio >= GOAL else 'BELOW GOAL'}"
        )
        if len(r.ds_times) > 1:
            print(f"{'':<10} dynshape runs: median {statistics.median(r.ds_times):.4f}s, "
                  f"max {max(r.ds_times):.4f}s")
    total_ratio = tot_sp / tot_ds if tot_ds else float("inf")
    print(f"{'total':<10} {'':>7} {tot_ds:>11.4f} {'':>10} {tot_sp:>10.3f} {'':>10} {total_ratio:>8.1f}x "
          f"(goal >= {GOAL:.0f}x: {'met' if total_ratio >= GOAL else 'NOT met'})\n")
    for r in results:
        if r.note:
            print(f"[{r.name}] {r.note}")

    # ---- answer comparison on the facts ----
    weaker, stronger, disagree, unsound, timeouts = [], [], [], [], 0
    by_template: dict[str, list[int]] = {}
    for f, g, a, b in zip(ds_facts, sp_facts, ds_ans, sp_ans):
        if b == "timeout":
            timeouts += 1
            b = None
        row = by_template.setdefault(f.template, [0, 0, 0, 0, set()])
        row[4].add(repr(f.expected))
        row[0] += 1
        row[1] += a is not None
        row[2] += b is not None
        row[3] += a is None and f.expected is not None
        if b is not None and a is None:
            weaker.append((f, g, b))
        elif a is not None and b is None:
            stronger.append(f)
        elif a is not None and a != b:
            disagree.append((f, g, a, b))
        if a is not None and a != f.expected:
            unsound.append((f, a))

    print(f"\nfacts: {n_facts}; dynshape decided {sum(a is not None for a in ds_ans)}, "
          f"sympy decided {sum(b not in (None, 'timeout') for b in sp_ans)} (sympy timeouts: {timeouts})")
    print(f"dynshape weaker than sympy (sympy decided, dynshape None): {len(weaker)}")
    for f, g, b in weaker[: args.show]:
        print(f"  [{f.template}] {f.kind}({f.lhs}, {f.rhs}): sympy {b}  (sympy form {g.kind}({g.lhs}, {g.rhs}))")
    print(f"dynshape stronger than sympy (dynshape decided, sympy None): {len(stronger)}")
    print(f"disagreements (both decided, different answers): {len(disagree)}")
    for f, _g, a, b in disagree[: args.show]:
        print(f"  [{f.template}] {f.kind}({f.lhs}, {f.rhs}): dynshape {a}, sympy {b}")
    print(f"dynshape answers contradicting the known answer (unsound): {len(unsound)}")
    for f, a in unsound[: args.show]:
        print(f"  [{f.template}] {f.kind}({f.lhs}, {f.rhs}): dynshape {a}, true answer {f.expected}")
    print("\nper template: facts, decided by dynshape, decided by sympy, dynshape None where decidable, answer")
    for name, (n, a, b, miss, exp) in by_template.items():
        print(f"  {name:<16} {n:>6} {a:>6} {b:>6} {miss:>6}  {'/'.join(sorted(exp))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
