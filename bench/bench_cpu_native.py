"""The cpu backend's compiled kernels (weights packed at load, backends/cpu/_gemm.c) against numpy's OpenBLAS, one
thread, on the work ResNet-18's convs make at batch 1.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python bench/bench_cpu_native.py [--reps 21]

Two tables, GMAC/s warm (operands in cache from the run before) and cold (a 64 MB pass between runs pushes them
out, as a network's other layers do):
- the GEMM per product shape (M x K @ K x N: a thread's part of a conv's weight times its im2col columns),
  against np.matmul; native.MAX_COLUMNS, the widest product the backend hands it, comes from this table;
- the direct conv (its im2col inside, a block of columns at a time) per conv shape, against np.matmul of the
  same product with the column matrix already made: OpenBLAS's side leaves out the im2col it would need.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from ember.backends.cpu import native

SHAPES = [  # M, K, N, what
    (512, 2304, 49, "layer 4 3x3, a thread's input channels"),
    (512, 1152, 49, "layer 4's 3x3/2, a thread's input channels"),
    (256, 576, 196, "layer 3's 3x3/2, a thread's input channels"),
    (128, 576, 392, "layer 2's 3x3/2, a band of rows"),
    (64, 147, 6384, "the stem, a band of rows"),
]
CONVS = [  # C, H = W, K, stride, what (3x3, pads 1, one image; K a thread's share of the output channels)
    (512, 7, 256, 1, "layer 4 3x3, half the output channels"),
    (256, 14, 256, 2, "layer 4's 3x3/2, half the output channels"),
    (128, 28, 128, 2, "layer 3's 3x3/2, half the output channels"),
    (64, 56, 128, 2, "layer 2's 3x3/2, whole"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=21)
    args = ap.parse_args()
    if not native.available():
        print("the compiled GEMM is not available here (not built, EMBER_NATIVE_GEMM=0, or no AVX-512F)")
        return 1
    rng = np.random.default_rng(0)
    flush = np.ones(16 << 20, np.float32)

    def median_s(fn: Callable[[], object], cold: bool) -> float:
        fn()
        ts = []
        for _ in range(args.reps):
            if cold:
                flush.sum()
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    def row(label: str, what: str, macs: int, blas: Callable[[], object], mine: Callable[[], object]) -> None:
        cells = []
        for cold in (False, True):
            tb, tm = median_s(blas, cold), median_s(mine, cold)
            cells.append(f"{macs / tb / 1e9:5.1f} / {macs / tm / 1e9:5.1f} ({tb / tm:.2f}x)")
        print(f"{label:>20s}  {what:44s} {cells[0]:>28s} {cells[1]:>22s}")

    header = f"{'what':44s} {'warm: blas / native GMAC/s':>28s} {'cold: blas / native':>22s}"
    print(f"{'product':>20s}  {header}")
    for m, k, n, what in SHAPES:
        w = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        c = np.empty((m, n), np.float32)
        row(f"{m}x{k} @ {k}x{n}", what, m * k * n, partial(np.matmul, w, b, out=c),
            native.gemm_step(native.pack(w), b, c))

    print(f"\n{'direct conv':>20s}  {header}")
    for ch, size, k, stride, what in CONVS:
        p = (size + 2 - 3) // stride + 1
        w = rng.standard_normal((k, ch * 9), dtype=np.float32)
        xp = rng.standard_normal((ch, size + 2, size + 2), dtype=np.float32)
        cols = rng.standard_normal((ch * 9, p * p), dtype=np.float32)
        row(f"{ch}->{k} {size}x{size} /{stride}", what, k * ch * 9 * p * p,
            partial(np.matmul, w, cols, out=np.empty((k, p * p), np.float32)),
            native.conv_step(native.pack(w), xp, (3, 3), (stride, stride), np.empty((p, p, k), np.float32)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
