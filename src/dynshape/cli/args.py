"""Parsers for the option mini-languages (`--dim`, shapes, `--input`, `--random`).

Malformed syntax is a bad invocation (`typer.BadParameter`, exit 2). Well-formed values that the model
rejects (min > max, a dim the model does not have) go on to `load_onnx`, whose message says why (exit 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

_NAME = r"[A-Za-z_][\w.\-]*"
_DIM = re.compile(rf"^({_NAME})=(\d*)(?::(\d*))?(?::(\d+))?$")


def parse_dims(specs: list[str] | None) -> dict[str, Any]:
    """`NAME=MIN:MAX[:MULTIPLE]` (either bound may be empty) or `NAME=VALUE` (fixed) -> load_onnx `dims`."""
    out: dict[str, Any] = {}
    for spec in specs or []:
        m = _DIM.match(spec.replace(" ", ""))
        if not m or (m.group(3) is None and not m.group(2)):
            raise typer.BadParameter(f"{spec!r}: expected NAME=MIN:MAX[:MULTIPLE] or NAME=VALUE, e.g. seq=1:512:8",
                                     param_hint="--dim")
        name, lo, hi, mult = m.groups()
        if name in out:
            raise typer.BadParameter(f"{name!r} is declared twice", param_hint="--dim")
        if hi is None:  # NAME=VALUE
            out[name] = int(lo)
            continue
        decl: dict[str, int] = {}
        if lo:
            decl["min"] = int(lo)
        if hi:
            decl["max"] = int(hi)
        if mult:
            decl["multiple_of"] = int(mult)
        out[name] = decl
    return out


def parse_shape(text: str, hint: str) -> tuple[int, ...]:
    """`2x16`, `2,16` or `7` -> (2, 16) / (7,); `()` or `scalar` -> ()."""
    t = text.strip()
    if t in ("()", "scalar", ""):
        return ()
    parts = re.split(r"[x,]", t)
    if not all(p.strip().isdigit() for p in parts):
        raise typer.BadParameter(f"{text!r}: a shape is non-negative integers separated by 'x' or ',', e.g. 2x16",
                                 param_hint=hint)
    return tuple(int(p) for p in parts)


def parse_shapes(text: str | None) -> list[tuple[int, ...]]:
    """`1x16,8x128` -> [(1, 16), (8, 128)] (a comma separates shapes here, so dims use 'x')."""
    if not text:
        return []
    return [parse_shape(s, "--shapes") for s in text.split(",")]


def _split_assign(spec: str, hint: str, example: str) -> tuple[str, str]:
    name, eq, rest = spec.partition("=")
    if not eq or not name.strip() or not rest.strip():
        raise typer.BadParameter(f"{spec!r}: expected {example}", param_hint=hint)
    return name.strip(), rest.strip()


def parse_inputs(specs: list[str] | None) -> dict[str, Path]:
    """`name=file.npy` pairs; a file that does not exist is a bad invocation."""
    out: dict[str, Path] = {}
    for spec in specs or []:
        name, file = _split_assign(spec, "--input", "NAME=FILE.npy")
        path = Path(file)
        if not path.is_file():
            raise typer.BadParameter(f"{spec!r}: file {file!r} does not exist", param_hint="--input")
        out[name] = path
    return out


@dataclass(frozen=True)
class RandomSpec:
    shape: tuple[int, ...]
    low: float | None = None
    high: float | None = None


def parse_randoms(specs: list[str] | None) -> dict[str, RandomSpec]:
    """`name=SHAPE[:LOW:HIGH]`, e.g. `x=2,16` or `input_ids=2x16:0:1000` (integers drawn from [LOW, HIGH))."""
    out: dict[str, RandomSpec] = {}
    for spec in specs or []:
        name, rest = _split_assign(spec, "--random", "NAME=SHAPE[:LOW:HIGH], e.g. input_ids=2,16:0:100")
        parts = rest.split(":")
        if len(parts) not in (1, 3):
            raise typer.BadParameter(f"{spec!r}: give both LOW and HIGH or neither (NAME=SHAPE[:LOW:HIGH])",
                                     param_hint="--random")
        shape = parse_shape(parts[0], "--random")
        if len(parts) == 1:
            out[name] = RandomSpec(shape)
            continue
        try:
            low, high = float(parts[1]), float(parts[2])
        except ValueError:
            raise typer.BadParameter(f"{spec!r}: LOW and HIGH must be numbers", param_hint="--random") from None
        if not low < high:
            raise typer.BadParameter(f"{spec!r}: LOW must be below HIGH", param_hint="--random")
        out[name] = RandomSpec(shape, low, high)
    return out
