"""Attention on the GPU: ember's two fused arms against the decomposition, PyTorch alongside.

Decoding shapes (one query row, long key/value cache): the flash kernel and the GEMM arm, each forced, timed
by `model.gpu_time` (GPU timestamps around a run) and by wall clock over back-to-back runs with
device-resident inputs and outputs. Prefill shapes: the arm ember picks against the unfused decomposition
(MatMul, Div, Softmax, MatMul), both ways. PyTorch SDPA (and its eager decomposition) when CUDA is present.
The GPU is kept busy first so its clocks are up.

    python3 bench/bench_attention.py [--reps 50]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_fused import attention_graph, build  # noqa: E402
from bench_kernels import cuda_torch  # noqa: E402

import ember  # noqa: E402
from ember.device_array import DeviceArray  # noqa: E402
from ember.ops import transformer  # noqa: E402

FLASH_DEFAULT = transformer.FLASH_MAX_SCORES


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


def torch_ms(shape: tuple, reps: int, kv: int | None = None) -> tuple[float, float] | None:
    torch = cuda_torch()
    if torch is None:
        return None
    kv_shape = shape if kv is None else (*shape[:2], kv, shape[3])
    q = torch.randn(shape, device="cuda")
    k, v = (torch.randn(kv_shape, device="cuda") for _ in range(2))
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
    decode = [(1, 32, 4096, 128), (4, 32, 2048, 128), (1, 8, 8192, 64)]  # (B, H, S_kv, D), one query row
    warm = None
    for shape in decode:  # both fused arms forced, to see which one decoding should take
        proto, feeds = build(attention_graph(*shape, sq=1))
        arms = {}
        for arm, limit in (("flash", 1 << 62), ("gemm", 0)):
            transformer.FLASH_MAX_SCORES = limit
            model = ember.load_onnx(proto, backend="wgpu")
            if warm is None:
                warm = time.perf_counter()
                while time.perf_counter() - warm < 1.0:
                    model.run(feeds)
            arms[arm] = (model.gpu_time(feeds, 10), wall_ms(model, feeds, args.reps))
        transformer.FLASH_MAX_SCORES = FLASH_DEFAULT
        ref = torch_ms((shape[0], shape[1], 1, shape[3]), args.reps, kv=shape[2])
        print(f"decode {str(shape):22} flash gpu {arms['flash'][0]:.4f} wall {arms['flash'][1]:.4f} ms | gemm gpu "
              f"{arms['gemm'][0]:.4f} wall {arms['gemm'][1]:.4f} ms" + (f" | torch sdpa {ref[0]:.4f}" if ref else ""),
              flush=True)
    for shape in shapes:
        proto, feeds = build(attention_graph(*shape))
        fused = ember.load_onnx(proto, backend="wgpu")
        plain = ember.load_onnx(proto, backend="wgpu", fuse=False)
        if warm is None:  # keep the GPU busy for ~1 s so its clocks are up
            warm = time.perf_counter()
            while time.perf_counter() - warm < 1.0:
                plain.run(feeds)
        err = float(np.abs(fused.run(feeds)["y"] - plain.run(feeds)["y"]).max())
        prof = [m.gpu_time(feeds, 10) for m in (fused, plain)]
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
