"""String ops: StringNormalizer, StringSplit, StringConcat, RegexFullMatch, and TfIdfVectorizer.

Strings are numpy object arrays of `str`. Sizes that depend on the text (words left after stop-word removal,
the most substrings of any element) are fresh dims. RegexFullMatch uses Python's `re`, which agrees with RE2
on the syntax both accept; RE2-only constructs are reported at load time as an invalid pattern.
"""

from __future__ import annotations

import re

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType
from dynshape.ops.dims import dmax
from dynshape.ops.dtypes import STRING

I64 = np.dtype(np.int64)
F32 = np.dtype(np.float32)


def _strings(values: list, shape: tuple) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(shape)


def _require_strings(ctx: InferCtx, t: TensorType, what: str) -> None:
    if t.dtype != STRING:
        ctx.error(f"{what} must be a string tensor, got {t.dtype}")


# ---------------------------------------------------------------------------------------------------------
# StringNormalizer
# ---------------------------------------------------------------------------------------------------------
def _case(s: str, action: str) -> str:
    return s.lower() if action == "LOWER" else s.upper() if action == "UPPER" else s


def _string_normalizer_ref(inputs: list, attrs: dict) -> list:
    """Drop stop words (case-insensitively unless is_case_sensitive), then change case. Only [C] and [1, C]
    inputs are allowed; when every word is dropped the output is one empty string ([1] or [1, 1])."""
    x = inputs[0]
    action = attrs.get("case_change_action", "NONE")
    stops = attrs.get("stopwords") or []
    sensitive = bool(attrs.get("is_case_sensitive", 0))
    stopset = set(stops) if sensitive else {w.lower() for w in stops}
    words = [str(w) for w in x.reshape(-1)]
    kept = [w for w in words if (w if sensitive else w.lower()) not in stopset]
    kept = [_case(w, action) for w in kept] or [""]
    return [_strings(kept, (1, len(kept)) if x.ndim == 2 else (len(kept),))]


def _string_normalizer_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    _require_strings(ctx, x, "X")
    if ctx.attr("case_change_action", "NONE") not in ("LOWER", "UPPER", "NONE"):
        ctx.error(f"case_change_action must be LOWER, UPPER or NONE, got {ctx.attr('case_change_action')!r}")
    if x.rank == 2:
        ctx.unify(x.shape[0], 1)
    elif x.rank != 1:
        ctx.error(f"X must be [C] or [1, C], got {x.shape}")
    # without stop words every word stays, but an empty input still gives one empty string
    n = ctx.fresh("normalized_words") if ctx.attr("stopwords") else dmax(x.shape[-1], 1)
    return [TensorType(STRING, (1, n) if x.rank == 2 else (n,))]


register("StringNormalizer", reference=_string_normalizer_ref, infer=_string_normalizer_rule)


# ---------------------------------------------------------------------------------------------------------
# StringSplit / StringConcat / RegexFullMatch
# ---------------------------------------------------------------------------------------------------------
def _string_split_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    delim = attrs.get("delimiter") or None  # unset or "": runs of whitespace
    maxsplit = attrs.get("maxsplit")
    parts = [str(s).split(delim, -1 if maxsplit is None else int(maxsplit)) for s in x.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    flat = [q for p in parts for q in p + [""] * (width - len(p))]
    return [_strings(flat, (*x.shape, width)), np.array([len(p) for p in parts], I64).reshape(x.shape)]


def _string_split_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    _require_strings(ctx, x, "X")
    return [TensorType(STRING, (*x.shape, ctx.fresh("substrings"))), TensorType(I64, x.shape)]


register("StringSplit", reference=_string_split_ref, infer=_string_split_rule)


def _string_concat_ref(inputs: list, attrs: dict) -> list:
    a, b = np.broadcast_arrays(*inputs)
    return [_strings([str(p) + str(q) for p, q in zip(a.reshape(-1), b.reshape(-1))], a.shape)]


def _string_concat_rule(ctx: InferCtx) -> list[TensorType]:
    a, b = ctx.inputs
    _require_strings(ctx, a, "X")
    _require_strings(ctx, b, "Y")
    return [TensorType(STRING, ctx.broadcast(tuple(a.shape), tuple(b.shape)))]


register("StringConcat", reference=_string_concat_ref, infer=_string_concat_rule)


def _regex_ref(inputs: list, attrs: dict) -> list:
    pat = re.compile(attrs["pattern"])
    x = inputs[0]
    return [np.array([pat.fullmatch(str(s)) is not None for s in x.reshape(-1)], bool).reshape(x.shape)]


def _regex_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    _require_strings(ctx, x, "X")
    pattern = ctx.attr("pattern")
    if pattern is None:
        ctx.error("the 'pattern' attribute is required")
    try:
        re.compile(pattern)
    except re.error as e:
        ctx.error(f"invalid pattern {pattern!r}: {e}")
    return [TensorType(np.dtype(bool), x.shape)]


register("RegexFullMatch", reference=_regex_ref, infer=_regex_rule)


# ---------------------------------------------------------------------------------------------------------
# TfIdfVectorizer
# ---------------------------------------------------------------------------------------------------------
def _pool(attrs: dict) -> dict[tuple, int]:
    """n-gram (a tuple of ints or strings) -> its output coordinate. `ngram_counts[i]` is where the
    (i+1)-grams start in the pool; only lengths in [min_gram_length, max_gram_length] are counted."""
    pool = attrs.get("pool_int64s") or attrs.get("pool_strings") or []
    starts = list(attrs["ngram_counts"])
    indexes = list(attrs["ngram_indexes"])
    lo, hi = int(attrs["min_gram_length"]), int(attrs["max_gram_length"])
    out: dict[tuple, int] = {}
    k = 0  # n-gram number across all lengths (ngram_indexes is parallel to it)
    for i, start in enumerate(starts):
        n = i + 1
        end = starts[i + 1] if i + 1 < len(starts) else len(pool)
        for j in range(start, end - n + 1, n):
            if lo <= n <= hi:
                out[tuple(pool[j:j + n])] = indexes[k]
            k += 1
    return out


def _tfidf_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    rows = x.reshape(1, -1) if x.ndim <= 1 else x
    pool = _pool(attrs)
    size = max(attrs["ngram_indexes"]) + 1
    lo, hi = int(attrs["min_gram_length"]), int(attrs["max_gram_length"])
    skips = int(attrs.get("max_skip_count", 0))
    counts = np.zeros((rows.shape[0], size), np.int64)
    for r, row in enumerate(rows):
        items = [v.item() if isinstance(v, np.generic) else v for v in row]
        for step in range(1, skips + 2):
            for n in range(max(lo, 1 if step == 1 else 2), hi + 1):  # a 1-gram is counted once, not per skip
                for start in range(len(items) - (n - 1) * step):
                    coord = pool.get(tuple(items[start:start + (n - 1) * step + 1:step]))
                    if coord is not None:
                        counts[r, coord] += 1
    mode = attrs.get("mode", "TF")
    w = np.asarray(attrs.get("weights") or np.ones(size), np.float64)
    if len(w) < size:
        w = np.concatenate([w, np.ones(size - len(w))])
    y = counts.astype(np.float64)
    if mode == "IDF":
        y = (counts > 0) * w[:size]
    elif mode == "TFIDF":
        y = counts * w[:size]
    y = y.astype(F32)
    return [y.reshape(size) if x.ndim <= 1 else y]


def _tfidf_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    for a in ("ngram_counts", "ngram_indexes", "min_gram_length", "max_gram_length", "mode"):
        if ctx.attr(a) is None:
            ctx.error(f"the {a!r} attribute is required")
    if ctx.attr("mode") not in ("TF", "IDF", "TFIDF"):
        ctx.error(f"mode must be TF, IDF or TFIDF, got {ctx.attr('mode')!r}")
    if x.rank > 2:
        ctx.error(f"X must be [C] or [N, C], got {x.shape}")
    size = max(ctx.attr("ngram_indexes")) + 1
    return [TensorType(F32, (size,) if x.rank <= 1 else (x.shape[0], size))]


register("TfIdfVectorizer", reference=_tfidf_ref, infer=_tfidf_rule)
