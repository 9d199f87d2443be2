"""Direct conv (kernels/conv_direct.wgsl) against implicit GEMM for stem-like convs, GPU-timestamp timed.

    python bench/bench_direct.py [--batches 1,8] [--configs 8x8,4x8,8x4,4x4] [--reps 5] [--target 0.3]

Per shape and batch (ResNet's stem 3 -> 64, 7x7 stride 2 pad 3, and MobileNetV2's 3 -> 32, 3x3 stride 2 pad 1,
at 224x224, bias + Relu epilogue): conv.py's
implicit GEMM, and the direct kernel with each RTxWARPS config (output rows per thread x warps of 8 channels),
each recorded once and timed as one compute pass repeated back to back (bench_kernels.Timer). Prints ms, TFLOP/s,
the workgroup count and the max error relative to max|ref| against implicit GEMM's output ("pick" marks the
config conv.direct_geometry chooses). On lavapipe use --batches 1 --reps 1 --target 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
from bench_kernels import Timer  # noqa: E402

import ember  # noqa: E402
from ember.backends.base import View  # noqa: E402
from ember.backends.wgpu import conv  # noqa: E402
from ember.core.expr import call, inp  # noqa: E402

# C, H, W, K, R(=S), stride, pad
SHAPES = {"stem": (3, 224, 224, 64, 7, 2, 3), "mbv2_stem": (3, 224, 224, 32, 3, 2, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--configs", default="4x4,4x8,8x4,8x8,2x8")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.3)
    args = ap.parse_args()
    be = ember.backend("wgpu")
    be._require_init()
    print(f"adapter: {be.adapter_name}")
    rng = np.random.default_rng(0)
    f32 = np.dtype(np.float32)
    relu = call("relu", inp(0))
    for name, (c, h, wd, k, r, st, pad) in SHAPES.items():
        for n in (int(b) for b in args.batches.split(",")):
            p = (h + 2 * pad - r) // st + 1
            q = (wd + 2 * pad - r) // st + 1
            arrays = {"x": rng.standard_normal((n, c, h, wd)), "w": rng.standard_normal((k, c, r, r)) * 0.1,
                      "b": rng.standard_normal(k)}
            views = {}
            for key, a in arrays.items():
                a = a.astype(np.float32)
                views[key] = View.contiguous(be.alloc(a.nbytes), f32, a.shape)
                be.upload(views[key].handle, a)
            out = View.contiguous(be.alloc(n * k * p * q * 4), f32, (n, k, p, q))
            x, w, b = views["x"], views["w"], views["b"]
            cs = conv._conv_shape(x, w, out, (st, st), (pad,) * 4, (1, 1), 1)
            flops = 2 * n * k * p * q * c * r * r
            pick = conv.direct_geometry(be, cs)
            arms: list = [("igemm", None)]
            for cfg in args.configs.split(","):
                g = conv.DirectGeometry.of(cs, *map(int, cfg.split("x")))
                if k % g.kt == 0:  # a workgroup's channels must divide K
                    arms.append((cfg, g))
            ref = None
            for arm, g in arms:
                types = {v.handle: "f32" for v in (x, w, b, out)}
                if g is None:
                    steps = conv._record_implicit_gemm(be, cs, x, w, b, out, relu, types, None)
                    groups = "-"
                else:
                    steps = conv._record_direct(be, cs, g, x, w, b, out, relu, types, None)
                    gr = g.grid(cs)
                    groups = str(gr[0] * gr[1] * gr[2])
                be.upload(out.handle, np.full(out.shape, np.nan, np.float32))
                t, _ = Timer(be, steps, True).measure(args.reps, args.target)
                got = be.download(out).astype(np.float64)
                ref = got if ref is None else ref
                err = float(np.abs(got - ref).max() / np.abs(ref).max())
                mark = "  pick" if g == pick else ""
                print(f"{name} b{n:<3} {arm:>6} {t * 1e3:8.4f} ms {flops / t / 1e12:6.2f} TFLOP/s "
                      f"{groups:>6} WGs  err {err:.1e}{mark}", flush=True)
            for v in (x, w, b, out):
                be.free(v.handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
