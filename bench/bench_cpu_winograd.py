"""The cpu backend's 3x3 stride-1 convs: direct (im2col + BLAS) against Winograd F(2,3) and F(4,3), per shape.

    PYTHONPATH=src python bench/bench_cpu_winograd.py [--shapes 1x64x56,1x128x28,...] [--runs 30] [--parts]

Each shape is NxCxS: an SxS input of C channels, C output channels, pads 1 (ResNet's 3x3 convs by default,
batch 1 and 8), `--weights` convs of it back to back, each with its own weights (as in a network, where they
come from memory rather than cache). Milliseconds are the 20th percentile of runs interleaved between the
variants (the machine may be shared: a noisy moment taxes all of them alike, and the low percentile drops it);
`--parts` also times the Winograd steps one by one (input transform, products, output).
This is what the cost model in ember/backends/cpu/winograd.py (`choose`) was measured with.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ember.backends.base import View  # noqa: E402
from ember.backends.cpu import CpuBackend  # noqa: E402
from ember.core import winograd  # noqa: E402

F32 = np.dtype(np.float32)
DEFAULT = "1x64x56,1x128x28,1x256x14,1x512x7,8x64x56,8x128x28,8x256x14,8x512x7"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--parts", action="store_true")
    ap.add_argument("--weights", type=int, default=4, help="convs of each shape, each with its own weights")
    args = ap.parse_args()
    be = CpuBackend().init()
    rng = np.random.default_rng(0)

    def up(a: np.ndarray) -> int:
        h = be.alloc(a.nbytes)
        be.copy_htod(h, np.ascontiguousarray(a, np.float32))
        return h

    print(f"{'shape':>12s} {'direct':>8s} {'F(2,3)':>8s} {'F(4,3)':>8s}  best   (ms, p20 of {args.runs})")
    for spec in args.shapes.split(","):
        n, c, s = (int(v) for v in spec.split("x"))
        x = rng.standard_normal((n, c, s, s)).astype(np.float32)
        b = rng.standard_normal(c).astype(np.float32)
        xv, bv = View.contiguous(up(x), F32, x.shape), View.contiguous(up(b), F32, (c,))
        out = View.contiguous(be.alloc(x.nbytes), F32, x.shape)
        # Several convs of the shape, each with its own weights, run back to back: in a network a conv's
        # weights come from memory, not from the cache where a repeated single conv would find them.
        fs = [rng.standard_normal((c, c, 3, 3)).astype(np.float32) / (3 * c ** 0.5) for _ in range(args.weights)]
        variants = {"direct": [st for f in fs for st in be.record_conv(
            xv, View.contiguous(up(f), F32, f.shape), bv, out, (1, 1), (1,) * 4, (1, 1), 1)]}
        for m in (2, 4):
            us = [winograd.transform_weights(f, m) for f in fs]
            variants[f"F({m},3)"] = [st for u in us for st in be.record_conv_winograd(
                xv, View.contiguous(up(u), F32, u.shape), bv, out, (1,) * 4, m)]
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.runs):
            for name, steps in variants.items():
                t0 = time.perf_counter()
                be.execute(steps)
                times[name].append((time.perf_counter() - t0) * 1e3 / len(fs))
        med = {name: pick(ts) for name, ts in times.items()}
        best = min(med, key=med.get)
        print(f"{spec:>12s} " + " ".join(f"{med[v]:8.3f}" for v in variants) + f"  {best}")
        if args.parts:
            for m in (2, 4):
                print(f"{'':>12s} F({m},3) parts: " + parts(be, variants[f"F({m},3)"], args.runs))
    return 0


def pick(ts: list[float]) -> float:
    return sorted(ts)[len(ts) // 5]


def parts(be: CpuBackend, steps: list, runs: int) -> str:
    """Median time of each part the Winograd step runs (it builds them on its first run)."""
    step = steps[0]
    cells = step.__closure__ or ()
    bound = next(cl.cell_contents for cl in cells if isinstance(cl.cell_contents, list)
                 and len(cl.cell_contents) == 2 and isinstance(cl.cell_contents[1], list))
    times: list[list[float]] = [[] for _ in bound[1]]
    for _ in range(runs):
        for i, part in enumerate(bound[1]):
            t0 = time.perf_counter()
            part()
            times[i].append((time.perf_counter() - t0) * 1e3)
    return " ".join(f"{getattr(p, '__name__', '?')} {pick(t):.3f}" for p, t in zip(bound[1], times,
                                                                                                 strict=True))


if __name__ == "__main__":
    raise SystemExit(main())
