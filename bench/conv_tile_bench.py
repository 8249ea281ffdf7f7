"""The conv tiles alone (csrc/ds_conv.c's ds_conv_tile2 over every block of a map, as a generated conv calls them),
in C, without Python or a model around them: the rate of the micro-kernels on a given geometry, for comparing
tile shapes (a whole model's time on this 2-core VM moves 30% between runs; a tile sweep in one process moves
~5%). Each geometry is timed best-of-N over calls on the same arrays (inputs and weights in cache as far as they
fit), 1 thread, with the machine's -march=native build of the library's own sources.

    python bench/conv_tile_bench.py                         # MobileNetV2's and ResNet's 1x1 / 3x3 shapes
    python bench/conv_tile_bench.py 16,96,112 24,144,56,1,1 64,128,28,3,2   # C,OC,side[,kernel,stride]
    python bench/conv_tile_bench.py --csrc /work/base/src/dynshape/codegen/csrc ...   # another tree's tiles
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from benchutil import cpu_model
from dynshape.codegen import cc

MAIN = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "ds_conv.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    const int64_t C = atoi(argv[1]), OC = atoi(argv[2]), HW = atoi(argv[3]), KK = atoi(argv[4]), S = atoi(argv[5]);
    const int reps = atoi(argv[6]);
    const char *ab = argc > 7 ? argv[7] : NULL; /* an environment variable set on every other call (A/B) */
    const int64_t OHW = (HW + 2 * (KK / 2) - KK) / S + 1, panels = (OC + 31) / 32, npix = OHW * OHW;
    int64_t geo[DS_CONV_GEO] = {0};
    geo[DS_CONV_H] = HW; geo[DS_CONV_W] = HW; geo[DS_CONV_C] = C; geo[DS_CONV_OH] = OHW; geo[DS_CONV_OW] = OHW;
    geo[DS_CONV_OC] = OC; geo[DS_CONV_KH] = KK; geo[DS_CONV_KW] = KK; geo[DS_CONV_SH] = S; geo[DS_CONV_SW] = S;
    geo[DS_CONV_DH] = 1; geo[DS_CONV_DW] = 1; geo[DS_CONV_PT] = KK / 2; geo[DS_CONV_PL] = KK / 2; geo[DS_CONV_G] = 1;
    geo[DS_CONV_CG] = C; geo[DS_CONV_OCG] = OC; geo[DS_CONV_LDY] = OC; geo[DS_CONV_ACT] = DS_ACT_RELU6;
    geo[DS_CONV_NPIX] = npix;
    float *x = aligned_alloc(64, (HW * HW * C * 4 + 63) / 64 * 64);
    float *y = aligned_alloc(64, (npix * OC * 4 + 63) / 64 * 64);
    float *bp = aligned_alloc(64, (panels * C * KK * KK * 32 * 4 + 63) / 64 * 64);
    float *bias = aligned_alloc(64, (OC * 4 + 63) / 64 * 64), *zeros = calloc(C + 16, 4);
    for (int64_t i = 0; i < HW * HW * C; i++) x[i] = (float)(i % 7) * 0.1f;
    for (int64_t i = 0; i < panels * C * KK * KK * 32; i++) bp[i] = (float)(i % 5) * 0.01f;
    for (int64_t i = 0; i < OC; i++) bias[i] = 0.1f;
    const int64_t blocks = (npix + DS_CONV_ROWS - 1) / DS_CONV_ROWS;
    double best = 1e9, best_b = 1e9, sum = 0;
    for (int r = 0; r < reps; r++) {
        if (ab) { if (r % 2) setenv(ab, "1", 1); else unsetenv(ab); }
        double t = now();
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t p0 = b * npix / blocks / 6 * 6, p1 = b + 1 < blocks ? (b + 1) * npix / blocks / 6 * 6 : npix;
            for (int64_t q = 0; q < panels; q += 2) ds_conv_tile2(geo, x, bp, y, zeros, p0, p1, 0, q, bias, NULL);
        }
        t = now() - t;
        if (ab && r % 2) best_b = t < best_b ? t : best_b;
        else best = t < best ? t : best;
    }
    for (int64_t i = 0; i < npix * OC; i++) sum += y[i];
    printf("%.2f %.3f %.2f\n", best * 1e6, sum, best_b * 1e6);
    return 0;
}
"""

DEFAULT = ["16,96,112", "24,144,56", "32,192,28", "64,384,14", "96,576,14", "160,960,7", "24,128,56",
           "256,256,14", "576,96,14", "32,64,56,3,2", "64,128,28,3,2", "512,512,7,3,1"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=DEFAULT, help="C,OC,side[,kernel,stride] each")
    ap.add_argument("--csrc", default=str(cc.CSRC), help="the csrc/ directory whose ds_conv.c is timed")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--ab", default=None, help="an environment variable the C reads (an experiment's switch), set on "
                                              "every other call: both variants timed in one process")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        main_c, exe = Path(tmp, "main.c"), Path(tmp, "tiles")
        main_c.write_text(MAIN)
        flags = ["-O3", "-march=native", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math", "-Wno-psabi",
                 "-fopenmp", f"-I{args.csrc}", *cc.include_flags()[1:]]
        subprocess.run(["gcc", *flags, str(main_c), str(Path(args.csrc, "ds_conv.c")), "-o", str(exe), "-lm"],
                       check=True)
        print(f"CPU: {cpu_model()}; 1 thread; tiles of {args.csrc}; best of {args.reps} calls; Relu6, a bias")
        print("| C -> OC | side | kernel, stride | us | GFLOP/s | checksum |")
        print("|---|---|---|---|---|---|")
        for spec in args.shapes:
            c, oc, side, *rest = (int(v) for v in spec.split(","))
            k, s = (rest + [1, 1])[:2] if rest else (1, 1)
            argv = [str(v) for v in (exe, c, oc, side, k, s, args.reps)] + ([args.ab] if args.ab else [])
            us, total, us_b = subprocess.run(["taskset", "-c", "1", *argv], check=True, capture_output=True,
                                             text=True).stdout.split()
            ohw = (side + 2 * (k // 2) - k) // s + 1
            rate = 2.0 * ohw * ohw * c * oc * k * k / (float(us) * 1e3)
            with_b = f" {float(us_b):.1f} with {args.ab} ({float(us) / float(us_b):.2f}x) |" if args.ab else ""
            print(f"| {c} -> {oc} | {side} | {k}x{k}, {s} | {float(us):.1f} | {rate:.1f} | {float(total):.6g} |"
                  f"{with_b}", flush=True)


if __name__ == "__main__":
    main()
