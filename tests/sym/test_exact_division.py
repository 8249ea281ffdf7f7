"""Floor division of a declared multiple: k*s // c == (k*m // c) * (s // m) when s is a multiple of m and c | k*m.

The canonical form makes H // 16 and 2 * (H // 32) the same expression when H is a multiple of 32, so a stride-2
conv's output and a 2x upsample of the next level agree symbolically. Checked by brute force over every
admissible value (a simplification that changes a value is the worst bug the engine can have)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import dynshape as ds


@settings(max_examples=300, deadline=None)
@given(m=st.sampled_from([1, 2, 3, 4, 8, 16, 32]), k=st.integers(-6, 6), c=st.integers(1, 70), off=st.integers(-40, 40),
       lo=st.integers(0, 5))
def test_division_of_a_declared_multiple_keeps_every_value(m, k, c, off, lo):
    s = ds.sym("s", min=lo, max=lo + 40 * m, multiple_of=m)
    e = (k * s + off) // c
    r = (k * s + off) % c
    for v in range(-(-lo // m) * m, lo + 40 * m + 1, m):
        assert (e if isinstance(e, int) else e.evaluate({"s": v})) == (k * v + off) // c
        assert (r if isinstance(r, int) else r.evaluate({"s": v})) == (k * v + off) % c


def test_equal_quotients_are_one_expression():
    h = ds.sym("H", min=32, max=1536, multiple_of=32)
    assert h // 16 == 2 * (h // 32) and h // 2 == 16 * (h // 32) and (h - 1) // 2 + 1 == h // 2
    assert (h // 32) // 2 == h // 64 and ds.prove(ds.eq(h // 8, 4 * (h // 32)))
    w = ds.sym("W", min=1, max=100)  # no declared multiple: nothing to rewrite
    assert str(w // 16) == "W//16"


_S, _T = ds.sym("s", min=0, max=60), ds.sym("t", min=0, max=60)
_U = ds.sym("u", min=0, max=9)
_ATOMS = [_S, _T, _S // 3, _T // 7, (_S + _T) // 2, _S % 5]


@settings(max_examples=300, deadline=None)
@given(div=st.tuples(st.integers(1, 12) | st.integers(-12, -1), st.lists(st.sampled_from(range(len(_ATOMS))),
                                                                       min_size=1, max_size=3)),
       terms=st.lists(st.tuples(st.integers(-9, 9), st.lists(st.sampled_from(range(len(_ATOMS))), max_size=2)),
                      max_size=4),
       const=st.integers(-5, 5), off=st.integers(-3, 3),
       env=st.tuples(st.integers(0, 60), st.integers(0, 60)))
def test_exact_quotient_divides_only_what_a_monomial_divides(div, terms, const, off, env):
    """exact_quotient(b * q, b) == q for a one-term divisor b and any polynomial q (so (b * q) / b == q at every
    value, b = 0 included: the quotient is a polynomial identity, not a division); b * q + a constant it does not
    take (or one more term b does not divide) gives None, never a wrong quotient."""
    c, idx = div
    b = c
    for i in idx:
        b = b * _ATOMS[i]
    q = const
    for coef, mono in terms:
        m = coef
        for i in mono:
            m = m * _ATOMS[i]
        q = q + m
    a = b * q
    got = ds.sym.exact_quotient(a, b)
    assert got is not None and got == q
    values = {"s": env[0], "t": env[1]}

    def ev(e):
        return e.evaluate(values) if ds.is_expr(e) else e

    assert ev(a) == ev(b) * ev(got)
    if off:  # a constant: no multiple of a symbolic one-term b
        assert ds.sym.exact_quotient(a + off, b) is None
    assert ds.sym.exact_quotient(a + 2 * _U, b) is None  # a term over an atom b lacks
