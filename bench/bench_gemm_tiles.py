"""SGEMM tile sweep: the generated tiled kernel at fixed (tile, K splits) plans, GPU-timestamp timed.

    python bench/bench_gemm_tiles.py [--sizes 2048,4096] [--reps 5]

Finds which tile shapes the generator's kernel runs fastest on this adapter (what plan_gemm's heuristic and the
autotuner's candidate list should contain). Each result is checked against float64 on 8 sampled rows.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("EMBER_AUTOTUNE", "0")
sys.path.insert(0, str(Path(__file__).parent))
from bench_kernels import Timer, upload  # noqa: E402

import ember  # noqa: E402
from ember.backends.wgpu import autotune as at  # noqa: E402
from ember.backends.wgpu import matmul as mm  # noqa: E402

TILES = [mm.Tile(128, 128, 8, 8, 8), mm.Tile(128, 128, 16, 8, 8), mm.Tile(64, 128, 16, 4, 8),
         mm.Tile(128, 64, 16, 8, 4), mm.Tile(128, 256, 8, 8, 16), mm.Tile(256, 128, 8, 16, 8),
         mm.Tile(64, 256, 16, 4, 16), mm.Tile(64, 64, 16, 4, 4)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="2048,4096")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    be = ember.backend("wgpu")
    be._require_init()
    limit = int(be.limits.get("max-compute-workgroup-storage-size", 16384))
    print("adapter:", be.adapter_name)
    for n in (int(s) for s in args.sizes.split(",")):
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n), np.float32)
        b = rng.standard_normal((n, n), np.float32)
        ha, hb, hc = upload(be, a), upload(be, b), be.alloc(n * n * 4)
        check = rng.integers(0, n, 8)
        ref = a[check].astype(np.float64) @ b.astype(np.float64)
        for tile in TILES:
            if tile.smem_bytes() > limit or tile.threads > 256:
                print(f"  {n}^3 {tile}: skipped (workgroup storage / threads)")
                continue
            orig = mm.plan_gemm
            mm.plan_gemm = at.plan_gemm = lambda *_a, t=tile: (t, 1)
            try:
                steps = be.record_gemm(False, False, n, n, n, 1.0, ha, n, hb, n, 0.0, hc, n)
                t, _ = Timer(be, steps, True).measure(args.reps, 0.3)
            except Exception as e:  # a tile the generator cannot build
                print(f"  {n}^3 {tile}: failed: {type(e).__name__}: {str(e)[:200]}")
                continue
            finally:
                mm.plan_gemm = at.plan_gemm = orig
            c = np.empty((n, n), np.float32)
            be.copy_dtoh(c, hc)
            err = float(np.abs(c[check] - ref).max() / np.abs(ref).max())
            print(f"  {n}^3 {str(tile):>16}: {2 * n**3 / t / 1e12:6.2f} TFLOP/s  (rel err {err:.1e})", flush=True)
        for h in (ha, hb, hc):
            be.free(h)
    return 0


if __name__ == "__main__":
    sys.exit(main())
