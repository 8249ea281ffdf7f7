"""The kernel IR: loop nests that fusion's lowerings build and one printer (`printer.py`) turns into C.

Why an IR and not C text: a kernel is built from parts (operand loads, an elementwise expression, a softmax's
row passes, a product's tiles) that several lowerings share; as data they compose, can be checked (a test
asks "is the outer loop parallel?", not "does line 7 contain #pragma"), and the printer alone decides names,
types and indentation. Lowerings never write C.

The pieces:
- scalars: `Const`, `Var` (named by the printer from its hint), `Bin`, `Un`, `Call` (math and helper
  functions), `Select`, `Cast`, `Load` (buffer[index]), `Addr` (buffer + offset, for micro-kernel calls);
- statements: `Let` (a constant), `Decl`/`Assign` (a mutable scalar, e.g. a running maximum), `Store`, `For`
  (with an `Omp` annotation: parallel, collapse, simd, reductions), `While`, `If`, `Eval` (a call), `Region` (an
  OpenMP parallel region: per-thread scratch, several work-shared loops), `Alloc`/`Free` (per-thread scratch),
  `Array` (a small local array) and `Pointer` (a local pointer into a buffer);
- a `Kernel`: name, parameters (`Buffer`s, pointers in and out) and extents: loop bounds as `int | sym.Expr`,
  computed per call from the symbols (static ones are literals the C compiler unrolls and vectorises).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Element types the IR knows (names as numpy spells them); the printer maps them to C.
F32, I64, BOOL, I32, F64 = "float32", "int64", "bool", "int32", "float64"


# ---- scalars ---------------------------------------------------------------------------------------------
class Expr:
    dtype: str

    # operator sugar keeps lowerings readable: a + b, a * b, a < b build Bin nodes
    def __add__(self, o: Any) -> Bin:
        return Bin("+", self, lit(o, self.dtype))

    def __radd__(self, o: Any) -> Bin:
        return Bin("+", lit(o, self.dtype), self)

    def __sub__(self, o: Any) -> Bin:
        return Bin("-", self, lit(o, self.dtype))

    def __rsub__(self, o: Any) -> Bin:
        return Bin("-", lit(o, self.dtype), self)

    def __mul__(self, o: Any) -> Bin:
        return Bin("*", self, lit(o, self.dtype))

    def __rmul__(self, o: Any) -> Bin:
        return Bin("*", lit(o, self.dtype), self)

    def __truediv__(self, o: Any) -> Bin:
        return Bin("/", self, lit(o, self.dtype))

    def __mod__(self, o: Any) -> Bin:
        return Bin("%", self, lit(o, self.dtype))

    def __lt__(self, o: Any) -> Bin:  # type: ignore[override]
        return Bin("<", self, lit(o, self.dtype))

    def __gt__(self, o: Any) -> Bin:  # type: ignore[override]
        return Bin(">", self, lit(o, self.dtype))

    def __le__(self, o: Any) -> Bin:  # type: ignore[override]
        return Bin("<=", self, lit(o, self.dtype))

    def __ge__(self, o: Any) -> Bin:  # type: ignore[override]
        return Bin(">=", self, lit(o, self.dtype))

    __hash__ = object.__hash__


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: Any
    dtype: str = F32


@dataclass(frozen=True, eq=False)
class Var(Expr):
    """A scalar the printer names from `hint` (unique within the kernel)."""

    hint: str
    dtype: str = I64


@dataclass(frozen=True, eq=False)
class Bin(Expr):
    op: str  # + - * / % < <= > >= == != && ||
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return BOOL if self.op in ("<", "<=", ">", ">=", "==", "!=", "&&", "||") else self.a.dtype


@dataclass(frozen=True, eq=False)
class Un(Expr):
    op: str  # - !
    a: Expr

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return BOOL if self.op == "!" else self.a.dtype


@dataclass(frozen=True, eq=False)
class Call(Expr):
    fn: str
    args: tuple[Expr, ...]
    dtype: str = F32


@dataclass(frozen=True, eq=False)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.a.dtype


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    a: Expr
    dtype: str


@dataclass(frozen=True, eq=False)
class Buffer:
    """A pointer (kernel parameter or scratch): elements of `dtype`; `const` when only read."""

    hint: str
    dtype: str = F32
    const: bool = True


@dataclass(frozen=True, eq=False)
class Load(Expr):
    buf: Buffer
    index: Expr

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.buf.dtype


@dataclass(frozen=True, eq=False)
class Addr(Expr):
    """buf + offset: a pointer into a buffer, passed to a micro-kernel."""

    buf: Buffer
    offset: Expr | None = None
    dtype: str = "ptr"


@dataclass(frozen=True, eq=False)
class Extent(Expr):
    """Loop bound k of the kernel (`Kernel.extents[k]`): a literal when static, else read from the call's dims."""

    k: int
    dtype: str = I64


NULL = Const(0, "ptr")


def lit(x: Any, dtype: str = F32) -> Expr:
    """Wrap a Python number as a Const of the other operand's type (exprs pass through)."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, (bool, np.bool_)):
        return Const(bool(x), BOOL)
    if isinstance(x, (int, np.integer)) and dtype in (I64, I32, "ptr"):
        return Const(int(x), I64)
    return Const(x, dtype if dtype not in ("ptr", BOOL) else I64)


def i64(x: int | Expr) -> Expr:
    return x if isinstance(x, Expr) else Const(int(x), I64)


def minimum(a: Expr, b: Any) -> Expr:
    b = lit(b, a.dtype)
    return Select(Bin("<", a, b), a, b)


def maximum(a: Expr, b: Any) -> Expr:
    b = lit(b, a.dtype)
    return Select(Bin(">", a, b), a, b)


def product(xs: Iterable[Expr | int]) -> Expr:
    """x0 * x1 * ... (1 for none), folding literal ones away."""
    out: Expr | None = None
    for x in xs:
        if isinstance(x, int) and x == 1 or isinstance(x, Const) and x.value == 1:
            continue
        x = i64(x)
        out = x if out is None else Bin("*", out, x)
    return out if out is not None else Const(1, I64)


def total(xs: Iterable[Expr | int]) -> Expr:
    """x0 + x1 + ... (0 for none)."""
    out: Expr | None = None
    for x in xs:
        x = i64(x)
        out = x if out is None else Bin("+", out, x)
    return out if out is not None else Const(0, I64)


# ---- statements ------------------------------------------------------------------------------------------
class Stmt:
    pass


@dataclass(frozen=True, eq=False)
class Let(Stmt):
    var: Var
    value: Expr


@dataclass(frozen=True, eq=False)
class Decl(Stmt):
    var: Var
    value: Expr


@dataclass(frozen=True, eq=False)
class Assign(Stmt):
    var: Var
    value: Expr


@dataclass(frozen=True, eq=False)
class Store(Stmt):
    buf: Buffer
    index: Expr
    value: Expr


@dataclass(frozen=True)
class Omp:
    """An OpenMP annotation of a loop: `parallel` (spawn a team) or `shared` (a work-shared `for` inside a
    `Region`), `simd`, `collapse`, a reduction, and the `if_` size below which the team is not woken."""

    parallel: bool = False
    shared: bool = False
    simd: bool = False
    collapse: int = 1
    schedule: str | None = "static"
    reduction: tuple[str, Var] | None = None
    if_: Expr | None = None


@dataclass(frozen=True, eq=False)
class For(Stmt):
    var: Var
    stop: Expr
    body: tuple[Stmt, ...]
    start: Expr = field(default_factory=lambda: Const(0, I64))
    step: Expr = field(default_factory=lambda: Const(1, I64))
    omp: Omp | None = None


@dataclass(frozen=True, eq=False)
class If(Stmt):
    cond: Expr
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...] = ()


@dataclass(frozen=True, eq=False)
class While(Stmt):
    """A loop whose step the body decides (it assigns the variables `cond` reads)."""

    cond: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True, eq=False)
class Pointer(Stmt):
    """A local pointer into a buffer: `T *buf = value;` (then used like any buffer)."""

    buf: Buffer
    value: Expr


@dataclass(frozen=True, eq=False)
class Eval(Stmt):
    """A call for its effect (a micro-kernel)."""

    call: Call


def call_void(fn: str, *args: Expr) -> Eval:
    """A C function's call for its effect (a micro-kernel, a library entry) as a statement."""
    return Eval(Call(fn, tuple(args), "void"))


@dataclass(frozen=True, eq=False)
class Region(Stmt):
    """`#pragma omp parallel if(if_) { body }`: per-thread scratch and work-shared loops inside."""

    body: tuple[Stmt, ...]
    if_: Expr | None = None


@dataclass(frozen=True, eq=False)
class Alloc(Stmt):
    """buf = malloc(count elements) (at least one; `zero`: calloc); freed by a matching `Free`."""

    buf: Buffer
    count: Expr
    zero: bool = False


@dataclass(frozen=True, eq=False)
class Free(Stmt):
    buf: Buffer


@dataclass(frozen=True, eq=False)
class Array(Stmt):
    """A local array of `size` elements (a literal size)."""

    buf: Buffer
    size: int


Body = Sequence[Stmt]


# ---- kernels ---------------------------------------------------------------------------------------------
DimLike = Any  # int | dynshape.sym.Expr


@dataclass(frozen=True, eq=False)
class Kernel:
    """One C function `void name(const int64_t *key, outputs..., inputs...)`.

    `key` holds the call's symbol values, in the order of `symbols`. `extents[k]` is what `Extent(k)` stands
    for: an int (printed as a literal the C compiler unrolls and vectorises) or a symbolic dim (computed in the
    prologue from the key, with Python's floor semantics). `outputs`/`inputs` are the pointer parameters, in the
    order the runtime binds them.
    """

    name: str
    extents: tuple[DimLike, ...]
    outputs: tuple[Buffer, ...]
    inputs: tuple[Buffer, ...]
    body: tuple[Stmt, ...]
    symbols: tuple[str, ...] = ()


def walk(stmts: Iterable[Stmt]) -> Iterable[Stmt]:
    """Every statement, depth first (tests and analyses look for loops, calls, pragmas)."""
    for s in stmts:
        yield s
        if isinstance(s, (For, Region, While)):
            yield from walk(s.body)
        elif isinstance(s, If):
            yield from walk(s.then)
            yield from walk(s.orelse)
