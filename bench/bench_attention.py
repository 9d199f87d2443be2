"""Attention on the GPU: the arm ember picks against the unfused decomposition, PyTorch alongside.

    python3 bench/bench_attention.py [--reps 50] [--shapes 1x12x1024x64,...] [--decode 1x32x4096x128,...]
        [--backend wgpu] [--set KEY=VALUE] [--json out.json] [--md out.md]

Prefill shapes (B x H x S x D) and decoding shapes (one query row over S keys): the graph as exporters write it
(MatMul, Div, Softmax, MatMul; graphs.attention_graph), loaded with fusion (ember's arm: the flash kernel or
GEMM + fused softmax + GEMM, named from Model.stats) and with fuse=False, each timed by Model.gpu_time (GPU
timestamps around one run) and by wall clock over `reps` back-to-back runs with device-resident inputs and
outputs (median of --repeat such batches). PyTorch SDPA and its eager decomposition when CUDA is present.
The GPU is kept busy first so its clocks are up.

Force one arm (flash against GEMM at the same shape, as BENCHMARKS.md's decoding table did) with the setting
for the choice: `--set attention=flash` or `--set attention=gemm` (EMBER_ATTENTION) applies to the fused model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import graphs  # noqa: E402
import harness  # noqa: E402

import ember  # noqa: E402

PREFILL = "1x12x1024x64,4x16x512x128,8x12x128x64,1x32x2048x128"
DECODE = "1x32x4096x128,4x32x2048x128,1x8x8192x64"  # B x H x keys x D, one query row


def wall(model: ember.Model, be: ember.ComputeBackend, feeds: dict, reps: int, repeat: int) -> harness.Stats:
    """ms per run over `reps` back-to-back runs on device-resident feeds, outputs kept on the device."""
    dev = {k: ember.DeviceArray.from_numpy(be, v) for k, v in feeds.items()}
    return harness.measure(lambda: model.run(dev, keep_on_device=True), repeat, 3, inner=reps, sync=be.synchronize)


def torch_ms(q_shape: tuple, kv_shape: tuple, reps: int, repeat: int) -> tuple[float, float] | None:
    torch = harness.cuda_torch()
    if torch is None:
        return None
    q = torch.randn(q_shape, device="cuda")
    k, v = (torch.randn(kv_shape, device="cuda") for _ in range(2))
    scale = q_shape[-1] ** -0.5

    def timed(fn: Any) -> float:
        return harness.measure(fn, repeat, 3, inner=reps, sync=torch.cuda.synchronize).median

    sdpa = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
    eager = timed(lambda: torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v)
    return sdpa, eager


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=50, help="back-to-back runs per wall-clock sample")
    ap.add_argument("--shapes", default=PREFILL, help="prefill shapes BxHxSxD (empty: none)")
    ap.add_argument("--decode", default=DECODE, help="decoding shapes BxHxSxD, one query row (empty: none)")
    ap.add_argument("--backend", default="wgpu")
    ap.add_argument("--warm-s", type=float, default=1.0, help="seconds of runs before the first timing")
    harness.add_settings(ap)
    harness.add_common(ap, repeat=5, warmup=3, backends=False)
    args = ap.parse_args()
    arm = harness.Arm.parse("fused", args.set)
    report = harness.Report(f"Attention on {args.backend}: ember's arm against fuse=False, ms per run", args,
                            row_key="shape")
    cases = [("decode", s) for s in args.decode.split(",") if s] + [("attention", s) for s in args.shapes.split(",")
                                                                     if s]
    be = ember.backend(args.backend)  # one device for every model, for DeviceArray feeds and synchronize
    warmed = False
    for kind, spec in cases:
        b, h, s, d = (int(v) for v in spec.split("x"))
        proto, feeds = graphs.synthetic(f"{kind}:{spec}")
        with arm.scope():
            fused = ember.load_onnx(proto, backend=be, **arm.load)
        plain = ember.load_onnx(proto, backend=be, fuse=False)
        if not warmed:  # keep the GPU busy so its clocks are up
            harness.warm([lambda m=plain, f=feeds: m.run(f)], args.warm_s)
            warmed = True
        err = harness.max_rel_err(fused.run(feeds)["y"], plain.run(feeds)["y"])
        with arm.scope():
            f_gpu, f_wall = fused.gpu_time(feeds, 10), wall(fused, be, feeds, args.reps, args.repeat)
        u_gpu, u_wall = plain.gpu_time(feeds, 10), wall(plain, be, feeds, args.reps, args.repeat)
        sq = 1 if kind == "decode" else s
        flop = 4 * b * h * sq * s * d
        # Model.stats: attention.fused counts the flash kernel, attention.gemm the GEMM arm.
        names = {"fused": "flash", "gemm": "gemm", "fallback": "unfused"}
        taken = [names.get(k.split(".", 1)[1], k) for k, v in fused.stats().items() if k.startswith("attention.") and v]
        ref = torch_ms((b, h, sq, d), (b, h, s, d), args.reps, args.repeat)
        label = f"{'decode ' if kind == 'decode' else ''}{b} x {h} x {s} x {d}"
        cells: dict[str, Any] = {"ember arm": "/".join(taken) or "?", "ember gpu": f_gpu, "ember wall": f_wall,
                                 "TFLOP/s (gpu)": flop / max(f_gpu, 1e-9) / 1e9, "fuse=False gpu": u_gpu,
                                 "fuse=False wall": u_wall, "max rel diff": f"{err:.1e}"}
        if ref is not None:
            cells.update({"torch sdpa": ref[0], "torch eager": ref[1]})
        print(f"{label:28} arm {cells['ember arm']:8} gpu {f_gpu:.4f} wall {f_wall.median:.4f} ms | fuse=False gpu "
              f"{u_gpu:.4f} wall {u_wall.median:.4f} | err {err:.1e}", flush=True)
        report.add(label, cells, fused_profile=fused.profile(feeds)[:3], unfused_profile=plain.profile(feeds)[:5])
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
