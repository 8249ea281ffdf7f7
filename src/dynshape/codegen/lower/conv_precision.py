"""Which convolutions multiply in bf16 under a bf16 precision: thresholds measured per conv shape.

Why a module of their own: the conv lowerings (lower/conv.py) and whatever explains or tests the choice read the
same rules; they are plain functions of a conv's geometry (lower/conv_geometry.geometry) and one option each.
"""

from __future__ import annotations


def bf16_too_narrow(geo: dict, min_macs: int) -> bool:
    """Whether a conv stays in float32 under a bf16 precision: fewer than `min_macs` multiply-adds a pixel (a
    group's KH x KW x CG inputs by its OCG outputs; Options.bf16_min_conv_macs, 2048).
    Why: its bf16 tiles gather and round each pixel's patch and run tiles mostly empty (a panel is 32 outputs, an
    AMX tile 32 inputs deep), costs the product's few multiply-adds do not repay. Measured one conv + ReLU a model
    at 1 thread, AMX, bf16 / float32 time: 16 -> 2 1x1 on 128x128 1.92, 3 -> 16 3x3 1.69, 16 -> 64 1x1 1.21,
    8 -> 8 3x3 1.20, 3 -> 32 3x3 1.15, 32 -> 16 1x1 1.12 (all under 2048), 16 -> 16 3x3 (2304) 1.02, 16 -> 32 3x3
    (4608) 1.04, 32 -> 16 3x3 0.80, 24 -> 24 3x3 0.89, 3 -> 64 7x7 0.73, 64 -> 64 3x3 0.61. unet_nn's first conv
    (3 -> 16) and its head (16 -> 2) ran 2.6x and 2.3x slower in bf16 than in float32. Float32 is also the
    more exact choice, so the rule holds on AVX512-BF16 without AMX too (the same gather and rounding). A conv the
    narrow AMX tiles take (conv_amx.narrow_fits: at most 8 input channels) gathers nothing and takes bf16 whatever
    its count: one conv + ReLU, 1 thread, float32 / narrow bf16: 3 -> 16 3x3 on 160x192 294 / 160 us, 1 -> 8 3x3
    177 / 140, 8 -> 8 3x3 on 128x128 318 / 90, 4 -> 16 1x1 73 / 66, 3 -> 24 3x3 stride 2 on 224x224 169 / 107."""
    return geo["KH"] * geo["KW"] * geo["CG"] * geo["OCG"] < min_macs


def bf16_winograd_too_narrow(geo: dict, min_macs: int) -> bool:
    """Whether a conv that Winograd takes runs float32's F(4x4) where its map pays for it (wino4_pays) under a bf16
    precision, and F(2x2) with bf16 products elsewhere (on VDPBF16PS: AMX tiles take 3x3 convs directly): fewer
    than `min_macs` multiply-adds a pixel (Options.bf16_min_winograd_macs). Where F(4x4) does not pay (small
    maps: mtcnn_rnet's 28 -> 48 on 10x10), F(2x2) in bf16 beats F(2x2) in float32 (1.05-1.07x that model).
    Why: F(4x4) in float32 makes 4x fewer products than the direct sum, F(2x2) in bf16 (F(4x4)'s transforms amplify
    bf16's rounding) 2.25x fewer at twice the rate, and the transforms, float32 in both, weigh most where the
    channels are few. One conv + Relu, 1 thread, AMD EPYC Zen 4, bf16 F(2x2) / float32 time: 16 -> 16 on 160x160
    1.83-1.94, 16 -> 32 on 235x235 1.42-1.53 (mtcnn_pnet's: its bf16 call was slower than its float32 one), 32 ->
    32 1.26-1.32, 32 -> 64 on 112x112 0.98-1.07, 64 -> 64 0.89-1.07, 128 -> 128 on 28x28 and 56x56 0.87-0.93,
    256 -> 256 0.57-0.81. Float32 is also the more exact choice."""
    return 9 * geo["C"] * geo["OC"] < min_macs
