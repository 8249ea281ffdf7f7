"""The torch.nn models of the corpus (bench/zoo_models.py), written here in the styles of models nobody tuned on:
a YOLOv8n-style detector, ConvNeXt-, EfficientNet / MobileNetV3-, UNet-style CNNs, a wav2vec2-style audio front
end and ResNet-18. Each factory returns the module; zoo_models exports it with seeded weights and statistics."""

from __future__ import annotations

from typing import Any


def _nn():
    import torch

    torch.set_num_threads(1)
    return torch, torch.nn


def yolov8(width: float = 0.25, depth: float = 1 / 3, nc: int = 80) -> Any:
    """YOLOv8n-style: Conv(BN folded at export)+SiLU, C2f (Split, n bottlenecks, Concat), SPPF (3 chained 5x5
    max-pools, Concat), PAN neck (nearest Upsample, Concat), decoupled head, DFL (Softmax over 16 bins, a 1x1 conv
    with weights 0..15), anchors from the feature shapes, boxes * stride Concat class sigmoids -> (b, 4 + nc, A)."""
    torch, nn = _nn()
    ch = [int(c * width) for c in (64, 128, 256, 512, 1024)]
    nd = [max(round(n * depth), 1) for n in (3, 6, 6, 3)]

    class Conv(nn.Module):
        def __init__(self, c1, c2, k=1, s=1):  # noqa: ANN001
            super().__init__()
            self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
            self.bn = nn.BatchNorm2d(c2)
            self.act = nn.SiLU()

        def forward(self, x):  # noqa: ANN001, ANN202
            return self.act(self.bn(self.conv(x)))

    class Bottleneck(nn.Module):
        def __init__(self, c, shortcut=True):  # noqa: ANN001
            super().__init__()
            self.cv1, self.cv2, self.add = Conv(c, c, 3), Conv(c, c, 3), shortcut

        def forward(self, x):  # noqa: ANN001, ANN202
            y = self.cv2(self.cv1(x))
            return x + y if self.add else y

    class C2f(nn.Module):
        def __init__(self, c1, c2, n=1, shortcut=False):  # noqa: ANN001
            super().__init__()
            self.c = c2 // 2
            self.cv1 = Conv(c1, 2 * self.c, 1)
            self.cv2 = Conv((2 + n) * self.c, c2, 1)
            self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

        def forward(self, x):  # noqa: ANN001, ANN202
            y = list(self.cv1(x).split((self.c, self.c), 1))
            y.extend(m(y[-1]) for m in self.m)
            return self.cv2(torch.cat(y, 1))

    class SPPF(nn.Module):
        def __init__(self, c1, c2, k=5):  # noqa: ANN001
            super().__init__()
            c_ = c1 // 2
            self.cv1, self.cv2 = Conv(c1, c_, 1), Conv(c_ * 4, c2, 1)
            self.m = nn.MaxPool2d(k, 1, k // 2)

        def forward(self, x):  # noqa: ANN001, ANN202
            y = [self.cv1(x)]
            y.extend(self.m(y[-1]) for _ in range(3))
            return self.cv2(torch.cat(y, 1))

    class DFL(nn.Module):
        def __init__(self, c1=16):  # noqa: ANN001
            super().__init__()
            self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
            self.conv.weight.data[:] = torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1)
            self.c1 = c1

        def forward(self, x):  # noqa: ANN001, ANN202
            b, _, a = x.shape
            return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)

    class Detect(nn.Module):
        def __init__(self, chs, nc):  # noqa: ANN001
            super().__init__()
            self.nc, self.reg_max, self.stride = nc, 16, (8, 16, 32)
            self.no = nc + 4 * 16
            c2, c3 = max(16, chs[0] // 4, 64), max(chs[0], min(nc, 100))
            self.cv2 = nn.ModuleList(nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 64, 1)) for x in chs)
            self.cv3 = nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for x in chs)
            self.dfl = DFL(16)

        def forward(self, xs):  # noqa: ANN001, ANN202
            b = xs[0].shape[0]
            outs, anchors, strides = [], [], []
            for i, x in enumerate(xs):
                o = torch.cat((self.cv2[i](x), self.cv3[i](x)), 1)
                outs.append(o.view(b, self.no, -1))
                h, w = x.shape[2], x.shape[3]
                sy = torch.arange(h, dtype=torch.float32) + 0.5
                sx = torch.arange(w, dtype=torch.float32) + 0.5
                yy, xx = torch.meshgrid(sy, sx, indexing="ij")
                anchors.append(torch.stack((xx, yy), -1).view(-1, 2))
                strides.append(torch.full((h * w, 1), float(self.stride[i])))
            a = torch.cat(anchors).transpose(0, 1).unsqueeze(0)
            s = torch.cat(strides).transpose(0, 1)
            x = torch.cat(outs, 2)
            box, cls = x.split((64, self.nc), 1)
            lt, rb = self.dfl(box).chunk(2, 1)
            x1y1, x2y2 = a - lt, a + rb
            dbox = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * s
            return torch.cat((dbox, cls.sigmoid()), 1)

    class YOLO(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c = ch
            self.b0 = nn.Sequential(Conv(3, c[0], 3, 2), Conv(c[0], c[1], 3, 2), C2f(c[1], c[1], nd[0], True))
            self.b1 = nn.Sequential(Conv(c[1], c[2], 3, 2), C2f(c[2], c[2], nd[1], True))
            self.b2 = nn.Sequential(Conv(c[2], c[3], 3, 2), C2f(c[3], c[3], nd[2], True))
            self.b3 = nn.Sequential(Conv(c[3], c[4], 3, 2), C2f(c[4], c[4], nd[3], True), SPPF(c[4], c[4]))
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.n1 = C2f(c[4] + c[3], c[3], nd[3])
            self.n2 = C2f(c[3] + c[2], c[2], nd[3])
            self.d1 = Conv(c[2], c[2], 3, 2)
            self.n3 = C2f(c[2] + c[3], c[3], nd[3])
            self.d2 = Conv(c[3], c[3], 3, 2)
            self.n4 = C2f(c[3] + c[4], c[4], nd[3])
            self.detect = Detect((c[2], c[3], c[4]), nc)

        def forward(self, x):  # noqa: ANN001, ANN202
            p3 = self.b1(self.b0(x))
            p4 = self.b2(p3)
            p5 = self.b3(p4)
            t4 = self.n1(torch.cat((self.up(p5), p4), 1))
            o3 = self.n2(torch.cat((self.up(t4), p3), 1))
            o4 = self.n3(torch.cat((self.d1(o3), t4), 1))
            o5 = self.n4(torch.cat((self.d2(o4), p5), 1))
            return self.detect([o3, o4, o5])

    return YOLO()


def convnext_nn(dims=(32, 64, 128, 256), depths=(1, 1, 3, 1)) -> Any:  # noqa: ANN001
    """ConvNeXt-style: 4x4 stride-4 stem, blocks of 7x7 depthwise -> LayerNorm over channels (NHWC permute) ->
    Linear 4x -> GELU -> Linear -> layer scale, residual; channels-first LayerNorm (mean / var over C) + 2x2
    stride-2 convs between stages; global mean, LayerNorm, Linear."""
    torch, nn = _nn()

    class LNCF(nn.Module):
        def __init__(self, c):  # noqa: ANN001
            super().__init__()
            self.w, self.b = nn.Parameter(1 + 0.1 * torch.randn(c)), nn.Parameter(0.1 * torch.randn(c))

        def forward(self, x):  # noqa: ANN001, ANN202
            u = x.mean(1, keepdim=True)
            s = (x - u).pow(2).mean(1, keepdim=True)
            x = (x - u) / torch.sqrt(s + 1e-6)
            return self.w[:, None, None] * x + self.b[:, None, None]

    class Block(nn.Module):
        def __init__(self, c):  # noqa: ANN001
            super().__init__()
            self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
            self.norm = nn.LayerNorm(c, eps=1e-6)
            self.pw1, self.act, self.pw2 = nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c)
            self.gamma = nn.Parameter(0.5 * torch.ones(c))

        def forward(self, x):  # noqa: ANN001, ANN202
            y = self.dw(x).permute(0, 2, 3, 1)
            y = self.gamma * self.pw2(self.act(self.pw1(self.norm(y))))
            return x + y.permute(0, 3, 1, 2)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list[Any] = [nn.Conv2d(3, dims[0], 4, 4), LNCF(dims[0])]
            for i, (c, d) in enumerate(zip(dims, depths)):
                if i:
                    layers += [LNCF(dims[i - 1]), nn.Conv2d(dims[i - 1], c, 2, 2)]
                layers += [Block(c) for _ in range(d)]
            self.features = nn.Sequential(*layers)
            self.norm, self.head = nn.LayerNorm(dims[-1]), nn.Linear(dims[-1], 100)

        def forward(self, x):  # noqa: ANN001, ANN202
            return self.head(self.norm(self.features(x).mean((2, 3))))

    return Net()


def effnet_nn() -> Any:
    """EfficientNet / MobileNetV3-style: MBConv (1x1 expand, 3x3 / 5x5 depthwise, SE: global pool -> 1x1 ->
    SiLU -> 1x1 -> Sigmoid (HardSigmoid in the HardSwish stages) -> Mul, 1x1 project, residual), SiLU and
    HardSwish stages, 1x1 head, global pool, Linear."""
    torch, nn = _nn()

    class SE(nn.Module):
        def __init__(self, c, r, hard):  # noqa: ANN001
            super().__init__()
            self.f1, self.f2 = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)
            self.act, self.gate = (nn.ReLU(), nn.Hardsigmoid()) if hard else (nn.SiLU(), nn.Sigmoid())

        def forward(self, x):  # noqa: ANN001, ANN202
            return x * self.gate(self.f2(self.act(self.f1(x.mean((2, 3), keepdim=True)))))

    class MB(nn.Module):
        def __init__(self, c1, c2, k, s, e, hard):  # noqa: ANN001
            super().__init__()
            act = nn.Hardswish if hard else nn.SiLU
            ce = c1 * e
            self.body = nn.Sequential(
                *([nn.Conv2d(c1, ce, 1, bias=False), nn.BatchNorm2d(ce), act()] if e != 1 else []),
                nn.Conv2d(ce, ce, k, s, k // 2, groups=ce, bias=False), nn.BatchNorm2d(ce), act(),
                SE(ce, max(8, c1 // 4), hard), nn.Conv2d(ce, c2, 1, bias=False), nn.BatchNorm2d(c2))
            self.res = s == 1 and c1 == c2

        def forward(self, x):  # noqa: ANN001, ANN202
            y = self.body(x)
            return x + y if self.res else y

    cfg = [(16, 16, 3, 1, 1, False), (16, 24, 3, 2, 4, False), (24, 24, 3, 1, 4, False), (24, 40, 5, 2, 4, False),
           (40, 40, 5, 1, 4, False), (40, 80, 3, 2, 4, True), (80, 80, 3, 1, 4, True), (80, 112, 5, 1, 4, True),
           (112, 160, 5, 2, 4, True), (160, 160, 5, 1, 4, True)]
    net = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.SiLU(),
                        *[MB(*c) for c in cfg], nn.Conv2d(160, 480, 1, bias=False), nn.BatchNorm2d(480), nn.Hardswish(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(480, 100))
    return net


def unet_nn(ch=(16, 32, 64, 128)) -> Any:  # noqa: ANN001
    """UNet-style: (Conv-BN-ReLU) x2 per level, MaxPool 2 down; up through ConvTranspose 2x2 stride 2 (the two
    deep levels) and bilinear Resize x2 + 1x1 conv (the shallow ones), Concat with the skip, (Conv-BN-ReLU) x2;
    a 1x1 conv to 2 classes."""
    torch, nn = _nn()

    def double(c1, c2):  # noqa: ANN001, ANN202
        return nn.Sequential(nn.Conv2d(c1, c2, 3, padding=1, bias=False), nn.BatchNorm2d(c2), nn.ReLU(),
                             nn.Conv2d(c2, c2, 3, padding=1, bias=False), nn.BatchNorm2d(c2), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inc = double(3, ch[0])
            self.downs = nn.ModuleList(double(ch[i], ch[i + 1]) for i in range(3))
            self.mid = double(ch[3], ch[3] * 2)
            self.ups = nn.ModuleList()
            self.decs = nn.ModuleList()
            cs = [ch[3] * 2, *reversed(ch)]
            for i in range(4):
                c_in, c_out = cs[i], cs[i + 1]
                if i < 2:
                    self.ups.append(nn.ConvTranspose2d(c_in, c_out, 2, 2))
                else:
                    self.ups.append(nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                                                  nn.Conv2d(c_in, c_out, 1)))
                self.decs.append(double(2 * c_out, c_out))
            self.out = nn.Conv2d(ch[0], 2, 1)

        def forward(self, x):  # noqa: ANN001, ANN202
            skips = [self.inc(x)]
            for d in self.downs:
                skips.append(d(nn.functional.max_pool2d(skips[-1], 2)))
            y = self.mid(nn.functional.max_pool2d(skips[-1], 2))
            for up, dec, s in zip(self.ups, self.decs, reversed(skips)):
                y = dec(torch.cat((up(y), s), 1))
            return self.out(y)

    return UNet()


def w2v_frontend_nn() -> Any:
    """wav2vec2-style feature encoder: Conv1d(1, 128, 10, stride 5) -> GroupNorm(128, 128) (exported as
    InstanceNormalization) -> GELU, six Conv1d (k 3,3,3,3,2,2, stride 2) -> GELU, then LayerNorm and a Linear
    projection over the frames."""
    torch, nn = _nn()

    class FE(nn.Module):
        def __init__(self, c=128, d=192) -> None:  # noqa: ANN001
            super().__init__()
            self.c0, self.gn = nn.Conv1d(1, c, 10, 5, bias=False), nn.GroupNorm(c, c)
            self.convs = nn.ModuleList(nn.Conv1d(c, c, k, 2, bias=False) for k in (3, 3, 3, 3, 2, 2))
            self.ln, self.proj = nn.LayerNorm(c), nn.Linear(c, d)
            self.act = nn.GELU()

        def forward(self, x):  # noqa: ANN001, ANN202
            y = self.act(self.gn(self.c0(x.unsqueeze(1))))
            for cv in self.convs:
                y = self.act(cv(y))
            return self.proj(self.ln(y.transpose(1, 2)))

    return FE()


def resnet18_nn(width: int = 64) -> Any:
    torch, nn = _nn()

    class Basic(nn.Module):
        def __init__(self, c1, c2, s):  # noqa: ANN001
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(c1, c2, 3, s, 1, bias=False), nn.BatchNorm2d(c2)
            self.c2, self.b2 = nn.Conv2d(c2, c2, 3, 1, 1, bias=False), nn.BatchNorm2d(c2)
            self.down = (nn.Sequential(nn.Conv2d(c1, c2, 1, s, bias=False), nn.BatchNorm2d(c2))
                         if s != 1 or c1 != c2 else nn.Identity())

        def forward(self, x):  # noqa: ANN001, ANN202
            return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + self.down(x))

    w = [width, width * 2, width * 4, width * 8]
    layers: list[Any] = [nn.Conv2d(3, w[0], 7, 2, 3, bias=False), nn.BatchNorm2d(w[0]), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1)]
    for i, c in enumerate(w):
        cin = w[max(i - 1, 0)]
        layers += [Basic(cin, c, 1 if i == 0 else 2), Basic(c, c, 1)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w[-1], 1000)]
    return nn.Sequential(*layers)
