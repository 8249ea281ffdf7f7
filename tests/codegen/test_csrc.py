"""The static C in codegen/csrc compiles cleanly under -Wall -Wextra -Werror, each file on its own, with OpenMP
(as every library builds) and with the libm variant of the prelude: a warning in a shipped header is a bug."""

from __future__ import annotations

import subprocess
import sysconfig
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dynshape.codegen import cc

FILES = sorted(p.name for p in cc.CSRC.iterdir() if p.suffix == ".c")
STRICT = ["-Wall", "-Wextra", "-Werror"]
# "avx2": every file also built for a CPU without AVX-512 (Zen 3, Haswell..Ice Lake client) whatever CPU runs the
# tests, so a machine with AVX-512 catches what only an AVX2 machine's -march=native would show (an AMD EPYC
# Zen 3's CI failed on a psabi note and three unused variables that the AVX-512 machines never compiled)
EXTRAS = {"omp": ["-fopenmp"], "libm": ["-DDS_LIBM_MATH", "-fopenmp"], "avx2": ["-march=x86-64-v3", "-fopenmp"]}


def _strict_compile(name: str, extra: list, out: Path) -> subprocess.CompletedProcess:
    flags = [f for f in cc.DEFAULT_FLAGS if not (f.startswith("-march") and any(e.startswith("-march") for e in extra))]
    argv = [*cc.find_compiler(), *flags, *STRICT, *extra, *cc.include_flags()]
    if name == "ds_trampoline.c":
        argv.append(f"-I{sysconfig.get_paths()['include']}")
    return subprocess.run([*argv, str(cc.CSRC / name), "-o", str(out)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def strict_builds(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The selected (variant, file) compiles started at once on two threads, in test order, each test waiting
    for its own: the -O3 compiles take ~25 s one after another and pytest runs on one core, so the second core
    would sit idle."""
    tmp = tmp_path_factory.mktemp("strict")
    wanted = [(it.callspec.params["variant"], it.callspec.params["name"]) for it in request.session.items
              if getattr(it, "originalname", None) == "test_static_c_compiles_with_warnings_as_errors"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {(v, n): pool.submit(_strict_compile, n, EXTRAS[v], tmp / f"{v}-{n}.so") for v, n in wanted}


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("variant", list(EXTRAS))
def test_static_c_compiles_with_warnings_as_errors(name: str, variant: str, strict_builds: dict) -> None:
    proc = strict_builds[variant, name].result()
    assert proc.returncode == 0, proc.stderr


def test_every_header_is_self_contained(tmp_path: Path) -> None:
    """Each header compiles alone (it includes what it uses), so include order never matters."""
    for h in sorted(p.name for p in cc.CSRC.iterdir() if p.suffix == ".h"):
        src = tmp_path / "one.c"
        src.write_text(f'#include "{h}"\nint ds_unused_symbol_for_{h[:-2]};\n')
        proc = subprocess.run([*cc.find_compiler(), *cc.DEFAULT_FLAGS, *STRICT, "-fopenmp", *cc.include_flags(),
                               str(src), "-o", str(tmp_path / "x.so")], capture_output=True, text=True)
        assert proc.returncode == 0, f"{h}: {proc.stderr}"


def test_a_header_change_is_a_new_build_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Builds #include csrc/ by path, so the cache key must hash the files' contents."""
    assert len(cc.csrc_digest()) == 64
    before = cc._cache_key("int x;", [], [], "gcc 12")
    monkeypatch.setattr(cc, "csrc_digest", lambda: "0" * 64)  # as if a header had changed
    assert cc._cache_key("int x;", [], [], "gcc 12") != before


# the bf16 libraries and the conv libraries they share headers with, built for CPUs without AVX512-BF16 (AVX-512
# alone; AVX2): their native paths compile away, and what stays must compile and link (a helper defined only under
# the native #if and called outside it left ds_gemm_bf16.c without a symbol there).
OTHER_CPUS = ["-march=skylake-avx512", "-march=x86-64-v3"]


@pytest.mark.parametrize("name", ["ds_gemm_bf16.c", "ds_conv_amx.c", "ds_conv_dw_wino.c"])
@pytest.mark.parametrize("march", OTHER_CPUS)
def test_the_bf16_libraries_compile_for_cpus_without_it(name: str, march: str, tmp_path: Path) -> None:
    flags = [f for f in cc.DEFAULT_FLAGS if not f.startswith("-march")]
    proc = subprocess.run([*cc.find_compiler(), *flags, march, *STRICT, "-fopenmp",
                           *cc.include_flags(), str(cc.CSRC / name), "-o", str(tmp_path / "x.so")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# Without AVX-512 a 64-byte ds_v16 has no register mode, and gcc 12 kept such accumulators on the stack: every
# multiply-add of the products and convolutions a round trip through memory (2 GFLOP/s; bert_small 25x and
# ResNet-50 35x slower than onnxruntime on an AMD EPYC Zen 3, unseen on the AVX-512 machines that run most tests).
# Their AVX2 micro-kernels run on 8-float vectors instead; this reads the x86-64-v3 assembly of each (and of every
# copy gcc made of it: .constprop, .part) and checks that no multiply-add takes an operand from the stack (the old
# kernels: two thirds or more of theirs did).
AVX2_HOT = {"ds_gemm.c": ["ds_half_4", "ds_half_1"],
            "ds_conv.c": ["ds_conv_tile", "ds_conv_nmicro_4", "ds_conv_rmicro2_4"],
            "ds_rnn.c": ["dsr_gemv"]}


@pytest.mark.parametrize("name", sorted(AVX2_HOT))
def test_avx2_micro_kernels_keep_accumulators_in_registers(name: str, tmp_path: Path) -> None:
    flags = [f for f in cc.DEFAULT_FLAGS if not f.startswith("-march") and f != "-shared"]
    asm = tmp_path / "k.s"
    proc = subprocess.run([*cc.find_compiler(), *flags, "-march=x86-64-v3", "-fopenmp", *cc.include_flags(),
                           "-S", str(cc.CSRC / name), "-o", str(asm)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = asm.read_text().splitlines()
    for fn in AVX2_HOT[name]:
        starts = [i for i, ln in enumerate(lines) if ln.endswith(":") and ln.split(".")[0].rstrip(":") == fn]
        assert starts, f"{fn} not in {name}'s assembly"
        for start in starts:
            end = next(i for i in range(start, len(lines)) if ".cfi_endproc" in lines[i])
            fmas = [ln for ln in lines[start:end] if "vfmadd" in ln]
            assert fmas, f"{lines[start]} no multiply-adds"
            assert not [ln for ln in fmas if "(%rsp)" in ln or "(%rbp)" in ln], (lines[start], fmas[:8])
