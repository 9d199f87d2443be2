"""Host cost of the ComputeBackend API, and a large GEMM through it against the same GEMM inside a model plan.

    python bench/bench_api.py [--backends wgpu,cpu] [--calls 2000] [--gemm N] [--gemm-repeat 10]
        [--json PATH] [--md PATH]

Part 1, per call of small ops through the public methods (gemm 64x64x64, unary relu and binary add of 4096
elements, reduce sum over 64 x 64 along axis 1), medians over --calls calls after a warm-up, in µs:
  async       wall clock of the call alone (the work is queued; nothing waits for it)
  async_cpu   the calling thread's CPU time of that call (on lavapipe the device's work runs on other threads and
              a submit may wait for the queue to drain: this column is the host's own cost there)
  sync        wall clock of the call then ComputeBackend.synchronize
  sync_cpu    the calling thread's CPU time of the same
  replays     api_cache_info() hits over the calls made (1.0: every call after the first replayed recorded steps)

Part 2, an N x N x N float32 GEMM (--gemm; default 4096 on hardware GPUs, 512 on software adapters and the cpu
backend), ms per call and TFLOP/s, side by side in one process:
  api async        be.gemm called back to back, one synchronize at the end, per call
  api + sync       be.gemm then be.synchronize, each call
  plan gpu_time    a one-node ONNX MatMul model (both operands inputs) through ember.load_onnx: Model.gpu_time
                   (GPU timestamps around its command buffer on wgpu; wall around the steps on cpu)
  plan resident    Model.run on DeviceArray feeds with keep_on_device=True, then synchronize (wall clock)
and the ratio of api + sync to plan gpu_time (the kernel's in-plan speed).
Uses the public API only. Timings on a software adapter (lavapipe) say nothing about GPU speed; its host columns
(async_cpu) do measure per-call host overhead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import graphs  # noqa: E402
import harness  # noqa: E402

import ember  # noqa: E402


def software(be: ember.ComputeBackend) -> bool:
    """A backend whose 'device' is this CPU: the cpu backend, or wgpu on a software adapter (lavapipe)."""
    adapter = getattr(be, "adapter", None)
    return adapter is None or adapter.info.get("adapter_type") == "CPU"


def per_call_us(fn: Callable[[], Any], calls: int, clock: Callable[[], float],
                sync: Callable[[], Any] | None = None) -> float:
    """Median µs of one call of fn (then sync, inside the timing)."""
    return statistics.median(harness.samples(fn, calls, sync=sync, clock=clock)) * 1e3


def small_calls(be: ember.ComputeBackend, args: argparse.Namespace, report: harness.Report) -> None:
    rng = np.random.default_rng(0)
    n = 64
    bufs = [be.alloc(4096 * 4) for _ in range(3)]
    for h in bufs:
        be.copy_htod(h, rng.standard_normal(4096).astype(np.float32))
    a, b, c = bufs
    ops: dict[str, Callable[[], None]] = {
        "gemm 64x64x64": lambda: be.gemm(False, False, n, n, n, 1.0, a, n, b, n, 0.0, c, n),
        "unary relu 4096": lambda: be.unary("relu", a, c, 4096),
        "binary add 4096": lambda: be.binary("add", a, b, c, 4096),
        "reduce sum 64x64 axis 1": lambda: be.reduce("sum", a, c, (64, 64), 1),
    }
    try:
        for label, fn in ops.items():
            for _ in range(max(args.warmup, 1)):
                fn()
            be.synchronize()
            info = getattr(be, "api_cache_info", None)  # older checkouts have no replay cache
            hits0 = info()["hits"] if info is not None else 0
            cells: dict[str, Any] = {}
            for column, clock, sync in (("async", time.perf_counter, None), ("async_cpu", time.thread_time, None),
                                        ("sync", time.perf_counter, be.synchronize),
                                        ("sync_cpu", time.thread_time, be.synchronize)):
                cells[column + " µs"] = per_call_us(fn, args.calls, clock, sync)
                be.synchronize()
            cells["replays"] = (info()["hits"] - hits0) / (4 * args.calls) if info is not None else float("nan")
            name = f"{be.name}: {label}"
            report.add(name, cells, backend=be.name, op=label)
            print(f"  {name:40s} " + "  ".join(f"{k} {v:9.1f}" for k, v in cells.items()), flush=True)
    finally:
        for h in bufs:
            be.free(h)


def big_gemm(be: ember.ComputeBackend, args: argparse.Namespace, report: harness.Report) -> None:
    n = args.gemm or (512 if software(be) else 4096)
    flop = 2.0 * n**3
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    ha, hb, hc = be.alloc(a.nbytes), be.alloc(b.nbytes), be.alloc(a.nbytes)
    be.copy_htod(ha, a)
    be.copy_htod(hb, b)
    results: dict[str, float] = {}
    model = None
    try:
        def call() -> None:
            be.gemm(False, False, n, n, n, 1.0, ha, n, hb, n, 0.0, hc, n)

        call()
        be.synchronize()
        rows = rng.integers(0, n, 4)
        got = np.empty((n, n), np.float32)
        be.copy_dtoh(got, hc)
        ref = a[rows].astype(np.float64) @ b.astype(np.float64)
        err = float(np.abs(got[rows] - ref).max() / np.abs(ref).max())
        inner = max(1, min(50, args.gemm_repeat))
        results["api async"] = harness.measure(call, args.gemm_repeat, args.warmup, inner=inner,
                                               sync=be.synchronize).median

        def call_sync() -> None:
            call()
            be.synchronize()

        results["api + sync"] = harness.measure(call_sync, args.gemm_repeat, args.warmup).median

        proto, feeds = graphs.build(graphs.matmul_graph(n, n, n))
        model = ember.load_onnx(proto, backend=be)
        model.run(feeds)
        results["plan gpu_time"] = model.gpu_time(feeds, args.gemm_repeat)
        dev = {k: ember.DeviceArray.from_numpy(be, v) for k, v in feeds.items()}

        def resident() -> None:
            model.run(dev, keep_on_device=True)
            be.synchronize()

        results["plan resident"] = harness.measure(resident, args.gemm_repeat, args.warmup).median
    finally:
        if model is not None:
            model.close()
        for h in (ha, hb, hc):
            be.free(h)
    cells: dict[str, Any] = {}
    for column, ms in results.items():
        cells[f"{column} ms"] = ms
        cells[f"{column} TFLOP/s"] = flop / (ms * 1e-3) / 1e12
    ratio = results["plan gpu_time"] / results["api + sync"]
    cells["api+sync / plan kernel"] = ratio
    name = f"{be.name}: gemm {n}x{n}x{n}"
    report.add(name, cells, backend=be.name, n=n, rel_err=err)
    print(f"  {name:40s} " + "  ".join(f"{k} {v:.3f}" for k, v in cells.items()) + f"  rel_err {err:.1e}",
          flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common(ap, repeat=10, warmup=20)
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per small op and column (default 2000)")
    ap.add_argument("--gemm", type=int, default=0,
                    help="N of the large GEMM (default 4096; 512 on software adapters and the cpu backend)")
    ap.add_argument("--gemm-repeat", type=int, default=0,
                    help="timed samples of the large GEMM (default --repeat)")
    ap.add_argument("--no-gemm", action="store_true", help="skip part 2")
    args = ap.parse_args(argv)
    args.gemm_repeat = args.gemm_repeat or args.repeat
    names = harness.backend_list(args.backends, ember.available_backends())
    backends = {name: ember.backend(name) for name in names}
    meta = {"adapters": {k: harness.adapter_name(b) for k, b in backends.items()}}
    small = harness.Report("ComputeBackend API: host time per small call (µs, median)", args, row_key="backend: op",
                           meta=meta)
    big = harness.Report("ComputeBackend API gemm against the same MatMul in a model plan", args,
                         row_key="backend: gemm", meta=meta, digits=4)
    for report in (small, big):  # both parts go to one JSON / markdown file, written here
        report.json_path = report.md_path = None

    def save() -> None:
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"meta": {"title": small.title, **small.meta}, "calls": small.rows,
                                             "gemm": big.rows}, indent=1, default=str))

    for be in backends.values():
        small_calls(be, args, small)
        save()
    if not args.no_gemm:
        for be in backends.values():
            big_gemm(be, args, big)
            save()
    text = small.finish() + ("" if args.no_gemm else "\n" + big.finish())
    if args.md is not None:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text)

if __name__ == "__main__":
    main()
