"""Artefacts: save once, load without compiling, and refuse anything that is not exactly what was built here."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen import cc
from dynshape.compiler import artifact
from tolerance import assert_f32_close


def _model() -> onnx.ModelProto:
    """y = erf(relu(x @ W + B) * 0.5): an elementwise tail the compiler fuses into one C kernel."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Add", ["h", "B"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Mul", ["r", "half"], ["m"]),
             helper.make_node("Erf", ["m"], ["y"])]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "B"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _x(b: int) -> np.ndarray:
    return np.random.default_rng(b).standard_normal((b, 4)).astype(np.float32)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNSHAPE_CACHE_DIR", str(tmp_path / "user-cache"))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """One artefact per module; tests that damage it work on a copy."""
    out = tmp_path_factory.mktemp("art") / "tiny.ds"
    artifact.save(_model(), out, dims={"batch": (1, 8)}, specialize=[{"batch": 2}])
    return out


@pytest.fixture
def copy(built, tmp_path) -> Path:
    dst = tmp_path / "copy.ds"
    shutil.copytree(built, dst)
    return dst


def _no_compiler(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the C compiler was invoked")

    monkeypatch.setattr(cc, "_compile", refuse)


def _rewrite_manifest(out: Path, **changes) -> None:
    path = out / artifact.MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_layout_and_manifest(built):
    manifest = json.loads((built / "manifest.json").read_text())
    files = manifest["files"]
    assert {"model.onnx", "config.json", "signature.txt", "signature.json"} <= set(files)
    libs = [f for f in files if f.startswith("libs/")]
    assert any(f.endswith(".so") for f in libs) and any(f.endswith(".c") for f in libs)
    assert manifest["dynshape"] == ds.__version__ and manifest["machine"] and manifest["compiler"]
    assert json.loads((built / "config.json").read_text())["specialize"] == [{"batch": 2}]
    assert "batch in [1, 8]" in (built / "signature.txt").read_text()
    sig = json.loads((built / "signature.json").read_text())
    assert sig["symbols"][0] | {"text": None} == {"name": "batch", "min": 1, "max": 8, "multiple_of": 1, "text": None}


def test_load_runs_like_the_model_without_compiling(built, monkeypatch):
    _no_compiler(monkeypatch)
    exe = artifact.load(built)
    graph = ds.load_onnx(_model(), dims={"batch": (1, 8)})
    assert list(exe.variants) == [(2,)]
    for b in (1, 2, 5):
        assert_f32_close(exe.run({"x": _x(b)})["y"], graph.run({"x": _x(b)})["y"], rtol=1e-5, scale=1e-6)
    assert exe.stats()["hits"] == {"generic": 2, "{'batch': 2}": 1}
    with pytest.raises(ds.ConstraintViolation, match="batch"):
        exe.run({"x": _x(9)})


def test_a_fresh_process_never_invokes_the_compiler(tmp_path, monkeypatch):
    """Across processes, with a compiler wrapper that logs every build: saving builds, loading and running do not.

    The saves count their builds in this process (`cc._compile`) with the usual compiler, so they reuse what the
    session built (tests/shared_builds.py); the wrapper is the fresh processes' compiler: a wrapper here made
    every library a new key, ~30 s of gcc."""
    log = tmp_path / "cc.log"
    wrapper = tmp_path / "cc-logged"
    real = shutil.which("cc") or shutil.which("gcc")
    if real is None:
        pytest.skip("no C compiler to wrap")
    wrapper.write_text(f'#!/bin/sh\ncase "$*" in *--version*) ;; *) echo build >> {log};; esac\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    builds, compile_ = [], cc._compile

    def counted(source, name, *args):
        builds.append(name)
        return compile_(source, name, *args)

    monkeypatch.setattr(cc, "_compile", counted)
    artifact.save(_model(), tmp_path / "fused.ds", dims={"batch": (1, 8)})
    artifact.save(_model(), tmp_path / "unfused.ds", dims={"batch": (1, 8)}, fuse=False)  # erf via its C helper
    artifact.save(_model(), tmp_path / "undeclared.ds")  # batch may be 0: the empty-tensor build ships too
    assert len(builds) >= 2, builds
    monkeypatch.setenv("CC", str(wrapper))
    log.write_text("")
    assert subprocess.run([str(wrapper), "-x", "c", "-", "-fsyntax-only"], input="int x;", text=True).returncode == 0
    assert log.read_text().count("build") == 1  # the wrapper logs what it compiles
    log.write_text("")
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        from dynshape.compiler import artifact
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from tolerance import assert_f32_close
        x = np.ones((3, 4), np.float32)
        a = artifact.load({str(tmp_path / "fused.ds")!r}).run({{"x": x}})["y"]
        b = artifact.load({str(tmp_path / "unfused.ds")!r}).run({{"x": x}})["y"]
        assert_f32_close(a, b, rtol=1e-5, scale=1e-6)
        u = artifact.load({str(tmp_path / "undeclared.ds")!r})
        assert_f32_close(u.run({{"x": x}})["y"], a, rtol=1e-5, scale=1e-6)
        assert u.run({{"x": np.ones((0, 4), np.float32)}})["y"].shape == (0, a.shape[1])
    """)
    env = {**os.environ, "DYNSHAPE_CACHE_DIR": str(tmp_path / "empty-cache")}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert log.read_text().count("build") == 0
    # loading looks for no compiler at all: a CC that does not exist changes nothing
    r = subprocess.run([sys.executable, "-c", script], env={**env, "CC": str(tmp_path / "no-such-cc")},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "empty-cache").exists()


@pytest.mark.parametrize("victim", ["model.onnx", "config.json", "lib"])
def test_a_tampered_file_is_named(copy, victim):
    rel = next(f for f in json.loads((copy / "manifest.json").read_text())["files"] if f.endswith(".so")) \
        if victim == "lib" else victim
    data = bytearray((copy / rel).read_bytes())
    data[-1] ^= 1
    (copy / rel).write_bytes(bytes(data))
    with pytest.raises(ds.DynshapeError, match=f"{rel} does not match its sha256"):
        artifact.load(copy)


def test_a_missing_file_is_named(copy):
    (copy / "config.json").unlink()
    with pytest.raises(ds.DynshapeError, match="missing config.json"):
        artifact.load(copy)


def test_an_unlisted_library_is_refused(copy):
    so = next((copy / "libs").rglob("*.so"))
    shutil.copy(so, so.with_name("planted.so"))
    with pytest.raises(ds.DynshapeError, match="planted.so is not listed"):
        artifact.load(copy)


def test_another_machine_is_refused_with_the_rebuild_command(copy, monkeypatch):
    _rewrite_manifest(copy, machine="riscv64\nmodel name\t: Imaginary Core 9\nflags\t\t: none")
    _no_compiler(monkeypatch)
    with pytest.raises(ds.DynshapeError, match="another machine") as e:
        artifact.load(copy)
    msg = str(e.value)
    assert "riscv64, Imaginary Core 9" in msg
    assert f"dynshape compile {copy / 'model.onnx'} --dim batch=1:8 --specialize batch=2" in msg


def test_another_compiler_or_version_is_refused(copy, monkeypatch):
    """Loading never looks for a compiler: the libraries are found under the compiler identity the manifest names,
    so a manifest naming another compiler finds none of them, and says so."""
    _no_compiler(monkeypatch)
    _rewrite_manifest(copy, compiler="/opt/tcc\ntcc version 0.9.27")
    with pytest.raises(ds.DynshapeError, match="compiler its manifest names.*tcc version 0.9.27"):
        artifact.load(copy)
    _rewrite_manifest(copy, dynshape="0.0.1")
    with pytest.raises(ds.DynshapeError, match="built by dynshape 0.0.1"):
        artifact.load(copy)


def test_a_directory_without_manifest_is_not_an_artefact(tmp_path):
    with pytest.raises(ds.DynshapeError, match="not a dynshape artefact"):
        artifact.load(tmp_path)


def test_save_replaces_an_artefact_but_not_other_directories(copy, tmp_path):
    artifact.save(_model(), copy, dims={"batch": (1, 8)}, specialize=[{"batch": 3}, {"batch": 4}])
    assert list(artifact.load(copy).variants) == [(3,), (4,)]
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    with pytest.raises(ds.DynshapeError, match="not a dynshape artefact; refusing to overwrite"):
        artifact.save(_model(), other)
    assert (other / "todo.txt").read_text() == "keep me"


def test_a_failed_save_leaves_nothing(tmp_path):
    with pytest.raises(ds.DynshapeError, match=r"no symbol \['seq'\]"):
        artifact.save(_model(), tmp_path / "out.ds", specialize=[{"batch": 1, "seq": 4}])
    assert list(tmp_path.iterdir()) == []


def test_declared_symbols_survive_the_round_trip(tmp_path, monkeypatch):
    artifact.save(_model(), tmp_path / "b.ds", dims={"batch": ds.sym("B", max=8, multiple_of=2)})
    _no_compiler(monkeypatch)
    (s,) = artifact.load(tmp_path / "b.ds").symbols
    assert (s.name, s.lo, s.hi, s.mult) == ("B", 2, 8, 2)


def test_the_options_are_saved_and_compared_before_anything_is_built(tmp_path, monkeypatch):
    out = tmp_path / "opts.ds"
    artifact.save(_model(), out, dims={"batch": (1, 8)}, hoist=False, par_min_elements=1)
    saved = json.loads((out / "config.json").read_text())["options"]
    assert saved["hoist"] is False and saved["par_min_elements"] == 1 and saved["strategy"] == "generic"
    _no_compiler(monkeypatch)
    monkeypatch.setenv("DYNSHAPE_HOIST", "1")  # the environment fills defaults only: the artefact's options win
    exe = artifact.load(out, arenas=2)
    assert exe.options.hoist is False and exe.options.arenas == 2
    assert_f32_close(exe.run({"x": _x(3)})["y"], ds.load_onnx(_model(), dims={"batch": (1, 8)})
                     .run({"x": _x(3)})["y"], rtol=1e-5, scale=1e-6)
    with pytest.raises(ds.DynshapeError, match=r"other kernel options: fused_attention=False \(built with True\)"):
        artifact.load(out, fused_attention=False)
    with pytest.raises(ds.DynshapeError, match="never compiles"):
        artifact.load(out, strategy="multi_version")


def test_build_options_are_part_of_every_kernel_library_key(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNSHAPE_CACHE_DIR", str(tmp_path / "keys"))
    g = ds.load_onnx(_model(), dims={"batch": (1, 8)})
    ds.compile(g)
    ds.compile(g, par_min_elements=7)  # same ops, another threshold: its own libraries
    ds.compile(g, strategy="generic")  # a serving option only: no new library
    libs = sorted(p.name.split("-")[0] for p in (tmp_path / "keys").rglob("tiny_*.so"))
    assert libs == ["tiny_products", "tiny_products"], libs
    with pytest.raises(ds.DynshapeError, match="unknown compile option.*fused_attention"):
        ds.compile(g, fused_attentoin=False)


def test_a_graph_is_saved_with_its_stated_requirements(tmp_path):
    """A Graph (what ds.from_torch returns) saves directly; a requirement ONNX cannot express (torch's
    runtime asserts) travels in config.json, and the loaded artefact still refuses inputs that break it."""
    from dynshape.frontends.onnx import load_onnx
    from dynshape.ir.graph import Fact
    from dynshape.ir.infer import infer_graph
    from dynshape.sym import divides

    g = load_onnx(_model(), {"batch": (1, 8)}, infer=False)
    batch = next(d for d in g.inputs[0].shape if ds.sym.is_expr(d))
    g.requires.append(Fact("require", "batch is even", "a frontend's guard", divides(2, batch)))
    infer_graph(g)
    assert any(f.text == "batch is even" for f in g.signature.facts)
    artifact.save(g, tmp_path / "g.ds")
    assert json.loads((tmp_path / "g.ds" / "config.json").read_text())["requires"][0]["kind"] == "div"
    exe = ds.load(tmp_path / "g.ds")
    ref = load_onnx(_model(), {"batch": (1, 8)}).run({"x": _x(4)})["y"]
    assert_f32_close(exe(x=_x(4))[0], ref, rtol=1e-5, scale=1e-6)
    with pytest.raises(ds.ConstraintViolation, match="2 divides batch .from a frontend.s guard"):
        exe(x=_x(3))


def test_a_tampered_requirement_is_parsed_never_evaluated(tmp_path):
    from dynshape.frontends.onnx import load_onnx

    g = load_onnx(_model(), {"batch": (1, 8)})
    artifact.save(g, tmp_path / "g.ds")
    config = json.loads((tmp_path / "g.ds" / "config.json").read_text())
    config["requires"] = [{"kind": "ge", "expr": "__import__('os').getpid()", "k": 0, "text": "t", "origin": "o"}]
    (tmp_path / "g.ds" / "config.json").write_text(json.dumps(config))
    files = json.loads((tmp_path / "g.ds" / artifact.MANIFEST).read_text())["files"]
    files["config.json"] = hashlib.sha256((tmp_path / "g.ds" / "config.json").read_bytes()).hexdigest()
    _rewrite_manifest(tmp_path / "g.ds", files=files)
    with pytest.raises(ds.DynshapeError, match="malformed requirement"):
        ds.load(tmp_path / "g.ds")


def test_a_model_build_needs_an_inferred_graph():
    """runtime takes typed builds only: a graph the compile step did not infer is refused, by input name."""
    from dynshape.runtime.model_build import ModelBuild

    data = _model().SerializeToString()
    with pytest.raises(ds.DynshapeError, match="'x'"):
        ModelBuild(data, ds.load_onnx(data, infer=False))
    build = artifact.typed_build(data, {"batch": (1, 8)})
    assert build.model == data and "y" in build.graph.types and build.dims == {"batch": (1, 8)}
