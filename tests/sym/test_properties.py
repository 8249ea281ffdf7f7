"""Brute-force soundness properties of the symbolic layer (`dynshape.sym`).

Every property draws random expressions over 1 to 3 symbols with small ranges, enumerates the admissible
assignments (respecting min, max and multiple_of) and checks the engine's answers against plain Python
integer arithmetic, which is the intended semantics (floor division and modulo as in Python).

The expression generator never divides by something that can be zero, except in the test that checks the
engine refuses exactly that. Symbols get unique names per example, so no test depends on how the engine
treats two declarations of the same name.

Runtime: the number of examples per test is fixed (derandomized, no example database) so CI is
reproducible; set DYNSHAPE_HYPOTHESIS_SCALE=10 to run ten times as many locally.
"""

from __future__ import annotations

import itertools
import math
import os
import random
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, assume, event, given, note, settings
from hypothesis import strategies as st

import dynshape as ds

SCALE = float(os.environ.get("DYNSHAPE_HYPOTHESIS_SCALE", "1"))


def cfg(n: int) -> settings:
    return settings(
        max_examples=max(1, int(n * SCALE)),
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


# ---------------------------------------------------------------------------------------------------------
# Symbols and their admissible values
# ---------------------------------------------------------------------------------------------------------

MULTS = (1, 2, 3, 4, 8)
UNBOUNDED_SPAN = 16  # for an unbounded symbol, enumerate values first .. first + UNBOUNDED_SPAN
MAX_ENVS = 400  # above this many assignments, check corners plus a deterministic sample

_ids = itertools.count()


@dataclass(frozen=True)
class Spec:
    """A symbol declaration: ds.sym(name, min=lo, max=hi, multiple_of=mult)."""

    name: str
    lo: int
    hi: int | None
    mult: int

    @property
    def first(self) -> int:  # smallest admissible value
        return -(-self.lo // self.mult) * self.mult

    @property
    def last(self) -> int | None:  # largest admissible value (None: unbounded)
        return None if self.hi is None else self.hi // self.mult * self.mult

    def values(self) -> list[int]:
        top = self.hi if self.hi is not None else self.first + UNBOUNDED_SPAN
        return list(range(self.first, top + 1, self.mult))

    def make(self):
        return ds.sym(self.name, min=self.lo, max=self.hi, multiple_of=self.mult)

    def __repr__(self) -> str:
        return f"{self.name} = ds.sym({self.name!r}, min={self.lo}, max={self.hi}, multiple_of={self.mult})"


@st.composite
def specs(draw) -> Spec:
    lo = draw(st.integers(0, 3))
    mult = draw(st.sampled_from(MULTS))
    first = -(-lo // mult) * mult
    if draw(st.integers(0, 6)) == 0:
        hi = None
    else:
        hi = first + draw(st.integers(0, max(12, first + 9) - first))
    return Spec(f"v{next(_ids)}", lo, hi, mult)


def envs_for(sps: list[Spec]) -> tuple[list[dict[str, int]], bool]:
    """Admissible assignments of `sps` and whether the list is every admissible assignment."""
    value_lists = [sp.values() for sp in sps]
    complete = all(sp.hi is not None for sp in sps)
    total = math.prod(len(v) for v in value_lists)
    names = [sp.name for sp in sps]
    if total <= MAX_ENVS:
        return [dict(zip(names, combo)) for combo in itertools.product(*value_lists)], complete
    corners = [dict(zip(names, combo)) for combo in itertools.product(*[(v[0], v[-1]) for v in value_lists])]
    rng = random.Random(total)
    sample = [dict(zip(names, (rng.choice(v) for v in value_lists))) for _ in range(MAX_ENVS)]
    return corners + sample, False


# ---------------------------------------------------------------------------------------------------------
# Expression trees: built into dynshape expressions and evaluated with Python int semantics
# ---------------------------------------------------------------------------------------------------------
# A tree is ("const", int) | ("sym", Spec) | (op, left, right) with op in OPS.

BIN_OPS = ("add", "sub", "mul", "min", "max")
DIV_OPS = ("floordiv", "mod", "ceildiv")


def build(t, syms):
    tag = t[0]
    if tag == "const":
        return t[1]
    if tag == "sym":
        return syms[t[1].name]
    a, b = build(t[1], syms), build(t[2], syms)
    return APPLY[tag](a, b)


APPLY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "min": lambda a, b: ds.min_(a, b),
    "max": lambda a, b: ds.max_(a, b),
    "ceildiv": lambda a, b: ds.ceil_div(a, b),
}

PY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "min": min,
    "max": max,
    "ceildiv": lambda a, b: -((-a) // b),
}


def ref(t, env) -> int:
    tag = t[0]
    if tag == "const":
        return t[1]
    if tag == "sym":
        return env[t[1].name]
    return PY[tag](ref(t[1], env), ref(t[2], env))


def show(t) -> str:
    tag = t[0]
    if tag == "const":
        return str(t[1])
    if tag == "sym":
        return t[1].name
    a, b = show(t[1]), show(t[2])
    return {
        "add": f"({a} + {b})",
        "sub": f"({a} - {b})",
        "mul": f"({a} * {b})",
        "floordiv": f"({a} // {b})",
        "mod": f"({a} % {b})",
        "min": f"ds.min_({a}, {b})",
        "max": f"ds.max_({a}, {b})",
        "ceildiv": f"ds.ceil_div({a}, {b})",
    }[tag]


def tree_syms(t) -> set[str]:
    if t[0] == "const":
        return set()
    if t[0] == "sym":
        return {t[1].name}
    return tree_syms(t[1]) | tree_syms(t[2])


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def ev(x, env) -> int:
    """Value of an engine result (plain int or Expr) under env; evaluate() must return a plain int."""
    if is_int(x):
        return x
    v = x.evaluate(env)
    assert is_int(v), f"evaluate returned {v!r} ({type(v).__name__}), not int"
    return v


def make_syms(sps: list[Spec]) -> dict:
    return {sp.name: sp.make() for sp in sps}


CONSTS = st.integers(-3, 9)
POS_DIVISORS = (1, 2, 3, 4, 5, 8)
NEG_DIVISORS = (-1, -2, -3, -4)


@st.composite
def trees(draw, sps, depth, neg_div=False):
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.integers(0, 4)):
            return ("sym", draw(st.sampled_from(sps)))
        return ("const", draw(CONSTS))
    op = draw(st.sampled_from(BIN_OPS + DIV_OPS))
    left = draw(trees(sps, depth - 1, neg_div))
    if op in DIV_OPS:
        return (op, left, draw(divisors(sps, depth - 1, neg_div)))
    return (op, left, draw(trees(sps, depth - 1, neg_div)))


@st.composite
def divisors(draw, sps, depth, neg_div=False):
    """Divisor trees that are >= 1 at every admissible assignment (or a negative constant if neg_div)."""
    pos_syms = [sp for sp in sps if sp.first >= 1]
    kind = draw(st.integers(0, 6)) if depth > 0 else draw(st.integers(0, 3))
    if kind == 0 or (kind in (1, 3) and not pos_syms):
        if neg_div and draw(st.booleans()):
            return ("const", draw(st.sampled_from(NEG_DIVISORS)))
        return ("const", draw(st.sampled_from(POS_DIVISORS)))
    if kind == 1:  # a symbol that is never 0
        return ("sym", draw(st.sampled_from(pos_syms)))
    if kind == 2:  # any symbol plus a positive constant
        return ("add", ("sym", draw(st.sampled_from(sps))), ("const", draw(st.integers(1, 3))))
    if kind == 3:  # k * positive symbol
        return ("mul", ("const", draw(st.integers(2, 3))), ("sym", draw(st.sampled_from(pos_syms))))
    if kind == 4:  # max(anything, k >= 1)
        return ("max", draw(trees(sps, depth - 1)), ("const", draw(st.integers(1, 4))))
    if kind == 5:  # product of positive divisors
        return ("mul", draw(divisors(sps, depth - 1)), draw(divisors(sps, depth - 1)))
    # positive divisor plus something in [0, k)
    inner = ("mod", draw(trees(sps, depth - 1)), ("const", draw(st.sampled_from(POS_DIVISORS))))
    return ("add", draw(divisors(sps, depth - 1)), inner)


@st.composite
def zero_divisors(draw, sps):
    """Divisor trees (always with a symbol in them) that may be 0; the test keeps those that reach 0."""
    sp = draw(st.sampled_from(sps))
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return ("sym", sp)
    if kind == 1:
        return ("sub", ("sym", sp), ("const", draw(st.sampled_from(sp.values()))))
    if kind == 2:
        return ("sub", ("sym", sp), ("sym", draw(st.sampled_from(sps))))
    if kind == 3:
        return ("mod", ("sym", sp), ("const", draw(st.sampled_from((2, 3, 4, 8)))))
    if kind == 4:
        return ("min", ("sym", sp), ("const", 0))
    return ("mul", ("sym", sp), draw(zero_divisors(sps)))


@st.composite
def scenarios(draw, depth=3, neg_div=False):
    sps = draw(st.lists(specs(), min_size=1, max_size=3))
    return sps, draw(trees(sps, depth, neg_div))


def describe(sps, t) -> str:
    return "\n".join([*map(repr, sps), f"e = {show(t)}"])


# ---------------------------------------------------------------------------------------------------------
# Construction and evaluate
# ---------------------------------------------------------------------------------------------------------


def check_expr_against_ref(sps, t, e, envs, what="e"):
    if not is_int(e):
        assert e.free_symbols <= tree_syms(t), f"{what} has symbols {set(e.free_symbols)} not in the tree"
        assert e.free_symbols, f"{what} = {e} has no free symbols but did not collapse to int"
        hash(e)
    for env in envs:
        want = ref(t, env)
        got = ev(e, env)
        assert got == want, f"{describe(sps, t)}\n{what} = {e}\nat {env}: got {got}, Python says {want}"


@cfg(400)
@given(scenarios(depth=4))
def test_construction_and_evaluate_match_python(case):
    sps, t = case
    note(describe(sps, t))
    e = build(t, make_syms(sps))
    envs, _ = envs_for(sps)
    check_expr_against_ref(sps, t, e, envs)


@cfg(100)
@given(scenarios(depth=3, neg_div=True))
def test_negative_constant_divisors_use_python_floor_semantics(case):
    sps, t = case
    note(describe(sps, t))
    e = build(t, make_syms(sps))
    envs, _ = envs_for(sps)
    check_expr_against_ref(sps, t, e, envs)
    check_expr_against_ref(sps, t, ds.simplify(e), envs, "simplify(e)")


@cfg(150)
@given(st.data())
def test_division_by_possibly_zero_expression_raises(data):
    sps = data.draw(st.lists(specs(), min_size=1, max_size=3))
    num = data.draw(trees(sps, 2))
    den = data.draw(zero_divisors(sps))
    op = data.draw(st.sampled_from(DIV_OPS))
    envs, _ = envs_for(sps)
    assume(any(ref(den, env) == 0 for env in envs))
    syms = make_syms(sps)
    a, d = build(num, syms), build(den, syms)
    assume(not (is_int(a) and is_int(d)))  # int // 0 is Python's business
    note(f"{describe(sps, num)}\ndivisor = {show(den)} (zero somewhere)\nop = {op}")
    with pytest.raises(ds.ShapeError):
        APPLY[op](a, d)


# ---------------------------------------------------------------------------------------------------------
# simplify
# ---------------------------------------------------------------------------------------------------------


@cfg(500)
@given(scenarios())
def test_simplify_is_sound_and_idempotent(case):
    sps, t = case
    note(describe(sps, t))
    e = build(t, make_syms(sps))
    s = ds.simplify(e)
    note(f"simplify(e) = {s}")
    envs, _ = envs_for(sps)
    check_expr_against_ref(sps, t, s, envs, "simplify(e)")
    s2 = ds.simplify(s)
    assert s2 == s, f"simplify not idempotent: {s} -> {s2}"


@cfg(300)
@given(scenarios())
def test_python_source_round_trip_is_exact(case):
    """to_py -> from_py (how an artefact stores a frontend's requirements) rebuilds an equal expression that
    evaluates like Python at every admissible point."""
    from dynshape.sym.pysource import from_py, to_py

    sps, t = case
    note(describe(sps, t))
    syms = make_syms(sps)
    e = build(t, syms)
    if is_int(e):
        return
    back = from_py(to_py(e, {n: n for n in e.free_symbols}), syms)
    assert back == e, f"{e} came back as {back}"
    envs, _ = envs_for(sps)
    check_expr_against_ref(sps, t, back, envs, "from_py(to_py(e))")


# ---------------------------------------------------------------------------------------------------------
# == on expressions: sound (equal forms evaluate equal), hash-consistent, complete on polynomials
# ---------------------------------------------------------------------------------------------------------


@st.composite
def mutants(draw, t, sps):
    """A tree that is usually, but not always, equal in value to t."""
    tag = t[0]
    if tag in ("const", "sym") or draw(st.integers(0, 3)) == 0:
        choice = draw(st.integers(0, 2))
        if choice == 0:
            return ("add", t, ("const", draw(st.integers(-1, 1))))
        if choice == 1:
            return ("mul", ("const", 1), t)
        return ("sub", ("add", t, ("sym", sps[0])), ("sym", sps[0]))
    left, right = t[1], t[2]
    if draw(st.booleans()):
        left = draw(mutants(left, sps))
    elif tag not in DIV_OPS:
        right = draw(mutants(right, sps))
    if draw(st.booleans()):  # swap operands: preserves value only for commutative ops
        if tag in DIV_OPS:
            return (tag, left, right)
        left, right = right, left
    return (tag, left, right)


@cfg(300)
@given(st.data())
def test_expression_equality_is_sound_and_hash_consistent(data):
    sps, t1 = data.draw(scenarios())
    t2 = data.draw(mutants(t1, sps))
    syms = make_syms(sps)
    e1, e2 = build(t1, syms), build(t2, syms)
    note(f"{describe(sps, t1)}\ne2 = {show(t2)}")
    same = e1 == e2
    assert isinstance(same, bool), f"== returned {type(same).__name__}, not bool"
    if not same:
        return
    assert hash(e1) == hash(e2)
    envs, _ = envs_for(sps)
    for env in envs:
        assert ref(t1, env) == ref(t2, env), f"{e1} == {e2} claimed, but they differ at {env}"


def expand(t) -> dict[tuple[str, ...], int]:
    """Polynomial of a +,-,* tree as {sorted monomial: coefficient}."""
    tag = t[0]
    if tag == "const":
        return {(): t[1]} if t[1] else {}
    if tag == "sym":
        return {(t[1].name,): 1}
    a, b = expand(t[1]), expand(t[2])
    out: dict[tuple[str, ...], int] = {}
    if tag in ("add", "sub"):
        sign = 1 if tag == "add" else -1
        for m, c in a.items():
            out[m] = out.get(m, 0) + c
        for m, c in b.items():
            out[m] = out.get(m, 0) + sign * c
    else:
        for (ma, ca), (mb, cb) in itertools.product(a.items(), b.items()):
            m = tuple(sorted(ma + mb))
            out[m] = out.get(m, 0) + ca * cb
    return {m: c for m, c in out.items() if c}


@st.composite
def ring_trees(draw, sps, depth):
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.integers(0, 2)):
            return ("sym", draw(st.sampled_from(sps)))
        return ("const", draw(CONSTS))
    op = draw(st.sampled_from(("add", "sub", "mul")))
    return (op, draw(ring_trees(sps, depth - 1)), draw(ring_trees(sps, depth - 1)))


@cfg(200)
@given(st.data())
def test_equality_is_complete_on_polynomials(data):
    """Canonical forms: two ways of writing the same polynomial compare equal (a*(b+1) == a*b + a)."""
    sps = data.draw(st.lists(specs(), min_size=1, max_size=3))
    t = data.draw(ring_trees(sps, 3))
    syms = make_syms(sps)
    poly = expand(t)
    terms = list(poly.items())
    data.draw(st.randoms(use_true_random=False)).shuffle(terms)
    e2 = 0
    for mono, coef in terms:
        e2 = e2 + coef * math.prod((syms[n] for n in mono), start=1)
    e1 = build(t, syms)
    note(f"{describe(sps, t)}\nexpanded = {e2}")
    assert e1 == e2, f"{e1} and {e2} are the same polynomial but compare unequal"
    if not is_int(e1):
        assert hash(e1) == hash(e2)


# ---------------------------------------------------------------------------------------------------------
# bounds
# ---------------------------------------------------------------------------------------------------------


def check_bounds_sound(sps, t, e, envs):
    lo, hi = ds.bounds(e)
    assert lo is None or is_int(lo), f"bounds lo {lo!r} is not int/None"
    assert hi is None or is_int(hi), f"bounds hi {hi!r} is not int/None"
    if lo is not None and hi is not None:
        assert lo <= hi, f"bounds({e}) = ({lo}, {hi}) is empty"
    for env in envs:
        v = ref(t, env)
        assert lo is None or lo <= v, f"{describe(sps, t)}\nbounds = ({lo}, {hi}) but e = {v} at {env}"
        assert hi is None or v <= hi, f"{describe(sps, t)}\nbounds = ({lo}, {hi}) but e = {v} at {env}"
    return lo, hi


@cfg(400)
@given(scenarios())
def test_bounds_are_sound(case):
    sps, t = case
    note(describe(sps, t))
    e = build(t, make_syms(sps))
    envs, _ = envs_for(sps)
    check_bounds_sound(sps, t, e, envs)


@cfg(400)
@given(scenarios())
def test_simplify_collapses_what_bounds_pins_to_one_value(case):
    """If the engine itself knows e has a single value k (bounds(e) == (k, k)), e is a constant over the
    admissible assignments and its canonical form is the plain int k (e.g. (s - 1)//s is 0 for s >= 1).
    Symbols declared with a single admissible value are left out: keeping those symbolic is a choice."""
    sps, t = case
    assume(all(len(sp.values()) >= 2 for sp in sps))
    e = build(t, make_syms(sps))
    lo, hi = ds.bounds(e)
    assume(lo is not None and lo == hi)
    note(f"{describe(sps, t)}\ne = {e}, bounds = ({lo}, {hi})")
    s = ds.simplify(e)
    assert is_int(s) and s == lo, f"simplify({e}) = {s!r}, but bounds pins it to {lo}"


@st.composite
def nonneg_polynomials(draw):
    """(specs, tree, exact (lo, hi)) for c + sum(coef * product of symbols) with coef, c >= 0."""
    sps = draw(st.lists(specs(), min_size=1, max_size=3))
    const = draw(st.integers(0, 5))
    monos = draw(
        st.lists(
            st.tuples(st.integers(0, 4), st.lists(st.sampled_from(sps), min_size=1, max_size=3)),
            min_size=1,
            max_size=4,
        )
    )
    t = ("const", const)
    for coef, factors in monos:
        m = ("const", coef)
        for sp in factors:
            m = ("mul", m, ("sym", sp))
        t = ("add", t, m)
    lo = const + sum(c * math.prod(sp.first for sp in f) for c, f in monos)
    unbounded = any(
        c > 0 and any(sp.last is None for sp in f) and all(sp.last is None or sp.last > 0 for sp in f)
        for c, f in monos
    )
    # a zero coefficient or a factor whose largest value is 0 makes the monomial 0 (even with unbounded ones)
    dead = [c == 0 or any(sp.last == 0 for sp in f) for c, f in monos]
    hi = None if unbounded else const + sum(
        0 if z else c * math.prod(sp.last for sp in f) for z, (c, f) in zip(dead, monos)
    )
    return sps, t, (lo, hi)


@cfg(250)
@given(nonneg_polynomials())
def test_bounds_exact_and_prove_complete_for_nonneg_polynomials(case):
    sps, t, (lo, hi) = case
    note(f"{describe(sps, t)}\nexact bounds = ({lo}, {hi})")
    e = build(t, make_syms(sps))
    envs, _ = envs_for(sps)
    assert check_bounds_sound(sps, t, e, envs) == (lo, hi)
    if is_int(e):
        return
    assert ds.prove(e >= lo) is True, f"prove({e} >= {lo})"
    assert ds.prove(e < lo) is False, f"prove({e} < {lo})"
    if hi is not None:
        assert ds.prove(e <= hi) is True, f"prove({e} <= {hi})"
        assert ds.prove(e > hi) is False, f"prove({e} > {hi})"
    if hi is None or hi > lo:  # holds at some assignment, fails at the minimum: only None is sound
        assert ds.prove(e >= lo + 1) is None, f"prove({e} >= {lo + 1})"


# ---------------------------------------------------------------------------------------------------------
# prove and bool(cond)
# ---------------------------------------------------------------------------------------------------------

CMP = {
    "lt": (lambda a, b: a < b, lambda a, b: a < b),
    "le": (lambda a, b: a <= b, lambda a, b: a <= b),
    "gt": (lambda a, b: a > b, lambda a, b: a > b),
    "ge": (lambda a, b: a >= b, lambda a, b: a >= b),
    "eq": (lambda a, b: ds.eq(a, b), lambda a, b: a == b),
    "ne": (lambda a, b: ds.ne(a, b), lambda a, b: a != b),
}


@cfg(600)
@given(st.data())
def test_prove_and_bool_are_sound(data):
    sps, lhs = data.draw(scenarios(depth=3))
    envs, _ = envs_for(sps)
    syms = make_syms(sps)
    a = build(lhs, syms)
    kind = data.draw(st.sampled_from((*CMP, "divides")))
    if kind == "divides":
        k = data.draw(st.sampled_from((1, 2, 3, 4, 8, 16)))
        assume(not is_int(a))
        cond = ds.divides(k, a)
        truth = [ref(lhs, env) % k == 0 for env in envs]
        text = f"ds.divides({k}, {show(lhs)})"
    else:
        if data.draw(st.integers(0, 2)) == 0:
            rhs = data.draw(trees(sps, 2))
        else:  # a constant near the extremes of the left side, where unsound reasoning shows up
            vals = sorted({ref(lhs, env) for env in envs})
            anchor = data.draw(st.sampled_from([vals[0], vals[-1], vals[len(vals) // 2]]))
            rhs = ("const", anchor + data.draw(st.integers(-1, 1)))
        b = build(rhs, syms)
        assume(not (is_int(a) and is_int(b)))
        build_cond, py = CMP[kind]
        cond = build_cond(a, b)
        truth = [py(ref(lhs, env), ref(rhs, env)) for env in envs]
        text = f"{kind}({show(lhs)}, {show(rhs)})"
    note("\n".join([*map(repr, sps), f"cond = {text}", f"engine form: {cond}"]))
    got = ds.prove(cond)
    event(f"prove -> {got!r}; truth {'all' if all(truth) else 'none' if not any(truth) else 'mixed'}")
    assert got is True or got is False or got is None, f"prove returned {got!r}"
    if got is True:
        bad = [env for env, ok in zip(envs, truth) if not ok]
        assert not bad, f"prove({text}) is True but it fails at {bad[0]}"
    if got is False:
        good = [env for env, ok in zip(envs, truth) if ok]
        assert not good, f"prove({text}) is False but it holds at {good[0]}"
    if got is None:
        with pytest.raises(ds.ShapeError):
            bool(cond)
    else:
        assert bool(cond) is got, f"bool({text}) disagrees with prove = {got}"


# ---------------------------------------------------------------------------------------------------------
# solve
# ---------------------------------------------------------------------------------------------------------


@st.composite
def linear_observations(draw):
    """Specs, an admissible assignment and one linear form a*x + c per symbol."""
    sps = draw(st.lists(specs(), min_size=1, max_size=3))
    assignment = {sp.name: draw(st.sampled_from(sp.values())) for sp in sps}
    forms = {sp.name: (draw(st.integers(1, 4)), draw(st.integers(-3, 6))) for sp in sps}
    return sps, assignment, forms


def linear_facts(sps, syms, assignment, forms):
    facts = []
    for i, sp in enumerate(sps):
        a, c = forms[sp.name]
        facts.append((a * syms[sp.name] + c, a * assignment[sp.name] + c, f"input{i}.shape[0]"))
    return facts


@cfg(250)
@given(st.data())
def test_solve_recovers_linear_assignment_and_accepts_true_observations(data):
    sps, assignment, forms = data.draw(linear_observations())
    syms = make_syms(sps)
    facts = linear_facts(sps, syms, assignment, forms)
    t = data.draw(trees(sps, 2))
    extra = build(t, syms)
    if not is_int(extra):  # a true, possibly nonlinear observation anywhere in the list must be accepted
        pos = data.draw(st.integers(0, len(facts)))
        facts.insert(pos, (extra, ref(t, assignment), "derived.shape[1]"))
    note(f"{sps}\nfacts = {[(str(e), v, lab) for e, v, lab in facts]}")
    got = ds.solve(facts)
    for name, v in assignment.items():
        assert got.get(name) == v, f"solve gave {got}, expected {assignment}"
        assert is_int(got[name])


@cfg(200)
@given(st.data())
def test_solve_rejects_bad_observations_naming_them(data):
    sps, assignment, forms = data.draw(linear_observations())
    syms = make_syms(sps)
    facts = linear_facts(sps, syms, assignment, forms)
    i = data.draw(st.integers(0, len(sps) - 1))
    sp = sps[i]
    x = syms[sp.name]
    a, c = forms[sp.name]
    kinds = ("below", "above", "not_multiple", "not_linear_image", "disagree", "derived")
    kind = data.draw(st.sampled_from(kinds))
    label = "bad_input.shape[2]"
    others = []
    if kind == "below":
        assume(sp.first > 0)
        v = data.draw(st.integers(sp.first - 3, sp.first - 1))
        bad = (a * x + c, a * v + c, label)
    elif kind == "above":
        assume(sp.last is not None)
        v = data.draw(st.integers(sp.last + 1, sp.last + 3))
        bad = (a * x + c, a * v + c, label)
    elif kind == "not_multiple":
        assume(sp.mult > 1)
        v = data.draw(st.sampled_from(sp.values())) + data.draw(st.integers(1, sp.mult - 1))
        bad = (a * x + c, a * v + c, label)
    elif kind == "not_linear_image":
        assume(a > 1)
        bad = (a * x + c, a * assignment[sp.name] + c + data.draw(st.integers(1, a - 1)), label)
    elif kind == "disagree":
        alt = [v for v in sp.values() if v != assignment[sp.name]]
        assume(alt)
        bad = (x, data.draw(st.sampled_from(alt)), label)
        others = [facts[i][2]]  # the earlier observation it disagrees with
    else:  # a nonlinear observation whose value contradicts the determined symbols
        t = data.draw(trees(sps, 2))
        e = build(t, syms)
        assume(not is_int(e))
        bad = (e, ref(t, assignment) + data.draw(st.sampled_from((-2, -1, 1, 2))), label)
    if kind in ("below", "above", "not_multiple", "not_linear_image"):
        facts[i] = bad  # the only observation of this symbol: the fact it breaks is its declaration
    else:
        facts.append(bad)
    note(f"{sps}\nassignment = {assignment}\nfacts = {[(str(e), v, lab) for e, v, lab in facts]}")
    with pytest.raises(ds.ConstraintViolation) as info:
        ds.solve(facts)
    msg = str(info.value)
    note(f"message: {msg}")
    assert label in msg, f"message does not name the observation {label!r}: {msg}"
    assert str(bad[1]) in msg, f"message does not give the observed value {bad[1]}: {msg}"
    for other in others:
        assert other in msg, f"message does not name the disagreeing observation {other!r}: {msg}"
