"""Brute-force soundness of ConstraintStore: it never loses a real solution.

Random declarations (small ranges) and random facts (equalities and conditions over linear forms,
sums and products of symbols) are fed to a store. Against every assignment of the declared symbols that
satisfies all the facts, the store must
  - not have raised (a contradiction is reported only when there is no solution),
  - keep the assignment admissible for every live symbol's refined range and divisor,
  - resolve every declared symbol to an expression that evaluates to its value there,
  - have only residual facts that hold there.
When the store raises, the message must name where the offending fact came from.
"""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import dynshape as ds

SCALE = float(os.environ.get("DYNSHAPE_HYPOTHESIS_SCALE", "1"))
CFG = settings(
    max_examples=max(1, int(300 * SCALE)),
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
UNBOUNDED_SPAN = 12
_ids = itertools.count()


@st.composite
def decls(draw):
    lo = draw(st.integers(0, 3))
    mult = draw(st.sampled_from((1, 1, 2, 3, 4)))
    first = -(-lo // mult) * mult
    hi = None if draw(st.integers(0, 5)) == 0 else first + draw(st.integers(0, 10))
    return (f"k{next(_ids)}", lo, hi, mult)


def values(decl) -> list[int]:
    _, lo, hi, mult = decl
    first = -(-lo // mult) * mult
    top = hi if hi is not None else first + UNBOUNDED_SPAN
    return list(range(first, top + 1, mult))


@st.composite
def forms(draw, names):
    """A small dimension expression as a tree: ("lin", x, a, c) | ("const", k) | ("sum"|"prod", x, y)."""
    kind = draw(st.sampled_from(("lin", "lin", "lin", "const", "sum", "prod")))
    if kind == "lin":
        return ("lin", draw(st.sampled_from(names)), draw(st.sampled_from((1, 1, 2, 3))), draw(st.integers(-3, 5)))
    if kind == "const":
        return ("const", draw(st.integers(0, 12)))
    return (kind, draw(st.sampled_from(names)), draw(st.sampled_from(names)))


def build(f, syms):
    if f[0] == "lin":
        return f[2] * syms[f[1]] + f[3]
    if f[0] == "const":
        return f[1]
    a, b = syms[f[1]], syms[f[2]]
    return a + b if f[0] == "sum" else a * b


def value(f, env) -> int:
    if f[0] == "lin":
        return f[2] * env[f[1]] + f[3]
    if f[0] == "const":
        return f[1]
    a, b = env[f[1]], env[f[2]]
    return a + b if f[0] == "sum" else a * b


@st.composite
def facts(draw, names):
    kind = draw(st.sampled_from(("equate", "equate", "ge", "le", "lt", "divides")))
    if kind == "divides":
        return (kind, draw(st.sampled_from((2, 3, 4, 8))), draw(forms(names)))
    a = draw(forms(names))
    b = draw(forms(names))
    if a[0] == "const" and b[0] == "const":
        b = ("lin", names[0], 1, 0)
    return (kind, a, b)


def holds(fact, env) -> bool:
    kind = fact[0]
    if kind == "divides":
        return value(fact[2], env) % fact[1] == 0
    a, b = value(fact[1], env), value(fact[2], env)
    return {"equate": a == b, "ge": a >= b, "le": a <= b, "lt": a < b}[kind]


def apply(store, fact, syms, origin):
    kind = fact[0]
    if kind == "equate":
        return store.equate(build(fact[1], syms), build(fact[2], syms), origin)
    if kind == "divides":
        return store.require(ds.divides(fact[1], build(fact[2], syms)), origin)
    a, b = build(fact[1], syms), build(fact[2], syms)
    cond = {"ge": lambda: a >= b, "le": lambda: a <= b, "lt": lambda: a < b}[kind]()
    return store.require(cond, origin)


@st.composite
def scenarios(draw):
    ds_ = draw(st.lists(decls(), min_size=1, max_size=3))
    names = [d[0] for d in ds_]
    return ds_, draw(st.lists(facts(names), min_size=1, max_size=4))


@CFG
@given(scenarios())
def test_store_never_loses_a_solution(case):
    declarations, fact_list = case
    syms = {name: ds.sym(name, min=lo, max=hi, multiple_of=m) for name, lo, hi, m in declarations}
    names = list(syms)
    note("\n".join(f"{n} = ds.sym({n!r}, min={lo}, max={hi}, multiple_of={m})" for n, lo, hi, m in declarations))
    note("\n".join(map(repr, fact_list)))
    envs = [dict(zip(names, combo)) for combo in itertools.product(*(values(d) for d in declarations))]
    store = ds.ConstraintStore()
    for name in names:
        store.declare(syms[name], f"decl of {name}")
    for i, fact in enumerate(fact_list):
        try:
            apply(store, fact, syms, f"fact #{i}")
        except ds.ShapeError as exc:
            prefix = fact_list[: i + 1]
            sols = [env for env in envs if all(holds(f, env) for f in prefix)]
            assert not sols, f"store raised on fact #{i} but {sols[0]} satisfies every fact so far:\n{exc}"
            assert f"fact #{i}" in str(exc), f"the contradiction message does not name the fact's origin:\n{exc}"
            return
    solutions = [env for env in envs if all(holds(f, env) for f in fact_list)]
    live = dict(store.symbols)
    residual = store.residual_facts()
    for env in solutions:
        for s in live.values():
            v = env[s.name]
            ok = v >= s.lo and (s.hi is None or v <= s.hi) and v % s.mult == 0
            assert ok, f"solution {env} excluded by the refined {s.describe()}"
        for name in names:
            r = store.resolve(syms[name])
            got = r if isinstance(r, int) else r.evaluate(env)
            assert got == env[name], f"resolve({name}) = {r} gives {got} at solution {env}"
        for cond, origin in residual:
            assert cond.evaluate(env), f"residual fact {cond} (from {origin}) fails at solution {env}"


def test_store_merges_through_a_chain_and_reports_every_origin():
    st_ = ds.ConstraintStore()
    a = st_.declare(ds.sym("chain_a", max=64), "input x axis 0")
    b = st_.declare(ds.sym("chain_b"), "input y axis 0")
    c = st_.declare(ds.sym("chain_c", multiple_of=4), "input z axis 1")
    st_.equate(a, b, "Add_1")
    st_.equate(b, c, "Mul_2")
    assert st_.resolve(a) == st_.resolve(b) == st_.resolve(c)
    assert ds.bounds(st_.resolve(a)) == (4, 64)
    assert ds.prove(ds.divides(4, st_.resolve(b))) is True
    with pytest.raises(ds.ShapeError) as info:
        st_.equate(c, 128, "Reshape_3")
    msg = str(info.value)
    for origin in ("input x axis 0", "Reshape_3"):
        assert origin in msg, f"{origin!r} missing from:\n{msg}"


def test_store_multiple_of_clash_lists_both_facts():
    st_ = ds.ConstraintStore()
    H = st_.declare(ds.sym("clash_H", multiple_of=32), "input image axis 2")
    with pytest.raises(ds.ShapeError) as info:
        st_.equate(H, 100, "Concat_7")
    msg = str(info.value)
    assert "input image axis 2" in msg and "Concat_7" in msg and "100" in msg and "32" in msg


def test_store_detects_contradiction_with_a_derived_range():
    """n <= 20 and n == 2*m leave the fact 2*m <= 20; binding m = 11 then contradicts it (n would be 22)."""
    st_ = ds.ConstraintStore()
    n = st_.declare(ds.sym("lin_n", max=20), "input a axis 0")
    m = st_.declare(ds.sym("lin_m"), "input b axis 0")
    st_.equate(n, 2 * m, "Concat_1")
    with pytest.raises(ds.ShapeError) as info:
        st_.equate(m, 11, "Slice_2")
    assert "Slice_2" in str(info.value) and "input a axis 0" in str(info.value)
