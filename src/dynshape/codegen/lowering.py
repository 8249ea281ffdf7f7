"""The lowering table: how each op (or fused kind) is compiled, per backend.

Every lowering is registered by an explicit `register_lowering(...)` call beside the code that implements it
(the expression rule beside the C math it prints to, the kernel emitter beside its kernel), so adding a
compiled op touches one place. `dynshape.codegen.lower` imports the modules that hold them, one explicit list.

Backends, in the order the compiler prefers them:
- "expr": a scalar rule (operands -> kernel-IR expression); elementwise ops with one join fused loop nests;
- "kernel": a fused item (see `dynshape.passes.items`) -> a kernel-IR loop nest, printed to C;
- "native": a pre-built C entry point bound to the call's buffers when a plan is bound (BLAS, row kernels);
- "numpy": a faster numpy/BLAS implementation than the reference, for what runs in Python.
What has none of these runs its reference, and `explain` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dynshape.codegen import kir
from dynshape.ir.graph import Graph, Node
from dynshape.ir.opdef import canonical_domain
from dynshape.options import Options

Backend = Literal["expr", "kernel", "native", "numpy"]
BACKENDS: tuple[Backend, ...] = ("expr", "kernel", "native", "numpy")


class Unsupported(Exception):  # noqa: N818 - a verdict, not a failure: the caller falls back and records why
    """A lowering declines a node or item; the message says why (shown by `explain`)."""


@dataclass(frozen=True)
class Lowering:
    op: str
    backend: Backend
    rule: Callable[..., Any]
    domain: str = ""

    @property
    def where(self) -> str:
        return f"{self.rule.__module__}.{getattr(self.rule, '__qualname__', self.rule)}"


_TABLE: dict[tuple[str, str, str], Lowering] = {}


def register_lowering(op: str, backend: Backend, rule: Callable[..., Any], *, domain: str = "") -> Callable[..., Any]:
    """Register `rule` as `op`'s lowering for `backend`; twice for one (op, backend) is a programming error."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; one of {BACKENDS}")
    key = (canonical_domain(domain), op, backend)
    if key in _TABLE:
        raise RuntimeError(f"{op!r} has two {backend!r} lowerings: {_TABLE[key].where} and {rule.__module__}")
    _TABLE[key] = Lowering(op, backend, rule, key[0])
    return rule


def get_lowering(op: str, backend: Backend, domain: str = "") -> Lowering | None:
    return _TABLE.get((canonical_domain(domain), op, backend))


def lowerings(backend: Backend | None = None) -> list[Lowering]:
    """Every registered lowering (for one backend), sorted by op."""
    return sorted((v for v in _TABLE.values() if backend is None or v.backend == backend), key=lambda v: v.op)


# ---- what a kernel lowering receives and returns ---------------------------------------------------------
@dataclass(frozen=True)
class PackedWeight:
    """A constant matrix a kernel reads packed into 32-column panels (`packed_gemm.pack_b`): packed once per
    weight array and shared by every build and variant of the graph."""

    weight: str
    trans: bool = False
    layout: str = "panels"  # panels (pack_b), conv (pack_conv: per group), taps (pack_taps: depthwise),
    # deconv (pack_deconv: a ConvTranspose's per-tap matrices), winograd / winograd4 (pack_winograd: the 16
    # matrices of F(2x2, 3x3), the 36 of F(4x4, 3x3))
    groups: int = 1


KernelArg = str | PackedWeight  # a graph value, or a packed constant matrix


@dataclass(frozen=True)
class LowerCtx:
    """What a kernel lowering may look at: the graph (types, constants), the kernel's name, the call's symbols
    in key order (loop bounds must follow from them) and the options (thread thresholds, math)."""

    graph: Graph
    name: str
    symbols: tuple[str, ...]
    options: Options
    # the values stored as bf16 (codegen/lower/conv_storage.py: convolution outputs that only bf16 convolutions
    # read): a kernel reading or writing one takes it as bf16 (the lowering reports it in `Lowered.storage`)
    bf16_values: frozenset[str] = frozenset()

    @property
    def key_names(self) -> frozenset[str]:
        return frozenset(self.symbols)


@dataclass(frozen=True)
class Storage:
    """Which of a kernel's values it can take stored as bf16 (None: not that one), and which it takes so
    (`applied`: x, y, r), for codegen/lower/conv_storage.py: `x` the input it reads as the rows of its products,
    `y` its one output, `r` the residual its tiles add."""

    x: str | None
    y: str | None
    r: str | None
    applied: tuple[bool, bool, bool] = (False, False, False)


@dataclass(frozen=True)
class Lowered:
    """A kernel and how the runtime binds it: `outputs` are the graph values its output parameters write,
    `inputs` what its input parameters read (graph values or packed weights), in parameter order; `needs` the
    helper libraries its C calls, which must be loaded first (their symbols resolve the kernel's calls)."""

    kernel: kir.Kernel
    outputs: tuple[str, ...]
    inputs: tuple[KernelArg, ...]
    needs: tuple[str, ...] = ()
    row_stride: bool = False  # its one output's rows are key[len(symbols)] elements apart (see ROW_STRIDE)
    # bytes the kernel allocates itself for a call, per thread running it (Winograd's transformed tiles): outside
    # the arena, so the memory report adds them beside it
    scratch_bytes: int = 0
    # how the kernel computes, where a kind has several ways (a conv: Winograd F(4x4) or F(2x2), or both chosen
    # per call; implicit GEMM; depthwise rows): `explain` prints it beside the kernel
    method: str = ""
    storage: Storage | None = None  # the values it can take stored as bf16 (None: none)


# The name of the extra key slot a kernel with `Lowered.row_stride` reads: the distance between its output's rows
# (channels-last pixels, product rows). The runtime passes the output's own last dim (dense), or the width of a
# Concat the output is a slice of, so that producer writes straight into the Concat's buffer (no copy).
ROW_STRIDE = "__row_stride"


# ---- native lowerings: pre-built C entry points bound to a plan's buffers --------------------------------
@dataclass(frozen=True, slots=True)  # no per-call __dict__: a cached plan holds these
class NativeCall:
    """One pre-bound call of a C entry point taking only pointers and int64s: a plan packs runs of these into
    one program (`codegen.program`), so they cost one foreign call together."""

    fn: Any  # a ctypes function whose argtypes are pointers / int64s
    args: tuple[int, ...]

    def __call__(self) -> None:
        self.fn(*self.args)


@dataclass
class BindRequest:
    """What a native lowering binds: the node, its attributes, the buffers of this key's plan (inputs, and the
    outputs it must fill; None for omitted ones), the values fixed for the key, and where to keep what the
    calls' raw addresses point into."""

    node: Node
    attrs: dict
    ins: list
    outs: list
    fixed: Mapping[str, Any]  # constants and per-key values (numpy arrays)
    keep: Any  # codegen.keep.Keep: kept objects, and `table(values)` / `hold(view)`
    addr: Callable[[Any], int]  # the address of a buffer (cached by the plan)
    options: Options
    # scratch(nbytes, tag): bytes a call may overwrite, shared by every plan of the arena (its calls never run at
    # once), grown when a key needs more; None outside a planned arena
    scratch: Callable[[int, str], Any] | None = None


@dataclass(slots=True)  # not frozen: made per step per new key of a bucket plan (a frozen init costs ~1 us more)
class RetableRequest:
    """A native step's buffers at another key of a plan moved in place (runtime/rekey.py): their shapes and
    addresses (C-contiguous, each of its dtype's `itemsize`), no arrays."""

    node: Node
    attrs: dict
    in_shapes: list  # a tuple per input (None for omitted ones)
    out_shapes: list
    in_addrs: list
    out_addrs: list
    itemsize: int
    # the C entry point of each call the step's last binding made, in order: a rule whose binder picks among
    # entry points retables only the one its words are for (None: bind again)
    fns: tuple = ()
    # per input, the array where it is a constant or a per-key value (its contents known for the key, as
    # BindRequest.fixed), else None: a rule whose binder checks such contents (a Gather's indices) checks them here
    in_values: list = field(default_factory=list)
    # per input, its elements' bytes (0 for omitted ones): a rule whose table says an input's type (a Gather's
    # int32 or int64 indices) reads it here
    in_itemsizes: tuple = ()


@dataclass(frozen=True)
class NativeRule:
    """`accepts(node, graph)`: None when the node can run natively, else why not (decided at build time, shown
    by explain); `bind(request)`: zero-argument calls filling the outputs, or None when this key's shapes are
    not covered (the step then runs its numpy path into the planned buffers). `strided(node)`: whether bind
    takes an output that is a slice of a wider channels-last buffer (a Concat's, read from its strides), so the
    plan may point the node at its columns of a Concat (runtime/concat_joins.py). `describe(node, graph,
    options)`: what the native step computes in other than plain float32 (an LSTM on 8-bit weights, its input
    projection in bf16), or None; explain prints it, so a user sees which steps run in which precision.
    `params(node)`: the inputs whose contents bind reads (None: every input after the first).
    `retable(request)`: for a binder whose calls take only tables that follow from its buffers' shapes and
    addresses (and from the contents of constant or per-key inputs, checked as bind checks them), the words of
    each table, in the order `bind` made them, for a `RetableRequest`; None: bind again. A bucket plan moving to
    a new key writes these words instead of binding (a decoder's KV Concat: ~40 us a step less per token; Llama's
    key / value heads repeated by Expand: ~25 us each)."""

    accepts: Callable[[Node, Graph], str | None]
    bind: Callable[[BindRequest], list[Callable[[], None]] | None]
    strided: Callable[[Node], bool] = lambda node: False
    describe: Callable[[Node, Graph, Options], str | None] = lambda node, graph, options: None
    retable: Callable[[RetableRequest], list[list[int]] | None] | None = None
    # the inputs (by position) whose contents `bind` reads when it binds (so they must be constants or per-key
    # values); the others it reads only when its calls run. None: every input after the first (the data). A
    # bucket plan keeps the key's symbolic values that no binder reads so in its arena (runtime/per_key.py)
    params: Callable[[Node], tuple[int, ...]] | None = None
