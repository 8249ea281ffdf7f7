"""The op table: what the IR's shape inference, the reference executor and the passes need to know about each op.

An `OpDef` bundles, for one ONNX op:
- `infer(ctx) -> list[ValueType]`: the shape and dtype rule over `int | Expr` dims (see `ir.infer.InferCtx`);
- `reference(inputs, attrs) -> list[np.ndarray]`: numpy semantics, the oracle every backend is checked against;
- the properties passes ask about (random, elementwise, a view or a transpose, how it takes a channels-last
  operand, which pool it is), typed and set where the op is registered. They used to be hand-kept sets of names
  in each pass, and an op left out of one (a new activation missing from the layout's elementwise set) silently
  lost an optimisation: a property beside the op's definition is seen when the op is written.

The table lives in the IR because inference and the interpreter look ops up by name; the definitions live
one layer up, in `dynshape.ops` (one module per family, each op's rule beside its reference), and fill the
table when that package is imported (the frontends import it). How an op is *compiled* is not here: each
lowering is registered beside the kernel that implements it (`dynshape.codegen.lowering`).

Domains: the default ONNX domain is spelt `DEFAULT_DOMAIN` ('') everywhere inside dynshape. The ONNX frontend
writes it so at import (`canonical_domain`), and `Node` normalises whatever a graph built by hand passes, so
a pass asks `is_default_domain(node)` instead of comparing against both spellings.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dynshape.errors import ModelError

if TYPE_CHECKING:
    from dynshape.ir.infer import InferCtx

Reference = Callable[[list, dict], list]
Infer = Callable[["InferCtx"], list[Any]]

DEFAULT_DOMAIN = ""  # ai.onnx, as dynshape spells it after import
_DEFAULT_ALIASES = frozenset({"", "ai.onnx", "onnx"})


def canonical_domain(domain: str) -> str:
    """`DEFAULT_DOMAIN` for every spelling of the default ONNX domain ('', 'ai.onnx', 'onnx'), else `domain`."""
    return DEFAULT_DOMAIN if domain in _DEFAULT_ALIASES else domain


class _HasOp(Protocol):
    op_type: str
    domain: str


def is_default_domain(node: _HasOp) -> bool:
    """Whether `node` is an op of the default ONNX domain (not ai.onnx.ml, com.microsoft, dynshape, ...)."""
    return node.domain == DEFAULT_DOMAIN


class Layout(enum.Enum):
    """How an op takes an operand held channels last (`passes/layout.py`)."""

    CHANNELS_FIRST = "channels_first"  # needs the ONNX order: the layout converts back before the op
    SPATIAL = "spatial"  # runs as dynshape::ChannelsLast(op): a channels-last kernel of its own
    ELEMENTWISE = "elementwise"  # same values on permuted operands: Transposes sink through it
    AXIS = "axis"  # Concat, Split, Softmax: sinks with its `axis` permuted
    REDUCE = "reduce"  # a reduction: sinks with its axes permuted
    ORDER_FREE = "order_free"  # reads every element of input 0 and nothing of their order: reads either layout


class Movement(enum.Enum):
    """Whether an op only moves data, and how (`passes/hoist.py`, the memory plan)."""

    NONE = "none"  # computes values (or moves them in a way no pass relies on)
    VIEW = "view"  # output = the input's buffer reinterpreted: the memory plan makes it a view, no copy
    PERMUTE = "permute"  # a permutation of the axes (Transpose): a copy of unchanged values


class PoolKind(enum.Enum):
    """What a pooling op reduces its window (or the whole map) with; a lowering matches it exhaustively."""

    MAX = "max"
    AVERAGE = "average"
    LP = "lp"


@dataclass(frozen=True)
class OpDef:
    """One op: its rules and the properties passes read (defaults: a plain op that computes new values)."""

    name: str
    reference: Reference
    infer: Infer | None = None
    domain: str = DEFAULT_DOMAIN
    # outputs are not a function of the inputs (random draws; Dropout in training mode): never folded,
    # deduplicated or computed once per shape
    random: bool = False
    # each output element is a function of the inputs' elements at the same (broadcast) index
    elementwise: bool = False
    # Add, Sub, Mul, Div: with a scalar operand, what a product's epilogue applies (passes/hoist.py)
    arithmetic: bool = False
    movement: Movement = Movement.NONE
    layout: Layout = Layout.CHANNELS_FIRST
    # how many leading inputs a layout permutation applies to (the rest are parameters: Clip's bounds, a
    # reduction's axes); None: every input
    permuted_inputs: int | None = None
    pool: PoolKind | None = None
    global_pool: bool = False  # the pool reduces the whole map (GlobalAveragePool), not a window


OPS: dict[tuple[str, str], OpDef] = {}


def register(name: str, *, reference: Reference, infer: Infer | None = None, domain: str = "",
             random: bool = False, elementwise: bool = False, arithmetic: bool = False,
             movement: Movement = Movement.NONE, layout: Layout = Layout.CHANNELS_FIRST,
             permuted_inputs: int | None = None, pool: PoolKind | None = None, global_pool: bool = False) -> OpDef:
    """Define an op; defining the same (domain, name) twice is a programming error."""
    key = (canonical_domain(domain), name)
    if key in OPS:
        raise RuntimeError(f"op {name!r} registered twice")
    if global_pool and pool is None:
        raise RuntimeError(f"op {name!r}: global_pool without a pool kind")
    op = OpDef(name=name, reference=reference, infer=infer, domain=key[0], random=random, elementwise=elementwise,
               arithmetic=arithmetic, movement=movement, layout=layout, permuted_inputs=permuted_inputs, pool=pool,
               global_pool=global_pool)
    OPS[key] = op
    return op


def lookup(name: str, domain: str = "") -> OpDef | None:
    """The op's definition, or None when dynshape does not define it."""
    return OPS.get((canonical_domain(domain), name))


def of(node: _HasOp) -> OpDef | None:
    """`node`'s op definition (None for an op dynshape does not define): what a pass asks for its properties."""
    return OPS.get((canonical_domain(node.domain), node.op_type))


def is_random(node: _HasOp) -> bool:
    """Whether `node`'s outputs are not a function of its inputs (see `OpDef.random`)."""
    op = of(node)
    return op is not None and op.random


def require(name: str, domain: str, where: str) -> OpDef:
    """The op's definition, or a ModelError naming `where` (an empty table means `dynshape.ops` was never
    imported: a graph built by hand must import it, as the frontends do)."""
    op = lookup(name, domain)
    if op is None:
        hint = "" if OPS else " (no op is defined: `import dynshape.ops` first)"
        raise ModelError(f"{where}: op {name!r} is not supported by dynshape{hint}")
    return op
