"""Kernel benchmark: the ComputeBackend ops (gemm, conv2d, attention, reduce, unary, binary, copies) on every
available backend, through ember's public API.

    python bench/bench_kernels.py [--quick] [--backends wgpu,cpu] [--only gemm,conv,...] [--repeat 5]
        [--gpu-timestamps] [--variant winograd=0 --variant winograd=4 ...] [--profile] [--target 0.2]
        [--json PATH] [--md PATH]

Default timing: the backend's public method (`be.gemm(...)`, `be.conv2d_forward(...)`, ...), called `inner` times
back to back, then `be.synchronize()`; median of --repeat such samples after a warm-up (on a GPU `inner` fills
--target seconds and the device is kept busy that long first, so short kernels are not read at idle clocks).
That includes each call's host cost (recording, bind groups), which is what a caller of the API pays.

--gpu-timestamps (alias --device-time): gemm, conv, attention, reduce, unary and binary instead run as one-node
ONNX models (graphs.py; conv with constant filter and bias, so Winograd is eligible as in a network) timed by
Model.gpu_time: GPU timestamps around one run's command buffer on wgpu (min of at least --repeat), the wall
clock around the recorded steps on cpu. --profile prints each such model's steps (Winograd's transform,
product and output stages).

--variant KEY=VALUE[,KEY=VALUE] (repeatable) adds one column per backend and variant, the settings scoped with
ember.settings.override (load options fuse / precision / autotune apply with --gpu-timestamps): winograd=0 / 2
/ 4 compares the direct conv against Winograd F(2,3) / F(4,3) on either backend, direct_conv=0 the direct
kernel against implicit GEMM on wgpu, autotune=0 / 1 the tile heuristic against the tuned tiles. A conv
column's "W" marks a run Winograd took.

Columns: numpy is numpy's own op on the host (matmul, sum, maximum, add, copyto); "torch cuda" is cuBLAS fp32
(TF32 off) where torch has CUDA. Cells are GFLOP/s (or GB/s) and milliseconds.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import graphs  # noqa: E402
import harness  # noqa: E402

import ember  # noqa: E402

# ResNet-18 convolutions (and MobileNetV2's stem): (name, C, K, H(=W) in, R(=S), stride, pad)
RESNET18 = [
    ("conv1 7x7/2", 3, 64, 224, 7, 2, 3),
    ("mbv2 stem 3x3/2", 3, 32, 224, 3, 2, 1),
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
OPS = ("gemm", "conv", "attention", "reduce", "unary", "binary", "copy")


class Buffers:
    """Device allocations of one measurement, freed together."""

    def __init__(self, be: ember.ComputeBackend) -> None:
        self.be, self.handles = be, []

    def put(self, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a, np.float32)
        h = self.alloc(a.nbytes)
        self.be.copy_htod(h, a)
        return h

    def alloc(self, nbytes: int) -> int:
        h = self.be.alloc(max(nbytes, 4))
        self.handles.append(h)
        return h

    def __enter__(self) -> Buffers:
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            self.be.free(h)


class Bench:
    def __init__(self, args: argparse.Namespace, backends: dict[str, ember.ComputeBackend]) -> None:
        self.args, self.backends = args, backends
        self.variants = [harness.Arm("")] + [harness.Arm.parse(v, [v]) for v in args.variant]
        self.report = harness.Report(f"Kernels ({'quick' if args.quick else 'full'}; "
                                     f"{'device time' if args.gpu_timestamps else 'API calls, wall clock'})",
                                     args, row_key="op / shape", lead=("unit", "numpy", "torch cuda"),
                                     meta={"adapters": {k: harness.adapter_name(b) for k, b in backends.items()},
                                           "numpy": np.__version__})
        self.rng = np.random.default_rng(0)

    # ---- one row ---------------------------------------------------------------------------------------------
    def row(self, op: str, label: str, work: float, unit: str, api: Callable[[ember.ComputeBackend], Any] | None,
            case: graphs.Case | None, host: Callable[[], Any] | None = None,
            torch: Callable[[], Any] | None = None) -> None:
        """Time one (op, shape) everywhere: `work` flops (unit GFLOP/s) or bytes (GB/s); `api(be)` sets up
        buffers and returns (call, check) for the API path; `case` is the one-node graph for device time."""
        name = f"{op} {label}"
        records: list[dict[str, Any]] = []

        def put(column: str, ms: float, **extra: Any) -> None:
            rate = work / (ms * 1e-3) / 1e9
            mark = " W" if extra.get("winograd") else ""
            self.report.set(name, column, f"{rate:.1f} ({ms:.3f} ms){mark}")
            records.append({"column": column, "ms": ms, unit: rate, **extra})
            print(f"  {name:44s} {column:22s} {ms:10.4f} ms {rate:9.1f} {unit}", flush=True)

        self.report.set(name, "unit", unit)
        if host is not None:
            put("numpy", harness.measure(host, self.args.repeat, 3).median)
        if torch is not None:
            t = harness.cuda_torch()
            put("torch cuda", harness.measure(torch, self.args.repeat, 3, inner=20, sync=t.cuda.synchronize).median)
        for be_name, be in self.backends.items():
            for arm in self.variants:
                column = f"{be_name} [{arm.label}]" if arm.label else be_name
                try:
                    if self.args.gpu_timestamps and case is not None:
                        ms, extra = self.device_time(be, case, arm, name)
                    elif api is not None:
                        ms, extra = self.api_time(be, api, arm)
                    else:
                        continue
                except Exception as e:  # a shape or variant this backend rejects: say so, go on
                    self.report.set(name, column, f"failed: {type(e).__name__}")
                    print(f"  {name:44s} {column:22s} failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
                    continue
                put(column, ms, **extra)
        self.report.row(name, records=records)
        self.report.save()

    def api_time(self, be: ember.ComputeBackend, api: Callable[[ember.ComputeBackend], Any],
                 arm: harness.Arm) -> tuple[float, dict[str, Any]]:
        gpu = be.name != "cpu"
        target = self.args.target if gpu else 0.0
        with Buffers(be) as bufs, arm.scope():
            call, check = api(bufs)
            call()  # pipelines, first touch, autotune
            be.synchronize()
            inner = harness.inner_for(call, target, be.synchronize) if gpu else 1
            st = harness.measure(call, self.args.repeat, self.args.warmup, inner=inner, sync=be.synchronize,
                                 warm_s=target)
            extra: dict[str, Any] = {"inner": inner, "p10_ms": st.p10, "p90_ms": st.p90}
            if check is not None:
                extra["rel_err"] = check()
        return st.median, extra

    def device_time(self, be: ember.ComputeBackend, case: graphs.Case, arm: harness.Arm,
                    name: str) -> tuple[float, dict[str, Any]]:
        proto, feeds = graphs.build(case)
        with arm.scope():
            model = ember.load_onnx(proto, backend=be, **arm.load)
            model.run(feeds)
            ms = model.gpu_time(feeds, self.args.repeat)
            extra: dict[str, Any] = {"steps": model.plan_info(feeds)["steps"],
                                     "winograd": bool(model.stats().get("conv.winograd"))}
            if self.args.profile:
                for label, t in model.profile(feeds):
                    print(f"      {t:9.4f} ms  {label}")
        return ms, extra

    # ---- the ops -------------------------------------------------------------------------------------------------
    def gemm(self, n: int) -> None:
        a = self.rng.standard_normal((n, n), np.float32)
        b = self.rng.standard_normal((n, n), np.float32)
        c = np.empty((n, n), np.float32)
        rows = self.rng.integers(0, n, 8)
        ref = a[rows].astype(np.float64) @ b.astype(np.float64)

        def api(bufs: Buffers) -> tuple[Callable[[], None], Callable[[], float]]:
            ha, hb, hc = bufs.put(a), bufs.put(b), bufs.alloc(n * n * 4)

            def check() -> float:
                out = np.empty((n, n), np.float32)
                bufs.be.copy_dtoh(out, hc)
                return float(np.abs(out[rows] - ref).max() / np.abs(ref).max())

            return lambda: bufs.be.gemm(False, False, n, n, n, 1.0, ha, n, hb, n, 0.0, hc, n), check

        torch = harness.cuda_torch()
        tmm = None
        if torch is not None:
            ta, tb = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
            tmm = lambda: ta @ tb  # noqa: E731
        self.row("gemm", f"{n}x{n}x{n}", 2.0 * n**3, "GFLOP/s", api, graphs.matmul_graph(n, n, n),
                 host=lambda: np.matmul(a, b, out=c), torch=tmm)

    def conv(self, label: str, n: int, c: int, k: int, h: int, r: int, s: int, pad: int) -> None:
        p = (h + 2 * pad - r) // s + 1
        x = self.rng.standard_normal((n, c, h, h), np.float32)
        w = (self.rng.standard_normal((k, c, r, r)) / math.sqrt(c * r * r)).astype(np.float32)

        def api(bufs: Buffers) -> tuple[Callable[[], None], None]:
            hx, hw, ho = bufs.put(x), bufs.put(w), bufs.alloc(n * k * p * p * 4)
            return (lambda: bufs.be.conv2d_forward(hx, (n, c, h, h), hw, (k, c, r, r), ho, (n, k, p, p), (s, s),
                                                   (pad, pad))), None

        self.row("conv", f"{label} {c}x{h}x{h}->{k}x{p}x{p}", 2.0 * n * k * p * p * c * r * r, "GFLOP/s", api,
                 graphs.conv_graph(n, c, h, k, r, s, pad))

    def attention(self, b: int, h: int, s: int, d: int) -> None:
        q, kk, v = (self.rng.standard_normal((b, h, s, d), np.float32) for _ in range(3))

        def api(bufs: Buffers) -> tuple[Callable[[], None], None]:
            hq, hk, hv, ho = bufs.put(q), bufs.put(kk), bufs.put(v), bufs.alloc(q.nbytes)
            return lambda: bufs.be.attention(hq, hk, hv, ho, b, h, s, s, d, d**-0.5), None

        self.row("attention", f"{b}x{h}x{s}x{d}", 4.0 * b * h * s * s * d, "GFLOP/s", api,
                 graphs.attention_graph(b, h, s, d))

    def reduce(self, rows: int, n: int) -> None:
        x = self.rng.standard_normal((rows, n), np.float32)
        out = np.empty(rows, np.float32)

        def api(bufs: Buffers) -> tuple[Callable[[], None], None]:
            hx, ho = bufs.put(x), bufs.alloc(rows * 4)
            return lambda: bufs.be.reduce(ember.ReduceOp.SUM, hx, ho, (rows, n), 1), None

        self.row("reduce", f"sum {rows}x{n}", 4.0 * rows * (n + 1), "GB/s", api, graphs.reduce_graph(rows, n),
                 host=lambda: np.sum(x, axis=1, out=out))

    def elementwise(self, n: int) -> None:
        x, y = (self.rng.standard_normal(n, np.float32) for _ in range(2))
        out = np.empty(n, np.float32)

        def unary(bufs: Buffers) -> tuple[Callable[[], None], None]:
            hx, ho = bufs.put(x), bufs.alloc(n * 4)
            return lambda: bufs.be.unary(ember.UnaryOp.RELU, hx, ho, n), None

        def binary(bufs: Buffers) -> tuple[Callable[[], None], None]:
            ha, hb, ho = bufs.put(x), bufs.put(y), bufs.alloc(n * 4)
            return lambda: bufs.be.binary(ember.BinaryOp.ADD, ha, hb, ho, n), None

        only = self.args.only
        if "unary" in only:
            self.row("unary", f"relu {n}", 8.0 * n, "GB/s", unary, graphs.unary_graph(n),
                     host=lambda: np.maximum(x, 0, out=out))
        if "binary" in only:
            self.row("binary", f"add {n}", 12.0 * n, "GB/s", binary, graphs.binary_graph(n),
                     host=lambda: np.add(x, y, out=out))

    def copies(self, mb: float) -> None:
        n = int(mb * 1e6) // 4
        src = self.rng.standard_normal(n, np.float32)
        dst = np.empty_like(src)

        def htod(bufs: Buffers) -> tuple[Callable[[], None], None]:
            h = bufs.alloc(n * 4)
            return lambda: bufs.be.copy_htod(h, src), None

        def dtoh(bufs: Buffers) -> tuple[Callable[[], None], None]:
            h = bufs.put(src)
            return lambda: bufs.be.copy_dtoh(dst, h), None

        self.row("copy_htod", f"{mb:g} MB", 4.0 * n, "GB/s", htod, None, host=lambda: np.copyto(dst, src))
        self.row("copy_dtoh", f"{mb:g} MB", 4.0 * n, "GB/s", dtoh, None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (a CPU Vulkan driver finishes in seconds)")
    harness.add_common(ap, repeat=5, warmup=1)
    ap.add_argument("--reps", dest="repeat", type=int, help=argparse.SUPPRESS)  # the earlier name of --repeat
    ap.add_argument("--target", type=float, default=None, help="seconds per sample on a GPU (sets inner)")
    ap.add_argument("--gpu-timestamps", "--device-time", dest="gpu_timestamps", action="store_true",
                    help="one-node models timed by Model.gpu_time instead of wall-clock API calls")
    ap.add_argument("--only", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,...]",
                    help="also time under these settings (repeatable: one column each)")
    ap.add_argument("--profile", action="store_true", help="with --gpu-timestamps: print each model's steps")
    args = ap.parse_args(argv)
    args.only = [o.strip() for o in args.only.split(",") if o.strip()]
    unknown = sorted(set(args.only) - set(OPS))
    if unknown:
        raise SystemExit(f"--only: unknown {unknown}; known: {', '.join(OPS)}")
    if args.target is None:
        args.target = 0.02 if args.quick else 0.2
    if args.quick:
        args.repeat = min(args.repeat, 3)
    names = harness.backend_list(args.backends, ember.available_backends())
    bench = Bench(args, {name: ember.backend(name) for name in names})
    q = args.quick
    if "gemm" in args.only:
        for n in [128, 256] if q else [1024, 2048, 4096]:
            bench.gemm(n)
    if "conv" in args.only:
        for batch in [1] if q else [1, 8]:
            for label, c, k, h, r, s, pad in RESNET18:
                if q:  # a quarter of the channels and of the spatial size
                    c, k, h = max(3, c // 4) if c > 3 else c, k // 4, max(4, h // 4)
                bench.conv(f"{label} b{batch}", batch, c, k, h, r, s, pad)
    if "attention" in args.only:
        for shape in [(1, 2, 64, 32)] if q else [(8, 12, 128, 64), (1, 12, 1024, 64), (4, 16, 512, 128)]:
            bench.attention(*shape)
    if "reduce" in args.only:
        for shape in [(256, 1024)] if q else [(4096, 4096), (8192, 768)]:
            bench.reduce(*shape)
    if "unary" in args.only or "binary" in args.only:
        for n in [1 << 16] if q else [1 << 24]:
            bench.elementwise(n)
    if "copy" in args.only:
        for mb in [1.0] if q else [4.8, 64.0]:  # 4.8 MB: ResNet-18 batch 8's input
            bench.copies(mb)
    bench.report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
