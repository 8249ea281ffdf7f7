"""A CNN's artefact loads and runs in a fresh process with no C compiler: its kernels call two conv libraries (the
dense tiles, and depthwise / Winograd, which calls the tiles), the pool library and the packed GEMM, and its
conv wrappers are a library of their own built at -O1 (codegen/library.py). Every one of them ships in the
artefact and loads in the order its calls need."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from dynshape.compiler import artifact


def _cnn():
    rng = np.random.default_rng(0)
    inits = []

    def conv(x, y, ci, co, k, **attrs):
        w = numpy_helper.from_array((rng.standard_normal((co, ci // attrs.get("group", 1), k, k)) * 0.2)
                                    .astype(np.float32), f"w{len(inits)}")
        inits.append(w)
        return helper.make_node("Conv", [x, w.name], [y], **attrs)

    nodes = [
        conv("x", "c0", 3, 32, 3, pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r0"]),
        conv("r0", "c1", 32, 32, 3, pads=[1, 1, 1, 1], group=32),  # depthwise
        conv("c1", "c2", 32, 48, 3, pads=[1, 1, 1, 1]),  # Winograd
        helper.make_node("MaxPool", ["c2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        conv("p", "c3", 48, 64, 1), helper.make_node("Relu", ["c3"], ["r3"]),
        conv("r3", "c4", 64, 64, 3, pads=[1, 1, 1, 1], group=64),  # after a 1x1: the chain
        helper.make_node("GlobalAveragePool", ["c4"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
    ]
    inits.append(numpy_helper.from_array(rng.standard_normal((64, 10)).astype(np.float32), "fc"))
    nodes.append(helper.make_node("MatMul", ["f", "fc"], ["y"]))
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_cnn_artefact_runs_in_a_fresh_process_without_a_compiler(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DYNSHAPE_CACHE_DIR", str(tmp_path / "build-cache"))
    model = _cnn()
    dims = {"n": (1, 2), "h": (8, 64), "w": (8, 64)}
    artifact.save(model, tmp_path / "cnn.ds", dims=dims)
    (tmp_path / "model.onnx").write_bytes(model.SerializeToString())
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        import dynshape as ds
        from dynshape.compiler import artifact
        from dynshape.runtime.build import KernelStep
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from tolerance import assert_f32_close
        exe = artifact.load({str(tmp_path / "cnn.ds")!r})
        ref = ds.load_onnx({str(tmp_path / "model.onnx")!r}, dims={dims!r})
        for shape in [(1, 3, 8, 8), (2, 3, 30, 22), (1, 3, 64, 64)]:
            x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
            assert_f32_close(exe.run({{"x": x}})["y"], ref.run({{"x": x}})["y"], rtol=1e-4, scale=1e-4)
        print("|".join(sorted({{s.method.split(":")[0] for s in exe.generic.steps if isinstance(s, KernelStep)}})))
    """)
    env = {**os.environ, "DYNSHAPE_CACHE_DIR": str(tmp_path / "empty-cache"), "CC": str(tmp_path / "no-such-cc")}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    for path in ("depthwise rows in C", "Winograd", "1x1 conv into depthwise", "implicit GEMM"):
        assert path in r.stdout, (path, r.stdout)
    assert not (tmp_path / "empty-cache").exists()  # nothing was built or cached on load
