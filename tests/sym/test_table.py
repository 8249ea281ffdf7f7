"""Table tests of the symbolic layer: named simplifications, proofs, bounds, printing, evaluation, errors.

Each row is checked for the expected answer and, where it is an expression, for agreement with the
original expression at a grid of admissible assignments (so a wrong expectation cannot hide an unsound
rewrite). Rows marked "contract" are the examples the `dynshape.sym` contract names explicitly.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

import dynshape as ds

# name -> (min, max, multiple_of); every symbol of this module is declared exactly once, here.
DECLS = {
    "b": (1, None, 1),
    "s": (1, None, 1),
    "h": (1, None, 1),
    "d": (1, None, 1),
    "c": (1, None, 1),
    "w": (1, None, 1),
    "batch": (1, None, 1),
    "seq": (1, 64, 1),  # a bounded sequence length
    "H": (3, None, 1),  # image height, at least a 3x3 kernel
    "H7": (7, None, 1),
    "s8": (1, None, 8),
    "s2": (1, None, 2),
    "t": (0, 7, 1),  # a small index
    "z": (0, None, 1),  # may be zero
}


@pytest.fixture(scope="module")
def S():
    return SimpleNamespace(
        **{name: ds.sym(name, min=lo, max=hi, multiple_of=m) for name, (lo, hi, m) in DECLS.items()}
    )


def admissible(name: str, count: int = 6) -> list[int]:
    lo, hi, m = DECLS[name]
    first = -(-lo // m) * m
    vals = list(range(first, first + count * m, m))
    return [v for v in vals if hi is None or v <= hi] + ([hi // m * m] if hi is not None else [])


def grid(*exprs) -> list[dict[str, int]]:
    names = sorted(set().union(*(e.free_symbols for e in exprs if not isinstance(e, int))))
    per = 6 if len(names) <= 2 else 3
    return [dict(zip(names, vals)) for vals in itertools.product(*(admissible(n, per) for n in names))]


def val(e, env) -> int:
    return e if isinstance(e, int) else e.evaluate(env)


def same_value_everywhere(a, b):
    for env in grid(a, b):
        assert val(a, env) == val(b, env), f"{a} and {b} differ at {env}: {val(a, env)} vs {val(b, env)}"


# ---------------------------------------------------------------------------------------------------------
# simplify: (id, lambda S: (expression, expected canonical form))
# ---------------------------------------------------------------------------------------------------------

SIMPLIFY = [
    # contract
    ("2b+b", lambda S: (2 * S.b + S.b, 3 * S.b)),
    ("(8*s)//8", lambda S: ((8 * S.s) // 8, S.s)),
    ("s8 % 8", lambda S: (S.s8 % 8, 0)),
    ("(s8//8)*8", lambda S: ((S.s8 // 8) * 8, S.s8)),
    ("min(b, b+1)", lambda S: (ds.min_(S.b, S.b + 1), S.b)),
    ("(b*s)//s", lambda S: ((S.b * S.s) // S.s, S.b)),
    # polynomial canonical form
    ("b - b", lambda S: (S.b - S.b, 0)),
    ("(b + s) - s", lambda S: ((S.b + S.s) - S.s, S.b)),
    ("b*(s*h) = (b*s)*h", lambda S: (S.b * (S.s * S.h), (S.b * S.s) * S.h)),
    ("b*(s+1) = b*s + b", lambda S: (S.b * (S.s + 1), S.b * S.s + S.b)),
    # trivial divisors
    ("s // 1", lambda S: (S.s // 1, S.s)),
    ("s % 1", lambda S: (S.s % 1, 0)),
    ("ceil_div(s, 1)", lambda S: (ds.ceil_div(S.s, 1), S.s)),
    ("s // s", lambda S: (S.s // S.s, 1)),
    ("(2*s) // s", lambda S: ((2 * S.s) // S.s, 2)),
    ("(s - 1)//s = 0", lambda S: ((S.s - 1) // S.s, 0)),
    ("ceil_div(s, s) = 1", lambda S: (ds.ceil_div(S.s, S.s), 1)),
    ("ceil_div(b*s, s) = b", lambda S: (ds.ceil_div(S.b * S.s, S.s), S.b)),
    ("(b*s - 1)//s = b - 1", lambda S: ((S.b * S.s - 1) // S.s, S.b - 1)),
    ("(b*s) % s", lambda S: ((S.b * S.s) % S.s, 0)),
    # floor / mod of linear forms
    ("(4s+2)//2", lambda S: ((4 * S.s + 2) // 2, 2 * S.s + 1)),
    ("(4s+3) % 2", lambda S: ((4 * S.s + 3) % 2, 1)),
    ("(6s+4) % 3", lambda S: ((6 * S.s + 4) % 3, 1)),
    ("(6s) % 3", lambda S: ((6 * S.s) % 3, 0)),
    # divisibility
    ("(s8 + 8)//8 = s8//8 + 1", lambda S: ((S.s8 + 8) // 8, S.s8 // 8 + 1)),
    ("(s8 + 3)//8 = s8//8", lambda S: ((S.s8 + 3) // 8, S.s8 // 8)),
    ("(s8 + 3) % 8", lambda S: ((S.s8 + 3) % 8, 3)),
    ("ceil_div(s8, 8) = s8//8", lambda S: (ds.ceil_div(S.s8, 8), S.s8 // 8)),
    ("(s8 + 7)//8*8 = s8", lambda S: ((S.s8 + 7) // 8 * 8, S.s8)),
    ("(s8*b) % 8", lambda S: ((S.s8 * S.b) % 8, 0)),
    ("(s2*b) % 2", lambda S: ((S.s2 * S.b) % 2, 0)),
    ("(s8//2) % 4", lambda S: ((S.s8 // 2) % 4, 0)),
    ("(s8//4)*4", lambda S: ((S.s8 // 4) * 4, S.s8)),
    # ranges
    ("t % 8 = t", lambda S: (S.t % 8, S.t)),
    ("t // 8 = 0", lambda S: (S.t // 8, 0)),
    ("seq // 65 = 0", lambda S: (S.seq // 65, 0)),
    ("(seq + 63)//64 = 1", lambda S: ((S.seq + 63) // 64, 1)),
    # min / max
    ("max(b, b+1)", lambda S: (ds.max_(S.b, S.b + 1), S.b + 1)),
    ("min(b, b)", lambda S: (ds.min_(S.b, S.b), S.b)),
    ("max(b, 0)", lambda S: (ds.max_(S.b, 0), S.b)),
    ("max(z, 0)", lambda S: (ds.max_(S.z, 0), S.z)),
    ("min(H, 2) with H >= 3", lambda S: (ds.min_(S.H, 2), 2)),
    ("max(H, 3) with H >= 3", lambda S: (ds.max_(S.H, 3), S.H)),
    ("min(t, 8) with t <= 7", lambda S: (ds.min_(S.t, 8), S.t)),
    ("max(seq, 64) with seq <= 64", lambda S: (ds.max_(S.seq, 64), 64)),
    ("min(seq, 64)", lambda S: (ds.min_(S.seq, 64), S.seq)),
    ("min(b, b*s)", lambda S: (ds.min_(S.b, S.b * S.s), S.b)),
    # conv / pool output sizes
    ("conv k3 s1 p1 = H", lambda S: ((S.H + 2 * 1 - 3) // 1 + 1, S.H)),
    ("conv k1 s1 p0 = H", lambda S: ((S.H + 0 - 1) // 1 + 1, S.H)),
    ("conv k3 s2 p1 = (H+1)//2", lambda S: ((S.H + 2 * 1 - 3) // 2 + 1, (S.H + 1) // 2)),
    ("pool k2 s2 = H//2", lambda S: ((S.H - 2) // 2 + 1, S.H // 2)),
    ("ceil_div(H, 2) = (H+1)//2", lambda S: (ds.ceil_div(S.H, 2), (S.H + 1) // 2)),
    # reshape / flatten / attention
    ("flatten (b*c*h*w)//b", lambda S: ((S.b * S.c * S.h * S.w) // S.b, S.c * S.h * S.w)),
    ("reshape -1: (b*s*d)//(b*s)", lambda S: ((S.b * S.s * S.d) // (S.b * S.s), S.d)),
    ("split heads: (b*s*h*d)//(h*d)", lambda S: ((S.b * S.s * S.h * S.d) // (S.h * S.d), S.b * S.s)),
    ("reshape const: (b*s*768)//(b*s*12)", lambda S: ((S.b * S.s * 768) // (S.b * S.s * 12), 64)),
    ("scores numel: (b*h*s*s)//(b*h)", lambda S: ((S.b * S.h * S.s * S.s) // (S.b * S.h), S.s * S.s)),
]


@pytest.mark.parametrize("case", [c for _, c in SIMPLIFY], ids=[i for i, _ in SIMPLIFY])
def test_simplify(S, case):
    expr, expected = case(S)
    got = ds.simplify(expr)
    want = expected if isinstance(expected, int) else ds.simplify(expected)
    same_value_everywhere(expr, got)
    same_value_everywhere(expr, expected)  # guards the table itself
    assert got == want, f"simplify({expr}) = {got}, expected {want}"
    if isinstance(want, int):
        assert isinstance(got, int), f"simplify({expr}) = {got!r} is a constant but not an int"


# ---------------------------------------------------------------------------------------------------------
# prove: (id, lambda S: condition, expected answer)
# ---------------------------------------------------------------------------------------------------------

PROVE = [
    # contract
    ("(b+7)//8*8 >= b", lambda S: (S.b + 7) // 8 * 8 >= S.b, True),
    ("2*s > s", lambda S: 2 * S.s > S.s, True),
    ("s*s >= s", lambda S: S.s * S.s >= S.s, True),
    ("8 | 4*s2", lambda S: ds.divides(8, 4 * S.s2), True),
    ("(H-3)//2 + 1 >= 1", lambda S: (S.H - 3) // 2 + 1 >= 1, True),
    # ranges
    ("b >= 1", lambda S: S.b >= 1, True),
    ("b >= 0", lambda S: S.b >= 0, True),
    ("b < 1", lambda S: S.b < 1, False),
    ("b > b", lambda S: S.b > S.b, False),
    ("b >= b", lambda S: S.b >= S.b, True),
    ("b - 1 >= 0", lambda S: S.b - 1 >= 0, True),
    ("seq <= 64", lambda S: S.seq <= 64, True),
    ("seq <= 63", lambda S: S.seq <= 63, None),
    ("seq > 64", lambda S: S.seq > 64, False),
    ("seq == 128", lambda S: ds.eq(S.seq, 128), False),
    ("2*seq <= 128", lambda S: 2 * S.seq <= 128, True),
    ("t < 8", lambda S: S.t < 8, True),
    ("t >= 0", lambda S: S.t >= 0, True),
    ("t == 8", lambda S: ds.eq(S.t, 8), False),
    ("b < 10**6 (unbounded)", lambda S: S.b < 10**6, None),
    ("z > 0 (z may be 0)", lambda S: S.z > 0, None),
    # equalities
    ("b == b + 1", lambda S: ds.eq(S.b, S.b + 1), False),
    ("b != b + 1", lambda S: ds.ne(S.b, S.b + 1), True),
    ("2b + b == 3b", lambda S: ds.eq(2 * S.b + S.b, 3 * S.b), True),
    ("b*(s+1) == b*s + b", lambda S: ds.eq(S.b * (S.s + 1), S.b * S.s + S.b), True),
    ("b*h*s*d == (b*s)*(h*d)", lambda S: ds.eq(S.b * S.h * S.s * S.d, (S.b * S.s) * (S.h * S.d)), True),
    ("2b != 2b + 1", lambda S: ds.ne(2 * S.b, 2 * S.b + 1), True),
    ("2b + 1 > 2b", lambda S: 2 * S.b + 1 > 2 * S.b, True),
    ("b*s//s == b", lambda S: ds.eq(S.b * S.s // S.s, S.b), True),
    ("(s8//8)*8 == s8", lambda S: ds.eq((S.s8 // 8) * 8, S.s8), True),
    ("s - (s//8)*8 == s % 8", lambda S: ds.eq(S.s - (S.s // 8) * 8, S.s % 8), True),
    # undecidable
    ("b < s", lambda S: S.b < S.s, None),
    ("b == s", lambda S: ds.eq(S.b, S.s), None),
    ("b != s", lambda S: ds.ne(S.b, S.s), None),
    ("b*s >= b + s", lambda S: S.b * S.s >= S.b + S.s, None),
    ("(s//8)*8 == s", lambda S: ds.eq((S.s // 8) * 8, S.s), None),
    ("s % 2 == 1", lambda S: ds.eq(S.s % 2, 1), None),
    # divisibility
    ("8 | s", lambda S: ds.divides(8, S.s), None),
    ("8 | s8", lambda S: ds.divides(8, S.s8), True),
    ("16 | s8", lambda S: ds.divides(16, S.s8), None),
    ("4 | 2*s2", lambda S: ds.divides(4, 2 * S.s2), True),
    ("2 | 2b + 1", lambda S: ds.divides(2, 2 * S.b + 1), False),
    ("3 | 6b + 3", lambda S: ds.divides(3, 6 * S.b + 3), True),
    ("1 | b", lambda S: ds.divides(1, S.b), True),
    ("64 | 64*h", lambda S: ds.divides(64, 64 * S.h), True),
    # conv / pool / padding
    ("conv k7 s2 p1 >= 1 given H7 >= 7", lambda S: (S.H7 + 2 - 7) // 2 + 1 >= 1, True),
    ("conv k3 s2 p1 <= H", lambda S: (S.H + 2 - 3) // 2 + 1 <= S.H, True),
    ("conv k3 s2 p1 == (H+1)//2", lambda S: ds.eq((S.H + 2 - 3) // 2 + 1, (S.H + 1) // 2), True),
    ("ceil_div(H, 2) == (H+1)//2", lambda S: ds.eq(ds.ceil_div(S.H, 2), (S.H + 1) // 2), True),
    ("pool k2 s2 == H//2", lambda S: ds.eq((S.H - 2) // 2 + 1, S.H // 2), True),
    ("ceil_div(s, 8)*8 >= s", lambda S: ds.ceil_div(S.s, 8) * 8 >= S.s, True),
    ("ceil_div(s, 8)*8 - s < 8", lambda S: ds.ceil_div(S.s, 8) * 8 - S.s < 8, True),
    ("(s+63)//64*64 >= s", lambda S: (S.s + 63) // 64 * 64 >= S.s, True),
    ("(s+63)//64*64 < s + 64", lambda S: (S.s + 63) // 64 * 64 < S.s + 64, True),
    ("s // 2 <= s", lambda S: S.s // 2 <= S.s, True),
    ("s // 2 < s", lambda S: S.s // 2 < S.s, True),
    # mod ranges
    ("s % 8 < 8", lambda S: S.s % 8 < 8, True),
    ("s % 8 >= 0", lambda S: S.s % 8 >= 0, True),
    ("s % 8 >= 8", lambda S: S.s % 8 >= 8, False),
    # min / max / products
    ("min(b, s) <= b", lambda S: ds.min_(S.b, S.s) <= S.b, True),
    ("max(b, s) >= s", lambda S: ds.max_(S.b, S.s) >= S.s, True),
    ("min(b, s) <= max(b, s)", lambda S: ds.min_(S.b, S.s) <= ds.max_(S.b, S.s), True),
    ("b*s >= b", lambda S: S.b * S.s >= S.b, True),
    ("b*s*h >= 1", lambda S: S.b * S.s * S.h >= 1, True),
    ("h*d <= b*s*h*d", lambda S: S.h * S.d <= S.b * S.s * S.h * S.d, True),
]


def _prove_id(row):
    return row[0]


@pytest.mark.parametrize("row", PROVE, ids=_prove_id)
def test_prove(S, row):
    _, make, expected = row
    cond = make(S)
    got = ds.prove(cond)
    assert got is expected, f"prove({cond}) = {got!r}, expected {expected!r}"


@pytest.mark.parametrize("row", [r for r in PROVE if r[2] is not None], ids=_prove_id)
def test_bool_of_decidable_condition(S, row):
    _, make, expected = row
    assert bool(make(S)) is expected


def test_bool_of_undecidable_condition_raises_naming_it(S):
    with pytest.raises(ds.ShapeError) as info:
        bool(S.batch < S.seq)
    assert "batch" in str(info.value) and "seq" in str(info.value)
    with pytest.raises(ds.ShapeError):
        if ds.eq(S.batch, 2 * S.seq):
            pass


def test_prove_of_constant_conditions():
    assert ds.prove(ds.eq(3, 3)) is True
    assert ds.prove(ds.ne(3, 3)) is False
    assert ds.prove(ds.divides(4, 12)) is True
    assert ds.prove(ds.divides(4, 10)) is False


def test_condition_comparisons_with_int_on_the_left(S):
    assert ds.prove(0 < S.b) is True
    assert ds.prove(64 >= S.seq) is True
    assert ds.prove(65 <= S.seq) is False


# ---------------------------------------------------------------------------------------------------------
# bounds
# ---------------------------------------------------------------------------------------------------------

BOUNDS = [
    ("b", lambda S: S.b, (1, None)),
    ("seq", lambda S: S.seq, (1, 64)),
    ("s8 (min rounded up to a multiple)", lambda S: S.s8, (8, None)),
    ("t", lambda S: S.t, (0, 7)),
    ("2*seq + 1", lambda S: 2 * S.seq + 1, (3, 129)),
    ("seq*seq", lambda S: S.seq * S.seq, (1, 4096)),
    ("seq*t + 3*seq", lambda S: S.seq * S.t + 3 * S.seq, (3, 640)),
    ("b*seq", lambda S: S.b * S.seq, (1, None)),
    ("seq - 1", lambda S: S.seq - 1, (0, 63)),
    ("64 - seq", lambda S: 64 - S.seq, (0, 63)),
    ("t - 7", lambda S: S.t - 7, (-7, 0)),
    ("5 - b (unbounded below)", lambda S: 5 - S.b, (None, 4)),
    ("s % 8", lambda S: S.s % 8, (0, 7)),
    ("seq // 8", lambda S: S.seq // 8, (0, 8)),
    ("ceil_div(seq, 8)", lambda S: ds.ceil_div(S.seq, 8), (1, 8)),
    ("min(seq, 10)", lambda S: ds.min_(S.seq, 10), (1, 10)),
    ("max(seq, 10)", lambda S: ds.max_(S.seq, 10), (10, 64)),
    ("(b + 7)//8*8 - b", lambda S: (S.b + 7) // 8 * 8 - S.b, (0, 7)),
    ("constant 5", lambda S: 5, (5, 5)),
]


@pytest.mark.parametrize("row", BOUNDS, ids=_prove_id)
def test_bounds(S, row):
    _, make, expected = row
    e = make(S)
    assert ds.bounds(e) == expected


# ---------------------------------------------------------------------------------------------------------
# constants, hashing, printing, evaluate
# ---------------------------------------------------------------------------------------------------------


def test_constant_expressions_collapse_to_int(S):
    for e, v in [(S.b - S.b, 0), (S.b * 0, 0), ((S.b + 1) - S.b, 1), (2 * (S.s + 3) - 2 * S.s, 6)]:
        assert type(e) is int and e == v
    assert ds.min_(3, 5) == 3 and type(ds.min_(3, 5)) is int
    assert ds.max_(3, 5) == 5 and type(ds.max_(3, 5)) is int
    assert ds.ceil_div(7, 2) == 4 and type(ds.ceil_div(7, 2)) is int
    assert ds.ceil_div(-7, 2) == -3
    assert ds.simplify(5) == 5


def test_expressions_are_hashable_and_equal_by_canonical_form(S):
    e1, e2 = 2 * S.b + S.b, 3 * S.b
    assert (e1 == e2) is True
    assert hash(e1) == hash(e2)
    assert {e1: "x"}[e2] == "x"
    assert (S.b == S.s) is False
    assert (S.b + 1 != S.b) is True


def test_str_forms(S):
    assert str(2 * S.batch + 1) == "2*batch + 1"
    assert str((S.H + 1) // 2) == "(H + 1)//2"
    assert str(S.batch) == "batch"
    text = str(ds.min_(S.batch, S.seq))
    assert "batch" in text and "seq" in text


def test_evaluate_and_free_symbols(S):
    e = 2 * S.batch + S.seq
    assert e.free_symbols == frozenset({"batch", "seq"})
    assert isinstance(e.free_symbols, frozenset)
    assert e.evaluate({"batch": 3, "seq": 5}) == 11
    assert e.evaluate({"batch": 3, "seq": 5, "unrelated": 1}) == 11
    assert ((S.H + 1) // 2).evaluate({"H": 5}) == 3


@pytest.mark.parametrize(
    "make, env, expected",
    [
        (lambda S: (S.b - 5) // 2, {"b": 2}, -2),
        (lambda S: (S.b - 5) % 3, {"b": 1}, 2),
        (lambda S: ds.ceil_div(S.b - 5, 2), {"b": 2}, -1),
        (lambda S: S.b // -2, {"b": 3}, -2),
        (lambda S: S.b % -2, {"b": 3}, -1),
        (lambda S: 7 // S.b, {"b": 2}, 3),
        (lambda S: 7 % S.b, {"b": 4}, 3),
        (lambda S: ds.min_(S.b, S.s) * ds.max_(S.b, S.s), {"b": 2, "s": 5}, 10),
    ],
    ids=["neg//", "neg%", "ceil_div neg", "//-2", "%-2", "7//b", "7%b", "min*max"],
)
def test_evaluate_uses_python_floor_semantics(S, make, env, expected):
    assert make(S).evaluate(env) == expected


def test_evaluate_missing_symbol_raises_naming_it(S):
    with pytest.raises(ds.ShapeError) as info:
        (2 * S.batch + S.seq).evaluate({"batch": 1})
    assert "seq" in str(info.value)


# ---------------------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(min=5, max=4),
        dict(multiple_of=0),
        dict(multiple_of=-8),
        dict(min=1, max=7, multiple_of=8),
        dict(min=-1),
        dict(min=1.5),
        dict(max=2.5),
    ],
    ids=["min>max", "multiple_of=0", "multiple_of<0", "no multiple in range", "negative min", "float min",
         "float max"],
)
def test_bad_symbol_declarations_raise(kwargs):
    with pytest.raises(ds.ShapeError):
        ds.sym("bad", **kwargs)


@pytest.mark.parametrize(
    "make",
    [
        lambda S: S.b // S.z,
        lambda S: S.b % S.z,
        lambda S: ds.ceil_div(S.b, S.z),
        lambda S: S.b // (S.s - 1),
        lambda S: S.b % (S.t - 3),
        lambda S: S.b // 0,
        lambda S: S.b % 0,
        lambda S: ds.ceil_div(S.b, 0),
        lambda S: 6 // S.z,
        lambda S: 0 // S.z,
        lambda S: S.b // (S.seq - S.s),
    ],
    ids=["b//z", "b%z", "ceil_div(b,z)", "b//(s-1)", "b%(t-3)", "b//0", "b%0", "ceil_div(b,0)", "6//z",
         "0//z", "b//(seq-s)"],
)
def test_division_by_possibly_zero_raises(S, make):
    with pytest.raises(ds.ShapeError):
        make(S)


@pytest.mark.parametrize(
    "make",
    [
        lambda S: S.b * 2.5,
        lambda S: 2.5 * S.b,
        lambda S: S.b + 2.5,
        lambda S: 2.5 - S.b,
        lambda S: S.b // 2.5,
        lambda S: S.b % 1.5,
        lambda S: ds.min_(S.b, 0.5),
        lambda S: ds.max_(2.5, S.b),
        lambda S: ds.ceil_div(S.b, 2.5),
        lambda S: S.b < 2.5,
        lambda S: ds.eq(S.b, 2.5),
        lambda S: ds.divides(2.5, S.b),
    ],
    ids=["b*2.5", "2.5*b", "b+2.5", "2.5-b", "b//2.5", "b%1.5", "min", "max", "ceil_div", "<", "eq",
         "divides"],
)
def test_non_integer_constants_raise(S, make):
    with pytest.raises(ds.ShapeError):
        make(S)


# ---------------------------------------------------------------------------------------------------------
# solve
# ---------------------------------------------------------------------------------------------------------


def test_solve_linear(S):
    assert ds.solve([(2 * S.b, 6)]) == {"b": 3}
    assert ds.solve([(2 * S.b + 1, 7, "x.shape[0]")]) == {"b": 3}
    assert ds.solve([(S.b, 2), (S.s, 5)]) == {"b": 2, "s": 5}
    assert ds.solve([(S.s8 - 8, 8)]) == {"s8": 16}
    assert ds.solve([(S.b + S.b, 4)]) == {"b": 2}


def test_solve_checks_derived_observations(S):
    assert ds.solve([(S.H, 5), ((S.H + 1) // 2, 3)]) == {"H": 5}
    assert ds.solve([((S.H + 1) // 2, 3), (S.H, 5)]) == {"H": 5}
    assert ds.solve([(S.b, 2), (S.s, 5), (S.b * S.s, 10)]) == {"b": 2, "s": 5}
    assert ds.solve([(5, 5)]) == {}


def violation(facts) -> str:
    with pytest.raises(ds.ConstraintViolation) as info:
        ds.solve(facts)
    return str(info.value)


def test_solve_errors_name_the_observation(S):
    msg = violation([(2 * S.b, 7, "x.shape[0]")])
    assert "x.shape[0]" in msg and "7" in msg

    msg = violation([(2 * S.batch, 7)])  # no label: the expression itself names the observation
    assert "2*batch" in msg and "7" in msg

    msg = violation([(S.seq, 128, "tokens.shape[1]")])  # range
    assert "tokens.shape[1]" in msg and "128" in msg and "64" in msg

    msg = violation([(S.s8, 12, "x.shape[1]")])  # divisibility
    assert "x.shape[1]" in msg and "12" in msg and "8" in msg

    msg = violation([(S.b, 3, "x.shape[0]"), (S.b, 4, "y.shape[0]")])  # disagreement
    assert "x.shape[0]" in msg and "y.shape[0]" in msg

    msg = violation([(S.H, 5, "img.shape[2]"), ((S.H + 1) // 2, 4, "feat.shape[2]")])  # derived
    assert "feat.shape[2]" in msg and "4" in msg

    msg = violation([(S.t, -1, "idx")])  # negative / below min
    assert "idx" in msg

    msg = violation([(5, 6, "const.shape[0]")])
    assert "const.shape[0]" in msg and "6" in msg


def test_a_disagreement_with_a_constant_dim_names_the_value_once():
    from dynshape.sym import solve, sym

    with pytest.raises(ds.ConstraintViolation) as e:
        solve([(sym("n", 1, 8) * 0 + 1, 2, "input 'x' axis 0")])
    assert str(e.value) == "input 'x' axis 0 is 2, but it must equal 1"
    n = sym("n", 1, 8)
    with pytest.raises(ds.ConstraintViolation, match=r"axis 1 is 5, but it must equal 2\*n = 4 with n = 2"):
        solve([(n, 2, "axis 0"), (2 * n, 5, "axis 1")])
