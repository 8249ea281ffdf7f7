"""The one printer: kernel IR (`kir`) -> C source.

It owns everything textual: the names (every `Var` and `Buffer` gets a unique C identifier from its hint,
in order of first declaration), indentation, C types, exact literals (`cgen.c_float` round-trips float32
bit for bit) and the OpenMP pragmas. Every expression is fully parenthesised, so precedence never depends
on how a lowering nested its nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from dynshape.codegen import kir
from dynshape.codegen.cgen import c_dim, c_float, c_int, c_type

_INDENT = "    "


class _Names:
    def __init__(self) -> None:
        self.taken: set[str] = set()
        self.of: dict[int, str] = {}

    def declare(self, obj: object, hint: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in hint) or "v"
        if base[0].isdigit():
            base = "v" + base
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        self.of[id(obj)] = name
        return name

    def __call__(self, obj: object) -> str:
        try:
            return self.of[id(obj)]
        except KeyError:
            raise ValueError(f"kernel IR uses {obj!r} before declaring it") from None


def _one_thread(o: kir.Omp | None) -> kir.Omp | None:
    """A loop's annotation on one thread: no team and no work-sharing, its `simd` (and the reduction and
    collapse that go with it) kept."""
    if o is None or not o.simd:
        return None
    return kir.Omp(simd=True, collapse=o.collapse, schedule=None, reduction=o.reduction)


def ctype(dtype: str) -> str:
    return "void *" if dtype == "ptr" else c_type(np.dtype(dtype))


class Printer:
    def __init__(self, kernel: kir.Kernel):
        self.k = kernel
        self.names = _Names()
        self.lines: list[str] = []
        self.extent_names: list[str] = []
        self.serial = False  # printing a region's one-thread form: its work-shared loops run as plain loops

    # ---- expressions -------------------------------------------------------------------------------------
    def expr(self, e: kir.Expr) -> str:
        """By a table on the node's type: a kernel's print is mostly expressions (DenseNet's 188 kernels: 46,000
        of them, a third of a warm compile's printing when each went down a chain of isinstance tests)."""
        try:
            how = _EXPR[type(e)]
        except KeyError:
            raise TypeError(f"not a kernel IR expression: {e!r}") from None
        return how(self, e)

    def _var(self, e) -> str:
        return self.names(e)

    def _extent(self, e: kir.Extent) -> str:
        return self.extent_names[e.k]

    def _bin(self, e: kir.Bin) -> str:
        return f"({self.expr(e.a)} {e.op} {self.expr(e.b)})"

    def _un(self, e: kir.Un) -> str:
        return f"({e.op}{self.expr(e.a)})"

    def _call(self, e: kir.Call) -> str:
        return f"{e.fn}({', '.join(self.expr(a) for a in e.args)})"

    def _select(self, e: kir.Select) -> str:
        return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"

    def _cast(self, e: kir.Cast) -> str:
        return f"({ctype(e.dtype)})({self.expr(e.a)})"

    def _load(self, e: kir.Load) -> str:
        return f"{self.names(e.buf)}[{self.expr(e.index)}]"

    def _addr(self, e: kir.Addr) -> str:
        base = self.names(e.buf)
        return base if e.offset is None else f"{base} + {self.expr(e.offset)}"

    @staticmethod
    def const(e: kir.Const) -> str:
        if e.dtype == kir.BOOL:
            return "1" if e.value else "0"
        if e.dtype == "ptr":
            return "NULL" if not e.value else c_int(int(e.value))
        if e.dtype in (kir.F32, "float64"):
            return c_float(float(e.value), np.dtype(e.dtype))
        return c_int(int(e.value))

    # ---- statements --------------------------------------------------------------------------------------
    def emit(self, line: str, depth: int) -> None:
        self.lines.append(_INDENT * depth + line)

    def block(self, stmts: Iterable[kir.Stmt], depth: int) -> None:
        for s in stmts:
            self.stmt(s, depth)

    def stmt(self, s: kir.Stmt, depth: int) -> None:
        if isinstance(s, kir.Let):
            value = self.expr(s.value)
            self.emit(f"const {ctype(s.var.dtype)} {self.names.declare(s.var, s.var.hint)} = {value};", depth)
        elif isinstance(s, kir.Decl):
            value = self.expr(s.value)
            self.emit(f"{ctype(s.var.dtype)} {self.names.declare(s.var, s.var.hint)} = {value};", depth)
        elif isinstance(s, kir.Assign):
            self.emit(f"{self.names(s.var)} = {self.expr(s.value)};", depth)
        elif isinstance(s, kir.Store):
            self.emit(f"{self.names(s.buf)}[{self.expr(s.index)}] = {self.expr(s.value)};", depth)
        elif isinstance(s, kir.Eval):
            self.emit(self.expr(s.call) + ";", depth)
        elif isinstance(s, kir.For):
            self.loop(s, depth)
        elif isinstance(s, kir.If):
            self.emit(f"if ({self.expr(s.cond)}) {{", depth)
            self.block(s.then, depth + 1)
            if s.orelse:
                self.emit("} else {", depth)
                self.block(s.orelse, depth + 1)
            self.emit("}", depth)
        elif isinstance(s, kir.While):
            self.emit(f"while ({self.expr(s.cond)}) {{", depth)
            self.block(s.body, depth + 1)
            self.emit("}", depth)
        elif isinstance(s, kir.Pointer):
            value = self.expr(s.value)
            self.emit(f"{ctype(s.buf.dtype)} *{self.names.declare(s.buf, s.buf.hint)} = {value};", depth)
        elif isinstance(s, kir.Region):
            self.emit(f"if ({self.team(s.if_)}) {{", depth)
            self.emit("#pragma omp parallel", depth + 1)
            self.emit("{", depth + 1)
            self.block(s.body, depth + 2)
            self.emit("}", depth + 1)
            self.emit("} else {", depth)
            serial, self.serial = self.serial, True
            self.block(s.body, depth + 1)
            self.serial = serial
            self.emit("}", depth)
        elif isinstance(s, kir.Alloc):
            t, n = ctype(s.buf.dtype), self.expr(s.count)
            name = self.names.declare(s.buf, s.buf.hint)
            if s.zero:
                self.emit(f"{t} *{name} = ({t} *)calloc({n} > 0 ? {n} : 1, sizeof({t}));", depth)
            else:
                self.emit(f"{t} *{name} = ({t} *)malloc(sizeof({t}) * ({n} > 0 ? {n} : 1));", depth)
        elif isinstance(s, kir.Free):
            self.emit(f"free({self.names(s.buf)});", depth)
        elif isinstance(s, kir.Array):
            self.emit(f"{ctype(s.buf.dtype)} {self.names.declare(s.buf, s.buf.hint)}[{s.size}];", depth)
        else:
            raise TypeError(f"not a kernel IR statement: {s!r}")

    def team(self, if_: kir.Expr | None) -> str:
        """When a parallel construct wakes its team: more than one thread, and its `if_`. Its other branch is the
        same code without the construct. Why not the `if` clause: a parallel region whose `if` is false still
        costs ~300 ns a call in libgomp (a one-thread team set up and torn down), against ~5 ns for the branch;
        a 39-kernel CNN paid it 39 times a call, a decoder step 7 times, and a 1-thread run on every kernel. (The
        branch also keeps `simd` below the threshold, which a bare `if` on a combined `parallel for simd` had
        switched off under OpenMP 5.)"""
        many = "omp_get_max_threads() > 1"
        return many if if_ is None else f"{many} && {self.expr(if_)}"

    def loop(self, s: kir.For, depth: int) -> None:
        o = s.omp
        if o is not None and o.parallel:  # (pragma() prints no `if` clause: the branch is the condition)
            self.emit(f"if ({self.team(o.if_)}) {{", depth)
            self._loop(s, dataclasses.replace(o, if_=None), depth + 1)
            self.emit("} else {", depth)
            self._loop(s, _one_thread(o), depth + 1)
            self.emit("}", depth)
        else:
            self._loop(s, _one_thread(o) if self.serial and o is not None and o.shared else o, depth)

    def _loop(self, s: kir.For, omp: kir.Omp | None, depth: int) -> None:
        i = self.names.declare(s.var, s.var.hint)
        if omp is not None:
            self.emit(self.pragma(omp), depth)
        step = f"{i}++" if isinstance(s.step, kir.Const) and s.step.value == 1 else f"{i} += {self.expr(s.step)}"
        self.emit(f"for (int64_t {i} = {self.expr(s.start)}; {i} < {self.expr(s.stop)}; {step}) {{", depth)
        self.block(s.body, depth + 1)
        self.emit("}", depth)

    def pragma(self, o: kir.Omp) -> str:
        words = ["#pragma omp"]
        if o.parallel:
            words += ["parallel", "for"]
        elif o.shared:
            words.append("for")
        if o.simd:
            words.append("simd")
        if o.collapse > 1:
            words.append(f"collapse({o.collapse})")
        if (o.parallel or o.shared) and o.schedule:
            words.append(f"schedule({o.schedule})")
        if o.reduction is not None:
            op, var = o.reduction
            words.append(f"reduction({op}:{self.names(var)})")
        return " ".join(words)

    # ---- the function --------------------------------------------------------------------------------------
    def function(self) -> str:
        k = self.k
        self.names.declare(k, k.name)
        d = self.names.declare(object(), "key")
        params = [f"const int64_t *{d}"]
        position = {s: i for i, s in enumerate(k.symbols)}
        for b in k.outputs:
            params.append(f"{ctype(b.dtype)} *restrict {self.names.declare(b, b.hint)}")
        for b in k.inputs:
            params.append(f"const {ctype(b.dtype)} *restrict {self.names.declare(b, b.hint)}")
        self.lines.append(f"void {self.names(k)}({', '.join(params)}) {{")
        for i, e in enumerate(k.extents):
            name = self.names.declare(object(), f"L{i}")
            self.extent_names.append(name)
            self.emit(f"const int64_t {name} = {c_dim(e, lambda s: f'{d}[{position[s]}]')};", 1)
        self.block(k.body, 1)
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"


_EXPR = {kir.Const: lambda p, e: p.const(e), kir.Var: Printer._var, kir.Buffer: Printer._var,
         kir.Extent: Printer._extent, kir.Bin: Printer._bin, kir.Un: Printer._un, kir.Call: Printer._call,
         kir.Select: Printer._select, kir.Cast: Printer._cast, kir.Load: Printer._load, kir.Addr: Printer._addr}


def print_c(kernel: kir.Kernel) -> str:
    """C source of one kernel function (the file's includes are the caller's: see `prelude`)."""
    return Printer(kernel).function()
