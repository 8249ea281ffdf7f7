"""The amount that pads y up to a multiple of c, as exporters write it: `(-(y % c)) % c` (HF Swin's window
padding) or `(c - y % c) % c`. The engine rewrites it to c * ceil(y / c) - y, so the padded size y + it is
c * ceil(y / c), a multiple of c in canonical form (the windows of a padded map then divide its size exactly).
Checked by brute force over every value in range: a rewrite that changes a value is the worst bug the engine can
have."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import dynshape as ds

S, T = ds.sym("s", min=0, max=50), ds.sym("t", min=0, max=50)
POOL = [S, T, S // 4, S + 3, 2 * S - T, (S + T) // 3, S * T, S % 5 + T]


@settings(max_examples=200, deadline=None)
@given(i=st.sampled_from(range(len(POOL))), c=st.integers(1, 16), k=st.integers(-2, 2))
def test_padding_amounts_keep_every_value(i, c, k):
    y = POOL[i]
    forms = {"-(y % c) % c": (-(y % c)) % c, "(c - y % c) % c": (c - y % c) % c,
             "(k*c - y % c) % c": (k * c - y % c) % c}
    padded = y + forms["-(y % c) % c"]
    for sv in range(0, 51, 7):
        for tv in range(0, 51, 5):
            env = {"s": sv, "t": tv}
            yv = y.evaluate(env)
            want = (-(yv % c)) % c
            for text, e in forms.items():
                got = e if isinstance(e, int) else e.evaluate(env)
                assert got == want, (text, y, c, env)
            pv = padded if isinstance(padded, int) else padded.evaluate(env)
            assert pv == yv + want and pv % c == 0
    # a size (every term positive) padded is a multiple of c in canonical form: dividing it by c leaves no floor
    # division behind (for a difference such as 2*s - t only the values are promised)
    if all(coef > 0 for _, coef in y.terms):
        assert (padded // c) * c == padded, (y, c, padded)


def test_a_swin_window_reverse_divides_the_padded_map():
    """(B * (Hp // 7) * (Wp // 7), 7, 7, C) back to (-1, Hp // 7, Wp // 7, 7, 7, C) and (-1, Hp, Wp, C), where Hp
    is H padded to a multiple of 7 as Swin pads it: the -1 is B both times (not a data-dependent dim)."""
    b, h, w = ds.sym("B", min=0), ds.sym("H", min=0), ds.sym("W", min=0)
    hp, wp = h + (-(h % 7)) % 7, w + (-(w % 7)) % 7
    windows = b * (hp // 7) * (wp // 7)
    assert ds.sym.exact_quotient(windows * 49 * 8, (hp // 7) * (wp // 7) * 49 * 8) == b
    assert ds.sym.exact_quotient(windows * 49 * 8, hp * wp * 8) == b
