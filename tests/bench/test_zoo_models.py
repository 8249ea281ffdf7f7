"""The corpus of bench/zoo_bench.py (bench/zoo_models.py): its fastest torch.nn models exported to tmp_path by the
corpus's own builders, loaded as a user would (`ds.load_onnx(path)`, nothing declared, `ds.compile(graph)`), and
checked against onnxruntime at the corpus's smallest probe, with the tolerance scaled by the output's magnitude.

Skipped where torch or onnxruntime is absent (the benchmark's extras, not dynshape's dependencies).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
torch.set_num_threads(1)  # the machine is shared

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import zoo_models  # noqa: E402
from tolerance import assert_f32_close  # noqa: E402


def test_corpus_is_complete_and_feeds_are_seeded() -> None:
    built = [m for m in zoo_models.CORPUS if not m.name.startswith("light_")]
    assert len(built) >= 25
    assert len({m.name for m in zoo_models.CORPUS}) == len(zoo_models.CORPUS)
    for m in built:
        # small / medium / large, or one for a file whose input shape is fixed (and says so in its source)
        assert len(m.probes) == 3 or (len(m.probes) == 1 and "fixed" in m.source), m.name
        for i, p in enumerate(m.probes):
            assert set(p) == set(m.inputs), m.name
            a, b = m.make_feed(i, seed=1), m.make_feed(i, seed=1)
            assert all(np.array_equal(a[k], b[k]) for k in a)
    bert = zoo_models.BY_NAME["bert"].make_feed(0)
    assert bert["input_ids"].dtype == np.int64 and bert["input_ids"].max() < 1000
    assert (bert["attention_mask"] == 1).all()


@pytest.mark.parametrize("name", ["w2v_frontend_nn", "unet_nn"])  # cold build cache: ~13 s together
def test_fast_corpus_model_matches_onnxruntime(name: str, tmp_path: Path) -> None:
    import dynshape as ds

    m = zoo_models.BY_NAME[name]
    path = tmp_path / f"{name}.onnx"
    m.build(path)
    feed = m.make_feed(0, seed=1)
    want = zoo_models.ort_session(str(path)).run(None, feed)
    g = ds.load_onnx(str(path))  # nothing declared: the default path the benchmark measures
    out = ds.compile(g).run(feed)
    got = [out[v.name] for v in g.outputs] if isinstance(out, dict) else list(out)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert_f32_close(a, b, rtol=1e-4, scale=1e-4)


def test_bart_runs_every_node_in_kernels(tmp_path: Path) -> None:
    """BART as the classic exporter writes it: its decoder's inputs are the ids shifted right by a ScatterND and
    masked by a Where on int64, per call; both compiled (nothing on numpy every call) and equal to onnxruntime."""
    import dynshape as ds

    m = zoo_models.BY_NAME["bart"]
    path = tmp_path / "bart.onnx"
    m.build(path)
    g = ds.load_onnx(str(path))
    exe = ds.compile(g)
    feed = m.make_feed(0, seed=1)
    feed["input_ids"][0, 3] = -100  # the label padding shift_tokens_right replaces by the pad id
    out = exe.run(feed)
    every_call = [u for u in exe.explain_build()["uncompiled"]
                  if u["when"] == "every call" and u["runs"] not in ("native", "compiled body")]
    assert not every_call, every_call
    want = zoo_models.ort_session(str(path)).run(None, feed)
    assert_f32_close(out[g.outputs[0].name], want[0], rtol=1e-4, scale=1e-4)
