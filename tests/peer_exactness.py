"""Where a peer is itself exact enough to check our answers against.

onnxruntime's 8-bit products by signed weights (u8s8: MatMulInteger, DynamicQuantizeMatMul, QLinearMatMul, a QDQ
MatMul) multiply with VPMADDUBSW on a CPU without VNNI (AVX2 alone, or AVX-512 without AVX512-VNNI): each pair of
u8 * s8 products is summed in 16 bits, saturating, so large activations against large weights come back wrong.
onnxruntime's quantization documentation says so ("saturation issue" on AVX2 / AVX512 without VNNI; its advice is
reduce_range or u8u8). Seen on an AMD EPYC (Zen 3, AVX2 only) with onnxruntime 1.32: a QDQ product 51-95% of its
RMS away from onnx's reference where ours equalled the reference to 1e-6. With VNNI (VPDPBUSD sums in 32 bits) it
is exact. The 8-bit tests compare against onnx's ReferenceEvaluator everywhere and against onnxruntime only where
it is exact; import as `from peer_exactness import ORT_INT8_EXACT` (tests/ is on sys.path, as for tolerance).
"""

from __future__ import annotations

from dynshape.codegen.bf16 import cpu_flags

ORT_INT8_EXACT: bool = bool({"avx512_vnni", "avx_vnni"} & cpu_flags())
