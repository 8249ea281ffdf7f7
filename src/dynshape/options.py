"""Every knob of the compiler, in one typed, frozen object: `ds.compile(graph, options=Options(...))`, or the
same fields as keyword arguments (`ds.compile(graph, strategy="generic", fused_attention=False)`).

Why one object: a switch that changes the generated code must be visible wherever that code is cached or
shipped. Each field is marked with what it affects:
- "build": the kernels themselves (fusion switches, BLAS, thread thresholds, math). These fields are part of the
  build cache key (`Options.build_key`), saved in an artefact's config (so `ds.load` compares them before
  building anything) and printed by `explain`;
- "runtime": how calls are served (specialisation strategy, memory policy): recorded and explained, but two
  executables differing only there share every kernel.

The environment is read here and only here, to fill defaults (`DYNSHAPE_HOIST=0` and friends are escape
hatches for experiments; an explicit field always wins).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from dynshape.errors import DynshapeError

STRATEGIES = ("auto", "generic", "multi_version", "bucketed", "static")
BLAS_CHOICES = ("auto", "mkl", "openblas")
PRECISIONS = ("fp32", "bf16", "bf16-emulated", "int8")


def _env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    raise DynshapeError(f"{name}={raw!r}: expected 0 or 1")


def _env_str(name: str, default: str | None) -> str | None:
    return os.environ.get(name) or default


def _build(doc: str, env: str | None = None, default: Any = None, kind: str = "build") -> Any:
    """A field; `env` names the environment variable that fills its default."""
    meta = {"kind": kind, "doc": doc, "env": env, "default": default}
    if env is None:
        return field(default=default, metadata=meta)
    if isinstance(default, bool):
        return field(default_factory=lambda: _env_flag(env, default), metadata=meta)
    return field(default_factory=lambda: _env_str(env, default), metadata=meta)


def _run(doc: str, default: Any = None, env: str | None = None) -> Any:
    return _build(doc, env, default, kind="runtime")


@dataclass(frozen=True)
class Options:
    """What `ds.compile` takes; see `ds.compile` for how the specialisation and memory fields interact."""

    # ---- what the kernels are (build cache key, artefact config) -------------------------------------------
    fuse: bool = _build("fuse ops into generated C kernels (False: one step per op, the baseline)", default=True)
    planned: bool = _build("memory plan per shape in pooled arenas (False: allocate every tensor per call)",
                           default=True)
    hoist: bool = _build("move scalar ops above data movement so they join a product's epilogue", "DYNSHAPE_HOIST",
                         True)
    packed_gemm: bool = _build("products by constant matrices on dynshape's packed micro-kernels with fused "
                               "epilogues (False: through the BLAS)", "DYNSHAPE_PACKED_GEMM", True)
    fused_softmax: bool = _build("a softmax joins its producer and consumer elementwise groups", default=True)
    fused_attention: bool = _build("softmax(Q @ KT) @ V without materialised scores", "DYNSHAPE_FUSED_ATTENTION",
                                   True)
    fold_transposes: bool = _build("head transposes written by the product or attention kernel itself",
                                   "DYNSHAPE_FOLD_TRANSPOSES", True)
    fused_layernorm: bool = _build("a last-axis LayerNormalization of a product runs on its blocks of rows",
                                   "DYNSHAPE_FUSED_LAYERNORM", True)
    fused_product_softmax: bool = _build("a last-axis softmax of a product (a classifier head) runs on its blocks "
                                         "of rows while they are in cache", "DYNSHAPE_FUSED_PRODUCT_SOFTMAX", True)
    fused_pw_dw: bool = _build("a 1x1 conv that only a depthwise conv reads (a MobileNet block's expansion) "
                               "is computed a few rows at a time into per-thread scratch the depthwise reads "
                               "in cache, instead of writing its whole map out", "DYNSHAPE_FUSED_PW_DW", True)
    conv_bias_in_tiles: bool = _build("convs add a per-channel bias (and apply a Relu or HardSwish that is their "
                                      "whole epilogue) in registers as their C stores each tile",
                                      "DYNSHAPE_CONV_BIAS_IN_TILES", True)
    fold_batchnorm: bool = _build("an inference BatchNormalization, and a per-channel Mul / Add / Sub by "
                                  "constants, folds into the weights and bias of the conv before it", default=True)
    conv_prologue: bool = _build("bf16: a per-channel scale, shift and Relu that alone feeds a 1x1 convolution "
                                 "(DenseNet's BatchNormalization + Relu before each layer) is applied as the "
                                 "convolution rounds its input rows, instead of a pass of its own over the map",
                                 "DYNSHAPE_CONV_PROLOGUE", True)
    pointwise_before_resize: bool = _build("a 1x1 convolution that alone reads an upsampling Resize runs before it, "
                                           "on the smaller map (UNet / FPN decoders: 4x fewer multiply-adds at scale "
                                           "2; the sums in another order, a few float32 ulp)", default=True)
    channels_last: bool = _build("CNNs run channels last: spatial ops wrapped, their transposes cancelled",
                                 "DYNSHAPE_CHANNELS_LAST", True)
    winograd: bool = _build("3x3 stride-1 convolutions by Winograd's transforms (see winograd_tile), relative "
                            "differences from the direct sum around 1e-6 (F(2x2)) to 1e-5 (F(4x4)); False: implicit "
                            "GEMM",
                            "DYNSHAPE_WINOGRAD", True)
    winograd_tile: int = _build("Winograd's output tile: 4 (F(4x4, 3x3), 4x fewer multiply-adds, where the map's "
                                "tiles are many and waste little of it and the weights are under 512 x 512 "
                                "channels, chosen per call where the map is a runtime size and the weights are "
                                "small; F(2x2) elsewhere) or 2 (F(2x2, 3x3) everywhere)", default=4)
    winograd_min_tiles: int = _build("F(2x2) tiles of a call (all its images) below which a Winograd-shaped 3x3 conv "
                                     "runs as an implicit GEMM instead: so few tiles save few multiply-adds and "
                                     "stream 16/9 of the weights (36/9 for F(4x4)) from memory (512 channels on a "
                                     "3x3 map: 1.66 ms against 0.72 a conv); a runtime map packs both and each call "
                                     "chooses; 0: Winograd whatever the map", default=16)
    winograd_min_channels: int | None = _build(
        "input channels below which a Winograd-shaped 3x3 conv runs as an implicit GEMM: its transforms cost more "
        "than the multiply-adds they save on few channels; None: 16 where the kernels run on AVX-512's 16-float "
        "vectors, 32 without AVX-512 (AVX2, AMD EPYC Zen 3, transforms on 8-float vectors: 16 instead of 32 made "
        "SqueezeNet 7% faster and unet, YOLOv8, ResNet-18 and a text detector 1-3% slower)", default=None)
    bf16_min_conv_macs: int = _build("multiply-adds per output pixel (a group's kernel area x input channels x "
                                     "output channels) below which a convolution stays in float32 under a bf16 "
                                     "precision: gathering and rounding its patches onto mostly empty tiles costs "
                                     "more than its few products save (unet's 3 -> 16 3x3 and 16 -> 2 1x1: 2.6x and "
                                     "2.3x slower in bf16); on AMX a conv on at most 8 input channels reads whole "
                                     "window rows instead (amx_direct_conv) and takes bf16 whatever its count; 0: "
                                     "every convolution in bf16", default=2048)
    bf16_min_winograd_macs: int = _build("multiply-adds per output pixel (9 x input x output channels) from which "
                                         "a 3x3 convolution that Winograd takes multiplies in bf16 (F(2x2)) under "
                                         "a bf16 precision without AMX tiles; below it, float32's Winograd (F(4x4) "
                                         "where it pays), whose 4x fewer products beat F(2x2)'s 2.25x at bf16's "
                                         "double rate while the transforms weigh most (16 -> 32 on 235x235: 1.5x "
                                         "faster in float32; 128 -> 128: 1.15x slower); 0: every such conv in bf16",
                                         default=9 * 64 * 128)
    bf16_min_recurrent_bytes: int = _build("float32 bytes of one direction's recurrent weights R from which a "
                                           "recurrent layer's per-step product takes bf16 too under a bf16 "
                                           "precision (the state rounded as read): a step streams all of R, and "
                                           "past the caches half the bytes is most of its time (a bidirectional "
                                           "LSTM of hidden 512, 4 MB a direction: 3.3x at batch 1, 2.1x at 16); "
                                           "a smaller R stays in cache and float32 (hidden 96-256 at batch 2-3 "
                                           "ran 0.88-0.96x in bf16); 0: every R in bf16", default=1 << 20)
    bf16_storage: bool = _build("bf16: a convolution's output that only bf16 convolutions read (as their input or the "
                                "residual their tiles add) is stored as bf16, rounded once as it is stored (a reading "
                                "conv rounds its input anyway; a residual is the float32 sum rounded once): half the "
                                "bytes between the convs of a CNN's memory-bound stages; False: every activation "
                                "float32 (codegen/lower/conv_storage.py)", default=True)
    amx_direct_conv: bool = _build("bf16 convolutions of stride 1 on a multiple of 16 input channels (or on more "
                                   "than 8, padded with zero channels to the next 16 where that adds at most half "
                                   "again), and those on at most 8 input channels (a stem: 3 -> 64 7x7 stride 2) at "
                                   "any stride, read their taps from a padded bf16 copy of the input made once per "
                                   "call, on AMX tiles, instead of gathering each block's patches "
                                   "(csrc/ds_conv_amx.c); False: the implicit GEMM's gathered patches",
                                   "DYNSHAPE_AMX_DIRECT_CONV", True)
    inplace_weights: bool = _build("products of at most 8 rows (every declared shape) read a large transposed "
                                   "weight (Gemm transB, >= 4 MB) in place, several rows at once, instead of a "
                                   "packed copy", "DYNSHAPE_INPLACE_WEIGHTS", True)
    blas: str = _build("BLAS for the products not on our micro-kernels: auto (MKL when installed), mkl, openblas",
                       "DYNSHAPE_BLAS", "auto")
    par_min_elements: int = _build("elements below which an elementwise or row loop nest runs on one thread",
                                   default=1 << 15)
    # (1 << 20 until 2026-12: MobileNetV2's and RegNet's convs on small maps, 0.1-1 M multiply-adds each, ran on one
    # thread of two, 0.77x onnxruntime at 64x64; from 1 << 17 they split: -22% there, bert at (1, 16) -10%)
    par_min_flops: int = _build("multiply-adds below which a product or conv runs on one thread", default=1 << 17)
    par_min_weights: int = _build("weight floats from which a product or conv runs on every thread whatever its "
                                  "rows (streaming them is its cost: a batch-1 classifier's 1024 x 1000)",
                                  default=1 << 18)
    fast_math: bool = _build("dynshape's vectorised exp/erf/tanh (a few ulp; False: libm's)", default=True)
    fold_bytes: int = _build("bytes of constant subgraphs (ConstantOfShape weights, casts, dequantisations, "
                             "transposes of initializers) computed once at compile time; a model needing more is "
                             "refused, naming the node", default=2 << 30)
    precision: str = _build("fp32 (default: every product in float32); bf16: products by constant weights take "
                            "bfloat16 operands with float32 accumulation (AVX512-BF16; refused on a CPU without "
                            "it), everything else stays float32; bf16-emulated: the same rounding on the float32 "
                            "kernels, on any CPU (for tests); int8: a statically quantized (QDQ) model's products "
                            "by 8-bit weights run as int8 products with int32 accumulation (VPDPBUSD where the CPU "
                            "has AVX512-VNNI, plain C elsewhere) and its other QuantizeLinear/DequantizeLinear "
                            "pairs as fused elementwise ops: the int8 sums are exact where the float graph rounds, "
                            "so results differ from the fp32 build by the graph's own float rounding "
                            "(passes/qdq.py); float models are unchanged (ds.quantize_dynamic quantizes one)",
                            "DYNSHAPE_PRECISION", "fp32")
    nonempty_build: bool = _build("symbols that may be 0 (undeclared dims) get a build for keys where every one "
                                  "is >= 1, behind a per-call test; keys with a 0 run a second build made on first "
                                  "use", "DYNSHAPE_NONEMPTY_BUILD", True)

    # ---- how calls are served ---------------------------------------------------------------------------------
    strategy: str = _run("specialisation: auto, generic, multi_version, bucketed or static", "auto")
    profile: str | None = _run("path of a profile written by exe.save_profile: its hot shapes are prebuilt")
    auto_specialize: bool | None = _run("build hot shapes in the background (None: on for multi_version)")
    hot_calls: int = _run("calls in the current window that make a shape hot", 20)
    hot_share: float = _run("share of the last window's calls that make a shape hot", 0.05)
    hot_window: int = _run("calls per profile window", 1000)
    max_variants: int | None = _run("cap on variants built from hotness (declared ones do not count)", 16)
    max_rank_variants: int = _run("cap on builds per executable for ranks fixed by an input's length (shape / "
                                  "axes tensors fed at run time): past it a call with a new length is refused", 16)
    max_branch_variants: int = _run("cap on builds per executable for If conditions decided by a small input's "
                                    "value (a sample rate): one build per value, past it a new value is refused", 8)
    compile_bodies: bool = _run("Loop / Scan bodies compiled once and called per iteration (False: the interpreter "
                                "runs them op by op, the baseline)", True, "DYNSHAPE_COMPILE_BODIES")
    buckets: tuple | None = _run("range buckets, e.g. ({'seq': (65, 128)}, {'batch': 1})")
    memory_budget: int | str | None = _run("refuse shapes whose arena exceeds this (bytes or '2GiB')")
    over_budget: str = _run("error: refuse at compile time; refuse_calls: refuse each call that needs more", "error")
    preallocate: bool = _run("reserve the worst-case arenas at compile time", False)
    arenas: int = _run("arenas in the pool (concurrent planned calls)", 4)
    plan_cache: int = _run("plans cached per arena, oldest dropped first (a plan holds a few KB; making one for "
                           "a new shape takes 0.1-1 ms)", 256)
    bucket_plans: bool = _run("a shape not seen before is served by its bucket's plan (each symbol rounded up to "
                              "the end of its quarter octave, laid out for the largest) moved to it in place, "
                              "cheaper than binding its own plan; the plan's state at each key is remembered and "
                              "put back when the key comes again, and a key called often binds its own", True,
                              "DYNSHAPE_BUCKET_PLANS")
    per_key_in_arena: bool = _run("a bucket plan runs the per-key steps that are cheap in its arena (kernels, native "
                                  "steps, views; values no larger than the inputs) on every call instead of in "
                                  "Python at each new shape: a decode loop's masks and positions", True,
                                  "DYNSHAPE_PER_KEY_IN_ARENA")
    inputs_in_place: bool = _run("large inputs that only generated kernels read are read where the caller's array "
                                 "lies, not copied into the arena", True, "DYNSHAPE_INPUTS_IN_PLACE")
    inputs_kept: bool = _run("every input's arena slot is its own for the whole call (no later value reuses it): "
                             "a Loop / Scan body's values that do not change per iteration are copied in once per "
                             "loop, not once per iteration", False)
    tune_malloc: bool = _run("keep freed memory mapped for reuse (glibc mallopt, process-wide)", True,
                             "DYNSHAPE_TUNE_MALLOC")
    cache_dir: str | None = _run("build cache directory (default ~/.cache/dynshape)", None, "DYNSHAPE_CACHE_DIR")

    def __post_init__(self) -> None:
        if self.buckets is not None and not isinstance(self.buckets, tuple):
            object.__setattr__(self, "buckets", tuple(self.buckets))
        if self.winograd_tile not in (2, 4):
            raise DynshapeError(f"winograd_tile={self.winograd_tile!r}: choose 2 (F(2x2, 3x3)) or 4 (F(4x4, 3x3))")
        if self.strategy not in STRATEGIES:
            raise DynshapeError(f"strategy={self.strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if self.over_budget not in ("error", "refuse_calls"):
            raise DynshapeError(f"over_budget={self.over_budget!r}: choose 'error' or 'refuse_calls'")
        if self.hot_calls < 1 or self.hot_window < 1 or not 0.0 <= self.hot_share <= 1.0 or self.arenas < 1:
            raise DynshapeError("hot_calls, hot_window and arenas must be >= 1 and hot_share in [0, 1]")
        for f in fields(self):  # a switch is True or False: a string ("false" from a config) would read as on
            v = getattr(self, f.name)
            if isinstance(f.metadata["default"], bool) and not isinstance(v, bool):
                raise DynshapeError(f"{f.name}={v!r}: expected True or False")
        if isinstance(self.plan_cache, bool) or not isinstance(self.plan_cache, int) or self.plan_cache < 0:
            raise DynshapeError(f"plan_cache={self.plan_cache!r}: must be an int >= 0 (0: plans are not kept)")
        for name in ("max_rank_variants", "max_branch_variants"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise DynshapeError(f"{name}={v!r}: must be an int >= 1")
        if self.max_variants is not None and self.max_variants < 1:
            raise DynshapeError(f"max_variants={self.max_variants}: must be >= 1 (or None for no cap)")
        if self.precision not in PRECISIONS:
            raise DynshapeError(f"precision={self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.blas not in BLAS_CHOICES:
            raise DynshapeError(f"blas={self.blas!r}: choose one of {', '.join(BLAS_CHOICES)}")
        if self.winograd_min_channels is not None and (isinstance(self.winograd_min_channels, bool) or not isinstance(
                self.winograd_min_channels, int) or self.winograd_min_channels < 0):
            raise DynshapeError(f"winograd_min_channels={self.winograd_min_channels!r}: expected None or an int >= 0")
        for name in ("par_min_elements", "par_min_flops", "par_min_weights", "fold_bytes", "winograd_min_tiles",
                     "bf16_min_conv_macs", "bf16_min_winograd_macs", "bf16_min_recurrent_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**62:
                raise DynshapeError(f"{name}={v!r}: expected an int in [0, 2**62)")

    # ---- views ----------------------------------------------------------------------------------------------
    def replace(self, **changes: Any) -> Options:
        return dataclasses.replace(self, **changes)

    def build_fields(self) -> dict[str, Any]:
        """The fields that change the generated kernels, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata["kind"] == "build"}

    def build_key(self) -> str:
        """A digest of the build fields: part of every kernel library's cache key."""
        text = json.dumps(self.build_fields(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = os.fspath(v) if isinstance(v, os.PathLike) else (list(v) if isinstance(v, tuple) else v)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Options:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DynshapeError(f"options: unknown field(s) {', '.join(unknown)}")
        return cls(**dict(data))

    def explain(self) -> list[dict[str, Any]]:
        """Every field with its value, kind, where the value came from (default, $ENV or given) and what it does."""
        rows = []
        for f in fields(self):
            v, env = getattr(self, f.name), f.metadata["env"]
            if v == f.metadata["default"]:
                origin = "default"
            elif env and os.environ.get(env) and v == Options.__dataclass_fields__[f.name].default_factory():
                origin = f"${env}"
            else:
                origin = "given"
            rows.append({"name": f.name, "value": v, "kind": f.metadata["kind"], "origin": origin,
                         "doc": f.metadata["doc"]})
        return rows


def make(options: Options | None = None, **kwargs: Any) -> Options:
    """`options` with the keyword fields applied; an unknown keyword is an error naming the valid ones."""
    base = options or Options()
    if not kwargs:
        return base
    known = {f.name for f in fields(Options)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise DynshapeError(f"unknown compile option(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    return dataclasses.replace(base, **kwargs)


def default_cache_dir() -> str:
    """$DYNSHAPE_CACHE_DIR, else $XDG_CACHE_HOME/dynshape, else ~/.cache/dynshape."""
    explicit = os.environ.get("DYNSHAPE_CACHE_DIR")
    if explicit:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME")
    return os.path.join(xdg or os.path.join(os.path.expanduser("~"), ".cache"), "dynshape")


def compiler_command() -> str | None:
    """$CC: the C compiler command (may carry arguments, e.g. 'ccache gcc'); None to search PATH."""
    return os.environ.get("CC") or None


def mkl_threading_layer() -> str:
    """$MKL_THREADING_LAYER (default gnu: the OpenMP runtime our kernels use, so the two share one pool)."""
    return os.environ.get("MKL_THREADING_LAYER", "gnu").lower()


#: GOMP_SPINCOUNT given to libgomp when the user sets neither it nor OMP_WAIT_POLICY (see default_openmp_spin)
OPENMP_SPIN = 30000


def default_openmp_spin() -> None:
    """Give libgomp a spin count before it loads, unless the user chose a wait policy. Why: libgomp spins 300,000
    iterations at the end of a parallel region, but only 1,000 (then sleeps, waking by futex) once it counts more
    threads than CPUs, and it counts every team of every calling thread: a second executable, a background
    build's packing, a server's instances. A decoder step at 2 threads on 2 cores then took 520 us instead of 78
    (bench/ootb_bench.py --only kv, past 1024; the same with OMP_WAIT_POLICY=active or GOMP_SPINCOUNT=10000). A
    libgomp loaded before this (torch imported first) keeps its own setting."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(OPENMP_SPIN)


def set_thread_count(threads: int) -> None:
    """Ask the OpenMP and BLAS runtimes for `threads` threads (OMP/OpenBLAS/MKL_NUM_THREADS), before they load:
    `dynshape serve --threads`. Written here, with the other environment access (the environment is this
    module's alone)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(int(threads))
