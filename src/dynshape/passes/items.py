"""What fusion produces: a schedule of `Item`s, each one node or several fused into one kernel.

Every item has the same face, whatever it holds: `kind` (which kernel lowering takes it), `nodes` (in
execution order), `inputs` (values read from outside it, in first-use order) and `outputs` (values it writes
that something outside reads). Items are immutable: a fusion rule that grows one builds a new one.

The kinds:
- `Single`: one node, run by its native lowering, numpy lowering or reference;
- `Elementwise`: a chain of elementwise ops over one iteration shape, one loop nest;
- `Softmax`: a last-axis softmax with the elementwise group feeding it and the one consuming it, row by row;
- `Product`: a product by a constant matrix with the elementwise group that alone reads it as its epilogue,
  and optionally the head transposes it writes itself or the LayerNormalization that closes it;
- `Attention`: softmax(pre(Q @ KT)) @ V, a block of query rows at a time (the scores never reach memory);
- `Conv`: a channels-last convolution with its epilogue (bias, activation, residual add);
- `ConvChain`: a 1x1 convolution whose result only a depthwise one reads (a MobileNet block's expansion),
  computed a few rows at a time into scratch the depthwise reads while they are in cache; `parts` are the two
  `Conv`s, which run as kernels of their own where the chain's lowering declines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dynshape.ir.graph import Node


@dataclass(frozen=True, eq=False)
class Item:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    kind: ClassVar[str] = "item"

    @property
    def nodes(self) -> tuple[Node, ...]:
        raise NotImplementedError

    @property
    def label(self) -> str:
        return "+".join(n.name or n.op_type for n in self.nodes)

    @property
    def produced(self) -> tuple[str, ...]:
        """Every value its nodes compute (outputs and the values that stay inside)."""
        return tuple(o for n in self.nodes for o in n.outputs if o)


@dataclass(frozen=True, eq=False)
class Single(Item):
    node: Node | None = None
    kind: ClassVar[str] = "node"

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (self.node,)


@dataclass(frozen=True, eq=False)
class Elementwise(Item):
    group: tuple[Node, ...] = ()
    shape: tuple = ()
    kind: ClassVar[str] = "elementwise"

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.group


@dataclass(frozen=True, eq=False)
class Softmax(Item):
    node: Node | None = None
    pre: Elementwise | None = None
    post: Elementwise | None = None
    shape: tuple = ()
    kind: ClassVar[str] = "softmax"

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (*(self.pre.nodes if self.pre else ()), self.node, *(self.post.nodes if self.post else ()))


@dataclass(frozen=True, eq=False)
class Product(Item):
    """A product with a constant 2-D right operand (MatMul, or Gemm without transA): inputs are
    [A, bias?, *epilogue operands, *layernorm scale/bias or *softmax operands]; the weight travels packed
    (`weight`, `trans_b`)."""

    node: Node | None = None
    weight: str = ""
    trans_b: bool = False
    epilogue: Elementwise | None = None
    shape: tuple = ()
    folded: tuple[Node, ...] = ()  # Reshape to heads + Transpose (0, 2, 1, 3), written directly
    heads: int = 0  # with `folded`: (b, s, heads * d) is written as (b, heads, s, d)
    layernorm: Node | None = None  # a last-axis LayerNormalization of the result, applied per block of rows
    softmax: Softmax | None = None  # a last-axis softmax (with its groups) of the result, per block of rows
    kind: ClassVar[str] = "product"

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (self.node, *(self.epilogue.nodes if self.epilogue else ()), *self.folded,
                *((self.layernorm,) if self.layernorm else ()), *(self.softmax.nodes if self.softmax else ()))


@dataclass(frozen=True, eq=False)
class Conv(Item):
    """A channels-last Conv (`dynshape::ChannelsLast(op=Conv)`) with constant weights and the elementwise group
    that alone reads it as its epilogue. inputs: [X, bias?, *epilogue operands, *prologue operands]; `shape` is
    the output's (N, *spatial, C). `prologue` (rules.match_conv_prologue): a per-input-channel scale, shift and
    Relu that alone produced the conv's input, applied as the kernel rounds its input rows (X is then the
    prologue's input)."""

    node: Node | None = None
    weight: str = ""
    epilogue: Elementwise | None = None
    shape: tuple = ()
    prologue: Elementwise | None = None
    kind: ClassVar[str] = "conv"

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (*(self.prologue.nodes if self.prologue else ()), self.node,
                *(self.epilogue.nodes if self.epilogue else ()))


@dataclass(frozen=True, eq=False)
class ConvChain(Item):
    """`first` (a 1x1 Conv item) feeding only `second` (a depthwise Conv item): inputs are first's then
    second's other ones; the value between them stays inside."""

    first: Conv | None = None
    second: Conv | None = None
    kind: ClassVar[str] = "conv_chain"

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (*self.first.nodes, *self.second.nodes)

    @property
    def parts(self) -> tuple[Item, ...]:
        return (self.first, self.second)


@dataclass(frozen=True, eq=False)
class Pool(Item):
    """A channels-last pooling (MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool), or a ReduceMean /
    ReduceMax over every spatial axis of a channels-last tensor (a global pool): one node, a kernel of its own."""

    node: Node | None = None
    shape: tuple = ()
    kind: ClassVar[str] = "pool"

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (self.node,)


@dataclass(frozen=True, eq=False)
class Attention(Item):
    """inputs: [Q, KT (or K, see k_rows), V, *softmax operands other than the scores]."""

    scores: Node | None = None  # MatMul(Q, KT)
    softmax: Softmax | None = None
    values: Node | None = None  # MatMul(P, V)
    folded: tuple[Node, ...] = ()  # a Transpose (0, 2, 1, 3) written directly (heads last)
    k_rows: tuple[Node, ...] = ()  # movement making KT from K: the kernel packs KT from K's rows
    kind: ClassVar[str] = "attention"

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (*self.k_rows, self.scores, *self.softmax.nodes, self.values, *self.folded)
