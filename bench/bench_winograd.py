"""Winograd vs direct 3x3 convolution on wgpu: ResNet-18's 3x3 stride-1 conv shapes, GPU-timestamp timed.

    python bench/bench_winograd.py [--batches 1,8] [--reps 5] [--target 0.3] [--dtype f32|f16] [--stages]
                                   [--autotune default|on|off] [--json PATH]

Per shape (C = K channels at H x W, pad 1, bias + Relu epilogue as in a BN-folded ResNet) and batch: the direct
conv (implicit GEMM, conv.py), Winograd F(2,3) and F(4,3) (winograd.py), each recorded once and timed as one
compute pass repeated back to back (bench_kernels.Timer; median of --reps after keeping the GPU busy --target
seconds). Prints ms, effective TFLOP/s (the direct conv's 2*N*K*P*Q*C*9 flops / time, for all three arms, so the
columns compare times), the max error relative to max|ref| against a float64 direct conv, the cost model's
estimate (winograd.estimate_s) and what WgpuBackend.winograd_tile picks for the shape. --stages also times the
Winograd kernels one by one (input transform, products, split-K reduce if any, output transform).

On lavapipe use small settings: --batches 1 --reps 1 --target 0 (the numbers only show that everything runs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_kernels import Timer  # noqa: E402

import ember  # noqa: E402
from ember.backends.base import View  # noqa: E402
from ember.core import winograd as wg  # noqa: E402
from ember.core.expr import call, inp  # noqa: E402

# ResNet-18's 3x3 stride-1 convs: (channels, H = W)
SHAPES = [(64, 56), (128, 28), (256, 14), (512, 7)]
RELU = call("relu", inp(0))


def direct_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float64 3x3 conv, pad 1, + bias, Relu."""
    n, c, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    w64 = w.astype(np.float64)
    out = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            out += np.einsum("kc,nchw->nkhw", w64[:, :, i, j], xp[:, :, i:i + h, j:j + wd], optimize=True)
    return np.maximum(out + b.astype(np.float64).reshape(1, -1, 1, 1), 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--shapes", default="", help="subset, e.g. 64x56,512x7 (channels x size)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.3, help="seconds of GPU warm-up / work per measurement")
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    ap.add_argument("--stages", action="store_true", help="also time the Winograd kernels one by one")
    ap.add_argument("--autotune", choices=("default", "on", "off"), default="default",
                    help="GEMM tile autotune for both arms (default: EMBER_AUTOTUNE, else on for hardware GPUs)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    be = ember.backend("wgpu")
    be._require_init()
    from ember.backends.wgpu import winograd as wgpu_wino

    dtype = np.dtype(np.float16 if args.dtype == "f16" else np.float32)
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    scope = {"default": None, "on": True, "off": False}[args.autotune]
    print(f"adapter: {be.adapter_name}; dtype {args.dtype}; autotune {args.autotune}"
          f" (EMBER_AUTOTUNE={os.environ.get('EMBER_AUTOTUNE', '')!r})")
    print(f"{'shape':>16} {'arm':>7} {'ms':>9} {'TFLOP/s':>8} {'max err':>9} {'model ms':>9}  pick")
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        for ch, size in shapes:
            n, c, k, h = batch, ch, ch, size
            rng = np.random.default_rng(0)
            x = rng.standard_normal((n, c, h, h)).astype(dtype)
            w = (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(dtype)
            b = (rng.standard_normal(k) * 0.1).astype(dtype)
            ref = direct_ref(x, w, b)
            flops = 2.0 * n * k * h * h * c * 9
            pick = be.winograd_tile(n, c, k, h, h, dtype)
            label = f"b{n} {c}@{h}x{h}"
            handles = []

            def put(a: np.ndarray, handles: list = handles) -> View:
                hh = be.alloc(max(a.size * be.storage_itemsize(dtype), 4))
                be.upload(hh, np.ascontiguousarray(a))
                handles.append(hh)
                return View.contiguous(hh, dtype, a.shape)

            xv, wv, bv = put(x), put(w), put(b)
            out = put(np.zeros((n, k, h, h), dtype))
            for arm in ("direct", "F(2,3)", "F(4,3)"):
                m = None if arm == "direct" else int(arm[2])
                with be.autotune_scope(scope):
                    if m is None:
                        steps = be.record_conv(xv, wv, bv, out, (1, 1), (1, 1, 1, 1), (1, 1), 1, RELU)
                        uv = None
                    else:
                        uv = put(wg.transform_weights(w.astype(np.float32), m).astype(dtype))
                        steps = be.record_conv_winograd(xv, uv, bv, out, (1, 1, 1, 1), m, RELU)
                be.upload(out.handle, np.full(out.shape, np.nan, dtype))
                t, _ = Timer(be, steps, True).measure(args.reps, args.target)
                got = be.download(out).astype(np.float64)
                err = float(np.abs(got - ref).max() / np.abs(ref).max())
                model = wgpu_wino.estimate_s(be, n, c, k, h, h, dtype.itemsize, m) * 1e3
                chosen = (f"winograd F({pick},3)" if pick else "direct") if arm == "direct" else ""
                print(f"{label:>16} {arm:>7} {t * 1e3:9.4f} {flops / t / 1e12:8.2f} {err:9.2e} {model:9.4f}  {chosen}",
                      flush=True)
                row = {"batch": n, "channels": c, "size": h, "arm": arm, "ms": t * 1e3, "tflops": flops / t / 1e12,
                       "max_rel_err": err, "model_ms": model, "pick": pick, "kernels": [st.label for st in steps]}
                if args.stages and m is not None:
                    row["stages_ms"] = {}
                    for st in steps:
                        ts, _ = Timer(be, [st], True).measure(args.reps, args.target / 4)
                        row["stages_ms"][st.label] = row["stages_ms"].get(st.label, 0.0) + ts * 1e3
                        print(f"{'':>16} {'':>7} {ts * 1e3:9.4f}   {st.label}", flush=True)
                rows.append(row)
                del steps
                if uv is not None:
                    be.free(uv.handle)
                    handles.remove(uv.handle)
            for hh in handles:
                be.free(hh)
    if args.json:
        Path(args.json).write_text(json.dumps({"adapter": be.adapter_name, "dtype": args.dtype, "rows": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
