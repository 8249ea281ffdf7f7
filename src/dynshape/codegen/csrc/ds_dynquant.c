/* DynamicQuantizeLinear's scale and zero point (ops/dynquant_conv.py: dynshape::DynamicQuantParams).

   One pass over n floats for their range widened to hold 0, then the spec's arithmetic in float32, in the order
   the reference (ops/quantize.py) rounds it: scale = (hi - lo) / 255, zero point = saturate(rint(0 - lo / scale)).
   A range of zero (all zeros, or n = 0) gives scale 1 and zero point 0, as onnxruntime does. A NaN anywhere gives
   scale NaN and zero point 0 (the quantized values are then unspecified, by the spec as by onnxruntime). The
   elements are read in memory order, whatever layout they are in: the result depends only on their values. */
#include <math.h>
#include <stdint.h>

void ds_dynquant_params_f32(const float *restrict x, int64_t n, float *restrict scale, uint8_t *restrict zp) {
    float lo = 0.0f, hi = 0.0f;
    int nan = 0;
    #pragma omp parallel for simd reduction(min:lo) reduction(max:hi) reduction(|:nan) if(parallel: n >= 262144)
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        nan |= v != v;
    }
    if (nan) {
        *scale = NAN;
        *zp = 0;
        return;
    }
    if (hi == lo) { /* all zeros, or n = 0: onnxruntime's scale 1, zero point 0 (ops/quantize.py) */
        *scale = 1.0f;
        *zp = 0;
        return;
    }
    const float s = (hi - lo) / 255.0f;
    *scale = s;
    float z = rintf(0.0f - lo / s);
    z = z < 0.0f ? 0.0f : (z > 255.0f ? 255.0f : z);
    *zp = (uint8_t)z;
}

void ds_dynquant_params_args(const int64_t *a) {
    ds_dynquant_params_f32((const float *)a[0], a[1], (float *)a[2], (uint8_t *)a[3]);
}
