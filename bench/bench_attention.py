"""Attention on the GPU, measured four ways, to tell kernel speed from measurement artefacts.

For each shape: ember's fused attention (one flash-style kernel) and the unfused decomposition
(MatMul, Div, Softmax, MatMul), each timed (a) by `model.profile` (per-dispatch GPU timestamps of one run)
and (b) by wall clock over back-to-back runs with device-resident inputs and outputs (one submit per run,
so host overhead is included but no upload/readback); PyTorch SDPA and its eager decomposition alongside
when CUDA is present. The GPU is kept busy first so its clocks are up.

    python3 bench/bench_attention.py [--reps 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_fused import attention_graph, build  # noqa: E402

import ember  # noqa: E402
from ember.device_array import DeviceArray  # noqa: E402


def wall_ms(model: ember.Model, feeds: dict, reps: int) -> float:
    be = model.compute_backend
    dev = {k: DeviceArray.from_numpy(be, v) for k, v in feeds.items()}
    for _ in range(3):
        model.run(dev, keep_on_device=True)
    be.synchronize()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            model.run(dev, keep_on_device=True)
        be.synchronize()
        times.append((time.perf_counter() - t) * 1e3 / reps)
    return min(times)


def torch_ms(shape: tuple, reps: int) -> tuple[float, float] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    q, k, v = (torch.randn(shape, device="cuda") for _ in range(3))
    scale = shape[-1] ** -0.5

    def timed(fn: object) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        best = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
            best.append((time.perf_counter() - t) * 1e3 / reps)
        return min(best)

    sdpa = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
    eager = timed(lambda: torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v)
    return sdpa, eager


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    shapes = [(1, 12, 1024, 64), (4, 16, 512, 128), (8, 12, 128, 64), (1, 32, 2048, 128)]
    warm = None
    for shape in shapes:
        proto, feeds = build(attention_graph(*shape))
        fused = ember.load_onnx(proto, backend="wgpu")
        plain = ember.load_onnx(proto, backend="wgpu", fuse=False)
        if warm is None:  # keep the GPU busy for ~1 s so its clocks are up
            warm = time.perf_counter()
            while time.perf_counter() - warm < 1.0:
                plain.run(feeds)
        err = float(np.abs(fused.run(feeds)["y"] - plain.run(feeds)["y"]).max())
        prof = [statistics.median(sum(ms for _, ms in m.profile(feeds)) for _ in range(10)) for m in (fused, plain)]
        wall = [wall_ms(m, feeds, args.reps) for m in (fused, plain)]
        flop = 4 * np.prod(shape) * shape[2]
        ref = torch_ms(shape, args.reps)
        line = (f"{str(shape):18} fused prof {prof[0]:.3f} wall {wall[0]:.3f} ms ({flop / wall[0] / 1e9:.1f} TFLOP/s)"
                f" | unfused prof {prof[1]:.3f} wall {wall[1]:.3f} | err {err:.1e}")
        if ref:
            line += f" | torch sdpa {ref[0]:.3f} eager {ref[1]:.3f}"
        print(line, flush=True)
        arm = [k for k, v in fused.stats().items() if k.startswith("attention.") and v]
        print(f"   arm {arm}; fused steps:", fused.profile(feeds)[:3], "\n   unfused steps:", plain.profile(feeds)[:5])
    return 0


if __name__ == "__main__":
    sys.exit(main())
