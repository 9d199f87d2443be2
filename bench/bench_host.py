"""Host overhead per node of a plan replay on the wgpu backend: where the microseconds go.

    PYTHONPATH=src python bench/bench_host.py [--models chain200,chain8,resnet18_b1] [--repeat 200]

Per model (fusion off for the chains, so each node is one dispatch), medians of `repeat` runs, µs per step:
  run        Model.run end to end (feeds in, outputs out), wall clock
  run_cpu    the same, CPU time of the calling thread only (host work; excludes waiting for the GPU and,
             on lavapipe, the GPU's work done by its own threads)
  check      Model._check_feeds alone (validation, casting)
  plan_run   Plan.run alone (writes, encode, submit, readback)
  encode     create encoder + encode every step + finish (the replay's host work; submitted untimed): the prepared
             replay a plan runs (be.prepare / encode_prepared), and `encode_py` the step-list path
             (be.encode through wgpu-py's encoder objects)
  submit     encode + submit, then a blocking sync outside the timed region
  raw_loop   the same C calls from a flat pre-resolved list (the floor for the Python loop)
  cffi_floor three trivial cffi calls per dispatch (AddRef/Release/AddRef-sized), no wgpu work
On a software adapter (lavapipe) `run` and `plan_run` include the GPU's work, done by the CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import ember  # noqa: E402
from ember.backends.wgpu.backend import Dispatch  # noqa: E402


def med_us(fn: Callable[[], Any], repeat: int, warmup: int = 5, clock: Callable[[], float] = time.perf_counter
           ) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t = clock()
        fn()
        ts.append(clock() - t)
    return statistics.median(ts) * 1e6


def load(name: str) -> tuple[Any, dict]:
    from bench.bench_models import chain_model, workloads

    if name.startswith("chain"):
        path, feeds = chain_model(int(name[5:]))
        return ember.load_onnx(path, backend="wgpu", fuse=False), feeds
    path, feeds, _ = workloads()[name]()
    return ember.load_onnx(path, backend="wgpu"), feeds


def measure(name: str, repeat: int) -> dict[str, float]:
    model, feeds = load(name)
    be = model.compute_backend
    plan = next(iter(model._plans.values()))
    steps = plan.steps
    n = len(steps)
    arrays = model._check_feeds(feeds)
    dev = be.device

    from wgpu.backends.wgpu_native import _api

    lib, null = _api.lib, _api.ffi.NULL
    prepared = hasattr(be, "encode_prepared")  # absent before the prepared replay: A/B against older commits
    replay = be.prepare(steps) if prepared else steps

    # Each encode is submitted and waited for outside the timing: wgpu-core recycles the command encoders of
    # completed submissions; dropping never-submitted ones instead costs ~45 µs each and starves that pool.
    def encode_py() -> float:
        t = time.perf_counter()
        enc = dev.create_command_encoder()
        be.encode(enc, steps)
        cb = enc.finish()
        dt = time.perf_counter() - t
        be.queue.submit([cb])
        be.synchronize()
        return dt

    def encode() -> float:
        if not prepared:
            return encode_py()
        t = time.perf_counter()
        cb = be.encode_prepared(replay)
        dt = time.perf_counter() - t
        lib.wgpuQueueSubmit(be.queue._internal, 1, _api.ffi.new("WGPUCommandBuffer[1]", [cb]))
        lib.wgpuCommandBufferRelease(cb)
        be.synchronize()
        return dt

    def submit() -> None:
        if prepared:
            be.execute_prepared(replay)
        else:
            be.execute(steps)

    def timed_submit() -> float:
        t = time.perf_counter()
        submit()
        dt = time.perf_counter() - t
        be.synchronize()
        return dt

    flat = [(s.pipeline._internal, s.bind_group._internal, *s.grid) for s in steps if type(s) is Dispatch]

    def raw_loop() -> None:
        enc = dev.create_command_encoder()
        cpass = enc.begin_compute_pass()
        p = cpass._internal
        sp, sb, dw = (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                      lib.wgpuComputePassEncoderDispatchWorkgroups)
        for pipe, bg, x, y, z in flat:
            sp(p, pipe)
            sb(p, 0, bg, 0, null)
            dw(p, x, y, z)
        cpass.end()
        enc.finish()

    def cffi_floor() -> None:
        enc = dev.create_command_encoder()
        e = enc._internal
        add, rel = lib.wgpuCommandEncoderAddRef, lib.wgpuCommandEncoderRelease
        for _ in flat:
            add(e)
            rel(e)
            add(e)
            rel(e)  # the 4th keeps the refcount balanced; counted as the 3 calls' cost ×4/3 below
        enc.finish()

    res = {"steps": n, "dispatches": len(flat)}
    res["run"] = med_us(lambda: model.run(feeds), repeat) / n
    res["run_cpu"] = med_us(lambda: model.run(feeds), repeat, clock=time.thread_time) / n
    res["check"] = med_us(lambda: model._check_feeds(feeds), repeat) / n
    res["plan_run"] = med_us(lambda: plan.run(arrays), repeat) / n
    res["encode"] = statistics.median(encode() for _ in range(repeat)) * 1e6 / n
    res["encode_py"] = statistics.median(encode_py() for _ in range(repeat)) * 1e6 / n
    for _ in range(5):
        timed_submit()
    res["submit"] = statistics.median(timed_submit() for _ in range(repeat)) * 1e6 / n
    res["raw_loop"] = med_us(raw_loop, repeat) / n
    res["cffi_floor"] = med_us(cffi_floor, repeat) / n * 3 / 4
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="chain200,chain8")
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    print(f"ember from {ember.__file__}")
    for name in args.models.split(","):
        r = measure(name, args.repeat)
        cells = "  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items())
        print(f"{name:12} µs/step: {cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
