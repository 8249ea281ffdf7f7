"""The CNN / RNN benchmark models of issue 12: what each one is, its dims and probes, and its torch builder.

The specs (names, input layouts, declared dims, probe shapes, input makers) import nothing but numpy, so the
benchmark can read them where torch is absent; the builders import torch when called. Every builder is seeded
(torch.manual_seed) and takes size knobs, so a test can build the same architecture at a tiny size. Weights are
random, nothing is downloaded; BatchNorm statistics are calibrated on a few random batches (train-mode
passes) so activations keep a realistic scale through deep stacks instead of vanishing, which would make the
correctness checks meaningless (every output near one constant).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Env = dict[str, int]
DimDecl = dict[str, Any]


@dataclass(frozen=True)
class Input:
    """One graph input: its name, its shape (ints are fixed, strings are symbols), dtype and value maker."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str = "float32"
    kind: str = "normal"  # normal | bytes (int64 0..255) | zeros | audio (0.1 * normal) | state (0.5 * normal)

    def concrete(self, env: Env) -> tuple[int, ...]:
        return tuple(env[d] if isinstance(d, str) else d for d in self.shape)


@dataclass(frozen=True)
class Spec:
    """A benchmark model: its inputs, the dims declared to `ds.load_onnx` and the probe shapes (symbol values)."""

    name: str
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]
    dims: dict[str, DimDecl]
    probes: tuple[Env, ...]
    about: str
    source: str = "torch"  # torch | light
    extra: dict[str, Any] = field(default_factory=dict)

    def make_inputs(self, env: Env, seed: int = 1) -> dict[str, np.ndarray]:
        """Deterministic inputs of the shape `env` gives the symbols."""
        rng = np.random.default_rng(seed)
        out: dict[str, np.ndarray] = {}
        for i in self.inputs:
            shape = i.concrete(env)
            if i.kind == "bytes":
                out[i.name] = rng.integers(0, 256, size=shape, dtype=np.int64)
            elif i.kind == "zeros":
                out[i.name] = np.zeros(shape, dtype=i.dtype)
            elif i.kind == "audio":
                out[i.name] = (0.1 * rng.standard_normal(shape)).astype(i.dtype)
            elif i.kind == "state":
                out[i.name] = (0.5 * rng.standard_normal(shape)).astype(i.dtype)
            else:
                out[i.name] = rng.standard_normal(shape, dtype=np.float32).astype(i.dtype)
        return out

    def shape_str(self, env: Env) -> str:
        """The probe as the first input's shape, e.g. 1x3x320x320 (other inputs' symbols follow it)."""
        return "x".join(str(d) for d in self.inputs[0].concrete(env))

    def sym_range(self, name: str) -> tuple[int, int, int]:
        """(min, max, multiple_of) of a declared symbol."""
        d = self.dims[name]
        if isinstance(d, tuple):
            return d[0], d[1], 1
        return d["min"], d["max"], d.get("multiple_of", 1)


def _mult(lo: int, hi: int, k: int) -> DimDecl:
    return {"min": lo, "max": hi, "multiple_of": k}


IMG = ("batch", 3, "H", "W")

SPECS: dict[str, Spec] = {
    "text_det": Spec(
        "text_det", (Input("x", IMG),), ("maps",),
        {"batch": (1, 8), "H": _mult(32, 1536, 32), "W": _mult(32, 1536, 32)},
        ({"batch": 1, "H": 320, "W": 320}, {"batch": 1, "H": 480, "W": 640}, {"batch": 2, "H": 736, "W": 736}),
        "MobileNetV3-large x0.5 backbone (SE, hardswish, 3x3/5x5 depthwise) + DBFPN neck (96 ch) + DB head"),
    "text_rec": Spec(
        "text_rec", (Input("x", ("batch", 3, 48, "W")),), ("probs",),
        {"batch": (1, 16), "W": (16, 2000)},
        ({"batch": 1, "W": 80}, {"batch": 4, "W": 320}, {"batch": 2, "W": 1000}),
        "CRNN: VGG-style conv stages, (2,1) pools, 2-layer BiLSTM (hidden 96), linear 6625 + softmax"),
    "text_rec_svtr": Spec(
        "text_rec_svtr", (Input("x", ("batch", 3, 48, "W")),), ("probs",),
        {"batch": (1, 16), "W": (16, 2000)},
        ({"batch": 1, "W": 80}, {"batch": 4, "W": 320}, {"batch": 2, "W": 1000}),
        "the CRNN conv stages + 2 transformer blocks (dim 120, 8 heads, swish MLP x2), linear 6625 + softmax"),
    "vad": Spec(
        "vad", (Input("x", ("frames", 576), kind="audio"), Input("h", (1, 1, 128), kind="state"),
                Input("c", (1, 1, 128), kind="state")), ("prob", "hn", "cn"),
        {"frames": (1, 100)},
        ({"frames": 1}, {"frames": 10}, {"frames": 100}),
        "Silero-v5-like: reflect pad + STFT conv1d + |.|, 4 conv1d, LSTM(128) over the frames (batch 1), "
        "linear + sigmoid; h/c state in and out"),
    "byte_cls": Spec(
        "byte_cls", (Input("bytes", ("batch", "len"), dtype="int64", kind="bytes"),), ("logits",),
        {"batch": (1, 16), "len": (64, 8192)},
        ({"batch": 1, "len": 1024}, {"batch": 4, "len": 1024}, {"batch": 16, "len": 1024}),
        "embedding(256, 32) + conv1d stack (stride, dilation, gated) + global max/avg pool + 2 dense"),
}


# ---------------------------------------------------------------------------------------------------------
# torch builders (torch imported lazily: the specs above serve the benchmark without it)
# ---------------------------------------------------------------------------------------------------------
def _div8(v: float) -> int:
    """MobileNet's channel rounding: the nearest multiple of 8, never below 90% of v."""
    n = max(8, int(v + 4) // 8 * 8)
    return n + 8 if n < 0.9 * v else n


def _calibrate_bn(model: Any, batches: list[Any]) -> Any:
    """Set every BatchNorm's running statistics from a few random batches, then switch to eval mode.

    Random init alone leaves running mean 0 / var 1, so the activations of a deep stack shrink or blow up
    layer after layer; calibrated statistics keep them O(1), as in a trained network. The affine parameters
    are randomised too, so BatchNorm is not the identity an exporter or a compiler could drop.
    """
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.momentum = None  # cumulative average over the calibration batches
            m.reset_running_stats()
            with torch.no_grad():
                m.weight.uniform_(0.6, 1.4)
                m.bias.normal_(0.0, 0.1)
    model.train()
    with torch.no_grad():
        for b in batches:
            model(*b)
    return model.eval()


def _rescale(model: Any, layer: Any, batch: tuple, std: float) -> Any:
    """Scale and centre `layer`'s output to mean 0 and standard deviation `std` on `batch`.

    Default init leaves classifier logits tiny or offset, so softmax and sigmoid outputs sit flat at 1/classes,
    0 or 1, where an absolute tolerance checks nothing; trained heads are peaked, and so are these afterwards.
    """
    import torch

    seen: list[tuple[float, float]] = []
    hook = layer.register_forward_hook(lambda _m, _i, out: seen.append((float(out.mean()), float(out.std()))))
    with torch.no_grad():
        model(*batch)
        hook.remove()
        mean, k = seen[0][0], std / seen[0][1]
        layer.weight.mul_(k)
        layer.bias.sub_(mean).mul_(k)
    return model


def build_text_det(scale: float = 0.5, neck: int = 96, seed: int = 0) -> Any:
    """PP-OCR-style mobile text detector: MobileNetV3-large (scale) + DBFPN (neck channels) + DB head."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    torch.manual_seed(seed)

    def cba(cin: int, cout: int, k: int, s: int, groups: int = 1, act: str | None = "relu") -> nn.Sequential:
        layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False),
                                   nn.BatchNorm2d(cout)]
        if act == "relu":
            layers.append(nn.ReLU())
        elif act == "hardswish":
            layers.append(nn.Hardswish())
        return nn.Sequential(*layers)

    class SE(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc1 = nn.Conv2d(c, _div8(c / 4), 1)
            self.fc2 = nn.Conv2d(_div8(c / 4), c, 1)

        def forward(self, x: Any) -> Any:
            s = F.hardsigmoid(self.fc2(F.relu(self.fc1(self.pool(x)))))
            return x * s

    class Block(nn.Module):
        def __init__(self, cin: int, k: int, exp: int, cout: int, se: bool, act: str, s: int) -> None:
            super().__init__()
            self.res = s == 1 and cin == cout
            self.expand = cba(cin, exp, 1, 1, act=act) if exp != cin else nn.Identity()
            self.dw = cba(exp, exp, k, s, groups=exp, act=act)
            self.se = SE(exp) if se else nn.Identity()
            self.project = cba(exp, cout, 1, 1, act=None)

        def forward(self, x: Any) -> Any:
            y = self.project(self.se(self.dw(self.expand(x))))
            return x + y if self.res else y

    # MobileNetV3-large: kernel, expansion, out, SE, activation, stride
    cfg = [(3, 16, 16, False, "relu", 1), (3, 64, 24, False, "relu", 2), (3, 72, 24, False, "relu", 1),
           (5, 72, 40, True, "relu", 2), (5, 120, 40, True, "relu", 1), (5, 120, 40, True, "relu", 1),
           (3, 240, 80, False, "hardswish", 2), (3, 200, 80, False, "hardswish", 1),
           (3, 184, 80, False, "hardswish", 1), (3, 184, 80, False, "hardswish", 1),
           (3, 480, 112, True, "hardswish", 1), (3, 672, 112, True, "hardswish", 1),
           (5, 672, 160, True, "hardswish", 2), (5, 960, 160, True, "hardswish", 1),
           (5, 960, 160, True, "hardswish", 1)]

    class Det(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c = _div8(16 * scale)
            self.stem = cba(3, c, 3, 2, act="hardswish")
            stages: list[list[nn.Module]] = [[]]
            outs: list[int] = []
            for i, (k, e, o, se, act, s) in enumerate(cfg):
                if s == 2 and i > 1:  # a new stage starts at each stride-2 block (the first one stays in stage 1)
                    stages.append([])
                    outs.append(c)
                stages[-1].append(Block(c, k, _div8(scale * e), _div8(scale * o), se, act, s))
                c = _div8(scale * o)
            last = _div8(scale * 960)
            stages[-1].append(cba(c, last, 1, 1, act="hardswish"))
            outs.append(last)
            self.stages = nn.ModuleList(nn.Sequential(*s) for s in stages)
            self.ins = nn.ModuleList(nn.Conv2d(ci, neck, 1, bias=False) for ci in outs)
            self.ps = nn.ModuleList(nn.Conv2d(neck, neck // 4, 3, padding=1, bias=False) for _ in outs)
            q = neck // 4
            self.head = nn.Sequential(
                nn.Conv2d(neck, q, 3, padding=1, bias=False), nn.BatchNorm2d(q), nn.ReLU(),
                nn.ConvTranspose2d(q, q, 2, 2), nn.BatchNorm2d(q), nn.ReLU(),
                nn.ConvTranspose2d(q, 1, 2, 2), nn.Sigmoid())

        def forward(self, x: Any) -> Any:
            x = self.stem(x)
            feats = []
            for st in self.stages:
                x = st(x)
                feats.append(x)
            c2, c3, c4, c5 = (conv(f) for conv, f in zip(self.ins, feats))

            def up(t: Any, f: int) -> Any:
                return F.interpolate(t, scale_factor=f, mode="nearest")

            o4 = c4 + up(c5, 2)
            o3 = c3 + up(o4, 2)
            o2 = c2 + up(o3, 2)
            p5, p4, p3, p2 = (conv(t) for conv, t in zip(self.ps, (c5, o4, o3, o2)))
            fuse = torch.cat([up(p5, 8), up(p4, 4), up(p3, 2), p2], dim=1)
            return self.head(fuse)

    m = Det()
    g = torch.Generator().manual_seed(seed + 1)
    return _calibrate_bn(m, [(torch.randn(2, 3, 256, 256, generator=g),) for _ in range(2)])


def _rec_backbone(width: float, nn: Any) -> tuple[Any, int]:
    """CRNN conv stages: 48 x W -> 1 x T with T = ceil(ceil(W / 2) / 2) (ceil-mode 2x2 pools, then (2,1) pools)."""

    def c(n: int) -> int:
        return max(4, int(n * width))

    def cbr(cin: int, cout: int) -> list[Any]:
        return [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    layers = [*cbr(3, c(32)), nn.MaxPool2d(2, 2, ceil_mode=True),
              *cbr(c(32), c(64)), nn.MaxPool2d(2, 2, ceil_mode=True),
              *cbr(c(64), c(128)), *cbr(c(128), c(128)), nn.MaxPool2d((2, 1), (2, 1)),
              *cbr(c(128), c(256)), *cbr(c(256), c(256)), nn.MaxPool2d((2, 1), (2, 1)),
              nn.AvgPool2d((3, 1))]
    return nn.Sequential(*layers), c(256)


def build_text_rec(width: float = 1.0, hidden: int = 96, layers: int = 2, classes: int = 6625,
                   seed: int = 0) -> Any:
    """CRNN recogniser: conv stages, squeeze to a width sequence, BiLSTM, linear head + softmax."""
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class Rec(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone, c = _rec_backbone(width, nn)
            self.rnn = nn.LSTM(c, hidden, num_layers=layers, bidirectional=True, batch_first=True)
            self.fc = nn.Linear(2 * hidden, classes)

        def forward(self, x: Any) -> Any:
            f = self.backbone(x).flatten(1, 2).permute(0, 2, 1)  # (N, C, 1, T) -> (N, T, C)
            y, _ = self.rnn(f)
            return torch.softmax(self.fc(y), dim=-1)

    g = torch.Generator().manual_seed(seed + 1)
    m = _calibrate_bn(Rec(), [(torch.randn(4, 3, 48, 160, generator=g),) for _ in range(2)])
    return _rescale(m, m.fc, (torch.randn(4, 3, 48, 160, generator=g),), 4.0)


def build_text_rec_svtr(width: float = 1.0, dim: int = 120, heads: int = 8, depth: int = 2,
                        classes: int = 6625, seed: int = 0) -> Any:
    """SVTR-style recogniser: the CRNN conv stages, a 1x1 conv to `dim`, `depth` pre-norm transformer blocks."""
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
            self.hd = dim // heads

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            qkv = self.qkv(self.n1(x)).reshape(b, t, 3, heads, self.hd).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            a = torch.softmax((q @ k.transpose(-2, -1)) * self.hd ** -0.5, dim=-1)
            x = x + self.proj((a @ v).transpose(1, 2).reshape(b, t, dim))
            h = self.fc1(self.n2(x))
            return x + self.fc2(h * torch.sigmoid(h))  # swish

    class Svtr(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone, c = _rec_backbone(width, nn)
            self.mix = nn.Conv2d(c, dim, 1)
            self.blocks = nn.Sequential(*[Block() for _ in range(depth)])
            self.norm = nn.LayerNorm(dim)
            self.fc = nn.Linear(dim, classes)

        def forward(self, x: Any) -> Any:
            f = self.mix(self.backbone(x)).flatten(1, 2).permute(0, 2, 1)  # (N, T, dim)
            return torch.softmax(self.fc(self.norm(self.blocks(f))), dim=-1)

    g = torch.Generator().manual_seed(seed + 1)
    m = _calibrate_bn(Svtr(), [(torch.randn(4, 3, 48, 160, generator=g),) for _ in range(2)])
    return _rescale(m, m.fc, (torch.randn(4, 3, 48, 160, generator=g),), 4.0)


def build_vad(hidden: int = 128, seed: int = 0) -> Any:
    """Voice activity (Silero v5's layout): each row of x is one frame (512 samples + 64 of context).

    Per frame: reflect pad 64, an STFT as a fixed conv1d (hann-windowed DFT basis, 129 bins, stride 128),
    magnitude, four conv1d + ReLU down to one 128-vector; then one LSTM runs over the frames (sequence = frames,
    batch 1) from the given state; a linear + sigmoid gives each frame's speech probability.
    """
    import torch
    from torch import nn
    from torch.nn import functional as F

    torch.manual_seed(seed)
    n_fft, bins = 256, 129
    t = np.arange(n_fft)
    win = 0.5 - 0.5 * np.cos(2 * np.pi * t / n_fft)
    ang = 2 * np.pi * np.outer(np.arange(bins), t) / n_fft
    basis = np.concatenate([np.cos(ang) * win, -np.sin(ang) * win])[:, None, :].astype(np.float32)

    class Vad(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("basis", torch.from_numpy(basis))
            self.enc = nn.Sequential(
                nn.Conv1d(bins, 128, 3, 1, 1), nn.ReLU(), nn.Conv1d(128, 64, 3, 2, 1), nn.ReLU(),
                nn.Conv1d(64, 64, 3, 2, 1), nn.ReLU(), nn.Conv1d(64, hidden, 3, 1, 1), nn.ReLU())
            self.rnn = nn.LSTM(hidden, hidden)
            self.out = nn.Linear(hidden, 1)

        def forward(self, x: Any, h: Any, c: Any) -> Any:
            s = F.pad(x.unsqueeze(1), (0, 64), mode="reflect")  # (F, 1, 640)
            spec = F.conv1d(s, self.basis, stride=128)  # (F, 258, 4)
            mag = torch.sqrt(spec[:, :bins] ** 2 + spec[:, bins:] ** 2)
            e = self.enc(mag).flatten(1)  # (F, hidden, 1) -> (F, hidden); squeeze exports as If
            y, (hn, cn) = self.rnn(e.unsqueeze(1), (h, c))  # sequence = frames, batch 1
            return torch.sigmoid(self.out(torch.relu(y.flatten(1)))), hn, cn

    m = Vad().eval()
    for layer in m.enc:
        if isinstance(layer, nn.Conv1d):  # He init: the default shrinks the features 3x per layer
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
    g = torch.Generator().manual_seed(seed + 1)
    batch = (0.1 * torch.randn(32, 576, generator=g), torch.zeros(1, 1, hidden), torch.zeros(1, 1, hidden))
    return _rescale(m, m.out, batch, 2.0)


def build_byte_cls(emb: int = 32, width: int = 128, classes: int = 16, seed: int = 0) -> Any:
    """Byte-sequence classifier (MalConv / file-type style): embedding, conv1d stack, global max+avg pool, MLP."""
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class ByteCls(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(256, emb)
            self.c1 = nn.Sequential(nn.Conv1d(emb, width, 7, 2, 3, bias=False), nn.BatchNorm1d(width), nn.ReLU(),
                                    nn.MaxPool1d(3, 2, 1))
            self.c2 = nn.Sequential(nn.Conv1d(width, width, 5, 1, 4, dilation=2, bias=False),
                                    nn.BatchNorm1d(width), nn.ReLU())
            self.ca = nn.Conv1d(width, 2 * width, 3, 2, 1)
            self.cg = nn.Conv1d(width, 2 * width, 3, 2, 1)
            self.mlp = nn.Sequential(nn.Linear(4 * width, 256), nn.ReLU(), nn.Linear(256, classes))

        def forward(self, b: Any) -> Any:
            x = self.c2(self.c1(self.emb(b).transpose(1, 2)))
            x = self.ca(x) * torch.sigmoid(self.cg(x))  # gated conv
            pooled = torch.cat([x.amax(dim=2), x.mean(dim=2)], dim=1)
            return self.mlp(pooled)

    g = torch.Generator().manual_seed(seed + 1)
    m = _calibrate_bn(ByteCls(), [(torch.randint(0, 256, (8, 1024), generator=g),) for _ in range(2)])
    return _rescale(m, m.mlp[-1], (torch.randint(0, 256, (8, 1024), generator=g),), 2.0)


BUILDERS: dict[str, Callable[..., Any]] = {
    "text_det": build_text_det, "text_rec": build_text_rec, "text_rec_svtr": build_text_rec_svtr,
    "vad": build_vad, "byte_cls": build_byte_cls,
}

# knobs that make each builder's architecture tiny (for tests): same ops, a fraction of the work
TINY: dict[str, dict[str, Any]] = {
    "text_det": {"scale": 0.25, "neck": 16}, "text_rec": {"width": 0.125, "hidden": 8, "classes": 37},
    "text_rec_svtr": {"width": 0.125, "dim": 16, "heads": 2, "classes": 37}, "vad": {},
    "byte_cls": {"emb": 8, "width": 16, "classes": 4},
}
