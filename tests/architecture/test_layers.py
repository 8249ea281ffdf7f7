"""The architecture's rules, checked where the tests run too: the import-linter contracts of pyproject.toml
(one-way layers, no private names across modules), and the environment read in one module only."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "dynshape"


def test_the_import_contracts_hold() -> None:
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (it is in the dev extra)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tools"), str(ROOT / "src")])}
    r = subprocess.run([exe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_the_private_names_contract_catches_a_private_import(tmp_path: Path) -> None:
    """The custom contract is not vacuous: a private-name import inside a package breaks it."""
    pytest.importorskip("importlinter")
    pkg = tmp_path / "pkgx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def _helper():\n    return 1\n")
    (pkg / "b.py").write_text("from pkgx.a import _helper\n")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.importlinter]\nroot_package = "pkgx"\n'
        'contract_types = ["private_names: import_contracts.PrivateNamesContract"]\n'
        '[[tool.importlinter.contracts]]\nname = "p"\ntype = "private_names"\ncontainers = ["pkgx"]\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tools"), str(tmp_path)])}
    exe = shutil.which("lint-imports") or pytest.skip("lint-imports not on PATH")
    r = subprocess.run([exe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "pkgx.b:1 imports _helper from pkgx.a" in r.stdout, r.stdout


def test_the_environment_is_read_in_one_module() -> None:
    """Every knob is a typed option; dynshape/options.py alone reads os.environ / os.getenv to fill defaults."""
    readers = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv") \
                    and isinstance(node.value, ast.Name) and node.value.id == "os":
                readers.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert readers and all(r.startswith("options.py:") for r in readers), readers


def test_no_source_file_is_over_800_lines() -> None:
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 800}
    assert not long, long


def test_test_modules_have_unique_basenames() -> None:
    """pytest imports test files by basename (rootdir mode, no __init__.py): two test_x.py in different folders
    make the whole suite fail to collect."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, Path] = {}
    clashes = []
    for p in sorted(tests.rglob("test_*.py")):
        if p.name in seen:
            clashes.append(f"{seen[p.name].relative_to(tests)} and {p.relative_to(tests)}")
        seen.setdefault(p.name, p)
    assert not clashes, "test modules sharing a basename: " + "; ".join(clashes)


def test_runtime_loads_no_frontend() -> None:
    """runtime compiles, saves and loads typed builds; reading models is the compile step's (dynshape.compiler)."""
    code = ("import sys, dynshape.runtime.artifact, dynshape.runtime.executable; "
            "print([m for m in sys.modules if m.startswith('dynshape.frontends')])")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


def test_the_acyclic_siblings_contract_catches_a_cycle(tmp_path: Path) -> None:
    """The contract is not vacuous: two sibling modules importing each other break it."""
    pytest.importorskip("importlinter")
    pkg = tmp_path / "pkgy"
    (pkg / "sub").mkdir(parents=True)
    for f in ("__init__.py", "sub/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "sub" / "a.py").write_text("from pkgy.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from pkgy.sub import a\n")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.importlinter]\nroot_package = "pkgy"\n'
        '[[tool.importlinter.contracts]]\nname = "c"\ntype = "acyclic_siblings"\nancestors = ["pkgy"]\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = subprocess.run([shutil.which("lint-imports") or "lint-imports"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "pkgy.sub" in r.stdout, r.stdout[-2000:]
