"""The static C's paths for CPUs without AVX-512 (ds_simd.h's `#else` branches: 16-float vectors as two AVX2
registers, column masks as counts, scalar tails; DS_MR 4 instead of 12) give the reference's results.

On a machine with AVX-512 every other test runs the AVX-512 paths only; here a child process builds every
library with CC="<cc> -mno-avx512f" (the compiler's identity is part of each build's cache key, so nothing is
shared with the AVX-512 builds) and runs convolutions that reach each C path: dense tiles with column tails and a
fused residual, the few-channel runs path, depthwise rows, Winograd, the 1x1-into-depthwise chain, pools and a
packed product. The built libraries are then checked to hold no 512-bit instruction.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dynshape.codegen.cc import CompileError, find_compiler

_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    import dynshape as ds
    from dynshape.runtime.build import KernelStep
    sys.path.insert(0, sys.argv[1])  # tests/, for the suite's float32 tolerance
    from tolerance import assert_f32_close

    rng = np.random.default_rng(0)
    def w(*shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32),
                                       f"w{len(inits)}")
    inits = []
    def conv(x, y, ci, co, k, **attrs):
        inits.append(w(co, ci // attrs.get("group", 1), k, k))
        bias = numpy_helper.from_array(rng.standard_normal(co).astype(np.float32), f"b{len(inits)}")
        inits.append(bias)
        return helper.make_node("Conv", [x, inits[-2].name, bias.name], [y], **attrs)
    nodes = [
        conv("x", "c0", 3, 40, 3, pads=[1, 1, 1, 1]),                      # few channels: the runs path
        helper.make_node("Relu", ["c0"], ["r0"]),
        conv("r0", "c1", 40, 40, 1),                                       # 40 = 32 + an 8-column tail
        helper.make_node("Add", ["c1", "r0"], ["a1"]),                     # residual in the tile's finish
        helper.make_node("Relu", ["a1"], ["r1"]),
        conv("r1", "c2", 40, 40, 3, pads=[1, 1, 1, 1], group=40),          # depthwise rows
        conv("c2", "c3", 40, 72, 1),                                       # two panels and a tail
        helper.make_node("Relu", ["c3"], ["r3"]),
        conv("r3", "c4", 72, 48, 3, pads=[1, 1, 1, 1]),                    # 3x3: Winograd where it pays
        helper.make_node("MaxPool", ["c4"], ["p4"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        conv("p4", "c5", 48, 96, 1),                                       # 1x1 into depthwise
        helper.make_node("Relu", ["c5"], ["r5"]),
        conv("r5", "c6", 96, 96, 3, pads=[1, 1, 1, 1], group=96),
        helper.make_node("GlobalAveragePool", ["c6"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
    ]
    inits.append(numpy_helper.from_array(rng.standard_normal((96, 37)).astype(np.float32), "fc"))
    nodes.append(helper.make_node("MatMul", ["f", "fc"], ["y"]))
    graph = helper.make_graph(nodes, "isa", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         ["n", 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    g = ds.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    exe = ds.compile(g, strategy="generic")
    kinds = sorted({s.kind for s in exe.generic.steps if isinstance(s, KernelStep)})
    methods = sorted({s.method.split(":")[0] for s in exe.generic.steps if isinstance(s, KernelStep)})
    for shape in [(1, 3, 9, 13), (2, 3, 30, 34), (1, 3, 64, 48)]:
        x = rng.standard_normal(shape).astype(np.float32)
        assert_f32_close(exe.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-4, scale=1e-6)  # outputs ~100
    print("KINDS", ",".join(kinds))
    print("METHODS", "|".join(methods))
    """
)


def _gcc() -> list[str] | None:
    try:
        argv = find_compiler()
    except CompileError:
        return None
    out = subprocess.run([*argv, "--version"], capture_output=True, text=True)
    return argv if "Free Software Foundation" in out.stdout + out.stderr else None


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="x86-64 Linux only")
def test_the_paths_for_cpus_without_avx512_match_the_reference(tmp_path: Path) -> None:
    argv = _gcc()
    if argv is None:
        pytest.skip("needs gcc (the flag -mno-avx512f)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["CC"] = shlex.join([*argv, "-mno-avx512f"])
    env["DYNSHAPE_CACHE_DIR"] = str(tmp_path)
    tests = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", _CHILD, tests], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.startswith(("KINDS", "METHODS")))
    assert {"conv", "pool"} <= set(lines["KINDS"].split(",")), lines
    methods = lines["METHODS"]
    for path in ("implicit GEMM", "depthwise rows in C", "Winograd", "1x1 conv into depthwise"):
        assert path in methods, (path, methods)
    libs = list(tmp_path.rglob("*.so"))
    assert libs, "nothing was built"
    objdump = shutil.which("objdump")
    if objdump:  # the flag took effect: no instruction touches a 512-bit register
        for so in libs:
            text = subprocess.run([objdump, "-d", str(so)], capture_output=True, text=True).stdout
            assert "zmm" not in text, so.name
