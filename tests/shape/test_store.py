"""ConstraintStore and broadcasting: merges, refinements, contradictions with provenance."""

import pytest

import dynshape as ds


def test_equality_to_out_of_range_constant_names_both_facts():
    st = ds.ConstraintStore()
    seq = st.declare(ds.sym("seq", max=64), "input 'x' axis 1")
    with pytest.raises(ds.ShapeError) as e:
        st.equate(seq, 128, "node Reshape_3")
    msg = str(e.value)
    assert "seq in [1, 64]" in msg and "input 'x' axis 1" in msg
    assert "seq == 128" in msg and "node Reshape_3" in msg


def test_divisibility_clash():
    st = ds.ConstraintStore()
    H = st.declare(ds.sym("H", multiple_of=32), "declared")
    with pytest.raises(ds.ShapeError, match="multiple of 32"):
        st.equate(H, 100, "node Conv_1")


def test_union_merges_ranges_and_divisors():
    st = ds.ConstraintStore()
    n = st.declare(ds.sym("n", max=100, multiple_of=4), "a")
    m = st.declare(ds.sym("m", min=10, multiple_of=6), "b")
    merged = st.equate(n, m, "MatMul_0")
    s = merged.atom()
    assert (s.lo, s.hi, s.mult) == (12, 96, 12)
    assert st.resolve(n) == st.resolve(m)


def test_union_with_empty_intersection_is_a_contradiction():
    st = ds.ConstraintStore()
    n = st.declare(ds.sym("n", max=10), "a")
    m = st.declare(ds.sym("m", min=20), "b")
    with pytest.raises(ds.ShapeError, match="can never hold") as e:
        st.equate(n, m, "Add_2")
    assert "n in [1, 10]" in str(e.value) and "m in [20, inf]" in str(e.value)


def test_derived_dim_binding_and_resolution():
    st = ds.ConstraintStore()
    k = st.declare(ds.sym("k"), "a")
    x = st.declare(ds.any_dim(), "b")
    st.equate(x, 2 * k, "Concat_1")
    assert st.resolve(x + 1) == 2 * k + 1


def test_require_refines_bare_symbol_and_keeps_residuals():
    st = ds.ConstraintStore()
    s = st.declare(ds.sym("s"), "a")
    st.require(ds.divides(8, s), "Reshape_1")
    assert st.resolve(s).atom().mult == 8
    st.require(s <= 512, "Slice_2")
    assert st.resolve(s).atom().hi == 512
    b = st.declare(ds.sym("b"), "c")
    st.require(b * st.resolve(s) <= 4096, "Attention")
    assert [c.text for c, _ in st.residual_facts()] == ["b*s <= 4096"]
    with pytest.raises(ds.ShapeError, match="can never hold"):
        st.require(st.resolve(s) > 1000, "Slice_9")


def test_broadcast_rules():
    n, m = ds.sym("n"), ds.sym("m")
    assert ds.broadcast_shapes((n, 1), (n, 3)) == (n, 3)
    assert ds.broadcast_shapes((n,), (1,)) == (n,)
    with pytest.raises(ds.ShapeError, match="not provably equal"):
        ds.broadcast_shapes((n,), (m,))
    with pytest.raises(ds.ShapeError):
        ds.broadcast_shapes((2,), (3,))
    st = ds.ConstraintStore()
    out = ds.broadcast_shapes((n,), (m,), unify=lambda a, b: st.equate(a, b, "Add_0"))
    assert st.resolve(n) == st.resolve(m) == st.resolve(out[0])


def test_broadcast_never_assumes_a_symbol_is_one():
    n = ds.sym("n", min=1, max=1)  # provably 1: broadcasts
    assert ds.broadcast_shapes((n,), (5,)) == (5,)
    k = ds.sym("k", min=1, max=8)  # could be 1 at run time, but is not assumed so
    with pytest.raises(ds.ShapeError):
        ds.broadcast_shapes((k,), (5,))


def test_a_dim_meets_its_clamp_at_zero():
    """e and max(0, e) are the same dim of two existing tensors (a dim is >= 0): no check, no broadcast."""
    from dynshape.passes.values import broadcast_pattern
    from dynshape.sym import max_

    n = ds.sym("n", min=0)
    e = n // 5 - 1  # negative for n < 5: max(0, e) does not simplify away
    clamped = max_(0, e)
    assert clamped != e
    assert ds.broadcast_shapes((e, 3), (clamped, 3)) == (e, 3)
    assert ds.broadcast_shapes((clamped, 3), (e, 1)) == (e, 3)
    assert broadcast_pattern((clamped, 3), (e, 3)) == (True, True)
    with pytest.raises(ds.ShapeError):
        ds.broadcast_shapes((e,), (max_(0, n // 5 - 2),))  # another expression: still not provably equal
