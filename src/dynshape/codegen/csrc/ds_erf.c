/* erf over a float32 array with the prelude's vectorised ds_erff (the numpy lowering of a lone Erf). */
#include "ds_prelude.h"
void ds_erf_f32(const float *restrict x, float *restrict y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = ds_erff(x[i]);
}
