"""The constants that Python and the static C share, each defined once, here: the C reads them from a header made
from this module (`ds_shared.h`, on every build's include path; its digest in every build's cache key), the
lowerings import them.

Why: a lowering fills an array the C reads by position (a conv's or pool's geometry), passes a code the C switches
on (an activation, a pool's mode) or sizes scratch the C fills (Winograd's chunks); these were defined twice, in a
.h and in a .py, kept equal by a comment, so a field added on one side only would have shifted every field after it
with no error.
"""

from __future__ import annotations

import atexit
import enum
import functools
import hashlib
import shutil
import tempfile
from pathlib import Path

HEADER = "ds_shared.h"

NR = 32  # columns of a packed weight panel: two 16-float vectors (DS_NR)
CONV_ROWS = 60  # output pixels per block of ds_conv_tile2: a multiple of every micro-tile height (DS_CONV_ROWS)
WINO_TILES = {2: 96, 4: 48}  # tiles per chunk of ds_wino_f2 / ds_wino_f4 (DS_WINO_TILES, DS_WINO4_TILES)
# window rows of a direct AMX conv whose rows end in a half chunk (ds_conv_amx_tile2 keeps a B tile each on its
# stack: 2 KB a row): conv_amx.fits admits no taller window (DS_CONV_AMX_MAX_KH)
CONV_AMX_MAX_KH = 16
# a narrow conv's padded copy holds pixels of the first of these channel counts at least C (ds_conv_amx_narrow_cp;
# bf16.narrow_channels): whole bf16 pairs in any window row, 16 / Cp pixels a vector; a window row of KW x Cp
# values is one tile row of at most NARROW_ROW values (64 bytes)
NARROW_PIXEL_CHANNELS = (2, 4, 8)
NARROW_ROW = 32


class Act(enum.IntEnum):
    """What a conv's tiles apply after their bias (DS_ACT_*; csrc/ds_conv_common.h's ds_act)."""

    NONE = 0
    RELU = 1
    HARDSWISH = 2
    SILU = 3
    RELU6 = 4  # Clip(c, 0, 6): MobileNetV2's


class PoolMode(enum.IntEnum):
    """How ds_pool_row reduces a window (DS_POOL_*): the max, the mean over the taps inside the input, or over the
    padded input's (count_include_pad)."""

    MAX = 0
    AVG = 1
    AVG_PADS = 2


class ReduceOp(enum.IntEnum):
    """What ds_reduce_f32 computes over each slice (DS_REDUCE_*; csrc/ds_rows.c): a sum, its mean, the largest or
    smallest element (NaN kept), the square root of the sum of squares (ConvNeXt V2's global response norm), the sum
    of squares, the sum of magnitudes."""

    SUM = 0
    MEAN = 1
    MAX = 2
    MIN = 3
    L2 = 4
    SUM_SQUARE = 5
    L1 = 6


class ScatterReduction(enum.IntEnum):
    """How ds_scatter_nd / ds_scatter_elements combine an update with the element at its index (DS_SCATTER_*)."""

    NONE = 0
    ADD = 1
    MUL = 2


class ScatterType(enum.IntEnum):
    """The element type a scatter's reduction computes in (DS_SCATTER_*; OTHER: bytes copied, no reduction)."""

    OTHER = 0
    F32 = 1
    F64 = 2
    I32 = 3
    I64 = 4


SCATTER_MAX_RANK = 16  # the C's index counters (DS_SCATTER_MAX_RANK)
# a ScatterND's and a ScatterElements' table (DS_SCATTER_ND_<field>, DS_SCATTER_EL_<field>; csrc/ds_scatter.c):
# the fields both begin with (DS_SCATTER_AT_<field>: one reader in the C), their own, then the geometry (shape,
# then the output's byte strides)
SCATTER_CALL = ("ITEMSIZE", "I32", "REDUCTION", "TYPE", "NBYTES", "OUT", "X", "IDX", "UPD")
SCATTER_ND = (*SCATTER_CALL, "K", "M", "SLICE")
SCATTER_EL = (*SCATTER_CALL, "RANK", "AXIS", "N")
# a conv's geometry array (DS_CONV_<field> is its index; csrc/ds_conv.h says what each holds)
CONV_GEO = ("H", "W", "C", "OH", "OW", "OC", "KH", "KW", "SH", "SW", "DH", "DW", "PT", "PL", "G", "CG", "OCG",
            "LDY", "ACT", "NPIX", "WREST", "XBF", "YBF", "RBF")
# a pool's geometry array (DS_POOL_<field>; csrc/ds_pool.h)
POOL_GEO = ("H", "W", "C", "OH", "OW", "KH", "KW", "SH", "SW", "DH", "DW", "PT", "PL", "PB", "PR", "MODE")


def _enum(prefix: str, names: tuple[str, ...], last: str) -> str:
    return f"enum {{ {', '.join(f'{prefix}_{n}' for n in names)}, {prefix}_{last} }};\n"


def header() -> str:
    """The text of ds_shared.h."""
    return "".join([
        "/* Generated from src/dynshape/codegen/cshared.py: the constants Python and the C share. Do not edit. */\n",
        "#ifndef DS_SHARED_H\n#define DS_SHARED_H\n",
        f"#define DS_NR {NR}\n#define DS_CONV_ROWS {CONV_ROWS}\n",
        f"#define DS_WINO_TILES {WINO_TILES[2]}\n#define DS_WINO4_TILES {WINO_TILES[4]}\n",
        f"#define DS_CONV_AMX_MAX_KH {CONV_AMX_MAX_KH}\n",
        "#define DS_NARROW_CP(c) (" + "".join(f"(c) <= {n} ? {n} : " for n in NARROW_PIXEL_CHANNELS[:-1])
        + f"{NARROW_PIXEL_CHANNELS[-1]})\n#define DS_NARROW_ROW {NARROW_ROW}\n",
        "enum { " + ", ".join(f"DS_ACT_{a.name} = {a.value}" for a in Act) + " };\n",
        "enum { " + ", ".join(f"DS_POOL_{m.name} = {m.value}" for m in PoolMode) + " };\n",
        _enum("DS_CONV", CONV_GEO, "GEO"),
        _enum("DS_POOL", POOL_GEO, "GEO"),
        "enum { " + ", ".join(f"DS_REDUCE_{r.name} = {r.value}" for r in ReduceOp) + " };\n",
        "enum { " + ", ".join(f"DS_SCATTER_{r.name} = {r.value}" for r in ScatterReduction) + " };\n",
        "enum { " + ", ".join(f"DS_SCATTER_{t.name} = {t.value}" for t in ScatterType) + " };\n",
        f"#define DS_SCATTER_MAX_RANK {SCATTER_MAX_RANK}\n",
        _enum("DS_SCATTER_AT", SCATTER_CALL, "END"),
        _enum("DS_SCATTER_ND", SCATTER_ND, "GEO"),
        _enum("DS_SCATTER_EL", SCATTER_EL, "GEO"),
        "#endif\n"])


DIGEST = hashlib.sha256(header().encode()).hexdigest()


@functools.cache
def include_dir() -> Path:
    """A directory holding ds_shared.h, made once per process (a temporary one: the package's own csrc/ may be
    read-only where it is installed), for every build's -I."""
    where = Path(tempfile.mkdtemp(prefix="dynshape-include-"))
    atexit.register(shutil.rmtree, where, True)
    (where / HEADER).write_text(header())
    return where
