"""Lowerings of the ops a dynamically quantized convolution becomes (ops/dynquant_conv.py, passes/qconv.py).

`DynamicQuantParams` runs natively (csrc/ds_dynquant.c: one pass for the range); `QuantizeCentered` and
`IntegerAdd` are elementwise expressions, so the first fuses with the activation it quantizes and the second
joins the convolution's epilogue with the scale and activation after it. Their expressions compute what the
references do, in the same float32 operations: a true division by the per-call scale (not a reciprocal),
rint (half to even), the saturation, and the int32 sum wrapping as the reference's does.
"""

from __future__ import annotations

import ctypes

import numpy as np

from dynshape.codegen import kir
from dynshape.codegen.clib import I64, P, declare
from dynshape.codegen.lower.elementwise import expr_rule
from dynshape.codegen.lowering import BindRequest, NativeCall, NativeRule, register_lowering
from dynshape.ir.graph import Graph, Node
from dynshape.passes.values import is_float32

DOMAIN = "dynshape"
LIBRARY = declare("dynquant", "ds_dynquant.c", {"ds_dynquant_params_f32": (P, I64, P, P),
                                                "ds_dynquant_params_args": (P,)}, openmp=True)


def library() -> ctypes.CDLL | None:
    return LIBRARY.try_load()


def _params_accepts(node: Node, graph: Graph) -> str | None:
    return None if is_float32(graph.types.get(node.inputs[0])) else "not float32"


def _bind_params(r: BindRequest) -> list | None:
    lib = library()
    x, s, z = r.ins[0], r.outs[0], r.outs[1] if len(r.outs) > 1 else None
    if lib is None or s is None or z is None or not x.flags.c_contiguous:
        return None
    args = r.keep.table([r.addr(x), x.size, r.addr(s), r.addr(z)])
    return [NativeCall(lib.ds_dynquant_params_args, (args,))]


register_lowering("DynamicQuantParams", "native", NativeRule(_params_accepts, _bind_params), domain=DOMAIN)


def _f(v: float) -> kir.Const:
    return kir.Const(v, kir.F32)


def _centered(n: Node, a: list[kir.Expr], g: Graph) -> kir.Expr:
    x, s = a[0], a[1]
    z = kir.Cast(a[2], kir.F32)
    v = kir.Bin("+", kir.Call("rintf", (kir.Bin("/", x, s),), kir.F32), z)
    v = kir.Select(kir.Bin("<", v, _f(0.0)), _f(0.0), kir.Select(kir.Bin(">", v, _f(255.0)), _f(255.0), v))
    return kir.Bin("-", v, z)


def _centered_accepts(n: Node, g: Graph) -> str | None:
    t = [g.types.get(x) for x in (*n.inputs, *n.outputs)]
    ok = is_float32(t[0]) and is_float32(t[1]) and np.dtype(t[2].dtype) == np.uint8 and is_float32(t[3])
    return None if ok else "not float32 x and scale with a uint8 zero point"


def _integer_add(n: Node, a: list[kir.Expr], g: Graph) -> kir.Expr:
    """float32(int32(a) + b), wrapping: the sum in uint32 (modulo 2^32, defined in C), read back as int32 (modulo in
    gcc and clang). int32(a) is exact: passes/qconv.py makes IntegerAdd only where every value of `a` is an integer
    below 2^24 in magnitude. Not through int64 as the reference goes: without AVX-512DQ no x86 vector instruction
    converts float32 to int64, and the whole fused loop (the scale and the SiLU after it too) ran scalar (9 ns an
    element on an AVX2 CPU)."""
    u32 = "uint32"
    wide = kir.Bin("+", kir.Cast(kir.Cast(a[0], kir.I32), u32), kir.Cast(a[1], u32))
    return kir.Cast(kir.Cast(wide, kir.I32), kir.F32)


def _integer_add_accepts(n: Node, g: Graph) -> str | None:
    t = [g.types.get(x) for x in (*n.inputs, *n.outputs)]
    ok = is_float32(t[0]) and np.dtype(t[1].dtype) == np.int32 and is_float32(t[2])
    return None if ok else "not float32 + int32"


expr_rule("QuantizeCentered", _centered, _centered_accepts, domain=DOMAIN)
expr_rule("IntegerAdd", _integer_add, _integer_add_accepts, domain=DOMAIN)
