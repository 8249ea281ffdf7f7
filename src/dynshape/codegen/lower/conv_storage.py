"""bf16 storage of the activations between bf16 convolutions (precision="bf16", Options.bf16_storage).

Why: at batch 1 a CNN's early stages are bound by memory, not by products: ResNet-50's 1x1 convs on its 56 x 56
maps read and write float32 maps of 0.8-3.2 MB (64-256 channels) and ran 2.5-3.5x OpenVINO's bf16 time (ours
250-550 us against 80-150, 1 thread, Sapphire Rapids-class Xeon), whose maps are bf16: half the bytes, and a
56 x 56 x 256 map (1.6 MB) then stays in L2 between the conv that writes it and the one that reads it.

What: a value is stored as bf16 when it is the one output of a conv kernel whose bf16 tiles finish it (bias,
residual, activation applied in registers, no generated epilogue after them) and every reader is such a kernel
reading it as the rows of its products (its input) or as the residual its tiles add, and it is no graph output.
A reading conv rounds its input to bf16 anyway, so an input stored as bf16 gives it the same operands, bit for bit;
a residual read as bf16 is the float32 sum rounded once where it was stored (OpenVINO's bf16 keeps its whole
residual stream so). Every other value stays float32; so does every reader that is not such a conv (a pool, a
Concat, a depthwise conv, a numpy step), which keeps its producer's output float32.

How: `choose` reads the kernels' `Lowered.storage` (what each lowering can take as bf16: conv.py's implicit-GEMM
and direct AMX tiles) and returns the values to store so; the build lowers the kernels that touch one again with
them in `LowerCtx.bf16_values` and checks that each took exactly those (`confirmed`), else keeps the float32
kernels. The C reads geo[DS_CONV_XBF / YBF / RBF] (csrc/ds_conv_common.h's finish, csrc/ds_gemm_bf16.c's patches,
csrc/ds_conv_amx.c's padded copy). The emulated precision stores float32 values rounded to bf16 instead: the same
values. The arena keeps a float32-sized buffer for such a value (half of it used).
"""

from __future__ import annotations

from collections.abc import Iterable

from dynshape.codegen import cshared, kir
from dynshape.codegen.lowering import Lowered, Storage

FLAGS = ("XBF", "YBF", "RBF")  # the geometry fields (cshared.CONV_GEO) of x, y and r


def storage_of(x: str | None, y: str | None, r: str | None, chosen: frozenset[str]) -> Storage:
    """A conv kernel's storage: the values it can take as bf16 (None where it cannot) and those of `chosen` it
    takes so."""
    return Storage(x, y, r, tuple(v is not None and v in chosen for v in (x, y, r)))


def flag_stores(geo: kir.Buffer, storage: Storage | None) -> list[kir.Stmt]:
    """The geometry array's bf16 flags for the values the kernel takes as bf16 (the array holds 0 otherwise)."""
    if storage is None:
        return []
    return [kir.Store(geo, kir.i64(cshared.CONV_GEO.index(f)), kir.i64(1))
            for f, on in zip(FLAGS, storage.applied, strict=True) if on]


def describe(storage: Storage | None) -> str:
    """What explain adds to the kernel's method: which of its values are stored as bf16."""
    if storage is None or not any(storage.applied):
        return ""
    names = [what for what, on in zip(("input", "output", "residual"), storage.applied, strict=True) if on]
    return "; bf16 storage: " + ", ".join(names)


def choose(kernels: Iterable[tuple[Lowered | None, tuple[str, ...]]], graph_outputs: frozenset[str]) -> frozenset[str]:
    """The values to store as bf16, from every step's (its kernel or None, the values it reads): each is the one
    output of a kernel that can store it so, no graph output, and read only by kernels that can read it so, in
    as many of their inputs as they read it as bf16 (a conv reading one value as its input and its residual
    reads it twice)."""
    steps = list(kernels)
    producers: dict[str, Lowered] = {}
    for lk, _ in steps:
        if lk is not None and lk.storage is not None and lk.storage.y is not None and len(lk.outputs) == 1:
            producers[lk.outputs[0]] = lk
    refused: set[str] = set(graph_outputs)
    for lk, reads in steps:
        for v in set(reads) & producers.keys():
            st = lk.storage if lk is not None else None
            able = 0 if st is None else (st.x == v) + (st.r == v)
            if able == 0 or sum(1 for u in reads if u == v) != able:
                refused.add(v)
    return frozenset(v for v in producers if v not in refused)


def confirmed(lk: Lowered, chosen: frozenset[str]) -> bool:
    """Whether a kernel lowered with `chosen` takes exactly its values in `chosen` as bf16 (its reads and its
    output, and nothing else), so that a writer and its readers agree on every value."""
    st = lk.storage
    taken = set() if st is None else {v for v, on in zip((st.x, st.y, st.r), st.applied, strict=True) if on}
    touched = (*lk.outputs, *(v for v in lk.inputs if isinstance(v, str)))
    return taken <= chosen and all(v in taken for v in touched if v in chosen)
