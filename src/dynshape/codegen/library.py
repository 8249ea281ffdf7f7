"""A build's kernels -> C files -> shared libraries -> entry points.

Kernels whose C is the same but for the name (one per layer of a transformer) share one function: the
compiler sees each body once, and their loop extents stay their own (computed per kernel from the key).
Kernels that call the packed-GEMM library and the others are two libraries (a long one split in two), compiled
at the same time as that library: on a cold cache the C compiler is most of the build. Each library's source
carries the digest of the build options, so two builds that differ in any option never share a library by
accident.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from dynshape.codegen import bf16, kir, packed_gemm
from dynshape.codegen.cc import DEFAULT_FLAGS, adopt, build_context, build_shared, compile_c, foreground
from dynshape.codegen.cgen import prelude
from dynshape.codegen.clib import CLibrary
from dynshape.codegen.lowering import Lowered, PackedWeight
from dynshape.codegen.printer import print_c
from dynshape.options import Options

_HELPERS: dict[str, tuple[CLibrary, str]] = {}


def register_helper(name: str, lib: CLibrary, header: str) -> None:
    """A static C library generated kernels may call (`Lowered.needs`): loaded, symbols global, before them;
    `header` (in csrc/) declares its entry points to them."""
    _HELPERS[name] = (lib, f'#include "{header}"\n')


register_helper("packed_gemm", packed_gemm.LIBRARY, "ds_gemm.h")
register_helper("packed_gemm_bf16", bf16.LIBRARY, "ds_gemm_bf16.h")


@dataclass(frozen=True)
class Compiled:
    """A kernel's C entry point (shared with its identical twins) and the source it came from."""

    entry: ctypes._CFuncPtr
    source: str
    shared_with: str  # the kernel whose function this one calls (itself when unique)


# A library whose kernels' C is longer than this compiles as two halves at once (gcc -O3 takes ~0.2 s for the
# bench BERT's 15 KB of product kernels; each extra file costs ~0.02 s of headers).
SPLIT_CHARS = 8000


def _halves(ks: list[Lowered], sources: dict[str, str]) -> list[list[Lowered]]:
    """`ks` as one list, or, when longer than SPLIT_CHARS, two of about equal source length (longest kernels
    first, each to the shorter half; each half keeps the build's order)."""
    size = {k.kernel.name: len(sources[k.kernel.name]) for k in ks}
    if sum(size.values()) <= SPLIT_CHARS or len(ks) < 2:
        return [ks]
    halves: tuple[set[str], set[str]] = (set(), set())
    load = [0, 0]
    for name in sorted(size, key=lambda n: -size[n]):
        i = 0 if load[0] <= load[1] else 1
        halves[i].add(name)
        load[i] += size[name]
    return [[k for k in ks if k.kernel.name in h] for h in halves]


# Kernels that only call the helper libraries (a conv's tiles, a pool's rows: their loops store nothing themselves)
# compile at -O1: their code is the geometry and the parallel loop around the calls, which -O3 makes no faster,
# and gcc -O3 took 1.6 s of DenseNet-121's 4 s cold build on its 120 conv wrappers (-O1: 1.0 s).
CALLS_FLAGS: tuple[str, ...] = tuple("-O1" if f == "-O3" else f for f in DEFAULT_FLAGS)


def calls_only(kernel: kir.Kernel) -> bool:
    """`kernel` calls functions, and no loop of it stores or accumulates anything itself (only index arithmetic
    and the calls): the work is in the functions it calls. A loop that sums into a scalar stored after it is
    work, and keeps -O3."""
    if not any(isinstance(s, kir.Eval) for s in kir.walk(kernel.body)):
        return False
    loops = [s for s in kir.walk(kernel.body) if isinstance(s, (kir.For, kir.While))]
    return not any(isinstance(s, (kir.Store, kir.Assign)) for loop in loops for s in kir.walk(loop.body))


def _with_needs(libs: list[CLibrary]) -> list[CLibrary]:
    """`libs` and every library they need, each once, the longest source first."""
    out: list[CLibrary] = []
    todo = list(libs)
    while todo:
        lib = todo.pop()
        if lib not in out:
            out.append(lib)
            todo.extend(lib.needs)
    return sorted(out, key=lambda lib: -len(lib.spec()["source"]))


def _build_only(lib: CLibrary) -> Callable[[], object]:
    spec = lib.spec()
    return functools.partial(build_shared, spec["source"], spec["name"], flags=spec["flags"], openmp=spec["openmp"])


def compile_kernels(kernels: list[Lowered], graph_name: str, options: Options,
                    parallel: bool = True) -> dict[str, Compiled]:
    """Kernel name -> its compiled entry. `parallel`: compile the libraries at the same time (False in the
    background builder, whose compiler processes would otherwise take the cores of the requests it serves)."""
    first: dict[str, str] = {}  # body text -> the first kernel with it
    sources: dict[str, str] = {}
    owner: dict[str, str] = {}
    for lk in kernels:
        name = lk.kernel.name
        text = print_c(lk.kernel)
        body = text.replace(name + "(", "@(", 1)
        owner[name] = first.setdefault(body, name)
        sources[name] = text
    groups: dict[tuple[tuple[str, ...], bool], list[Lowered]] = {}
    for lk in kernels:
        if owner[lk.kernel.name] == lk.kernel.name:
            groups.setdefault((lk.needs, calls_only(lk.kernel)), []).append(lk)
    jobs = []
    for (needs, calls), ks in groups.items():
        head = prelude(options.fast_math) + f"/* dynshape build options {options.build_key()} */\n"
        head += "".join(_HELPERS[n][1] for n in needs)
        tag = "calls" if calls else "products" if needs else "fused"
        parts = _halves(ks, sources) if parallel else [ks]
        for i, part in enumerate(parts):
            src = head + "".join(sources[k.kernel.name] for k in part)
            jobs.append((src, f"{graph_name}_{tag}{i if len(parts) > 1 else ''}", [k.kernel.name for k in part],
                         needs, CALLS_FLAGS if calls else DEFAULT_FLAGS))
    jobs.sort(key=lambda j: -len(j[0]))  # the longest compile starts first
    helpers = {n for _, _, _, needs, _ in jobs for n in needs}
    packs = any(isinstance(x, PackedWeight) for lk in kernels for x in lk.inputs)
    # the static libraries first (on a cold cache ds_conv.c alone was 2.2 s of gcc, ds_gemm.c 1.2 s: started last,
    # after the kernels, they were DenseNet's 5.2 s cold build), only compiled here: loading follows the needs
    tasks: list[Callable[[], object]] = [_build_only(lib) for lib in _with_needs(
        [_HELPERS[n][0] for n in sorted(helpers)] + ([packed_gemm.LIBRARY] if packs else []))]
    tasks += [functools.partial(build_shared, src, name, flags=fl, openmp=True) for src, name, _, _, fl in jobs]
    if parallel and len(tasks) > 1:
        ctx = build_context()  # the workers build where this thread would (an artefact's libs/), offline if it is

        def run(task: Callable[[], object]) -> object:
            with adopt(ctx):
                return task()

        with foreground(), ThreadPoolExecutor(2) as pool:
            list(pool.map(run, tasks))
    else:
        for task in tasks:
            task()
    for n in sorted(helpers):  # loaded (symbols global) before the kernels that call them
        _HELPERS[n][0].load()
    out: dict[str, Compiled] = {}
    for src, name, names, _, fl in jobs:
        lib = compile_c(src, name, symbols=names, flags=fl, openmp=True)
        for k in names:
            fn = getattr(lib, k)
            fn.restype = None
            out[k] = Compiled(fn, sources[k], k)
    for lk in kernels:
        k = lk.kernel.name
        if k not in out:
            out[k] = Compiled(out[owner[k]].entry, sources[k], owner[k])
    return out
