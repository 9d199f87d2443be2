"""GPU timing for the wgpu backend: whole-run GPU time (gpu_time) and per-step profiles (profile) from timestamp
queries, with the GPU warmed up first on hardware adapters (WgpuBackend.gpu_time / profile call these)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import wgpu

from ..base import ComputeBackend

PROFILE_WARMUP_S = 0.05  # see profile()
PROFILE_REPS = 3
# gpu_time keeps stamping runs for at least this long and reports the fastest: a GPU idle for a few seconds (say
# while a model compiles) reads several times slow for a fraction of a second of stamped runs (BENCHMARKS.md).
GPU_TIME_MIN_S = 1.0


def profile(be: Any, steps: list, method: str | None = None) -> list[float]:
    """Per-step GPU time in ms from timestamp queries.

    method "marginal" (default on hardware GPUs): what each step adds to the whole run in the stream, as
    T(run with step i executed twice) - T(run), T from stamps bracketing the whole command buffer, min of
    PROFILE_REPS. Stamping each step's own pass does not work there: a pass's beginning stamp is taken when
    the pass is reached, not when earlier work has drained, and a step alone in its own submit reads several
    times its in-stream time (BENCHMARKS.md).
    method "isolated" (default on software adapters, where n + 1 whole runs would be slow): each step in its
    own stamped pass and submit.
    """
    if "timestamp-query" not in be.features:
        return ComputeBackend.profile(be, steps)
    if method is None:
        method = "isolated" if be.adapter.info["adapter_type"] == "CPU" else "marginal"
    if method not in ("marginal", "isolated"):
        raise ValueError(f"method: expected 'marginal' or 'isolated', got {method!r}")
    warm_up(be, steps)
    if method == "isolated":
        return [stamped_ms(be, [st]) for st in steps]
    whole = min(stamped_ms(be, steps) for _ in range(PROFILE_REPS))
    return [max(0.0, min(stamped_ms(be, steps[:i + 1] + steps[i:]) for _ in range(PROFILE_REPS)) - whole)
            for i in range(len(steps))]


def gpu_time(be: Any, steps: list, reps: int = 5) -> float:
    """GPU milliseconds of one run of `steps` in the stream (one command buffer between two stamps), the
    minimum of at least `reps` (and on a hardware GPU, of GPU_TIME_MIN_S of runs) after warming the GPU up:
    what a plan's run costs the GPU, without host time."""
    if "timestamp-query" not in be.features:
        return ComputeBackend.gpu_time(be, steps, reps)
    warm_up(be, steps)
    hardware = be.adapter.info["adapter_type"] != "CPU"
    best, count, end = float("inf"), 0, time.perf_counter() + (GPU_TIME_MIN_S if hardware else 0.0)
    while count < max(1, reps) or time.perf_counter() < end:
        best = min(best, stamped_ms(be, steps))
        count += 1
    return best


def warm_up(be: Any, steps: list) -> None:
    """Run `steps` for PROFILE_WARMUP_S on a hardware GPU before timing it: GPUs drop their clocks within
    milliseconds of idling, and kernels timed right after the host had been busy read several times slow."""
    if be.adapter.info["adapter_type"] == "CPU":
        return
    end = time.perf_counter() + PROFILE_WARMUP_S
    while time.perf_counter() < end:
        be.execute(steps)
        be._device_synchronize()


def stamped_ms(be: Any, steps: list) -> float:
    """GPU milliseconds of `steps` in one command buffer and submit, between a stamp in an empty pass before
    them and one after them (the GPU is idle before: the submit is waited for)."""
    qs = be.device.create_query_set(type="timestamp", count=2)
    resolve = be.device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    try:
        encoder = be.device.create_command_encoder()
        encoder.begin_compute_pass(timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": 0}).end()
        be.encode(encoder, steps)
        encoder.begin_compute_pass(timestamp_writes={"query_set": qs, "end_of_pass_write_index": 1}).end()
        encoder.resolve_query_set(qs, 0, 2, resolve, 0)
        be.flush()
        be.queue.submit([encoder.finish()])
        t0, t1 = np.frombuffer(be.queue.read_buffer(resolve), np.uint64).astype(np.float64)
        return max(0.0, (t1 - t0) * be.rt.timestamp_period(be.queue) / 1e6)
    finally:
        resolve.destroy()
        qs.destroy()
