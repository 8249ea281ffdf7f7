"""The constants Python and the C share (codegen/cshared.py -> the generated ds_shared.h): what a build that
includes the libraries' headers sees is what the lowerings use, field by field."""

from __future__ import annotations

import ctypes

from dynshape.codegen import cc, cshared
from dynshape.codegen.lower import conv, pool

_NAMES = ([f"DS_CONV_{f}" for f in (*cshared.CONV_GEO, "GEO")] + [f"DS_POOL_{f}" for f in (*cshared.POOL_GEO, "GEO")]
          + [f"DS_ACT_{a.name}" for a in cshared.Act] + [f"DS_POOL_{m.name}" for m in cshared.PoolMode]
          + ["DS_NR", "DS_CONV_ROWS", "DS_WINO_TILES", "DS_WINO4_TILES", "DS_CONV_AMX_MAX_KH"])


def test_the_c_headers_see_the_python_constants() -> None:
    """A C file including ds_conv.h, ds_pool.h and ds_gemm.h (as the libraries and generated kernels do) reports
    every shared constant; each equals cshared's."""
    source = ('#include "ds_conv.h"\n#include "ds_pool.h"\n#include "ds_gemm.h"\n'
              f"static const long long values[] = {{{', '.join(_NAMES)}}};\n"
              "long long ds_shared_value(int i) { return values[i]; }\n")
    lib = cc.compile_c(source, "shared_constants_probe", symbols=["ds_shared_value"])
    lib.ds_shared_value.argtypes, lib.ds_shared_value.restype = [ctypes.c_int], ctypes.c_longlong
    seen = {name: lib.ds_shared_value(i) for i, name in enumerate(_NAMES)}
    want = {**{f"DS_CONV_{f}": i for i, f in enumerate((*cshared.CONV_GEO, "GEO"))},
            **{f"DS_POOL_{f}": i for i, f in enumerate((*cshared.POOL_GEO, "GEO"))},
            **{f"DS_ACT_{a.name}": int(a) for a in cshared.Act}, **{f"DS_POOL_{m.name}": int(m) for m in
                                                                      cshared.PoolMode},
            "DS_NR": cshared.NR, "DS_CONV_ROWS": cshared.CONV_ROWS, "DS_WINO_TILES": cshared.WINO_TILES[2],
            "DS_WINO4_TILES": cshared.WINO_TILES[4], "DS_CONV_AMX_MAX_KH": cshared.CONV_AMX_MAX_KH}
    assert seen == want


def test_the_lowerings_take_the_shared_constants() -> None:
    """The lowerings' names for the shared values are cshared's (no second definition to drift)."""
    assert (conv.ACT_NONE, conv.ACT_RELU, conv.ACT_HARDSWISH, conv.ACT_SILU, conv.ACT_RELU6) == tuple(cshared.Act)
    assert conv.ROWS == cshared.CONV_ROWS and conv.WINO_TILES is cshared.WINO_TILES
    assert pool.POOL_GEO is cshared.POOL_GEO


def test_the_header_enters_every_build_key() -> None:
    """A change to the shared constants is a different build: the key of the same source and flags differs."""
    before = cc._cache_key("int x;", ["-O2"], [], "gcc")
    digest = cshared.DIGEST
    try:
        cshared.DIGEST = "another"
        assert cc._cache_key("int x;", ["-O2"], [], "gcc") != before
    finally:
        cshared.DIGEST = digest
    assert cc._cache_key("int x;", ["-O2"], [], "gcc") == before
