"""Every request of ../shared/bench's stream through dynshape and onnxruntime: outputs within 1e-4 (abs and rel).

    python bench/check_stream.py [--model bert_small|mlp]

Prints the worst absolute and relative differences and exits non-zero if any request is outside tolerance.
"""

from __future__ import annotations

import argparse

import numpy as np

import dynshape as ds
from benchutil import DIMS, common, peers

TOL = 1e-4


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert_small", choices=sorted(DIMS))
    args = ap.parse_args()
    exe = ds.compile(ds.load_onnx(common.onnx_path(args.model), dims=DIMS[args.model]))
    ort, _ = peers.make_ort(args.model, 1)
    names = [v.name for v in exe.graph.outputs]
    worst_abs = worst_rel = 0.0
    bad = 0
    reqs = common.load_stream()["streams"][args.model]
    for r in reqs:
        x = common.make_inputs(args.model, common.req_shape(args.model, r), seed=r["data_seed"])
        ours = exe.run(x)
        for name, ref in zip(names, ort(x)):
            d = np.abs(ours[name].astype(np.float64) - ref)
            worst_abs = max(worst_abs, float(d.max()))
            worst_rel = max(worst_rel, float((d / np.maximum(np.abs(ref), 1e-30)).max()))
            if not np.allclose(ours[name], ref, rtol=TOL, atol=TOL):
                bad += 1
    print(f"{args.model}: {len(reqs)} requests, {bad} outside rtol=atol={TOL}; worst |diff| {worst_abs:.2e}, "
          f"worst relative {worst_rel:.2e} (relative is large only where the reference is ~0)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
