"""torch.compile(backend="dynshape"): one build for every shape, reuse for Dynamo's size-1 graph, explain(),
eager fallback, options, frozen-weight checks, input handling."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch_models as tm  # noqa: E402

import dynshape.torch as dt  # noqa: E402
from dynshape.errors import DynshapeError  # noqa: E402
from tolerance import assert_f32_close  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


@pytest.fixture(autouse=True)
def _fresh():
    dt.register()
    torch._dynamo.reset()
    dt.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


def _same(a, b, tol=1e-5):
    a = [a] if isinstance(a, torch.Tensor) else list(a)
    b = [b] if isinstance(b, torch.Tensor) else list(b)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert_f32_close(x.numpy(), y.numpy(), rtol=tol, scale=tol)


def test_one_build_serves_every_batch_including_dynamos_batch_one_graph():
    m = tm.mlp().eval()
    c = torch.compile(m, backend="dynshape", dynamic=True, options={"fallback": "error"})
    with torch.no_grad():
        for b in (3, 5, 1, 7, 1):
            x = torch.randn(b, 64)
            _same(c(x), m(x))
    rep = dt.explain()
    assert len(rep.records) == 2 and rep.builds == 1
    first, second = rep.records
    assert first.outcome.startswith("built") and first.symbols[0]["range"] == (1, None)
    assert first.symbols[0]["torch_range"] == (2, None)  # Dynamo's 0/1 specialisation, relaxed for reuse
    assert re.search(r"reuses build 0 .* with \w+_0 = 1", second.outcome)
    assert "size()[0]" in (second.recompile_reason or "")  # the guard Dynamo gave for recompiling
    text = str(rep)
    assert "2 graph(s) from Dynamo, 1 dynshape build(s) compiled, 1 serving" in text and "recompiled because" in text


def test_batch_one_first_then_general_graph_takes_it_over():
    m = tm.mlp().eval()
    c = torch.compile(m, backend="dynshape", dynamic=True, options={"fallback": "error"})
    with torch.no_grad():
        for b in (1, 3, 1, 6):  # Dynamo's first graph has batch 1 fixed; the second is general
            x = torch.randn(b, 64)
            _same(c(x), m(x))
    rep = dt.explain()
    assert rep.builds == 2 and rep.serving == 1
    assert re.search(r"served by build 1 with \w+_0 = 1", rep.records[0].outcome)
    assert rep.records[0].exe is rep.records[1].exe


def test_mark_dynamic_range_becomes_the_symbol_range():
    m = tm.mlp().eval()
    c = torch.compile(m, backend="dynshape", options={"fallback": "error"})
    x = torch.randn(4, 64)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=48)
    with torch.no_grad():
        _same(c(x), m(x))
    (sym,) = dt.explain().records[0].symbols
    assert sym["torch_range"] == (2, 48) and sym["range"] == (1, 48)


def test_transformer_decoder_and_its_symbols():
    m = tm.GPT().eval()
    c = torch.compile(m, backend="dynshape", dynamic=True, options={"fallback": "error"})
    with torch.no_grad():
        for shape in ((2, 7), (3, 33), (1, 9)):
            x = torch.randint(0, 100, shape)
            _same(c(x), m(x), tol=2e-5)
    rep = dt.explain()
    assert rep.builds == 1
    names = [s["name"] for s in rep.records[0].symbols]
    assert names == ["idx_0", "idx_1"]


def test_unsupported_op_falls_back_to_eager_with_one_warning_naming_it():
    class Odd(torch.nn.Module):
        def forward(self, x):
            return torch.erfinv(x).relu()

    m = Odd()
    c = torch.compile(m, backend="dynshape")
    x = torch.rand(3, 4) * 0.5
    with pytest.warns(UserWarning, match=r"runs eagerly: .*erfinv\.default x1"):
        y = c(x)
    _same(y, m(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _same(c(x), m(x))  # the same graph: no second warning
    assert dt.explain().records[0].outcome.startswith("eager fallback")


def test_fallback_error_option_raises():
    class Odd(torch.nn.Module):
        def forward(self, x):
            return torch.lgamma(x)

    c = torch.compile(Odd(), backend="dynshape", options={"fallback": "error"})
    with pytest.raises(Exception, match="lgamma"):
        c(torch.rand(3) + 1)


def test_compile_options_reach_ds_compile_and_unknown_ones_are_refused():
    m = tm.mlp().eval()
    c = torch.compile(m, backend="dynshape", dynamic=True, options={"strategy": "generic"})
    with torch.no_grad():
        c(torch.randn(4, 64))
    assert dt.explain().records[0].exe.explain_strategy()["strategy"] == "generic"
    torch._dynamo.reset()
    bad = torch.compile(m, backend="dynshape", options={"stratgey": "generic"})
    with pytest.raises(Exception, match=r"unknown option\(s\) \['stratgey'\]"):
        bad(torch.randn(4, 64))


def test_changed_weights_rebuild_instead_of_answering_stale():
    m = tm.mlp().eval()
    c = torch.compile(m, backend="dynshape", dynamic=True, options={"fallback": "error"})
    x = torch.randn(4, 64)
    with torch.no_grad():
        _same(c(x), m(x))
        m[0].weight.mul_(2)  # in place: same tensor, new version
        with pytest.warns(UserWarning, match="weight\\(s\\) changed"):
            y = c(x)
        _same(y, m(x))
        _same(c(x), m(x))  # rebuilt once, then quiet


def test_non_contiguous_input_is_copied_and_other_devices_are_refused():
    m = tm.mlp().eval()
    c = torch.compile(m, backend="dynshape", dynamic=True, options={"fallback": "error"})
    with torch.no_grad():
        x = torch.randn(64, 6).t()  # (6, 64), not contiguous
        assert not x.is_contiguous()
        _same(c(x), m(x))
    from dynshape.torch.backend import _slow_feed

    with pytest.raises(DynshapeError, match=r"input 'x' is on meta.*runs on the CPU"):
        _slow_feed([torch.empty(2, 3, device="meta")], ["x"], [0])


def test_grad_mode_warns_outputs_are_inference_only():
    m = tm.mlp()
    c = torch.compile(m, backend="dynshape", options={"fallback": "error"})
    with pytest.warns(UserWarning, match="inference-only"):
        y = c(torch.randn(2, 64))
    assert not y.requires_grad


def test_bert_one_build_over_shapes():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=100, max_position_embeddings=64)
    m = transformers.BertModel(cfg).eval()
    c = torch.compile(m, backend="dynshape", dynamic=True, options={"fallback": "error"})
    with torch.no_grad():
        for shape in ((1, 8), (2, 8), (3, 13), (1, 30)):  # batch 1 first: Dynamo's first graph fixes it
            ids = torch.randint(0, 100, shape)
            mask = torch.ones(shape, dtype=torch.long)
            mask[-1, -3:] = 0
            got, ref = c(input_ids=ids, attention_mask=mask), m(input_ids=ids, attention_mask=mask)
            _same([got.last_hidden_state, got.pooler_output], [ref.last_hidden_state, ref.pooler_output], tol=1e-4)
    rep = dt.explain()
    assert rep.serving == 1, str(rep)  # the general graph's build took the batch-1 graph over
    rng = {s["name"]: s["range"] for s in rep.records[-1].symbols}
    assert rng["input_ids_1"] == (1, 64)  # position embeddings bound the sequence: torch's guard, as a range


class _Scaled(torch.nn.Module):
    """A module float (LayerNorm's eps, a scale attribute) and a float the caller passes."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8, eps=1e-5)
        self.scale = 0.5

    def forward(self, x, t: float):
        return torch.softmax(self.norm(x) * self.scale / t, -1)


def test_module_floats_become_guarded_constants_without_a_dynamo_restart(monkeypatch):
    import dynshape.torch.backend as backend

    calls, passed = [], []

    def traced(gm, ex, **kw):
        calls.append(1)
        fn = inner(gm, ex, **kw)
        passed.append([n.name for n in gm.graph.nodes if n.op == "placeholder"])  # what Dynamo's call passes
        return fn

    inner = backend.dynshape_backend
    monkeypatch.setitem(torch._dynamo.backends.registry._COMPILER_FNS, "dynshape", traced)
    m = _Scaled().eval()
    c = torch.compile(m, backend="dynshape", dynamic=True, options={"fallback": "error"})
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        for t in (0.7, 1.3):  # the caller's float stays a runtime input: no recompile for a new value
            _same(c(x, t), m(x, t))
        assert len(calls) == 1  # Dynamo traced once: no restart to specialise eps and scale
        rec = dt.explain().records[0]
        assert any(i.startswith("t: float64[]") for i in rec.inputs), rec.inputs  # the caller's float: an input
        assert not any(n.endswith(("scale", "eps", "scale_", "eps_")) for n in passed[0]), passed  # not passed per call
        m.scale, m.norm.eps = 2.0, 1e-1  # the guards on the constants fail: Dynamo recompiles
        _same(c(x, 0.7), m(x, 0.7))
    assert len(calls) == 2


def test_entry_point_is_declared_in_pyproject():
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    block = text.split("[project.entry-points.torch_dynamo_backends]", 1)[1].split("[", 1)[0]
    assert 'dynshape = "dynshape.torch.backend:dynshape_backend"' in block
    assert 'torch = ["torch==2.13.0",' in text  # exactly the version whose CPU wheel lies on the machine
    from dynshape.torch.backend import dynshape_backend

    assert callable(dynshape_backend)
