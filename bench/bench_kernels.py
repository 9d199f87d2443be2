"""Kernel benchmark: gemm (square) and conv2d at ResNet-18 layer shapes on every available backend.

    python bench/bench_kernels.py [--quick] [--json PATH] [--backends wgpu,cpu] [--reps 5] [--gpu-timestamps]

Each op is recorded once; a measurement executes the recorded steps `inner` times back to back in one submit
(on wgpu: one command encoder, one compute pass) and waits for the device, so Python overhead is amortised.
The figure reported is the median over --reps measurements after a warm-up. The numpy column is numpy's own
matmul for gemm and the cpu backend (numpy im2col + matmul) for conv. With --gpu-timestamps the wgpu time comes
from timestamp queries around the pass instead of the host clock (where the adapter has timestamp-query).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import ember  # noqa: E402
from ember.backends.base import View  # noqa: E402

F32 = np.dtype(np.float32)

# ResNet-18 convolutions: (name, C, K, H(=W) in, R(=S), stride, pad)
RESNET18 = [
    ("conv1 7x7/2", 3, 64, 224, 7, 2, 3),
    ("layer1 3x3 64", 64, 64, 56, 3, 1, 1),
    ("layer2 3x3/2 64->128", 64, 128, 56, 3, 2, 1),
    ("layer2 3x3 128", 128, 128, 28, 3, 1, 1),
    ("layer2 down 1x1/2", 64, 128, 56, 1, 2, 0),
    ("layer3 3x3/2 128->256", 128, 256, 28, 3, 2, 1),
    ("layer3 3x3 256", 256, 256, 14, 3, 1, 1),
    ("layer3 down 1x1/2", 128, 256, 28, 1, 2, 0),
    ("layer4 3x3/2 256->512", 256, 512, 14, 3, 2, 1),
    ("layer4 3x3 512", 512, 512, 7, 3, 1, 1),
    ("layer4 down 1x1/2", 256, 512, 14, 1, 2, 0),
]


def cuda_torch() -> Any:
    """torch where it has CUDA, with TF32 off (fp32 everywhere, as ember computes), else None: the PyTorch
    columns of the benchmarks."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def upload(be: ember.ComputeBackend, a: np.ndarray) -> int:
    a = np.ascontiguousarray(a, np.float32)
    h = be.alloc(max(a.nbytes, 4))
    be.copy_htod(h, a)
    return h


class Timer:
    """Times `steps` repeated `inner` times per measurement on one backend."""

    def __init__(self, be: ember.ComputeBackend, steps: list, gpu_timestamps: bool) -> None:
        self.be, self.steps = be, steps
        self.ts = None
        if gpu_timestamps and be.name == "wgpu" and "timestamp-query" in be.features:
            self.ts = _Timestamps(be)

    def once(self, inner: int) -> float:
        if self.ts is not None:
            return self.ts.run(self.steps * inner)
        t0 = time.perf_counter()
        self.be.execute(self.steps * inner)
        self.be.synchronize()
        return time.perf_counter() - t0

    def measure(self, reps: int, target_s: float) -> tuple[float, int]:
        self.once(1)  # warm-up: pipeline creation, first touch
        t1 = self.once(1)
        inner = 1 if self.be.name == "cpu" else max(1, min(500, math.ceil(target_s / max(t1, 1e-6))))
        # Keep the device busy for a while before timing, so clocks that dropped while the host prepared the
        # inputs are back up (short kernels measured straight after an idle gap read 2-4x slow on an H200).
        end = time.perf_counter() + target_s
        while time.perf_counter() < end:
            self.once(inner)
        times = [self.once(inner) / inner for _ in range(reps)]
        return statistics.median(times), inner


class _Timestamps:
    """GPU time of one compute pass holding every dispatch, from timestamp queries at its start and end."""

    def __init__(self, be: Any) -> None:
        import wgpu

        self.be, self.wgpu = be, wgpu
        self.qs = be.device.create_query_set(type="timestamp", count=2)
        usage = wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC
        self.resolve = be.device.create_buffer(size=16, usage=usage)
        from wgpu.backends.wgpu_native import _api

        self.period = _api.libf.wgpuQueueGetTimestampPeriod(be.queue._internal)

    def run(self, steps: list) -> float:
        be = self.be
        enc = be.device.create_command_encoder()
        cpass = enc.begin_compute_pass(timestamp_writes={"query_set": self.qs, "beginning_of_pass_write_index": 0,
                                                         "end_of_pass_write_index": 1})
        current = None
        for st in steps:
            if st.pipeline is not current:
                cpass.set_pipeline(st.pipeline)
                current = st.pipeline
            cpass.set_bind_group(0, st.bind_group)
            cpass.dispatch_workgroups(*st.grid)
        cpass.end()
        enc.resolve_query_set(self.qs, 0, 2, self.resolve, 0)
        be.queue.submit([enc.finish()])
        t0, t1 = np.frombuffer(be.queue.read_buffer(self.resolve), np.uint64)
        return float(t1 - t0) * self.period * 1e-9


def bench_gemm(be: ember.ComputeBackend, n: int, reps: int, target: float, ts: bool) -> dict:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), np.float32)
    b = rng.standard_normal((n, n), np.float32)
    ha, hb, hc = upload(be, a), upload(be, b), be.alloc(n * n * 4)
    try:
        steps = be.record_gemm(False, False, n, n, n, 1.0, ha, n, hb, n, 0.0, hc, n)
        t, inner = Timer(be, steps, ts).measure(reps, target)
        c = np.empty((n, n), np.float32)
        be.copy_dtoh(c, hc)
        check = rng.integers(0, n, 8)
        ref = a[check].astype(np.float64) @ b.astype(np.float64)
        err = float(np.abs(c[check] - ref).max() / np.abs(ref).max())
    finally:
        for h in (ha, hb, hc):
            be.free(h)
    return {"seconds": t, "inner": inner, "rel_err": err}


def bench_numpy_gemm(n: int, reps: int) -> dict:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), np.float32)
    b = rng.standard_normal((n, n), np.float32)
    c = np.empty((n, n), np.float32)
    np.matmul(a, b, out=c)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.matmul(a, b, out=c)
        times.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(times), "inner": 1}


def bench_conv(be: ember.ComputeBackend, shape: tuple, reps: int, target: float, ts: bool) -> dict:
    n, c, k, h, r, s, pad = shape
    p = (h + 2 * pad - r) // s + 1
    rng = np.random.default_rng(0)
    hx = upload(be, rng.standard_normal((n, c, h, h), np.float32))
    hw = upload(be, rng.standard_normal((k, c, r, r), np.float32) / math.sqrt(c * r * r))
    hb = upload(be, rng.standard_normal(k, np.float32))
    ho = be.alloc(n * k * p * p * 4)
    try:
        steps = be.record_conv(View.contiguous(hx, F32, (n, c, h, h)), View.contiguous(hw, F32, (k, c, r, r)),
                               View.contiguous(hb, F32, (k,)), View.contiguous(ho, F32, (n, k, p, p)),
                               (s, s), (pad, pad, pad, pad), (1, 1), 1)
        t, inner = Timer(be, steps, ts).measure(reps, target)
    finally:
        for hh in (hx, hw, hb, ho):
            be.free(hh)
    return {"seconds": t, "inner": inner}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a CPU Vulkan driver finishes in seconds)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--backends", default=",".join(ember.available_backends()))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--target", type=float, default=None, help="seconds per measurement on the GPU (sets inner)")
    ap.add_argument("--gpu-timestamps", action="store_true", help="wgpu: time the pass with timestamp queries")
    ap.add_argument("--only", choices=["gemm", "conv"], help="run one part")
    args = ap.parse_args(argv)
    target = args.target if args.target is not None else (0.02 if args.quick else 0.2)
    reps = max(1, args.reps if not args.quick else min(args.reps, 3))

    backends = {}
    for name in [b.strip() for b in args.backends.split(",") if b.strip()]:
        backends[name] = ember.backend(name)
    gemm_sizes = [128, 256] if args.quick else [1024, 2048, 4096]
    conv_shapes = []
    for batch in ([1] if args.quick else [1, 8]):
        for name, c, k, h, r, s, pad in RESNET18:
            if args.quick:  # a quarter of the channels and of the spatial size
                c, k, h = max(3, c // 4) if c > 3 else c, k // 4, max(4, h // 4)
            conv_shapes.append((f"{name} b{batch}", (batch, c, k, h, r, s, pad)))

    results: list[dict] = []

    def emit(op: str, label: str, flops: float, backend: str, res: dict) -> None:
        rec = {"op": op, "shape": label, "backend": backend, "ms": res["seconds"] * 1e3,
               "gflops": flops / res["seconds"] / 1e9, "inner": res["inner"]}
        if "rel_err" in res:
            rec["rel_err"] = res["rel_err"]
        results.append(rec)
        print(f"  {op:5s} {label:32s} {backend:6s} {rec['ms']:10.3f} ms {rec['gflops']:9.1f} GFLOP/s", flush=True)

    if args.only in (None, "gemm"):
        for n in gemm_sizes:
            flops = 2.0 * n**3
            emit("gemm", f"{n}x{n}x{n}", flops, "numpy", bench_numpy_gemm(n, reps))
            for name, be in backends.items():
                emit("gemm", f"{n}x{n}x{n}", flops, name, bench_gemm(be, n, reps, target, args.gpu_timestamps))
    if args.only in (None, "conv"):
        for label, shp in conv_shapes:
            n, c, k, h, r, s, pad = shp
            p = (h + 2 * pad - r) // s + 1
            flops = 2.0 * n * k * p * p * c * r * r
            desc = f"{label} {c}x{h}x{h}->{k}x{p}x{p}"
            for name, be in backends.items():
                emit("conv", desc, flops, "numpy" if name == "cpu" else name,
                     bench_conv(be, shp, reps, target, args.gpu_timestamps))

    # markdown table: one row per (op, shape), GFLOP/s (ms) per backend
    cols = sorted(dict.fromkeys(r["backend"] for r in results), key=lambda c: (c != "numpy", c == "cpu"))
    rows: dict[tuple[str, str], dict[str, dict]] = {}
    for r in results:
        rows.setdefault((r["op"], r["shape"]), {})[r["backend"]] = r
    adapter = backends["wgpu"].adapter_name if "wgpu" in backends else "-"
    print(f"\n### Kernel benchmark ({'quick' if args.quick else 'full'}; wgpu adapter: {adapter}; "
          f"median of {reps}{', GPU timestamps' if args.gpu_timestamps else ''})\n")
    print("| op | shape | " + " | ".join(f"{c} GFLOP/s (ms)" for c in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for (op, shape), by in rows.items():
        cells = [f"{by[c]['gflops']:.1f} ({by[c]['ms']:.3f})" if c in by else "-" for c in cols]
        print(f"| {op} | {shape} | " + " | ".join(cells) + " |")
    if args.json:
        meta = {"quick": args.quick, "reps": reps, "adapter": adapter, "python": platform.python_version(),
                "numpy": np.__version__, "machine": platform.machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "gpu_timestamps": args.gpu_timestamps}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
