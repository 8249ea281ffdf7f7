"""Signal ops: DFT (opsets 17 and 20), STFT, MelWeightMatrix, HannWindow, HammingWindow, BlackmanWindow.

Complex values travel as a trailing axis of 2 (real, imaginary); a real signal has a trailing axis of 1. The
transforms run at the input's precision (numpy's FFT in single precision for float32 and narrower types,
double for double, as the spec's evaluator does: its single-precision rounding is what the conformance data
holds) and round once to the input type. Output lengths read from scalar
inputs (dft_length, frame_length, a window's size) are exact when the value is known at load time and fresh
dims otherwise; one-sided spectra keep floor(n/2) + 1 bins, symbolically too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType
from dynshape.ops import dtypes as dt
from dynshape.ops.dims import arg_value, is_static, norm

F32 = np.dtype(np.float32)


def _scalar_int(x: Any, default: int | None = None) -> int | None:
    return default if x is None else int(np.asarray(x).reshape(-1)[0])


def _to_complex(x: np.ndarray) -> np.ndarray:
    work = np.float64 if x.dtype == np.float64 else np.float32
    cwork = np.complex128 if x.dtype == np.float64 else np.complex64
    xf = x.astype(work)
    return (xf[..., 0] + 1j * xf[..., 1]).astype(cwork) if x.shape[-1] == 2 else xf[..., 0].astype(cwork)


def _from_complex(z: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return dt.cast(np.stack([z.real, z.imag], axis=-1), dtype)


# ---------------------------------------------------------------------------------------------------------
# DFT
# ---------------------------------------------------------------------------------------------------------
def _dft_axis(axis: int, rank: int) -> int:
    """A signal axis: the trailing complex axis is not one (range [-r, -2] or [0, r-2])."""
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank - 1:
        raise ValueError(f"axis {axis} is not a signal axis of a rank-{rank} input")
    return a


def _dft_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    n = _scalar_int(inputs[1] if len(inputs) > 1 else None)
    if attrs.get("_opset", 20) >= 20:
        axis = _scalar_int(inputs[2] if len(inputs) > 2 else None, -2)
    else:
        axis = attrs.get("axis", 1)
    axis = _dft_axis(axis, x.ndim)
    inverse, onesided = bool(attrs.get("inverse", 0)), bool(attrs.get("onesided", 0))
    z = _to_complex(x)
    if inverse and onesided:  # IRFFT: a one-sided spectrum back to a real signal
        length = n if n is not None else 2 * (x.shape[axis] - 1)
        y = np.fft.irfft(z, n=length, axis=axis)
        return [dt.cast(y[..., None], x.dtype)]
    length = n if n is not None else x.shape[axis]
    z = _fit(z, length, axis)
    y = np.fft.ifft(z, axis=axis) if inverse else np.fft.fft(z, axis=axis)
    if onesided:
        y = np.take(y, np.arange(length // 2 + 1), axis=axis)
    return [_from_complex(y, x.dtype)]


def _fit(z: np.ndarray, n: int, axis: int) -> np.ndarray:
    """Zero-pad or truncate `z` to length n along `axis`."""
    d = z.shape[axis]
    if n < d:
        return np.take(z, np.arange(n), axis=axis)
    if n > d:
        pad = [(0, 0)] * z.ndim
        pad[axis] = (0, n - d)
        return np.pad(z, pad)
    return z


def _dft_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    if x.rank < 2:
        ctx.error(f"the input needs a signal axis and a trailing (real, imag) axis, got {x.shape}")
    last = x.shape[-1]
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    given = len(ctx.inputs) > 1 and ctx.inputs[1] is not None
    if ctx.opset >= 20:
        av = arg_value(ctx, 2)
        if len(ctx.inputs) > 2 and ctx.inputs[2] is not None and av is None:
            # the axis is fed at run time: only the trailing axis is certain, unless no length changes
            if is_static(last) and last not in (1, 2):
                ctx.error(f"the trailing axis must be 1 (real) or 2 (complex), got {last}")
            same = not given and not onesided
            return [TensorType(x.dtype, (*(x.shape[:-1] if same else [ctx.fresh("dft") for _ in x.shape[:-1]]),
                                         1 if inverse and onesided else 2))]
        axis = -2 if av is None else int(av[0])
    else:
        axis = int(ctx.attr("axis", 1))
    try:
        axis = _dft_axis(axis, x.rank)
    except ValueError as e:
        ctx.error(str(e))
    nv = arg_value(ctx, 1) if given else None
    n = norm(nv[0]) if nv is not None else (ctx.fresh("dft_length") if given else None)
    shape = list(x.shape)
    if inverse and onesided:
        ctx.unify(last, 2)
        shape[axis] = n if n is not None else 2 * (x.shape[axis] - 1)
        shape[-1] = 1
        return [TensorType(x.dtype, tuple(shape))]
    if is_static(last) and last not in (1, 2):
        ctx.error(f"the trailing axis must be 1 (real) or 2 (complex), got {last}")
    if onesided:
        ctx.unify(last, 1)
    length = n if n is not None else x.shape[axis]
    shape[axis] = length // 2 + 1 if onesided else length
    shape[-1] = 2
    return [TensorType(x.dtype, tuple(shape))]


register("DFT", reference=_dft_ref, infer=_dft_rule)


# ---------------------------------------------------------------------------------------------------------
# STFT
# ---------------------------------------------------------------------------------------------------------
def _stft_ref(inputs: list, attrs: dict) -> list:
    x, step = inputs[:2]
    window, frame_len = (list(inputs[2:]) + [None, None])[:2]
    step = _scalar_int(step)
    frame = _scalar_int(frame_len, window.shape[0] if window is not None else x.shape[1])
    onesided = bool(attrs.get("onesided", 1))
    z = _to_complex(x)  # (B, L)
    frames = (x.shape[1] - frame) // step + 1
    idx = np.arange(frames)[:, None] * step + np.arange(frame)[None, :]
    seg = z[:, idx]  # (B, frames, frame)
    if window is not None:
        seg = seg * window.astype(np.float64)
    y = np.fft.fft(seg, axis=-1)
    if onesided:
        y = y[..., : frame // 2 + 1]
    return [_from_complex(y, x.dtype)]


def _stft_rule(ctx: InferCtx) -> list[TensorType]:
    x, step = ctx.inputs[:2]
    window, frame_len = (list(ctx.inputs[2:]) + [None, None])[:2]
    if x.rank != 3:
        ctx.error(f"the signal must be (B, L, 1|2), got {x.shape}")
    sv = arg_value(ctx, 1)
    fv = arg_value(ctx, 3) if frame_len is not None else None
    if frame_len is not None and fv is None:
        frame = ctx.fresh("frame_length")
    elif fv is not None:
        frame = norm(fv[0])
    elif window is not None:
        frame = window.shape[0]
    else:
        frame = x.shape[1]
    if window is not None:
        if window.rank != 1:
            ctx.error(f"the window must be 1-D, got {window.shape}")
        frame = ctx.unify(window.shape[0], frame)
    if sv is None:
        frames = ctx.fresh("stft_frames")
    else:
        s = norm(sv[0])
        if is_static(s) and s < 1:
            ctx.error(f"frame_step must be >= 1, got {s}")
        frames = (x.shape[1] - frame) // s + 1
    onesided = bool(ctx.attr("onesided", 1))
    if onesided:
        ctx.unify(x.shape[2], 1)
    bins = frame // 2 + 1 if onesided else frame
    return [TensorType(x.dtype, (x.shape[0], frames, bins, 2))]


register("STFT", reference=_stft_ref, infer=_stft_rule)


# ---------------------------------------------------------------------------------------------------------
# MelWeightMatrix
# ---------------------------------------------------------------------------------------------------------
def _mel_ref(inputs: list, attrs: dict) -> list:
    """Triangular filters between bins quantised as ONNX defines them: (dft_length + 1) * f // sample_rate
    for num_mel_bins + 2 equally spaced mel points (the step divides the mel range by num_mel_bins + 2)."""
    mels, n, rate = (_scalar_int(v) for v in inputs[:3])
    lo, hi = (float(np.asarray(v).reshape(-1)[0]) for v in inputs[3:5])
    bins = n // 2 + 1
    mel_lo = 2595 * np.log1p(lo / 700) / np.log(10)
    mel_hi = 2595 * np.log1p(hi / 700) / np.log(10)
    pts = np.arange(mels + 2) * ((mel_hi - mel_lo) / (mels + 2)) + mel_lo
    hz = 700 * np.expm1(pts / 2595 * np.log(10))
    f = (((n + 1) * hz) // rate).astype(np.int64)
    w = np.zeros((bins, mels))
    for i in range(mels):
        left, mid, right = f[i], f[i + 1], f[i + 2]
        if mid == left:
            w[mid, i] = 1
        else:
            w[left:mid + 1, i] = (np.arange(left, mid + 1) - left) / (mid - left)
        if right > mid:
            w[mid:right, i] = (right - np.arange(mid, right)) / (right - mid)
    return [w.astype(dt.np_dtype(attrs.get("output_datatype", 1)))]


def _mel_rule(ctx: InferCtx) -> list[TensorType]:
    mv, nv = arg_value(ctx, 0), arg_value(ctx, 1)
    mels = norm(mv[0]) if mv is not None else ctx.fresh("num_mel_bins")
    bins = norm(nv[0]) // 2 + 1 if nv is not None else ctx.fresh("mel_spectrogram_bins")
    return [TensorType(dt.np_dtype(ctx.attr("output_datatype", 1)), (bins, mels))]


register("MelWeightMatrix", reference=_mel_ref, infer=_mel_rule)


# ---------------------------------------------------------------------------------------------------------
# windows
# ---------------------------------------------------------------------------------------------------------
def _window(terms: tuple[float, ...]) -> Any:
    """sum_k (-1)^k a_k cos(2 pi k n / N), N = size (periodic) or size - 1 (symmetric)."""

    def ref(inputs: list, attrs: dict) -> list:
        size = _scalar_int(inputs[0])
        denom = size if attrs.get("periodic", 1) else size - 1
        n = np.arange(size, dtype=np.float64)
        y = np.zeros(size)
        for k, a in enumerate(terms):
            y = y + (-1) ** k * a * (np.cos(2 * np.pi * k * n / denom) if k else 1.0)
        return [y.astype(dt.np_dtype(attrs.get("output_datatype", 1)))]

    return ref


def _window_rule(ctx: InferCtx) -> list[TensorType]:
    v = arg_value(ctx, 0)
    size = norm(v[0]) if v is not None else ctx.fresh("window_size")
    return [TensorType(dt.np_dtype(ctx.attr("output_datatype", 1)), (size,))]


_HAMMING_A = 25 / 46  # the "optimal" Hamming coefficient the spec uses, not the rounded 0.54
register("HannWindow", reference=_window((0.5, 0.5)), infer=_window_rule)
register("HammingWindow", reference=_window((_HAMMING_A, 1 - _HAMMING_A)), infer=_window_rule)
register("BlackmanWindow", reference=_window((0.42, 0.5, 0.08)), infer=_window_rule)
