"""Issue 15, defects 15-19: artefacts load without a compiler, interrupted builds and saves leave nothing that
lasts, concurrent saves each leave a whole artefact, only regular files are read, and a keyed signature makes
tampering with recomputed hashes detectable."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen import cc
from dynshape.compiler import artifact
from dynshape.runtime import artifact_io as aio

ROOT = Path(__file__).resolve().parents[2]


def _model() -> onnx.ModelProto:
    """y = erf(relu(x @ W + B) * 0.5): one fused C kernel."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Mul", ["r", "half"], ["m"]),
             helper.make_node("Erf", ["m"], ["y"])]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "B"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


X = np.ones((3, 4), np.float32)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNSHAPE_CACHE_DIR", str(tmp_path / "user-cache"))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("art") / "tiny.ds"
    artifact.save(_model(), out, dims={"batch": (1, 8)})
    return out


@pytest.fixture(scope="module")
def signed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("signed") / "tiny.ds"
    artifact.save(_model(), out, dims={"batch": (1, 8)}, signing_key=b"s3cret")
    return out


@pytest.fixture
def copy(built, tmp_path) -> Path:
    dst = tmp_path / "copy.ds"
    shutil.copytree(built, dst)
    return dst


def _python(script: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _rehash(out: Path) -> None:
    """Recompute every sha256 in the manifest, as an attacker who can write the directory would."""
    path = out / artifact.MANIFEST
    manifest = json.loads(path.read_text())
    manifest["files"] = {rel: aio.hashlib.sha256((out / rel).read_bytes()).hexdigest() for rel in manifest["files"]}
    path.write_text(json.dumps(manifest))


# ---- 15: no compiler needed to load ------------------------------------------------------------------------
def test_loading_needs_no_compiler_on_path(built, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    r = _python(f"""
        import numpy as np
        from dynshape.compiler import artifact
        print(artifact.load({str(built)!r}).run({{"x": np.ones((3, 4), np.float32)}})["y"].shape)
    """, env={"PATH": str(empty), "CC": "", "DYNSHAPE_CACHE_DIR": str(tmp_path / "c")})
    assert r.returncode == 0, r.stderr
    assert "(3, 3)" in r.stdout


# ---- 16: stale work directories -------------------------------------------------------------------------------
def test_stale_work_directories_of_dead_processes_are_cleaned_by_the_next_build(tmp_path):
    out = tmp_path / "m.ds"
    dead, host = _dead_pid(), os.uname().nodename
    stale_tmp = tmp_path / f".m.ds.tmp-{dead}-abc"
    stale_tmp.mkdir()
    (stale_tmp / ".owner").write_text(f"{host} {dead}\n")
    live_tmp = tmp_path / f".m.ds.tmp-{os.getpid()}-live"  # a save in progress (this process): kept
    live_tmp.mkdir()
    (live_tmp / ".owner").write_text(f"{host} {os.getpid()}\n")
    artifact.save(_model(), out, dims={"batch": (1, 8)})
    assert not stale_tmp.exists() and live_tmp.exists()
    shard = next(p for p in (out / "libs").iterdir() if p.is_dir())
    stale_build = shard / f".build-{dead}-xyz"
    stale_build.mkdir()
    (stale_build / ".owner").write_text(f"{host} {dead}\n")
    assert cc.clean_stale(shard, ".build-") == [stale_build] and not stale_build.exists()


def test_a_killed_save_leaves_a_work_directory_that_the_next_save_removes(tmp_path):
    out = tmp_path / "k.ds"
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_artefacts import _model
        from dynshape.compiler import artifact
        def hang(label, done, total):
            if label == "compiling kernels":
                print("building", flush=True)
                time.sleep(600)
        artifact.save(_model(), {str(out)!r}, on_step=hang)
    """)], env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "building"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    left = [q for q in tmp_path.iterdir() if q.name.startswith(".k.ds.tmp-")]
    assert left and not out.exists()
    artifact.save(_model(), out)
    assert [q.name for q in tmp_path.iterdir()] == ["k.ds"]
    assert artifact.load(out).run({"x": X})["y"].shape == (3, 3)


# ---- 17: concurrent saves, atomic replacement ------------------------------------------------------------------
def test_concurrent_swaps_into_one_out_always_leave_a_whole_artefact(built, tmp_path):
    """4 processes swap 40 copies each into OUT while this one loads it: every swap and every load succeeds."""
    out = tmp_path / "c.ds"
    shutil.copytree(built, out)
    script = f"""
        import shutil
        from pathlib import Path
        from dynshape.runtime import artifact_io as aio
        out = Path({str(out)!r})
        for _ in range(40):
            tmp = aio.new_tmpdir(out)
            shutil.copytree({str(built)!r}, tmp, dirs_exist_ok=True)
            aio.swap_in(tmp, out)
    """
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)],
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    loads = 0
    while any(p.poll() is None for p in procs):
        assert artifact.load(out).run({"x": X})["y"].shape == (3, 3)
        loads += 1
    errors = [p.stderr.read() for p in procs if p.returncode != 0]
    assert not errors, errors[0]
    assert loads > 0 and [q.name for q in tmp_path.iterdir()] == ["c.ds"]
    assert artifact.load(out).run({"x": X})["y"].shape == (3, 3)


def test_two_processes_saving_to_one_out_both_succeed(tmp_path, build_store):
    out = tmp_path / "two.ds"
    # the children copy the libraries this session built (tests/shared_builds.py) rather than compile every
    # native helper four times over (~60 s on 2 cores): what is tested is the two saves' swaps into one OUT
    script = f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from test_artefacts import _model
        from dynshape.compiler import artifact
        if {str(build_store) if build_store else ""!r}:
            import shared_builds
            shared_builds.install({str(build_store)!r})
        for _ in range(2):
            artifact.save(_model(), {str(out)!r}, dims={{"batch": (1, 8)}})
    """
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src"),
                                   "DYNSHAPE_CACHE_DIR": str(tmp_path / f"cache{i}")}) for i in range(2)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    assert [q.name for q in tmp_path.iterdir() if not q.name.startswith("cache")] == ["two.ds"]
    assert artifact.load(out).run({"x": X})["y"].shape == (3, 3)


def test_a_kill_between_the_two_renames_keeps_the_old_artefact(built, tmp_path):
    """Without RENAME_EXCHANGE the old artefact is renamed aside first; dying right after that loses nothing:
    the next load puts it back."""
    out = tmp_path / "r.ds"
    shutil.copytree(built, out)
    r = _python(f"""
        import os, shutil
        from pathlib import Path
        from dynshape.runtime import artifact_io as aio
        aio._exchange = lambda a, b: False
        real = os.replace
        def replace(a, b):
            real(a, b)
            if Path(b).name == "a":
                os._exit(9)  # killed between the two renames
        os.replace = replace
        out = Path({str(out)!r})
        tmp = aio.new_tmpdir(out)
        shutil.copytree({str(built)!r}, tmp, dirs_exist_ok=True)
        aio.swap_in(tmp, out)
    """)
    assert r.returncode == 9, r.stderr
    assert not out.exists()
    assert artifact.load(out).run({"x": X})["y"].shape == (3, 3)
    assert sorted(q.name for q in tmp_path.iterdir() if not q.name.startswith(".r.ds.tmp-")) == ["r.ds"]


# ---- 18: regular files only, malformed config ----------------------------------------------------------------
def test_model_symlinked_to_dev_zero_is_refused(copy):
    (copy / "model.onnx").unlink()
    (copy / "model.onnx").symlink_to("/dev/zero")
    with pytest.raises(ds.DynshapeError, match="model.onnx is not a regular file or directory"):
        artifact.load(copy)


def test_config_as_a_fifo_is_refused_without_hanging(copy):
    (copy / "config.json").unlink()
    os.mkfifo(copy / "config.json")
    t0 = time.perf_counter()
    with pytest.raises(ds.DynshapeError, match="config.json is not a regular file"):
        artifact.load(copy)
    assert time.perf_counter() - t0 < 10


def test_manifest_symlink_is_refused(copy, tmp_path):
    real = tmp_path / "elsewhere.json"
    shutil.move(copy / "manifest.json", real)
    (copy / "manifest.json").symlink_to(real)
    with pytest.raises(ds.DynshapeError, match="manifest.json is a symbolic link"):
        artifact.load(copy)


@pytest.mark.parametrize(("dims", "pattern"), [([], r"'dims' is list"), ({"batch": "big"}, r"dims\['batch'\]"),
                                               ({"batch": {"name": "batch"}}, r"dims\['batch'\]")])
def test_malformed_config_with_a_matching_manifest_is_one_error(copy, dims, pattern):
    path = copy / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "dims": dims}))
    _rehash(copy)
    with pytest.raises(ds.DynshapeError, match=rf"config.json is malformed \({pattern}"):
        artifact.load(copy)


# ---- 19: keyed signature --------------------------------------------------------------------------------------
def test_signed_artefact_loads_with_its_key(signed):
    assert json.loads((signed / "manifest.json").read_text())["signature"]["alg"] == "hmac-sha256"
    assert artifact.load(signed, signing_key=b"s3cret").run({"x": X})["y"].shape == (3, 3)
    assert artifact.load(signed, signing_key="s3cret").run({"x": X})["y"].shape == (3, 3)


def test_patched_library_with_recomputed_hashes_is_refused_when_a_key_is_set(signed, tmp_path):
    copy = tmp_path / "patched.ds"
    shutil.copytree(signed, copy)
    so = next((copy / "libs").rglob("*.so"))
    data = bytearray(so.read_bytes())
    data[-1] ^= 1
    so.write_bytes(bytes(data))
    manifest = json.loads((copy / "manifest.json").read_text())
    _rehash(copy)  # the hashes match again; only the signature can tell
    m2 = json.loads((copy / "manifest.json").read_text())
    m2["signature"] = manifest["signature"]
    (copy / "manifest.json").write_text(json.dumps(m2))
    with pytest.raises(ds.DynshapeError, match="signature does not match"):
        artifact.load(copy, signing_key=b"s3cret")


def test_wrong_key_and_unsigned_artefacts_are_refused(signed, built):
    with pytest.raises(ds.DynshapeError, match="signature does not match"):
        artifact.load(signed, signing_key=b"other")
    with pytest.raises(ds.DynshapeError, match="is not signed, and a signing key was given"):
        artifact.load(built, signing_key=b"s3cret")


def test_cli_signs_and_verifies_with_a_key_file(tmp_path):
    from typer.testing import CliRunner

    from dynshape.cli.main import app

    model = tmp_path / "m.onnx"
    onnx.save(_model(), str(model))
    key = tmp_path / "key"
    key.write_text("k3y\n")
    runner = CliRunner()
    r = runner.invoke(app, ["compile", str(model), "--dim", "batch=1:8", "-o", str(tmp_path / "m.ds"),
                            "--signing-key-file", str(key)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["run", str(tmp_path / "m.ds"), "--shape", "2", "--signing-key-file", str(key)])
    assert r.exit_code == 0, r.output
    key.write_text("other")
    r = runner.invoke(app, ["run", str(tmp_path / "m.ds"), "--shape", "2", "--signing-key-file", str(key)])
    assert r.exit_code == 1 and "signature does not match" in r.stderr
    # the key file may come from the environment instead (a deployment's secret mount)
    key.write_text("k3y\n")
    r = runner.invoke(app, ["run", str(tmp_path / "m.ds"), "--shape", "2"], env={"DYNSHAPE_SIGNING_KEY_FILE": str(key)})
    assert r.exit_code == 0, r.output
    key.write_text("other")
    r = runner.invoke(app, ["run", str(tmp_path / "m.ds"), "--shape", "2"], env={"DYNSHAPE_SIGNING_KEY_FILE": str(key)})
    assert r.exit_code == 1 and "signature does not match" in r.stderr


def test_two_processes_building_one_kernel_compile_it_once(tmp_path):
    """The cache shard is locked while a library builds: the second process waits, then finds it built."""
    real = shutil.which("cc") or shutil.which("gcc")
    if real is None:
        pytest.skip("no C compiler")
    log = tmp_path / "cc.log"
    wrapper = tmp_path / "slow-cc"
    wrapper.write_text(f'#!/bin/sh\ncase "$*" in *--version*) ;; *) echo build >> {log}; sleep 1;; esac\n'
                       f'exec {real} "$@"\n')
    wrapper.chmod(0o755)
    script = """
        from dynshape.codegen import cc
        lib = cc.compile_c("int ds_answer(void) { return 42; }", "answer", symbols=["ds_answer"])
        assert lib.ds_answer() == 42
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CC": str(wrapper),
           "DYNSHAPE_CACHE_DIR": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env=env, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    assert log.read_text().count("build") == 1
