"""Compiled artefacts: `save` compiles a model once into a directory; `load` serves it without compiling.

Layout of an artefact directory OUT:
  model.onnx                       the model exactly as compiled
  config.json                      declared dims, specialisations and the options: everything `compile` was given
  signature.txt, signature.json    what every call's inputs must satisfy (for people and for tools)
  libs/                            the C build cache of this build: generated .c, built .so, sha256 sidecars
  manifest.json                    sha256 of every other file, dynshape version, compiler identity, machine tag

Why libs/ is a build cache: `save` builds into OUT/libs, so `compile_c` writes each library under its content
key; `load` points `compile_c` at the same directory in offline mode (`cc.offline`: keys use the compiler
identity the manifest records, no compiler is looked for or run, a missing library is an error, never a
compilation), where the same options make the same generated sources, hence the same keys. The manifest is
checked first, so a tampered, missing or unlisted file, or libraries built for another CPU, are refused before
any of them is loaded; so are options that would make different kernels.

Why the model comes in as a `ModelBuild` (runtime/model_build.py) and never as a file: reading ONNX, exporting
a torch graph to ONNX and inferring its types is the compile step's work (`dynshape.compiler`, the layer above),
so runtime does no frontend work and holds no frontend import (an import contract in pyproject.toml). `save`
asks the compile step for the typed build once its refusals are passed; `load` hands it the verified model
bytes and gets the typed build back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from dynshape.codegen import cc
from dynshape.errors import DynshapeError
from dynshape.ir.graph import Fact, Graph, describe_symbol, format_type
from dynshape.options import Options, make
from dynshape.runtime import artifact_io as aio
from dynshape.runtime.executable import Executable
from dynshape.runtime.memory import settled
from dynshape.runtime.model_build import BuildReader, CompileStep, ModelBuild
from dynshape.sym import is_expr, sym
from dynshape.sym.pysource import cond_from_json, cond_to_json

__all__ = ["FORMAT", "build_cache", "load", "save", "signature_json"]

FORMAT = "dynshape-artefact-1"
MODEL, CONFIG, MANIFEST, LIBS = "model.onnx", "config.json", "manifest.json", "libs"
_REQUIRED = (MODEL, CONFIG)
_env_lock = threading.RLock()

StepFn = Callable[[str, int, int], None]  # (what starts now, steps done, steps in all)


@contextmanager
def build_cache(path: Path) -> Iterator[None]:
    """Point this thread's builds at `path` (cc.pinned_cache_dir): other threads, such as background variant
    builds of other executables, keep their own cache, so the artefact gets exactly the libraries it lists.
    The lock serialises saves and loads within a process."""
    with _env_lock, cc.pinned_cache_dir(path):
        yield


# ---- saving ---------------------------------------------------------------------------------------------
def save(compile_step: CompileStep, out_dir: str | os.PathLike, specialize: list[Mapping[str, int]] | None = None,
         *, options: Options | None = None, on_step: StepFn | None = None, signing_key: bytes | str | None = None,
         **knobs: Any) -> Executable:
    """Build the typed model `compile_step` yields once and write the artefact to `out_dir`; returns the
    executable. `compile_step(step)` is called after the refusals that need no model (target, options), reports
    its own two steps through `step(label)` and returns a `ModelBuild` (the model's ONNX bytes, its inferred
    graph with the requirements to keep, its declared dims): `dynshape.compiler.artifact.save` makes it from a
    path, bytes, ModelProto or Graph.
    `options` / keyword options as for `ds.compile` (the strategy is always generic: a loaded artefact never
    compiles, so it cannot build variants as calls arrive).

    The directory is built beside `out_dir` and swapped into place at the end (artifact_io: atomically, under a
    lock, so concurrent saves to one OUT each leave a whole artefact and a killed one leaves the old), so a
    failed build leaves nothing half-written; an existing artefact there is replaced, any other non-empty
    directory is refused. `signing_key` adds an HMAC-SHA256 of the manifest that `load(..., signing_key=...)`
    verifies (see artifact_io: artefacts are native code; load only your own).
    """
    out = Path(out_dir)
    _check_target(out)
    opts = make(options, **knobs)
    if opts.strategy not in ("auto", "generic") or opts.auto_specialize or opts.profile or opts.buckets:
        raise DynshapeError("an artefact serves its generic build and the declared specialisations only: "
                            "strategy, auto_specialize, profile and buckets are for ds.compile")
    opts = opts.replace(strategy="generic", cache_dir=None)
    specs = [dict(s) for s in specialize or []]
    total, done = 4 + len(specs), 0  # the compile step's two, kernels, one per variant, writing

    def step(label: str) -> None:
        nonlocal done
        if on_step is not None:
            on_step(label, done, total)
        done += 1

    tmp = aio.new_tmpdir(out)
    try:
        build = compile_step(step)
        if not isinstance(build, ModelBuild):
            raise TypeError(f"the compile step returned {type(build).__name__}, not a ModelBuild")
        graph, dims, data = build.graph, build.dims, build.model
        with build_cache(tmp / LIBS):
            step("compiling kernels")
            exe = Executable(graph, None, opts)
            names = [s.name for s in exe.symbols]
            for spec in specs:
                unknown = sorted(set(spec) - set(names))
                if unknown:
                    raise DynshapeError(f"specialize {spec}: the model has no symbol {unknown} (its symbols: "
                                        f"{', '.join(names) or 'none'})")
                step("variant " + ", ".join(f"{k}={v}" for k, v in spec.items()))
                exe.add_variant(spec)
            if exe.has_empty_build:  # its kernels ship too: load never compiles
                step("empty-tensor build")
                exe.empty_build()
            _native_helpers(graph)
        step("writing artefact")
        config = {"dims": {n: _dim_json(n, d) for n, d in (dims or {}).items()},
                  "specialize": [{k: int(v) for k, v in s.items()} for s in specs], "options": opts.to_json(),
                  "requires": [{"origin": f.origin, **cond_to_json(f.check)} for f in graph.requires]}
        (tmp / MODEL).write_bytes(data)
        (tmp / CONFIG).write_text(json.dumps(config, indent=1) + "\n")
        (tmp / "signature.txt").write_text(str(graph.signature) + "\n")
        (tmp / "signature.json").write_text(json.dumps(signature_json(graph), indent=1) + "\n")
        (tmp / LIBS).mkdir(exist_ok=True)
        manifest = {"format": FORMAT, "dynshape": _version(), **_toolchain(),
                    "files": {rel: _sha256(tmp / rel) for rel in _files(tmp) if rel != ".owner"}}
        if signing_key is not None:
            manifest = aio.sign(manifest, signing_key)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        _check_target(out)  # again: another process may have put something else there meanwhile
        aio.swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if on_step is not None:
        on_step("done", total, total)
    return exe


def _check_target(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise DynshapeError(f"{out} is a file; give a directory for the artefact")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise DynshapeError(f"{out} is a non-empty directory that is not a dynshape artefact; refusing to overwrite "
                            "it: choose a new or empty directory")


def _dim_json(name: str, d: Any) -> int | dict:
    """A `dims` declaration as JSON: an int, or the symbol it makes (name, min, max, multiple_of)."""
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        return int(d)
    if isinstance(d, tuple) and len(d) == 2:
        d = {"min": d[0], "max": d[1]}
    if isinstance(d, Mapping):
        return {"name": name, "min": int(d.get("min", 1)), "max": d.get("max"),
                "multiple_of": int(d.get("multiple_of", 1))}
    if is_expr(d) and d.is_atom():
        a = d.atom()
        return {"name": a.name, "min": a.lo, "max": a.hi, "multiple_of": a.mult}
    raise DynshapeError(f"dims[{name!r}] = {d}: an artefact records ints, ranges and plain symbols only")


def _dims_from_json(dims: dict) -> dict[str, Any]:
    return {n: d if isinstance(d, int) else sym(d["name"], d["min"], d["max"], d["multiple_of"])
            for n, d in dims.items()}


def signature_json(graph: Graph) -> dict:
    """The signature as plain data: symbols with ranges, facts with origins, input and output types."""
    syms = []
    for s in graph.signature.symbols.values():
        a = s.atom()
        syms.append({"name": a.name, "min": a.lo, "max": a.hi, "multiple_of": a.mult, "text": describe_symbol(s)})
    return {
        "symbols": syms,
        "facts": [{"kind": f.kind, "text": f.text, "origin": f.origin} for f in graph.signature.facts],
        "inputs": [{"name": v.name, "type": format_type(graph.types.get(v.name), v.dtype)} for v in graph.inputs],
        "outputs": [{"name": v.name, "type": format_type(graph.types.get(v.name), v.dtype)} for v in graph.outputs],
    }


def _native_helpers(graph: Graph, build: bool = True) -> None:
    """Build (save) or fetch (load) the C helpers the lowerings compile lazily, inside the artefact's libs/.

    Building them here and loading them into the process at load time means a run never compiles them.
    """
    from dynshape.codegen import native_helpers

    if build:
        native_helpers.build_all()
    native_helpers.load_all()


def _loaded_options(out: Path, saved: Options, overrides: Mapping[str, Any], config: dict) -> Options:
    """The saved options with the caller's serving overrides; a kernel-changing difference is refused now."""
    build_fields = set(saved.build_fields())
    changed = {k: v for k, v in overrides.items() if k in build_fields and getattr(saved, k) != v}
    if changed:
        what = ", ".join(f"{k}={v!r} (built with {getattr(saved, k)!r})" for k, v in changed.items())
        raise DynshapeError(f"artefact {out} was built with other kernel options: {what}; rebuild it with those "
                            f"options: {_rebuild_hint(out, config)}")
    for k in ("strategy", "auto_specialize", "profile", "buckets"):
        if k in overrides:
            raise DynshapeError(f"ds.load(..., {k}=...): a loaded artefact never compiles, so it serves its "
                                "generic build and declared specialisations only")
    return make(saved, **{k: v for k, v in overrides.items() if k not in build_fields})


# ---- loading --------------------------------------------------------------------------------------------
def load(out_dir: str | os.PathLike, read_build: BuildReader, *, signing_key: bytes | str | None = None,
         **overrides: Any) -> Executable:
    """The executable saved in `out_dir`, after verifying every file; never invokes the C compiler.

    `read_build(model bytes, dims, requirements)` is the compile step's reader of the verified model.onnx
    (`dynshape.compiler.artifact.load` passes it): it returns the typed build this loads and runs.
    `overrides`: options of how calls are served (memory_budget, preallocate, arenas, ...). Options that change
    the kernels must match the artefact's (they are compared before anything is built): rebuild otherwise.
    `signing_key`: refuse the artefact unless its manifest carries a matching HMAC (`save(..., signing_key=)`).
    The directory is read under a shared lock: a concurrent save swaps its artefact in before or after, never
    during."""
    out = Path(out_dir)
    if not out.exists() and out.parent.is_dir():
        with aio.locked(out.parent):
            aio.restore_interrupted(out)  # a save killed between its two renames left the artefact aside
    with aio.locked(out.parent, shared=True):
        return _load(out, read_build, signing_key, overrides)


def _load(out: Path, read_build: BuildReader, signing_key: bytes | str | None,
          overrides: Mapping[str, Any]) -> Executable:
    manifest = _read_manifest(out)
    if signing_key is not None:
        aio.verify_signature(manifest, signing_key, f"artefact {out}")
    contents = _verify(out, manifest)
    config, dims, specialize, saved = _parse_config(out, contents[CONFIG])
    requires = config.get("requires", [])
    if not isinstance(requires, list) or not all(isinstance(r, dict) for r in requires):
        raise DynshapeError(f"artefact {out}: {CONFIG} is malformed ('requires' is not a list of conditions); "
                            "rebuild it with `dynshape compile`")
    opts = _loaded_options(out, saved, overrides, config)
    libs = out / LIBS
    if any(rel.startswith(LIBS + "/") for rel in manifest["files"]):
        _check_machine(out, manifest, config)
    with build_cache(libs), cc.offline(manifest.get("compiler") or "none"):
        graph = _load_graph(read_build, contents[MODEL], dims, requires, out)
        try:
            exe = Executable(graph, specialize, opts)
            if exe.has_empty_build:  # saved beside the main build; made now, while the libraries are at hand
                exe.empty_build()
        except cc.CompileError as e:  # a library the manifest's compiler identity does not find
            raise DynshapeError(f"artefact {out} does not hold the libraries this model needs under the compiler "
                                f"its manifest names ({_first_line(manifest.get('compiler'))}): the artefact is "
                                f"damaged or was made by another dynshape ({e}); rebuild it: "
                                f"{_rebuild_hint(out, config)}") from None
        _native_helpers(graph, build=False)
    built = sorted(set(_files(libs, LIBS + "/")) - set(manifest["files"]))
    if built:  # a guard, not a path: the checks above make identical sources, hence identical keys
        for rel in built:
            (out / rel).unlink(missing_ok=True)
        raise DynshapeError(f"artefact {out} lacks kernels this dynshape generates ({', '.join(built)}); "
                            f"rebuild it: {_rebuild_hint(out, config)}")
    return settled(exe)


def _load_graph(read_build: BuildReader, model: bytes, dims: dict, requires: list, out: Path) -> Graph:
    """The saved model, typed by the compile step's reader, with its stated requirements (config.json's
    "requires") handed to it to re-attach before inference."""
    symbols = {v.atom().name: v for v in dims.values() if is_expr(v)}
    try:
        facts = [Fact("require", str(r["text"]), str(r["origin"]), cond_from_json(r, symbols)) for r in requires]
    except (KeyError, TypeError, DynshapeError) as e:
        raise DynshapeError(f"artefact {out}: {CONFIG} has a malformed requirement ({e}); rebuild it") from None
    build = read_build(model, dims, facts)
    if not isinstance(build, ModelBuild):
        raise TypeError(f"the build reader returned {type(build).__name__}, not a ModelBuild")
    return build.graph


def _parse_config(out: Path, data: bytes) -> tuple[dict, dict[str, Any], list[dict], Options]:
    """config.json checked field by field: a dims mapping of ints or symbol records, a list of specialisations
    (symbol -> int), the options; anything else is one error naming the file, never a traceback."""

    def bad(why: str) -> DynshapeError:
        return DynshapeError(f"artefact {out}: {CONFIG} is malformed ({why}); rebuild it with `dynshape compile`")

    try:
        config = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"not JSON: {e}") from None
    if not isinstance(config, dict):
        raise bad(f"a {type(config).__name__}, not an object")
    dims, specialize = config.get("dims"), config.get("specialize")
    if not isinstance(dims, dict):
        raise bad(f"'dims' is {type(dims).__name__}, not an object of name -> dim")
    for name, d in dims.items():
        ok = (isinstance(d, int) and not isinstance(d, bool)) or (
            isinstance(d, dict) and isinstance(d.get("name"), str) and isinstance(d.get("min"), int)
            and (d.get("max") is None or isinstance(d.get("max"), int)) and isinstance(d.get("multiple_of"), int))
        if not ok:
            raise bad(f"dims[{name!r}] = {d!r} is neither an int nor {{name, min, max, multiple_of}}")
    if not isinstance(specialize, list) or not all(
            isinstance(sp, dict) and all(isinstance(v, int) and not isinstance(v, bool) for v in sp.values())
            for sp in specialize):
        raise bad("'specialize' is not a list of {symbol: int}")
    try:
        return config, _dims_from_json(dims), [dict(sp) for sp in specialize], Options.from_json(config["options"])
    except (ValueError, KeyError, TypeError, AttributeError, DynshapeError) as e:
        raise bad(f"{type(e).__name__}: {e}") from None


def _read_manifest(out: Path) -> dict:
    path = out / MANIFEST
    if not path.exists() and not path.is_symlink():
        raise DynshapeError(f"{out} is not a dynshape artefact (no {MANIFEST}); create one with "
                            f"`dynshape compile MODEL.onnx -o {out}`")
    data = aio.read_regular(path, f"artefact {out}", "rebuild it with `dynshape compile`", aio.SMALL_FILE_LIMIT)
    try:
        manifest = json.loads(data)
        files = manifest["files"]
        assert isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
    except (ValueError, KeyError, TypeError, AssertionError, UnicodeDecodeError):
        raise DynshapeError(f"artefact {out}: {MANIFEST} is malformed; rebuild it with `dynshape compile`") from None
    if manifest.get("format") != FORMAT:
        raise DynshapeError(f"artefact {out} has format {manifest.get('format')!r}, this dynshape reads {FORMAT!r}; "
                            "rebuild it with `dynshape compile`")
    if manifest.get("dynshape") != _version():
        raise DynshapeError(f"artefact {out} was built by dynshape {manifest.get('dynshape')}, this is {_version()}: "
                            "its generated kernels may differ; rebuild it with `dynshape compile`")
    return manifest


def _verify(out: Path, manifest: dict) -> dict[str, bytes]:
    """Check every listed file against its sha256 and that libs/ holds nothing unlisted; returns required files."""
    files: dict[str, str] = manifest["files"]
    hint = f"rebuild it with `dynshape compile MODEL.onnx ... -o {out}`"
    for rel in _REQUIRED:
        if rel not in files:
            raise DynshapeError(f"artefact {out}: {MANIFEST} does not list {rel}; {hint}")
    aio.check_tree(out, f"artefact {out}", hint)
    contents = {}
    for rel, digest in sorted(files.items()):
        path = out / rel
        if not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise DynshapeError(f"artefact {out}: {MANIFEST} lists {rel!r}, which is outside the artefact; {hint}")
        data = aio.read_regular(path, f"artefact {out}", hint, aio.SMALL_FILE_LIMIT if rel == CONFIG else None)
        if hashlib.sha256(data).hexdigest() != digest:
            raise DynshapeError(f"artefact {out}: {rel} does not match its sha256 in {MANIFEST} (modified or "
                                f"corrupted); {hint}")
        if rel in _REQUIRED:
            contents[rel] = data
    extra = [rel for rel in _files(out / LIBS, LIBS + "/") if rel not in files]
    if extra:
        raise DynshapeError(f"artefact {out}: {', '.join(extra)} is not listed in {MANIFEST}; refusing to load "
                            f"unverified libraries: remove it or {hint}")
    return contents


def _check_machine(out: Path, manifest: dict, config: dict) -> None:
    """Native code is only valid on the CPU it was built for (-march=native)."""
    here = cc.machine_tag()
    if manifest.get("machine") != here:
        diff = _machine_diff(manifest.get("machine"), here)
        raise DynshapeError(f"artefact {out} was built for another machine ({diff}): its kernels target that CPU "
                            f"(-march=native) and may not run here; rebuild it on this machine: "
                            f"{_rebuild_hint(out, config)}")


def _rebuild_hint(out: Path, config: dict) -> str:
    """The `dynshape compile` command that rebuilds this artefact from its own model.onnx and config."""
    parts = ["dynshape compile", str(out / MODEL)]
    dims = config.get("dims") if isinstance(config, dict) else None
    for name, d in (dims.items() if isinstance(dims, dict) else ()):
        if isinstance(d, int):
            parts.append(f"--dim {name}={d}")
        elif isinstance(d, dict):
            mult = f":{d['multiple_of']}" if d.get("multiple_of", 1) > 1 else ""
            parts.append(f"--dim {name}={d.get('min', '')}:{'' if d.get('max') is None else d['max']}{mult}")
    specs = config.get("specialize") if isinstance(config, dict) else None
    for spec in (specs if isinstance(specs, list) else ()):
        if isinstance(spec, dict):
            parts.append("--specialize " + ",".join(f"{k}={v}" for k, v in spec.items()))
    parts.append(f"-o {out.parent / (out.name + '-rebuilt')}")
    return "`" + " ".join(parts) + "`"


# ---- small helpers --------------------------------------------------------------------------------------
def _toolchain() -> dict[str, str | None]:
    """Compiler identity (None without a compiler) and machine tag: what the libraries' cache keys bind to."""
    try:
        compiler: str | None = cc.compiler_identity()
    except cc.CompileError:
        compiler = None
    return {"compiler": compiler, "machine": cc.machine_tag()}


def _machine_diff(built: str | None, here: str) -> str:
    """`built for X; this one: Y`, naming the CPU models, or the features when only those differ."""

    def cpu(tag: str | None) -> str:
        lines = (tag or "unknown").splitlines()
        models = sorted({ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")})
        return ", ".join(lines[:1] + models)

    if cpu(built) != cpu(here):
        return f"built for {cpu(built)}; this one: {cpu(here)}"
    return f"same CPU model ({cpu(here)}) but different CPU features"


def _first_line(text: str | None) -> str:
    return "none" if not text else " | ".join(text.splitlines()[:2])


def _files(root: Path, prefix: str = "") -> list[str]:
    """Relative POSIX paths of the regular files under root, sorted."""
    if not root.is_dir():
        return []
    return sorted(prefix + p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _version() -> str:
    from dynshape import __version__

    return __version__
