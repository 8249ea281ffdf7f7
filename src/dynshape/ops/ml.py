"""Classical-ML ops of the ai.onnx.ml domain: LabelEncoder, TreeEnsemble, ArrayFeatureExtractor, Binarizer,
Scaler, Normalizer, Imputer, LinearRegressor, CategoryMapper, OneHotEncoder, FeatureVectorizer.

These are lookup tables and elementwise maps whose parameters live in attributes, so their shape rules are
simple and exact; what needs care is the spec's defaults (LabelEncoder's per-type default value, a tree's
NaN routing, the aggregate over trees that reach no leaf of a target). Map- and dictionary-typed ops (ZipMap,
DictVectorizer, CastMap) have no counterpart in dynshape's tensor IR and stay unsupported, as do the classifiers
(LinearClassifier, SVM*), which the node suite does not exercise.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType
from dynshape.ops.dtypes import STRING

ML = "ai.onnx.ml"
I64, F32 = np.dtype(np.int64), np.dtype(np.float32)


# ---------------------------------------------------------------------------------------------------------
# LabelEncoder
# ---------------------------------------------------------------------------------------------------------
def _attr_array(attrs: dict, kind: str) -> np.ndarray | None:
    """keys_* / values_* as one array: the tensor form, or whichever list attribute is set."""
    if attrs.get(f"{kind}_tensor") is not None:
        return np.asarray(attrs[f"{kind}_tensor"]).reshape(-1)
    for suffix, dtype in (("strings", STRING), ("int64s", I64), ("floats", F32)):
        v = attrs.get(f"{kind}_{suffix}")
        if v is not None:
            out = np.empty(len(v), dtype=dtype) if dtype == STRING else np.asarray(v, dtype=dtype)
            if dtype == STRING:
                out[:] = list(v)
            return out
    return None


def _label_default(attrs: dict, values: np.ndarray) -> Any:
    if attrs.get("default_tensor") is not None:
        return np.asarray(attrs["default_tensor"]).reshape(-1)[0]
    if values.dtype == STRING:
        return attrs.get("default_string", "_Unused")
    if values.dtype.kind == "f":
        return attrs.get("default_float", -0.0)
    return attrs.get("default_int64", -1)


def _key(v: Any) -> Any:
    """A lookup key: NaN keys match NaN inputs (as the spec's float keys do)."""
    if isinstance(v, (float, np.floating)) and np.isnan(v):
        return "nan"
    return v.item() if isinstance(v, np.generic) else v


def _label_encoder_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    keys, values = _attr_array(attrs, "keys"), _attr_array(attrs, "values")
    table = {_key(k): v for k, v in zip(keys, values)}
    default = _label_default(attrs, values)
    flat = [table.get(_key(v), default) for v in x.reshape(-1)]
    out = np.empty(len(flat), dtype=values.dtype) if values.dtype == STRING else np.asarray(flat, values.dtype)
    if values.dtype == STRING:
        out[:] = flat
    return [out.reshape(x.shape)]


def _label_encoder_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    attrs = ctx.node.attrs
    keys, values = _attr_array(attrs, "keys"), _attr_array(attrs, "values")
    if keys is None or values is None:
        ctx.error("LabelEncoder needs one keys_* and one values_* attribute")
    if len(keys) != len(values):
        ctx.error(f"{len(keys)} keys for {len(values)} values")
    return [TensorType(values.dtype, x.shape)]


register("LabelEncoder", reference=_label_encoder_ref, infer=_label_encoder_rule, domain=ML)


# ---------------------------------------------------------------------------------------------------------
# TreeEnsemble (ai.onnx.ml 5)
# ---------------------------------------------------------------------------------------------------------
def _member_sets(attrs: dict, modes: np.ndarray) -> dict[int, set]:
    """BRANCH_MEMBER nodes in order, each with its NaN-delimited run of membership_values."""
    values = [] if attrs.get("membership_values") is None else list(np.asarray(attrs["membership_values"]))
    runs, cur = [], []
    for v in values:
        if np.isnan(v):
            runs.append(set(cur))
            cur = []
        else:
            cur.append(float(v))
    if cur:
        runs.append(set(cur))
    members = [i for i, m in enumerate(modes) if m == 6]
    return {node: (runs[k] if k < len(runs) else set()) for k, node in enumerate(members)}


def _branch(mode: int, x: float, split: float, member: set | None) -> bool:
    if mode == 0:
        return x <= split
    if mode == 1:
        return x < split
    if mode == 2:
        return x >= split
    if mode == 3:
        return x > split
    if mode == 4:
        return x == split
    if mode == 5:
        return x != split
    return x in (member or set())


def _post(y: np.ndarray, post: int) -> np.ndarray:
    if post == 1:  # SOFTMAX
        e = np.exp(y - y.max(axis=1, keepdims=True, initial=-np.inf))
        return e / e.sum(axis=1, keepdims=True)
    if post == 2:  # LOGISTIC
        return 1 / (1 + np.exp(-y))
    if post == 3:  # SOFTMAX_ZERO: zeros stay zero
        e = np.where(y == 0, 0.0, np.exp(y - y.max(axis=1, keepdims=True, initial=-np.inf)))
        s = e.sum(axis=1, keepdims=True)
        return np.where(s == 0, 0.0, e / np.where(s == 0, 1, s))
    if post == 4:  # PROBIT
        return np.sqrt(2) * _erfinv(2 * y - 1)
    return y


def _erfinv(z: np.ndarray) -> np.ndarray:
    """Inverse error function: Giles' single-precision approximation refined by two Newton steps on erf."""
    z = np.asarray(z, np.float64)
    w = -np.log(np.clip((1 - z) * (1 + z), 1e-300, None))
    small = w < 5
    ws, wl = w - 2.5, np.sqrt(w) - 3
    ps = np.polyval([2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                     -0.00125372503, -0.00417768164, 0.246640727, 1.50140941], ws)
    pl = np.polyval([-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                     -0.0076224613, 0.00943887047, 1.00167406, 2.83297682], wl)
    x = np.where(small, ps, pl) * z
    erf = np.vectorize(math.erf, otypes=[np.float64])
    for _ in range(2):
        x = x - (erf(x) - z) / (2 / np.sqrt(np.pi) * np.exp(-x * x))
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(z) >= 1, np.sign(z) * np.inf, x)


def _tree_ensemble_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0].astype(np.float64)
    modes = np.asarray(attrs.get("nodes_modes")).reshape(-1).astype(int)
    feats = attrs["nodes_featureids"]
    splits = np.asarray(attrs["nodes_splits"]).reshape(-1).astype(np.float64)
    tnode, fnode = attrs["nodes_truenodeids"], attrs["nodes_falsenodeids"]
    tleaf, fleaf = attrs["nodes_trueleafs"], attrs["nodes_falseleafs"]
    nan_true = attrs.get("nodes_missing_value_tracks_true") or [0] * len(modes)
    weights = np.asarray(attrs["leaf_weights"]).reshape(-1).astype(np.float64)
    targets = attrs["leaf_targetids"]
    n_targets, roots = int(attrs["n_targets"]), attrs["tree_roots"]
    agg = int(attrs.get("aggregate_function", 1))
    sets = _member_sets(attrs, modes)
    y = np.zeros((x.shape[0], n_targets))
    for b in range(x.shape[0]):
        vals: list[list[float]] = [[] for _ in range(n_targets)]
        for root in roots:
            i, leaf = int(root), None
            while leaf is None:
                v = x[b, feats[i]]
                go = bool(nan_true[i]) if np.isnan(v) else _branch(modes[i], v, splits[i], sets.get(i))
                nxt, is_leaf = (tnode[i], tleaf[i]) if go else (fnode[i], fleaf[i])
                if is_leaf:
                    leaf = nxt
                else:
                    i = nxt
            vals[targets[leaf]].append(weights[leaf])
        for t, vs in enumerate(vals):
            if vs:
                y[b, t] = {0: sum(vs) / len(roots), 1: sum(vs), 2: min(vs), 3: max(vs)}[agg]
    return [_post(y, int(attrs.get("post_transform", 0))).astype(inputs[0].dtype)]


def _tree_ensemble_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    if x.rank != 2:
        ctx.error(f"X must be [batch, features], got {x.shape}")
    for a in ("n_targets", "tree_roots", "nodes_featureids", "leaf_weights", "leaf_targetids"):
        if ctx.attr(a) is None:
            ctx.error(f"the {a!r} attribute is required")
    return [TensorType(x.dtype, (x.shape[0], int(ctx.attr("n_targets"))))]


register("TreeEnsemble", reference=_tree_ensemble_ref, infer=_tree_ensemble_rule, domain=ML)


# ---------------------------------------------------------------------------------------------------------
# small maps
# ---------------------------------------------------------------------------------------------------------
def _array_feature_extractor_ref(inputs: list, attrs: dict) -> list:
    x, idx = inputs
    idx = idx.astype(np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= x.shape[-1]):
        raise ValueError(f"an index is outside the last axis of length {x.shape[-1]}")
    y = np.take(x, idx, axis=-1)
    return [y.reshape(1, -1) if x.ndim == 1 else y]


def _array_feature_extractor_rule(ctx: InferCtx) -> list[TensorType]:
    x, idx = ctx.inputs
    k = 1
    for d in idx.shape:
        k = k * d
    return [TensorType(x.dtype, (1, k) if x.rank == 1 else (*x.shape[:-1], k))]


register("ArrayFeatureExtractor", reference=_array_feature_extractor_ref, infer=_array_feature_extractor_rule,
         domain=ML)


def _same(ctx: InferCtx) -> list[TensorType]:
    return [TensorType(ctx.inputs[0].dtype, ctx.inputs[0].shape)]


register("Binarizer", domain=ML, infer=_same,
         reference=lambda ins, a: [(ins[0] > a.get("threshold", 0.0)).astype(ins[0].dtype)])


def _scaler_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0].astype(np.float64)
    offset = np.asarray(attrs.get("offset", [0.0]), np.float64)
    scale = np.asarray(attrs.get("scale", [1.0]), np.float64)
    return [((x - offset) * scale).astype(F32)]


register("Scaler", reference=_scaler_ref, domain=ML,
         infer=lambda ctx: [TensorType(F32, ctx.inputs[0].shape)])


def _normalizer_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0].astype(np.float64)
    x2 = x if x.ndim == 2 else x.reshape(1, -1)
    norm = attrs.get("norm", "MAX")
    if norm == "MAX":
        d = np.abs(x2).max(axis=1, keepdims=True, initial=0.0)
    elif norm == "L1":
        d = np.abs(x2).sum(axis=1, keepdims=True)
    else:
        d = np.sqrt((x2 * x2).sum(axis=1, keepdims=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.where(d == 0, x2, x2 / np.where(d == 0, 1, d))
    return [y.reshape(x.shape).astype(F32)]


register("Normalizer", reference=_normalizer_ref, domain=ML, infer=lambda ctx: [TensorType(F32, ctx.inputs[0].shape)])


def _imputer_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    if x.dtype.kind == "f":
        fill = np.asarray(attrs.get("imputed_value_floats", [0.0]), x.dtype)
        bad = attrs.get("replaced_value_float", 0.0)
        hit = np.isnan(x) if np.isnan(bad) else x == bad
    else:
        fill = np.asarray(attrs.get("imputed_value_int64s", [0]), x.dtype)
        hit = x == attrs.get("replaced_value_int64", 0)
    return [np.where(hit, np.broadcast_to(fill, x.shape[-1:]) if fill.size > 1 else fill.reshape(()), x)]


register("Imputer", reference=_imputer_ref, domain=ML, infer=_same)


def _linear_regressor_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0].astype(np.float64)
    x2 = x if x.ndim == 2 else x.reshape(1, -1)
    t = int(attrs.get("targets", 1))
    coef = np.asarray(attrs.get("coefficients", []), np.float64).reshape(t, -1)
    icpt = np.asarray(attrs.get("intercepts") or [0.0] * t, np.float64)
    y = x2 @ coef.T + icpt
    if attrs.get("post_transform", "NONE") == "PROBIT":
        y = _post(y, 4)
    return [y.astype(F32)]


def _linear_regressor_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    n = x.shape[0] if x.rank == 2 else 1
    return [TensorType(F32, (n, int(ctx.attr("targets", 1))))]


register("LinearRegressor", reference=_linear_regressor_ref, infer=_linear_regressor_rule, domain=ML)


# ---------------------------------------------------------------------------------------------------------
# category maps and one-hot features
# ---------------------------------------------------------------------------------------------------------
def _category_mapper_ref(inputs: list, attrs: dict) -> list:
    """Strings to ints or ints to strings through the parallel cats_* lists; unknowns get the default."""
    x = inputs[0]
    ints, strs = list(attrs.get("cats_int64s", [])), list(attrs.get("cats_strings", []))
    if x.dtype == STRING:
        table = dict(zip(strs, ints))
        d = attrs.get("default_int64", -1)
        return [np.array([table.get(str(v), d) for v in x.reshape(-1)], I64).reshape(x.shape)]
    table = dict(zip(ints, strs))
    d = attrs.get("default_string", "_Unused")
    out = np.empty(x.size, dtype=object)
    out[:] = [table.get(int(v), d) for v in x.reshape(-1)]
    return [out.reshape(x.shape)]


def _category_mapper_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    if len(ctx.attr("cats_int64s", [])) != len(ctx.attr("cats_strings", [])):
        ctx.error("cats_int64s and cats_strings must have the same length")
    return [TensorType(I64 if x.dtype == STRING else STRING, x.shape)]


register("CategoryMapper", reference=_category_mapper_ref, infer=_category_mapper_rule, domain=ML)


def _one_hot_encoder_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    cats = list(attrs.get("cats_strings") or attrs.get("cats_int64s") or [])
    index = {c: i for i, c in enumerate(cats)}
    flat = [str(v) if x.dtype == STRING else int(v) for v in x.reshape(-1)]
    y = np.zeros((len(flat), len(cats)), F32)
    for r, v in enumerate(flat):
        if v in index:
            y[r, index[v]] = 1
        elif not attrs.get("zeros", 1):
            raise ValueError(f"category {v!r} is not one of the {len(cats)} known ones (zeros=0)")
    return [y.reshape(*x.shape, len(cats))]


def _one_hot_encoder_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    cats = ctx.attr("cats_strings") or ctx.attr("cats_int64s")
    if not cats:
        ctx.error("OneHotEncoder needs cats_strings or cats_int64s")
    return [TensorType(F32, (*x.shape, len(cats)))]


register("OneHotEncoder", reference=_one_hot_encoder_ref, infer=_one_hot_encoder_rule, domain=ML)


def _feature_vectorizer_ref(inputs: list, attrs: dict) -> list:
    """Each input's features, cut or zero-padded to its inputdimensions entry, side by side (float32)."""
    widths = list(attrs["inputdimensions"])
    rows = [x.reshape(x.shape[0], -1) if x.ndim > 1 else x.reshape(1, -1) for x in inputs]
    n = rows[0].shape[0]
    parts = []
    for r, w in zip(rows, widths):
        part = np.zeros((n, w), F32)
        k = min(w, r.shape[1])
        part[:, :k] = r[:, :k]
        parts.append(part)
    return [np.concatenate(parts, axis=1)]


def _feature_vectorizer_rule(ctx: InferCtx) -> list[TensorType]:
    widths = ctx.attr("inputdimensions")
    if widths is None or len(widths) != len(ctx.inputs):
        ctx.error(f"inputdimensions must give one width per input ({len(ctx.inputs)})")
    xs = ctx.inputs
    n = xs[0].shape[0] if xs[0].rank > 1 else 1
    for x in xs[1:]:
        n = ctx.unify(n, x.shape[0] if x.rank > 1 else 1)
    return [TensorType(F32, (n, int(sum(widths))))]


register("FeatureVectorizer", reference=_feature_vectorizer_ref, infer=_feature_vectorizer_rule, domain=ML)
