"""Bucket plans: one bound plan per bucket of keys, moved to each new key of the bucket in place.

Why: a plan is bound per key (plan.py), in Python, ~200 us for a small decoder step and ~1.3 ms for GPT-2's,
against ~30-100 us of kernels; a decode loop meets a new key (past length) at every token, so its first
generation ran at 0.2x onnxruntime, and a generation longer than the plan cache re-bound every token.

A bucket plan is laid out once for the largest key of its bucket (`bucket_layout`), so every
key of the bucket whose buffers fit has the same addresses. Moving it to another key (`rekey`) then touches only
what the key changes: the kernels' one key table is written in place; a native step is bound again only when its
buffers' shapes or its per-key inputs changed (a Concat of the past and the new token), into the same program
words; per-key values equal to the last key's stay the same arrays; the inputs' and outputs' views and the
in-place words are made for the key (searched again only when an address in an in-place slot moved). A step
whose rule has `retable` (Concat, Expand; a Gather of per-key indices, which it range-checks) gets its tables'
words from shapes and addresses alone, without views or a binder. Anything a step cannot redo in place (another
number or kind of calls) gives up: the caller drops the bucket plan and binds a new one at the key.

Soundness rests on one fact: a binder's calls are a function of its node, its buffers (address, shape,
strides) and the contents of its constant and per-key inputs; a step whose buffers and inputs are the same
arrays at the same addresses keeps its calls.
"""

from __future__ import annotations

import ctypes
import math
import operator
import struct
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from dynshape.codegen import program
from dynshape.codegen.keep import Keep, TableRef
from dynshape.codegen.lowering import NativeCall, RetableRequest
from dynshape.passes.symbolic import value_items_py
from dynshape.runtime.build import KernelStep
from dynshape.runtime.lean_io import make_lean_io
from dynshape.runtime.per_key import shape_py
from dynshape.runtime.plan import BoundPlan, Planner, fresh_outputs, scratch_for
from dynshape.runtime.pointers import address
from dynshape.runtime.programs import native_words, patch
from dynshape.sym import Expr, bounds
from dynshape.sym.pysource import compile_key_function, key_names, to_py
from dynshape.sym.trace import traced, untraced

BUCKETS_PER_ARENA = 16  # bucket plans kept per arena (oldest dropped first)
OCTAVE_SLACK = 4 << 20  # bytes a bucket plan laid out for a whole octave may hold beyond the key's own layout
GROWTH_SPAN = 3  # octaves beyond its own a growing symbol's bucket may span, within the same slack


def bucket_of(key: tuple, his: tuple = (), fine: int = 2, ahead: tuple = (), span: int = 0) -> tuple:
    """The largest key of `key`'s bucket: each symbol rounded up to the end of its octave (`fine` 0: 64..127) or of
    its quarter octave (`fine` 2: 64..79, 80..95, ...; below 8 exact), and no further than its declared bound
    (`his`, None: unbounded). A symbol whose `ahead` is 1 takes the bucket of its next value (never below this
    one), and `span` octaves more: see `bucket_layout`."""
    out = []
    for k, v in enumerate(key):
        v = int(v)
        grows = ahead[k] if k < len(ahead) else 0
        u = v + grows
        e = max(0, u.bit_length() - 1 - fine)
        top = max(v, ((((u >> e) + 1) << e) << (span if grows else 0)) - 1)
        hi = his[k] if k < len(his) else None
        out.append(top if hi is None else max(v, min(top, int(hi))))
    return tuple(out)


def bucket_layout(pl: Planner, key: tuple, shapes: dict, his: tuple, last: tuple | None = None) -> tuple | None:
    """(largest key, offsets, arena bytes, bytes per buffer) of a new bucket for `key`: its octave where that
    layout holds at most 25% (or OCTAVE_SLACK) more than the key's own, else its quarter octave (a decode loop
    makes a bucket plan every octave of past lengths, not every 16 tokens, and an image model's buffers, large
    per unit of a symbol, stay within 25%); None where neither's shape arithmetic holds or fits the key.
    Each symbol that grew since `last` (the key the last bucket plan served) takes the bucket of its next value:
    a decode step's two growing symbols one apart (past 31, past_plus_1 32) straddle an octave's end, and the
    bucket of the key itself (past <= 31, past_plus_1 <= 63) held that one key before the next made another plan
    (5 plans bound over GPT-2's first 64 tokens from past 16 instead of 3, ~2 ms each). A growing symbol's bucket
    then spans up to GROWTH_SPAN octaves more while the layout stays within the same slack: a decode loop that has
    shown it grows binds a plan every few octaves, not every octave (GPT-2's step from past 16: one plan for
    32..511, where it bound one at 32, 64, 128 and 256)."""
    own = None
    ahead = () if last is None else tuple(int(v > w) for v, w in zip(key, last))
    for fine in (0, 2):
        top = bucket_of(key, his, fine, ahead)
        try:
            top_shapes, offsets, total = pl.layout(top)
        except Exception:  # noqa: BLE001 - the largest key's shape arithmetic fails: no such bucket
            continue
        if any(shp and min(shp) < 0 for shp in top_shapes.values()):
            continue
        sizes = pl.sizes(top_shapes)
        if not all(n <= sizes[b] for b, n in pl.sizes(shapes).items()):
            continue
        if fine == 0 and top != key:
            own = own or pl.layout(key)[2]
            if total > max(1.25 * own, own + OCTAVE_SLACK):
                continue
            for span in range(1, GROWTH_SPAN + 1) if any(ahead) else ():
                wider = bucket_of(key, his, 0, ahead, span)
                try:
                    w_shapes, w_offsets, w_total = pl.layout(wider)
                except Exception:  # noqa: BLE001 - shape arithmetic that fails further out: keep the last that held
                    break
                if wider == top or any(shp and min(shp) < 0 for shp in w_shapes.values()) \
                        or w_total > max(1.25 * own, own + OCTAVE_SLACK):
                    break
                top, offsets, total, sizes = wider, w_offsets, w_total, pl.sizes(w_shapes)
        return top, offsets, total, sizes
    return None


def holding_bucket(arena: Any, uid: int, pl: Planner, key: tuple, shapes: dict) -> BoundPlan | None:
    """The last made bucket plan of variant `uid` bound to the arena's buffer whose layout holds this key (a decode
    loop's is the last made), or None."""
    for plan in reversed(arena.buckets.values()):
        st = plan.bucket
        if st.slot[0] == uid and st.planner is pl and plan.arena is arena.buf and st.covers(key) \
                and st.fits(pl, key):
            return plan
    return None


@dataclass(slots=True)
class StepRecord:
    """One step of a bucket plan: what it was bound from and where its calls' words lie."""

    step: Any
    calls: list  # the calls it made (NativeCalls with their TableRefs, or Python calls)
    where: list  # per call: (program index, word offset), or its index in the plan's calls (a call of its own)
    keep: Keep | None  # a native step's own tables (rewritten in place when it is bound again), None: a kernel
    syms: frozenset  # the symbols its buffers' shapes depend on
    perkey: frozenset  # its inputs computed per key (symbolic values, per-key steps' outputs)
    shapes: tuple = ()  # its buffers' shapes at the plan's key
    held: Keep | None = None  # what its last binding holds (views' buffers, scratch); its tables live in `keep`
    retable: Any = None  # its rule's `retable` (its tables' words from shapes and addresses), where it applies
    tables: list = field(default_factory=list)  # an int64 view of each table its calls take, for retable
    itemsize: int = 0  # its output's element size, for retable
    in_itemsizes: tuple = ()  # its inputs' element sizes (0: omitted), for retable
    # its retable traced (`BucketState.trace_retables`): (table, word, index in the bucket's traced words) of each
    # word that depends on the key; None: not traced (retable per key, or bind again)
    form: tuple | None = None
    # whether it reads or writes an in-place input's or output's slot (its words may hold the caller's address, so
    # `_restore` must run before they are rewritten); a step that does not keeps them as they are
    placed: bool = True


@dataclass(slots=True)
class BucketState:
    """What a bucket plan needs to move between keys (filled by `Planner.bind(..., bucket=state)`)."""

    slot: tuple  # (variant uid, bucket or "worst")
    top: tuple | None  # the bucket's largest key (None: the layout holds every key)
    offsets: dict
    sizes: dict | None  # each buffer's bytes in the layout (None: the layout holds every key)
    total: int = 0  # the layout's arena bytes
    planner: Any = None  # the Planner that bound it (a variant's bucket planner, or its own: bucket_dispatch.py)
    # the symbolic values it holds in arena slots (Planner.slots): their image, which its first call copies into
    # the slots, and each one's (name, view of the image) (per_key.slot_image)
    slot_image: Any = None
    slot_views: tuple = ()
    key: tuple = ()
    at: dict = field(default_factory=dict)  # every value's address at `key`: one map, a move and a recall write its
    # per-key values' entries in place (the arena's are the layout's, the same at every key of the bucket)
    fixed: dict = field(default_factory=dict)  # per-key values at `key`
    tables: list = field(default_factory=list)  # (TableRef, count, row-stride kernel or None): kernel key tables
    views: list = field(default_factory=list)  # those tables as ctypes int64 arrays, once sealed
    # per table: None (the key alone), or (output, the Concat it is a slice of or None) of its row-stride kernel,
    # whose stride follows from the shapes (`_row_stride`) without a view of the output
    strided: list = field(default_factory=list)
    steps: list = field(default_factory=list)  # StepRecord per bound step
    programs: list = field(default_factory=list)
    int_tables: list = field(default_factory=list)  # the shared keep's int64 tables (the kernels' keys)
    copied: set = field(default_factory=set)
    shapes: dict | None = field(default_factory=dict)  # every value's shape at `key` (None: recalled; the next move
    # makes it again)
    arrays: dict = field(default_factory=dict)  # the views made at `key` (reused where the shape is the same)
    base: int = 0  # the arena's address
    span: tuple | None = None  # (lo, hi): the addresses of the in-place slots, whole (None: find them per key)
    signed: list = field(default_factory=list)  # the values a dim of which may be negative (to refuse by name)
    caps: tuple = ()  # the bytes in the layout of the buffers whose size depends on the symbols (Planner.grows)
    by_symbol: dict = field(default_factory=dict)  # symbol name -> indices in `steps` of those that read it
    by_value: dict = field(default_factory=dict)  # per-key value -> indices in `steps` of those that read it
    words: Any = None  # key -> every traced retable word (`trace_retables`), None: no step has a form
    word_symbols: frozenset = frozenset()  # the symbols those words read
    word_exprs: list = field(default_factory=list)  # those words as expressions (`trace_retables`)
    # per set of changed symbols: the words a move writes when nothing else changes (`_lean_puts`), or None
    puts: dict = field(default_factory=dict)
    # per set of changed symbols: the values whose shapes read one, and one function of the key giving their shapes
    # and the bytes of the growing buffers among them, with those buffers' caps (`shapes_at`)
    parts: dict = field(default_factory=dict)
    # the movable steps' (calls, held, shapes), flat, as the states remember them: None once a move may have bound
    # one again (made anew by the next state remembered; key_states.py)
    movable_snap: tuple | None = None
    # the graph's inputs and outputs, each (name, dtype, offset in the arena): dtype None where its array is not a
    # plain view of the arena (a constant or per-key value, a Concat's columns), offset None for an input the
    # calls do not read (no array)
    io: tuple = ()
    # what the key_states.py memory of this plan needs: [address, bytes, ...] of every buffer of words a move or a
    # call rewrites in place (programs, sealed tables), as ds_scatter_bytes' first arguments (its address, its
    # count) and those bytes in all; the steps a move may rebind; the remembered keys and bytes
    mutable: Any = None
    copy_args: tuple = ()
    mutable_bytes: int = 0
    movable: tuple = ()
    remembered: dict = field(default_factory=dict)
    remembered_bytes: int = 0
    in_a_row: int = 1  # calls in a row at `key` (key_states.OWN_PLAN_IN_A_ROW), the last one's number in `stats`
    last_call: int = -2

    def covers(self, key: tuple) -> bool:
        return self.top is None or all(k <= t for k, t in zip(key, self.top))

    def fits(self, pl: Planner, key: tuple) -> bool:
        """Whether every buffer at this key fits its slot in the layout (one compiled function of the key gives the
        bytes of those whose shapes are symbolic: ~25 us less per new key than the products over their shapes)."""
        if self.sizes is None:
            return True
        return all(map(operator.le, pl.grow_bytes(key), self.caps))

    def shapes_at(self, pl: Planner, key: tuple) -> dict | None:
        """Every value's shape at this key of the bucket, or None where a buffer outgrows its slot in the layout
        (`fits`). From the last key's: only the shapes reading a symbol that changed are computed, with the bytes
        of the growing buffers among them (the others fit as they did). Why: all of GPT-2's step's 100 shapes and
        90 buffer sizes were ~30 us of each token of a first generation, where the past length changes ~30."""
        if self.shapes is None:  # (recalled: a remembered state keeps no shapes)
            return dict(zip(pl.values, pl.shapes(key))) if self.fits(pl, key) else None
        changed = frozenset(name for name, a, b in zip(pl.symbol_names, key, self.key) if a != b)
        part = self.parts.get(changed)
        if part is None:
            part = self.parts[changed] = _shapes_part(pl, self, changed)
        names, fn, caps = part
        made = fn(key)
        n = len(names)
        if self.sizes is not None and not all(map(operator.le, made[n:], caps)):
            return None
        shapes = dict(self.shapes)
        shapes.update(zip(names, made[:n]))
        return shapes

    def record(self, pl: Planner, key: tuple, base: int, shapes: dict, at: dict, fixed: dict, spans: dict,
               calls: list, where: list, programs: list, int_tables: list, copied: set, keeps: list) -> None:
        self.base = base
        self.key, self.at, self.programs, self.int_tables, self.copied = key, at, programs, list(int_tables), copied
        self.shapes = shapes
        types = pl.graph.types
        self.signed = [x for x in pl.values if any(isinstance(d, Expr) and _may_be_negative(d) for d in types[x].shape)]
        self.caps = () if self.sizes is None else tuple(self.sizes[b] for b in pl.grows)
        placed = [*pl.in_place, *pl.out_place]
        if placed and self.sizes is not None:
            self.span = (min(at[x] for x in placed), max(at[x] + self.sizes[x] for x in placed))
        self.fixed = {x: v for x, v in fixed.items() if x not in pl.fixed}
        self.views = [(ctypes.c_int64 * n).from_address(ref.addr) for ref, n, _ in self.tables]  # (kept by the plan)
        self.strided = [None if k is None else (k.outputs[0], getattr(pl.joins.get(k.outputs[0]), "into", None))
                        for _, _, k in self.tables]
        order = sorted(spans.items(), key=lambda kv: kv[1][0])
        slots = set(placed)
        for k, (i, (first, own)) in enumerate(order):
            end = order[k + 1][1][0] if k + 1 < len(order) else len(calls)
            s = pl.build.steps[i]
            names = [x for x in (*s.inputs, *s.outputs) if x and isinstance(x, str) and x not in pl.fixed]
            perkey = frozenset(x for x in names if x in self.fixed)
            syms: set = set()
            for x in names:
                if x in pl.base:
                    jn = pl.joins.get(x)
                    for d in (*pl.graph.types[x].shape, *(pl.graph.types[jn.into].shape if jn else ())):
                        if isinstance(d, Expr):
                            syms |= d.free_symbols
            rec = StepRecord(s, calls[first:end], where[first:end], own, frozenset(syms), perkey,
                             _shapes_of(pl, s, shapes), placed=any(pl.base.get(x) in slots for x in names))
            rule = getattr(s, "native", None)
            if rule is not None and rule.retable is not None and not any(x in pl.joins for x in names) \
                    and all(type(c) is NativeCall and all(type(a) is TableRef for a in c.args) for c in rec.calls):
                rec.retable, rec.itemsize = rule.retable, np.dtype(pl.graph.types[s.outputs[0]].dtype).itemsize
                rec.in_itemsizes = tuple(np.dtype(pl.graph.types[x].dtype).itemsize if x else 0 for x in s.inputs)
                rec.tables = [(ctypes.c_int64 * (a.nbytes // 8)).from_address(a.addr)  # (kept by the plan)
                              for c in rec.calls for a in c.args]
            self.steps.append(rec)
        for k, rec in enumerate(self.steps):
            for name in rec.syms:
                self.by_symbol.setdefault(name, []).append(k)
            for x in rec.perkey:
                self.by_value.setdefault(x, []).append(k)
        self.trace_retables(pl, at)
        plain = {x for x in pl.base if x not in self.fixed and x not in pl.fixed and x not in pl.joins}

        def io(x: str, read: bool) -> tuple:
            if x in plain:
                return x, pl.dtypes[x], at[x] - base
            return x, None, 0 if read else None

        g = pl.graph
        self.io = (*(io(v.name, v.name in pl.base) for v in g.inputs), *(io(v.name, True) for v in g.outputs))
        # (and the image of the symbolic values' slots: a state put back holds its key's values)
        image = () if self.slot_image is None else (self.slot_image,)
        buffers = [b for b in (*programs, *(b for k in keeps for b in k.buffers), *image) if b.nbytes]
        self.mutable = np.array([x for b in buffers for x in (b.ctypes.data, b.nbytes)], np.int64)
        self.copy_args, self.mutable_bytes = (self.mutable.ctypes.data, len(buffers)), sum(b.nbytes for b in buffers)
        # the steps whose calls, held tables or shapes a move may assign (a traced retable's and a kernel's without
        # per-key inputs change words only)
        self.movable = tuple(k for k in sorted({k for ks in (*self.by_symbol.values(), *self.by_value.values())
                                                for k in ks})
                             if self.steps[k].form is None
                             and (type(self.steps[k].step) is not KernelStep or self.steps[k].perkey))

    def trace_retables(self, pl: Planner, at: dict) -> None:
        """Trace each retable whose buffers are all the arena's or constants on the symbolic shapes (sym/trace.py):
        where it is plain arithmetic on them, its words at every key of the bucket are one compiled function of the
        key, and the rekey writes only the words that depend on it (the others are the binder's, checked equal at the
        plan's key, as the traced ones are). Why: a Concat's retable made per key (a request,
        its shapes, its words, a comparison with the table's) was ~8 us a step of a decoder's ~44 us rekey. The
        addresses are the layout's, the same at every key of the bucket; a traced word whose old or new value is an
        address inside the in-place span puts the in-place words back and has the places searched again (`_move`)."""
        types, forms, known = pl.graph.types, [], set(pl.symbol_names)
        env = dict(zip(pl.symbol_names, self.key))
        for rec in self.steps:
            if rec.retable is None or rec.perkey:
                continue
            s = rec.step
            names = [x for x in (*s.inputs, *s.outputs) if x]
            if not all(x in pl.fixed or (x in pl.base and x not in self.fixed) for x in names):
                continue

            def shape(x: str | None) -> tuple | None:
                return None if not x else tuple(traced(d) for d in types[x].shape)

            try:
                words = rec.retable(_retable_request(rec, shape, at, pl.fixed))
                if words is None or len(words) != len(rec.tables) or any(len(w) != len(t)
                                                                          for w, t in zip(words, rec.tables)):
                    continue
                exprs = [[untraced(w) for w in ws] for ws in words]
                if any(isinstance(e, Expr) and not e.free_symbols <= known for es in exprs for e in es) or any(
                        (e if type(e) is int else e.evaluate(env)) != w
                        for es, t in zip(exprs, rec.tables) for e, w in zip(es, t[:])):
                    continue  # a symbol the key lacks, or words other than the binder's at this key
            except Exception:  # noqa: BLE001 - it branches on a dim, or is not plain arithmetic: retable per key
                continue
            varying = [(t, i, e) for t, es in enumerate(exprs) for i, e in enumerate(es) if isinstance(e, Expr)]
            rec.form = tuple((t, i, len(forms) + j) for j, (t, i, _) in enumerate(varying))
            forms += [e for _, _, e in varying]
        self.word_exprs = forms
        if forms:  # only the words that depend on the key (the others stay as the binder wrote them)
            names = key_names(pl.symbol_names)
            self.words = compile_key_function("retable_words", list(pl.symbol_names),
                                              "return [" + ", ".join(to_py(e, names) for e in forms) + "]")
            self.word_symbols = frozenset().union(*(e.free_symbols for e in forms))


def _shapes_part(pl: Planner, st: BucketState, changed: frozenset) -> tuple:
    """BucketState.parts' entry for `changed`: (the values whose shapes read a changed symbol, one function of the
    key giving their shapes and then the bytes of the growing buffers among them, those buffers' caps)."""
    types, names = pl.graph.types, key_names(pl.symbol_names)

    def reads(x: str) -> bool:
        return any(isinstance(d, Expr) and not d.free_symbols.isdisjoint(changed) for d in types[x].shape)

    values = [x for x in pl.values if reads(x)]
    grows = [k for k, b in enumerate(pl.grows) if reads(b)]
    body = [shape_py(types[x].shape, names) for x in values] + [pl.bytes_py(pl.grows[k], names) for k in grows]
    fn = compile_key_function("moved_shapes", list(pl.symbol_names), f"return [{', '.join(body)}]")
    return values, fn, tuple(st.caps[k] for k in grows) if st.caps else ()


def _retable_request(rec: StepRecord, shape: Any, at: dict, values: dict) -> RetableRequest:
    """A step's retable request: its buffers' shapes (`shape(name)`: this key's, or traced), addresses (`at`),
    the entry points of its last binding, and the arrays of its inputs found in `values` (constants, per-key)."""
    s = rec.step
    return RetableRequest(s.node, s.attrs, [shape(x) for x in s.inputs], [shape(o) for o in s.outputs],
                          [at[x] if x else None for x in s.inputs], [at[o] if o else None for o in s.outputs],
                          rec.itemsize, tuple(c.fn for c in rec.calls),
                          [values.get(x) if x else None for x in s.inputs], rec.in_itemsizes)


def _row_stride(shapes: dict, x: str, into: str | None) -> int:
    """KernelStep.key_values' row stride of value x's array (a slice of Concat `into`'s: its rows) from the shapes
    alone, as numpy strides it (a zero dim counts as 1). Why: making x's view to read its strides cost ~3 us per
    row-stride kernel at every move (nine of GPT-2's step's ten key tables)."""
    if len(shapes[x]) < 2:
        return 1
    return max(shapes[into or x][-1], 1)


def _may_be_negative(d: Expr) -> bool:
    lo = bounds(d)[0]
    return lo is None or lo < 0


def _shapes_of(pl: Planner, s: Any, shapes: dict) -> tuple:
    """The shapes of a step's arena buffers (a joined one's whole Concat too): what its binding depends on."""
    out = []
    for x in (*s.inputs, *s.outputs):
        if x and isinstance(x, str) and x in pl.base:
            jn = pl.joins.get(x)
            out.append((shapes[x], shapes[jn.into] if jn is not None else None))
    return tuple(out)


class _GiveUp(Exception):  # noqa: N818 - a verdict: this key needs its own plan
    pass


def rekey(pl: Planner, plan: BoundPlan, key: tuple, shapes: dict) -> bool:
    """Move a bucket plan to `key` in place (its buffers fit the layout: checked by the caller). False: it
    cannot (a step it cannot redo in place); the plan is then unusable and the caller drops it. A refusal of the
    key itself (a negative dim) raises, leaving the plan as it was."""
    st: BucketState = plan.bucket
    if key == st.key:
        return True
    arena = plan.arena
    for x in st.signed:  # refused before anything changes (as bind refuses it)
        if min(shapes[x]) < 0:
            pl.addresses(key, arena.ctypes.data, shapes, st.offsets)  # raises, naming the value
    if st.shapes is None:  # (recalled: a remembered state keeps no shapes)
        st.shapes = dict(zip(pl.values, pl.shapes(st.key)))
    try:
        _move(pl, plan, st, key, shapes, st.at)  # (in place: a move rewrites only its per-key values')
    except Exception:  # noqa: BLE001 - a step that cannot move in place, or a binder failing for this key: the
        return False  # key's own plan's bind names the node
    return True


def _restore(plan: BoundPlan) -> None:
    """The in-place words back on their slots, before anything rewrites a step's words wholesale (a step bound
    again, a table retabled per key) or the places are searched again: no word may keep a caller's address from an
    earlier call that `current` no longer records."""
    for (_, _, slot, _, places), cur in zip(plan.in_place, plan.current or ()):
        if cur != slot:
            patch(places, slot)
    for (_, slot, _, places), cur in zip(plan.out_place, plan.out_current or ()):
        if cur != slot:
            patch(places, slot)
    plan.current = [p[2] for p in plan.in_place]
    plan.out_current = [p[1] for p in plan.out_place]


def _move(pl: Planner, plan: BoundPlan, st: BucketState, key: tuple, shapes: dict, at: dict) -> None:
    arena = plan.arena
    addrs: dict = {}
    changed = {name for name, a, b in zip(pl.symbol_names, key, st.key) if a != b}
    keyed = pl.keyed
    lean = keyed.unchanged(changed)  # every per-key value outside the arena as at the last key: nothing to compute
    puts = None
    if lean:  # (then the words alone change: one compiled function of the key writes them all, `_lean_puts`)
        c = frozenset(changed)
        puts = st.puts.get(c, _UNSET)
        if puts is _UNSET:
            puts = st.puts[c] = _lean_puts(pl, st, c, arena)
    symbolic = pl.build.symbolic  # (only the symbolic values the changed symbols read: the others stay the last key's;
    # none where the lean words hold the slots' values)
    symvals = symbolic.only(key, changed) if symbolic is not None and (puts is None or not puts.slots) else {}
    if lean:  # (read below, never written: the constants' own map where the plan holds no per-key value)
        fixed, per_key_bytes, moved = {**pl.fixed, **st.fixed} if st.fixed else pl.fixed, 0, frozenset()
    else:  # (this key's shapes as the last key's tuples where equal: the states a move that binds steps again
        old = st.shapes  # leaves remembered hold fewer objects; a lean move keeps no shapes of its steps)
        shapes = {x: o if (o := old.get(x)) == shp else shp for x, shp in shapes.items()}
        fixed, per_key_bytes = keyed.values(key, symvals, at, addrs, [], st.fixed, changed)  # kept by st.fixed
        moved = {x for x, v in st.fixed.items() if fixed[x] is not v}  # per-key values that are new arrays
    fixed_addr = pl.fixed_addr
    old_shapes, old_views = st.shapes, st.arrays
    views: dict = {}

    def get(x: str | None) -> Any:
        if not x:
            return None
        if x in fixed:
            return fixed[x]
        v = views.get(x)
        if v is None:
            jn = pl.joins.get(x)
            v = old_views.get(x)
            if v is None or shapes[x] != old_shapes[x] or (jn is not None and shapes[jn.into] != old_shapes[jn.into]):
                v = pl.view(x, arena, st.base, at, shapes, st.offsets, key)
            views[x] = v
            addrs[id(v)] = at[x]
        return v

    for x, v in st.slot_views:  # the image of the symbolic values held in the arena (per_key.slot_image)
        if x in symvals:
            v[...] = symvals[x]

    def addr(a: np.ndarray) -> int:
        return addrs.get(id(a)) or fixed_addr.get(id(a)) or address(a)

    def shape_of(x: str | None) -> tuple | None:
        return None if not x else fixed[x].shape if x in fixed else shapes[x]

    replaced: dict = {}  # index in the plan's calls -> the Python call that replaces it
    restored = False

    def restore() -> None:  # before the first whole rewrite of a placed step's words (`_restore`), once
        nonlocal restored
        if not restored:
            restored = True
            _restore(plan)

    dirty = st.span is None  # whether a word that changed is (or was) an address inside an in-place slot
    if dirty:
        restore()
    todo = set()  # the steps whose buffers' shapes or per-key inputs may have changed
    if puts is not None:
        if _put_words(puts, key, None if dirty else st.span):  # (refused: a word in an in-place slot changes)
            restore()
            dirty = True
            _put_words(puts, key, None)
    else:
        for view, strided in zip(st.views, st.strided):
            view[:] = key if strided is None else (*key, _row_stride(shapes, *strided))
        for name in changed:
            todo.update(st.by_symbol.get(name, ()))
        for x in moved:
            todo.update(st.by_value.get(x, ()))
    traced_words = st.words(key) if todo and st.words is not None and not changed.isdisjoint(st.word_symbols) \
        else None
    if todo:  # (the steps below may assign their calls, tables and shapes)
        st.movable_snap = None
    for k in sorted(todo):
        rec = st.steps[k]
        s = rec.step
        if rec.form is not None:  # its key-dependent words from the compiled function: nothing else changes
            if traced_words is not None:
                tables, span = rec.tables, st.span
                for t, i, j in rec.form:
                    w = traced_words[j]
                    old = tables[t][i]
                    if old != w:
                        if not dirty and (span[0] <= w < span[1] or span[0] <= old < span[1]):
                            restore()  # an address in an in-place slot: the places are searched again
                            dirty = True
                        tables[t][i] = w
            continue
        new_inputs = bool(rec.perkey & moved)
        if type(s) is KernelStep:  # its key table is written above; a new per-key input moves its addresses
            if new_inputs:
                if rec.placed:
                    restore()
                if type(rec.where[0]) is not int:
                    dirty = _write_inputs(st, rec, at) or dirty
                else:  # (a call of its own: made again)
                    dirty = _write(pl, st, rec, [NativeCall(s.entry, (rec.calls[0].args[0],
                                                                      *[at[o] for o in s.outputs],
                                                                      *[at[x] for x in s.inputs]))]) or dirty
            continue
        now = _shapes_of(pl, s, shapes)
        if not new_inputs and now == rec.shapes:
            continue
        if rec.placed:
            restore()  # what follows rewrites the step's words wholesale
        if rec.retable is not None:  # the tables' words from the shapes and addresses alone: no views, no binder
            words = rec.retable(_retable_request(rec, shape_of, at, fixed))
            if words is not None and len(words) == len(rec.tables) and all(
                    len(w) == len(t) for w, t in zip(words, rec.tables)):
                for w, t in zip(words, rec.tables):
                    old_words = t[:]
                    if old_words != w:
                        dirty = dirty or _moves_address(old_words, w, st.span)
                        t[:] = w
                rec.shapes = now
                continue
        own = Keep()
        made = pl.bind_step(s, [get(x) for x in s.inputs], [get(o) for o in s.outputs], own, addr, fixed,
                            scratch_for(arena, own))
        if len(made) != len(rec.calls):
            raise _GiveUp
        same_words = True
        for a, b, w in zip(made, rec.calls, rec.where):
            if type(w) is int:  # a call of its own (Python, or too many arguments for a program): replaced
                if type(a) is NativeCall or type(b) is NativeCall:
                    raise _GiveUp
                plan.calls[w] = replaced[w] = a
                continue
            if type(a) is not NativeCall or a.fn is not b.fn or len(a.args) != len(b.args):
                raise _GiveUp
            for x, y in zip(a.args, b.args):
                if type(x) is TableRef:  # this key's table into the same bytes as the last key's
                    if type(y) is not TableRef or x.nbytes != y.nbytes:
                        raise _GiveUp
                    old = ctypes.string_at(y.addr, y.nbytes)
                    if old != x.data:
                        dirty = dirty or _moves_address(old, x.data, st.span)
                        ctypes.memmove(y.addr, x.data, x.nbytes)
                    x.addr, x.data = y.addr, None
                elif x != y:
                    same_words = False
        own.seal()  # the tables a Python call reads (its NativeCalls' went into the last key's bytes above)
        if not same_words:
            dirty = _write(pl, st, rec, made) or dirty
        rec.calls, rec.held, rec.shapes = made, own, now
    if replaced:  # (a Python call runs as itself: the others' partials stay)
        runs = list(plan.runs)
        for w, a in replaced.items():
            runs[w] = a
        plan.runs = tuple(runs)
    made = None if puts is None or puts.io is None or todo or replaced else \
        puts.io(key, old_views, fixed, {p[0] for p in plan.out_place})
    if made is not None:  # (lean_io.py: the loop below, written out for this bucket and these symbols)
        plan.inputs, plan.outputs, views, plan.want, plan.copy_in, in_bytes, out_bytes, fresh = made
    else:
        arrays = []  # the inputs' and outputs' arrays (inline: ~1 us a view less than `get`)
        for x, dtype, off in st.io:
            if off is None:
                arrays.append(None)
            elif dtype is None:
                arrays.append(get(x))
            else:
                v = views.get(x)
                if v is None:
                    v = old_views.get(x)
                    if v is None or shapes[x] != old_shapes[x]:
                        v = np.ndarray(shapes[x], dtype, buffer=arena, offset=off)
                    views[x] = v
                arrays.append(v)
        n = len(plan.inputs)
        plan.inputs = arrays[:n]
        plan.outputs = [(name, v) for (name, _), v in zip(plan.outputs, arrays[n:])]
    st.key, st.shapes, st.arrays, st.at = key, shapes, views, at
    if moved:  # (else the same arrays: the map stays, shared with the states remembered at earlier keys)
        st.fixed = {x: fixed[x] for x in st.fixed}
    if dirty:  # the in-place words found again (as bind finds them), from their slots
        restore()
        words = st.programs + st.int_tables + [t for rec in st.steps if rec.keep is not None
                                               for t in rec.keep.int_tables]
        plan.in_place, plan.out_place = pl.places(at, shapes, plan.calls, words, st.copied, st.sizes)
        plan.current, plan.out_current = [p[2] for p in plan.in_place], [p[1] for p in plan.out_place]
        if made is not None:  # (the places found may be others: `fresh` follows them)
            fresh = fresh_outputs(plan.outputs, plan.out_place)
    elif made is not None:
        plan.in_place = tuple((k, d, slot, in_bytes[k], places) for k, d, slot, _, places in plan.in_place)
        plan.out_place = tuple((x, slot, out_bytes[x], places) for x, slot, _, places in plan.out_place)
    elif plan.in_place or plan.out_place:  # the same words hold the same addresses: only the sizes change
        dt, names = pl.dtypes, plan.input_names
        plan.in_place = tuple((k, d, slot, math.prod(shapes[names[k]]) * dt[names[k]].itemsize, places)
                              for k, d, slot, _, places in plan.in_place)
        plan.out_place = tuple((x, slot, math.prod(shapes[x]) * dt[x].itemsize, places)
                               for x, slot, _, places in plan.out_place)
    plan.nbytes = per_key_bytes
    if made is not None:
        plan.fresh = fresh
        return
    plan.fresh = fresh_outputs(plan.outputs, plan.out_place)
    plan.views_changed()


_UNSET = object()


class _LeanWords(NamedTuple):
    """`_lean_puts`' words: the compiled function giving them at a key, the buffer it fills, the words' addresses
    (kept alive here), those two buffers' addresses and count, ds_put_words, and whether the slots' image is among
    them (the symbolic values then need not be computed)."""

    fn: Any
    vals: np.ndarray
    dst: np.ndarray
    dst_at: int
    vals_at: int
    n: int
    put: Any
    slots: bool
    io: Any  # lean_io.py's function of the key giving the inputs' and outputs' views and sizes, or None


def _lean_puts(pl: Planner, st: BucketState, changed: frozenset, arena: np.ndarray) -> _LeanWords | None:
    """The words a move changing the symbols in `changed`, and no per-key value, writes: every kernel key table
    (the key, and a row stride from the shapes), the traced words of the steps reading a changed symbol, and the
    symbolic values in the slots' image where every one is int64 (`slots` says so), as one compiled function
    of the key, with each word's address; None where such a move does more (a step reading a changed symbol with
    neither a traced retable nor a kernel's key table: bound again or retabled per key). Why: the tables', the
    traced words' and the slots' loops, an array or a word at a time, were ~40 us of a decode step's move, all of
    it Python; `_put_words` is one compiled function and one C call."""
    todo = sorted({k for name in changed for k in st.by_symbol.get(name, ())})
    names = key_names(pl.symbol_names)
    types = pl.graph.types
    exprs, dst = [], []
    for (ref, count, _), strided in zip(st.tables, st.strided):
        words = [names[x] for x in pl.symbol_names]
        if strided is not None:  # (`_row_stride`, as source)
            x, into = strided
            words.append("1" if len(types[x].shape) < 2 else f"max({to_py(types[into or x].shape[-1], names)}, 1)")
        if len(words) != count:
            return None
        exprs += words
        dst += [ref.addr + 8 * j for j in range(count)]
    for k in todo:
        rec = st.steps[k]
        if rec.form is None:
            if type(rec.step) is KernelStep:  # its key table is above, its addresses stay
                continue
            return None
        for t, i, j in rec.form:
            exprs.append(to_py(st.word_exprs[j], names))
            dst.append(ctypes.addressof(rec.tables[t]) + 8 * i)
    slots = _slot_words(pl, st, names)
    if slots is not None:
        exprs += slots[0]
        dst += slots[1]
    if not exprs:
        return None
    fn = compile_key_function("lean_words", list(pl.symbol_names), "return [" + ", ".join(exprs) + "]")
    dst_array, vals = np.array(dst, np.int64), np.zeros(len(dst), np.int64)
    lib = program.LIBRARY.try_load()
    if lib is None:
        return None
    io = make_lean_io(pl, arena, st.io, len(pl.graph.inputs), frozenset(pl.fixed) | frozenset(st.fixed), changed)
    return _LeanWords(fn, vals, dst_array, dst_array.ctypes.data, vals.ctypes.data, len(dst), lib.ds_put_words,
                      slots is not None, io)


def _slot_words(pl: Planner, st: BucketState, names: dict) -> tuple[list, list] | None:
    """The symbolic values in the slots' image (per_key.slot_image) as words: (each element's expression, its
    address in the image); None unless every one is int64 and inference knows each element as an integer
    expression of the key's symbols (what `symbolic_values` computes them from)."""
    exprs, dst = [], []
    for x, v in st.slot_views:
        items = value_items_py(pl.graph.types.get(x), names)
        if v.dtype != np.int64 or not v.flags.c_contiguous or items is None or len(items) != v.size:
            return None
        at = address(v)
        exprs += items
        dst += [at + 8 * i for i in range(len(items))]
    return exprs, dst


def _put_words(puts: _LeanWords, key: tuple, span: tuple | None) -> bool:
    """Write a lean move's words at `key` (`_lean_puts`); True, writing nothing, where a word that changes holds or
    would hold an address in `span` (the in-place slots': the caller puts their words back, then writes with no
    span)."""
    # (a value past int64 raises OverflowError: the move fails, and the key's own bind refuses it)
    puts.vals[:] = puts.fn(key)
    lo, hi = span if span is not None else (0, 0)
    return bool(puts.put(puts.dst_at, puts.vals_at, puts.n, lo, hi))


def _write(pl: Planner, st: BucketState, rec: StepRecord, made: list) -> bool:
    """A step's new calls into its program words; whether a word that changed is an address in an in-place slot."""
    moved = st.span is None
    for call, (j, off) in zip(made, rec.where):
        words = native_words(call, pl.entry)
        if words is None:
            raise _GiveUp
        prog = st.programs[j]
        if not moved:
            lo, hi = st.span
            moved = any(a != b and (lo <= a < hi or lo <= b < hi)
                        for a, b in zip(prog[off:off + len(words)].tolist(), words))
        prog[off:off + len(words)] = words
    rec.calls = made
    return moved


def _write_inputs(st: BucketState, rec: StepRecord, at: dict) -> bool:
    """A kernel's program words for its per-key inputs' new addresses, in place ([entry, nargs, key table,
    *outputs, *inputs]: its entry, key table and outputs stay, and the words of an input read in place were put
    back on its slot by `_restore` first); whether a word that changed is an address in an in-place slot. Why:
    making the whole call again and comparing its words cost ~3 us a kernel, nine a token on Llama's step (its
    rotary tables are new per-key arrays at every past length). The record's `calls` keep the last binding's
    (a kernel's are read for their key table only)."""
    s = rec.step
    j, off = rec.where[0]
    prog = st.programs[j]
    first = off + 3 + len(s.outputs)
    span = st.span
    moved = span is None
    for i, x in enumerate(s.inputs):
        if x in rec.perkey:
            new = at[x]
            old = int(prog[first + i])
            if new != old:
                if not moved and (span[0] <= new < span[1] or span[0] <= old < span[1]):
                    moved = True
                prog[first + i] = new
    return moved


def _moves_address(old: bytes | list, new: bytes | list, span: tuple | None) -> bool:
    """Whether a table's words that differ between `old` and `new` (bytes or int lists) include an address in
    `span` (lo, hi)."""
    if span is None or len(old) != len(new) or (type(old) is bytes and len(old) % 8):
        return True
    if type(old) is bytes:
        n = len(old) // 8
        old, new = struct.unpack(f"{n}q", old), struct.unpack(f"{n}q", new)
    lo, hi = span
    return any(a != b and (lo <= a < hi or lo <= b < hi) for a, b in zip(old, new))
