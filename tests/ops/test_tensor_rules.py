"""Shape rules of the tensor ops: plain ints agree with the numpy references; symbolic chains stay exact."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dynshape as ds
from dynshape.errors import ShapeError
from dynshape.ir import opdef
from dynshape.ir.types import TensorType
from dynshape.ops import dims as T

I64 = np.dtype(np.int64)
F32 = np.dtype(np.float32)
_fresh = itertools.count()


class FakeCtx:
    """The part of `ir.infer.InferCtx` the rules use, recording facts instead of storing them."""

    def __init__(self, op: str, inputs: list, attrs: dict | None = None, opset: int = 21, num_outputs: int = 1):
        self.op_type, self.name, self.inputs, self.opset = op, f"{op}_0", inputs, opset
        self.attrs, self.num_outputs, self.facts = attrs or {}, num_outputs, []

    def attr(self, name, default=None):
        return self.attrs.get(name, default)

    def require(self, cond, fix=None):
        if ds.prove(cond) is False:
            raise ShapeError(f"{self.op_type}: {cond} is false")
        self.facts.append(cond)

    def unify(self, a, b):
        self.require(ds.eq(a, b) if ds.is_expr(a) or ds.is_expr(b) else a == b)
        return a if T.is_static(a) else b

    def broadcast(self, *shapes):
        return ds.broadcast_shapes(*shapes, unify=self.unify)

    def fresh(self, hint):
        return ds.sym(f"{hint}_{next(_fresh)}", min=0)

    def static(self, d, what):
        if not T.is_static(d):
            raise ShapeError(f"{self.op_type}: {what} is {d}, not static")
        return int(d)

    def error(self, msg, fix=None):
        raise ShapeError(f"{self.op_type}: {msg}")


def infer(op, inputs, opset=21, nout=1, **attrs):
    ctx = FakeCtx(op, inputs, attrs, opset, nout)
    return opdef.lookup(op).infer(ctx), ctx


def tt(shape, dtype=F32, value=None):
    return TensorType(np.dtype(dtype), tuple(shape), value)


def const(a, dtype=I64):
    a = np.asarray(a, dtype=dtype)
    return TensorType(a.dtype, a.shape, a)


def symval(items):
    """A 1-D int64 value holding symbolic dims (what Shape produces)."""
    return TensorType(I64, (len(items),), T.make_value(list(items), I64))


# ------------------------------------------------------------------------------------------------
# static shapes: rule vs reference
# ------------------------------------------------------------------------------------------------
rng = np.random.default_rng(0)
X = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)

STATIC_CASES = [
    ("Reshape", [X, np.array([4, -1, 0], np.int64)], {1}, {}),
    ("Reshape", [X, np.array([0, 0, 24], np.int64)], {1}, {}),
    ("Transpose", [X], set(), {"perm": [3, 1, 0, 2]}),
    ("Concat", [X, X[:, :1]], set(), {"axis": 1}),
    ("Slice", [X, np.array([1, -1]), np.array([100, -5]), np.array([3, 2]), np.array([2, -1])], {1, 2, 3, 4}, {}),
    ("Gather", [X, np.array([[0, -1], [1, 2]], np.int64)], {1}, {"axis": 2}),
    ("GatherElements", [X, np.zeros((2, 3, 2, 6), np.int64)], {1}, {"axis": 2}),
    ("GatherND", [X, np.zeros((2, 5, 2), np.int64)], {1}, {"batch_dims": 1}),
    ("ScatterND", [X, np.zeros((5, 2), np.int64), np.ones((5, 4, 6), np.float32)], {1}, {}),
    ("Unsqueeze", [X, np.array([0, -1], np.int64)], {1}, {}),
    ("Squeeze", [X[:1], np.array([0], np.int64)], {1}, {}),
    ("Flatten", [X], set(), {"axis": -1}),
    ("Flatten", [X], set(), {"axis": 4}),
    ("Expand", [X[:, :1], np.array([5, 1, 3, 1, 1], np.int64)], {1}, {}),
    ("Tile", [X, np.array([1, 2, 1, 3], np.int64)], {1}, {}),
    ("Pad", [X, np.array([0, 1, -1, 2, 0, 0, 2, -3], np.int64)], {1}, {"mode": "constant"}),
    ("Pad", [X, np.array([1, 2], np.int64), None, np.array([-1], np.int64)], {1, 3}, {"mode": "reflect"}),
    ("Shape", [X], set(), {"start": 1, "end": -1}),
    ("Size", [X], set(), {}),
    ("ConstantOfShape", [np.array([2, 3], np.int64)], {0}, {"value": np.array([7], np.int32)}),
    ("Range", [np.array(10, np.int64), np.array(-3, np.int64), np.array(-4, np.int64)], {0, 1, 2}, {}),
    ("DepthToSpace", [X.reshape(2, 12, 3, 2)], set(), {"blocksize": 2, "mode": "CRD"}),
    ("SpaceToDepth", [X], set(), {"blocksize": 2}),
    ("Trilu", [X, np.array(1, np.int64)], {1}, {"upper": 0}),
    ("OneHot", [np.array([[1, 2]]), np.array(5.0, np.float32), np.array([0, 1], np.float32)], {1}, {"axis": 1}),
    ("Resize", [X, None, np.array([1, 1, 1.5, 0.5], np.float32)], {2}, {"mode": "linear"}),
    ("Resize", [X, None, None, np.array([7, 2], np.int64)], {3}, {"axes": [3, 2]}),
    (
        "Resize",
        [X, None, None, np.array([9, 9], np.int64)],
        {3},
        {"axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
    ),
    ("Compress", [X, np.array([True, False, True])], {1}, {"axis": 1}),
    ("EyeLike", [X[0, 0]], set(), {"dtype": 7, "k": 1}),
]


@pytest.mark.parametrize("op,arrays,params,attrs", STATIC_CASES, ids=[c[0] for c in STATIC_CASES])
def test_static_rule_matches_reference(op, arrays, params, attrs):
    pairs = [(a, a) for a in arrays]
    inputs = [
        None if a is None else (const(a, a.dtype) if i in params else tt(a.shape, a.dtype))
        for i, a in enumerate(arrays)
    ]
    types, _ = infer(op, inputs, **attrs)
    ref = opdef.lookup(op).reference([a for a, _ in pairs], {**attrs, "_opset": 21, "_num_outputs": 1})
    assert [(t.shape, t.dtype) for t in types] == [(r.shape, r.dtype) for r in ref]


@pytest.mark.parametrize(
    "split,num_outputs,n_out,dim",
    [
        ([1, 2, 3], None, 3, 6),
        (None, 3, 3, 7),
        (None, None, 2, 8),
        (None, 4, 4, 4),
    ],
)
def test_split_static(split, num_outputs, n_out, dim):
    x = np.arange(dim * 2, dtype=np.float32).reshape(2, dim)
    attrs = {"axis": 1} | ({"num_outputs": num_outputs} if num_outputs else {})
    inputs = [tt(x.shape), None if split is None else const(split)]
    types, _ = infer("Split", inputs, 18, n_out, **attrs)
    ref = opdef.lookup("Split").reference(
        [x, None if split is None else np.array(split)], {**attrs, "_opset": 18, "_num_outputs": n_out}
    )
    assert [t.shape for t in types] == [r.shape for r in ref]


def test_static_errors_are_node_named():
    with pytest.raises(ShapeError, match="Reshape"):
        infer("Reshape", [tt((2, 3)), const([4, -1])])
    with pytest.raises(ShapeError, match="Split"):
        infer("Split", [tt((2, 7))], 13, 2, axis=1)
    with pytest.raises(ShapeError, match="Squeeze"):
        infer("Squeeze", [tt((2, 3)), const([0])])


# ------------------------------------------------------------------------------------------------
# value propagation: shape arithmetic stays exact
# ------------------------------------------------------------------------------------------------
def test_exporter_reshape_chain_stays_symbolic():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as torch.onnx emits for multi-head attention."""
    b, s = ds.sym("b"), ds.sym("s")
    x = tt((b, s, 768))
    (shape,), _ = infer("Shape", [x])
    assert list(shape.value) == [b, s, 768]
    (gb,), _ = infer("Gather", [shape, const(0)], axis=0)
    (gs,), _ = infer("Gather", [shape, const(1)], axis=0)
    assert gb.shape == () and gb.value.item() == b
    (ub,), _ = infer("Unsqueeze", [gb, const([0])])
    (us,), _ = infer("Unsqueeze", [gs, const([0])])
    (target,), _ = infer("Concat", [ub, us, const([12]), const([64])], axis=0)
    assert list(target.value) == [b, s, 12, 64]
    (y,), _ = infer("Reshape", [x, target])
    assert y.shape == (b, s, 12, 64)
    (back,), ctx = infer("Reshape", [y, const([0, 0, -1])])
    assert back.shape == (b, s, 768)
    (flat,), ctx = infer("Reshape", [x, symval([b * s, -1])])
    assert flat.shape == (b * s, 768)
    (unflat,), ctx = infer("Reshape", [flat, symval([b, -1, 768])])
    assert unflat.shape == (b, s, 768)


def test_reshape_minus_one_records_divisibility():
    n = ds.sym("n")
    (y,), ctx = infer("Reshape", [tt((n, 6)), const([4, -1])])
    assert y.shape == (4, (6 * n) // 4)
    assert any("divides" in str(f) for f in ctx.facts)
    assert y.shape[1].evaluate({"n": 2}) == 3


def test_reshape_unknown_target_gets_fresh_dims():
    (y,), _ = infer("Reshape", [tt((4, 6)), tt((3,), I64)])
    assert len(y.shape) == 3 and all(ds.is_expr(d) for d in y.shape)


def test_shape_slice_and_size():
    n, m = ds.sym("n"), ds.sym("m")
    (shape,), _ = infer("Shape", [tt((n, 3, m))], start=-2)
    assert list(shape.value) == [3, m]
    (full,), _ = infer("Shape", [tt((n, 3, m))])
    (tail,), _ = infer("Slice", [full, const([1]), const([2**63 - 1])])
    assert tail.shape == (2,) and list(tail.value) == [3, m]
    (size,), _ = infer("Size", [tt((n, 3, m))])
    assert size.value.item() == 3 * n * m


def test_range_constant_of_shape_expand_with_symbolic_values():
    n = ds.sym("n")
    limit = TensorType(I64, (), T.make_value(n, I64, ()))
    (r,), _ = infer("Range", [const(0), limit, const(1)])
    assert r.shape == (n,)
    (r2,), _ = infer("Range", [const(1), limit, const(2)])
    assert r2.shape[0].evaluate({"n": 6}) == len(range(1, 6, 2))
    (r3,), _ = infer("Range", [limit, const(0), const(-3)])
    assert r3.shape[0].evaluate({"n": 7}) == len(range(7, 0, -3))
    (c,), _ = infer("ConstantOfShape", [symval([n, 4])], value=np.array([1], np.int64))
    assert c.shape == (n, 4) and c.dtype == I64
    (e,), _ = infer("Expand", [tt((1, 4)), symval([n, 1])])
    assert e.shape == (n, 4)
    (t,), _ = infer("Tile", [tt((n, 4)), const([3, 1])])
    assert t.shape == (3 * n, 4)


def test_value_propagates_through_movement_ops():
    n = ds.sym("n")
    v = symval([n, 2, n + 1, 5])
    (tr,), _ = infer("Transpose", [TensorType(I64, (2, 2), v.value.reshape(2, 2))])
    assert list(tr.value.reshape(-1)) == [n, n + 1, 2, 5]
    (sq,), _ = infer("Squeeze", [TensorType(I64, (1, 4), v.value.reshape(1, 4)), const([0])])
    assert list(sq.value) == [n, 2, n + 1, 5]
    parts, _ = infer("Split", [v, const([1, 3])], 18, 2)
    assert list(parts[0].value) == [n] and list(parts[1].value) == [2, n + 1, 5]
    (fl,), _ = infer("Flatten", [TensorType(I64, (2, 2), v.value.reshape(2, 2))], axis=0)
    assert fl.shape == (1, 4) and fl.value[0, 2] == n + 1
    (rev,), _ = infer("Slice", [v, const([-1]), const([-(2**63)]), const([0]), const([-1])])
    assert list(rev.value) == [5, n + 1, 2, n]


def test_data_dependent_sizes_are_fresh():
    (nz,), _ = infer("NonZero", [tt((3, 4))])
    assert nz.shape[0] == 2 and ds.is_expr(nz.shape[1])
    outs, _ = infer("Unique", [tt((3, 4))], 21, 4, axis=1)
    assert outs[0].shape[:1] == (3,) and ds.is_expr(outs[0].shape[1]) and outs[2].shape == (4,)
    (c,), _ = infer("Compress", [tt((3, 4)), tt((3,), np.bool_)], axis=0)
    assert ds.is_expr(c.shape[0]) and c.shape[1] == 4


# ------------------------------------------------------------------------------------------------
# Slice over symbolic dims: the length expression is right for every concrete value
# ------------------------------------------------------------------------------------------------
def _py_slice_len(d, s, e, t):
    return len(opdef.lookup("Slice").reference([np.zeros(d), np.array([s]), np.array([e]), None, np.array([t])], {})[0])


index = st.one_of(st.integers(-12, 12), st.sampled_from([2**63 - 1, -(2**63), 2**31 - 1]))


@settings(max_examples=150, deadline=None)
@given(
    s=index, e=index, t=st.sampled_from([-3, -2, -1, 1, 2, 3]), ds_=st.lists(st.integers(0, 11), min_size=3, max_size=3)
)
def test_slice_symbolic_length_evaluates_like_numpy(s, e, t, ds_):
    d = ds.sym("d", min=0)
    (y,), _ = infer("Slice", [tt((d,)), const([s]), const([e]), const([0]), const([t])])
    for v in ds_:
        got = y.shape[0] if T.is_static(y.shape[0]) else y.shape[0].evaluate({"d": v})
        assert got == _py_slice_len(v, s, e, t)


@settings(max_examples=100, deadline=None)
@given(
    off=st.integers(-4, 4),
    k=st.integers(-6, 6),
    t=st.sampled_from([-2, -1, 1, 2]),
    vals=st.lists(st.integers(0, 9), min_size=2, max_size=2),
)
def test_slice_with_symbolic_start_of_unknown_sign(off, k, t, vals):
    """start = n - m + off: its sign is unknown, so the rule must be exact for both signs."""
    n, m, d = ds.sym("n", min=0), ds.sym("m", min=0), ds.sym("d", min=0)
    (y,), _ = infer("Slice", [tt((d,)), symval([n - m + off]), const([k]), const([0]), const([t])])
    for nv, mv in itertools.product(vals, vals):
        for dv in (0, 3, 8):
            env = {"n": nv, "m": mv, "d": dv}
            got = y.shape[0] if T.is_static(y.shape[0]) else y.shape[0].evaluate(env)
            assert got == _py_slice_len(dv, nv - mv + off, k, t)


def test_unknown_parameters_keep_rank_and_what_is_certain():
    n = ds.sym("n")
    (e,), _ = infer("Expand", [tt((n, 1, 3)), tt((4,), I64)])
    assert len(e.shape) == 4 and e.shape[3] == 3 and all(ds.is_expr(d) for d in e.shape[:3])
    (u,), _ = infer("Unsqueeze", [tt((n, 3)), tt((2,), I64)])
    assert len(u.shape) == 4
    (s,), _ = infer("Squeeze", [tt((1, n, 1)), tt((2,), I64)])
    assert len(s.shape) == 1
    (p,), _ = infer("Pad", [tt((n, 3)), tt((2,), I64), None, const([1])])
    assert p.shape[0] == n and ds.is_expr(p.shape[1])
    (sl,), _ = infer("Slice", [tt((n, 3, 4)), tt((1,), I64), tt((1,), I64), const([1])])
    assert sl.shape[0] == n and ds.is_expr(sl.shape[1]) and sl.shape[2] == 4


def test_mod_of_a_dividend_that_may_be_negative_follows_fmod():
    """fmod=0 (numpy's mod, the divisor's sign) is the engine's floor mod for a positive divisor whatever the
    dividend's sign; fmod=1 (C's fmod, the dividend's sign) is not, and stays unknown for a dividend that may be
    negative. Values checked at every h."""
    h = ds.sym("h", min=0, max=40)
    (floor,), _ = infer("Mod", [symval([-(h % 7)]), const([7])])
    (trunc,), _ = infer("Mod", [symval([-(h % 7)]), const([7])], fmod=1)
    assert trunc.value is None
    (e,) = floor.value.tolist()
    for v in range(41):
        assert e.evaluate({"h": v}) == (-(v % 7)) % 7
