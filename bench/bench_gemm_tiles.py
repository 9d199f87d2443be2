"""SGEMM tile sweep: the generated tiled kernel at fixed (tile, K splits) plans, GPU-timestamp timed.

    python bench/bench_gemm_tiles.py [--sizes 2048,4096] [--reps 5] [--tiles 128x128x8/8x8,128x256x16/8x16wu]

Finds which tiles (shape, plus the 'w' warp layout and 'u' unrolled K loop of matmul.Tile) the generator's kernel
runs fastest with on this adapter. Each result is checked against float64 on 8 sampled rows. With torch and CUDA
present, cuBLAS fp32 (TF32 off) is timed in the same process as the yardstick.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("EMBER_AUTOTUNE", "0")
sys.path.insert(0, str(Path(__file__).parent))
from bench_kernels import Timer, cuda_torch, upload  # noqa: E402

import ember  # noqa: E402
from ember.backends.wgpu import autotune as at  # noqa: E402
from ember.backends.wgpu import matmul as mm  # noqa: E402

TILES = ["128x128x8/8x8", "128x128x16/8x8", "128x128x16/8x8w", "128x256x16/8x16", "128x256x16/8x16w",
         "128x256x16/8x16wu", "256x128x8/16x8", "256x128x8/16x8w", "64x128x16/8x8", "128x128x8/8x8wu",
         "64x64x16/4x4"]


def torch_tflops(n: int, reps: int) -> float | None:
    torch = cuda_torch()
    if torch is None:
        return None
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / 20)
    return 2 * n**3 / sorted(times)[len(times) // 2] / 1e12


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="2048,4096")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tiles", default=",".join(TILES))
    args = ap.parse_args()
    be = ember.backend("wgpu")
    be._require_init()
    limit = int(be.limits.get("max-compute-workgroup-storage-size", 16384))
    print("adapter:", be.adapter_name)
    tiles = [mm.Tile.parse(s) for s in args.tiles.split(",")]
    for n in (int(s) for s in args.sizes.split(",")):
        ref_tf = torch_tflops(n, args.reps)
        if ref_tf is not None:
            print(f"  {n}^3 cuBLAS fp32 (torch, TF32 off): {ref_tf:6.2f} TFLOP/s", flush=True)
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n), np.float32)
        b = rng.standard_normal((n, n), np.float32)
        ha, hb, hc = upload(be, a), upload(be, b), be.alloc(n * n * 4)
        check = rng.integers(0, n, 8)
        ref = a[check].astype(np.float64) @ b.astype(np.float64)
        for tile in tiles:
            name = f"{str(tile):>18}"
            if tile.smem_bytes() > limit or tile.threads > 256:
                print(f"  {n}^3 {name}: skipped (workgroup storage / threads)")
                continue
            orig_plan = mm.plan_gemm
            mm.plan_gemm = at.plan_gemm = lambda *_a, t=tile: (t, 1)
            try:
                steps = be.record_gemm(False, False, n, n, n, 1.0, ha, n, hb, n, 0.0, hc, n)
                t, _ = Timer(be, steps, True).measure(args.reps, 0.3)
            except Exception as e:  # a tile the generator cannot build
                print(f"  {n}^3 {name}: failed: {type(e).__name__}: {str(e)[:200]}")
                continue
            finally:
                mm.plan_gemm = at.plan_gemm = orig_plan
            c = np.empty((n, n), np.float32)
            be.copy_dtoh(c, hc)
            err = float(np.abs(c[check] - ref).max() / np.abs(ref).max())
            print(f"  {n}^3 {name}: {2 * n**3 / t / 1e12:6.2f} TFLOP/s  (rel err {err:.1e})", flush=True)
        for h in (ha, hb, hc):
            be.free(h)
    return 0


if __name__ == "__main__":
    sys.exit(main())
