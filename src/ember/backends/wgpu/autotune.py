"""Autotune of the generated GEMM kernel (matmul and implicit-GEMM conv): per problem shape, a few tile configs.

`plan_gemm`'s heuristic was tuned on one GPU (an H200); on another the best tile and split-K count differ. When a
problem is first recorded (model load), `choose` records a handful of legal (tile, splits) candidates around the
heuristic's pick, times them on the device in one submit, and keeps the fastest; the choice is cached in memory and
in a JSON file per adapter (tune_cache.py), so later loads time nothing.

- On/off: `load_onnx(..., autotune=True/False)`, else EMBER_AUTOTUNE=1/0, else on for hardware adapters and off
  for software ones (lavapipe: its timings say nothing about a GPU, and the test suite stays fast).
- Timing: GPU timestamp queries around each candidate's pass where the adapter has 'timestamp-query', else the
  host clock around submit + wait. Every candidate runs once to warm up, then REPS rounds interleave the
  candidates (so clock ramps hit all alike); the minimum counts. The heuristic's pick is kept unless another
  candidate beats it by more than KEEP_MARGIN (noise must not flip choices).
- Safety: candidates run on the problem's real buffers (the kernels bake in their bindings), so the output's
  binding is copied aside before the timed passes and back after them, in the same submit: a gemm with
  beta * C reading the output, or data next to the output in its buffer, is left as it was.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import wgpu

from ... import settings
from ...core import progress
from .program import Dispatch, kernel
from .shader import tiles
from .shader.bindings import Bindings
from .shader.loaders import Loader
from .shader.tiles import (
    HUGE_MIN_WORKGROUPS,
    LARGE_16K,
    MAX_SPLITS,
    MIN_SPLIT_K,
    TARGET_WORKGROUPS,
    TILES,
    Tile,
    split_count,
)
from .tune_cache import TuneCache, adapter_identity, cache_dir, cache_path, generator_version

if TYPE_CHECKING:
    from .backend import WgpuBackend

log = logging.getLogger(__name__)

MAX_CANDIDATES = 7
REPS = 5
CPU_REPS = 2  # software adapters: their timings only exercise the mechanism, keep it short
KEEP_MARGIN = 0.03
# Below this many flops a kernel takes microseconds whatever its tile: timing noise would decide, so the
# heuristic's pick stands and nothing is timed or cached. On hardware GPUs the bar is higher: tuning a model's many
# small 1x1 convs costs seconds at load and noise-picked tiles can make the model slower, while the big products
# that gain from tuning stay above it (BENCHMARKS.md).
MIN_TUNE_FLOP = 1 << 22  # software adapters (lavapipe): the tests tune small problems
MIN_TUNE_FLOP_GPU = 1 << 26
# Rectangular tiles the heuristic never picks: for outputs much wider than tall (conv: few channels, many pixels)
# and the reverse.
WIDE = Tile(64, 128, 16, 8, 8)  # 128 threads
TALL = Tile(128, 64, 16, 8, 8)

Plan = tuple[Tile, int]  # (tile, K splits)


# ---- candidates ------------------------------------------------------------------------------------------------
def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def tile_legal(be: WgpuBackend, t: Tile) -> bool:
    """Whether the generator can emit `t` and the device can run it (see GemmProblem and StridedLoader)."""
    lim = be.limits
    if t.tm % 4 or t.tn % 4 or t.bm % t.tm or t.bn % t.tn or t.bk % 4:
        return False
    # Thread and quad indices are decoded with shifts and masks.
    if not all(_pow2(v) for v in (t.tx, t.bm // 4, t.bn // 4, t.bk // 4)):
        return False
    if t.warp and (t.tx < 8 or t.ty < 4 or t.threads % 32):
        return False
    # Every thread loads the same number of quads of each operand.
    if (t.bk * t.bm // 4) % t.threads or (t.bk * t.bn // 4) % t.threads:
        return False
    return (t.threads <= int(lim.get("max-compute-invocations-per-workgroup", 256))
            and t.threads <= int(lim.get("max-compute-workgroup-size-x", 256))
            and t.smem_bytes() <= int(lim.get("max-compute-workgroup-storage-size", 16384)))


def plan_legal(be: WgpuBackend, plan: Plan, m: int, n: int, k: int, z: int) -> bool:
    t, splits = plan
    if not tile_legal(be, t) or splits < 1:
        return False
    if splits == 1:
        return True
    # Every split non-empty (the generator asserts it) and the partial sums bindable.
    scratch = splits * z * m * n * 4
    return (splits <= math.ceil(k / t.bk) and split_count(k, t, splits) == splits
            and scratch <= be.max_binding and scratch <= be.max_buffer)


def _natural_splits(be: WgpuBackend, t: Tile, m: int, n: int, k: int, z: int) -> int:
    """plan_gemm's split rule applied to tile t: split K when t's tiling alone leaves the GPU idle."""
    wg = math.ceil(m / t.bm) * math.ceil(n / t.bn) * z
    if wg >= TARGET_WORKGROUPS:
        return 1
    room = be.max_binding // max(1, 4 * z * m * n)
    s = min(math.ceil(TARGET_WORKGROUPS / wg), k // MIN_SPLIT_K, MAX_SPLITS, room)
    return split_count(k, t, s) if s >= 2 else 1


def candidates(be: WgpuBackend, m: int, n: int, k: int, z: int) -> list[Plan]:
    """The heuristic's plan first, then up to MAX_CANDIDATES - 1 legal alternatives around it: the same tile with
    K split twice as much / half as much (or in two where unsplit but short of workgroups), the other standard
    tiles with their own split rule (the 16 KiB 128 x 128 tile where the 32 KiB one does not fit), and one
    rectangular tile along the output's long side."""
    base = tiles.plan_gemm(be, m, n, k, z)
    found = [base]

    def add(t: Tile, s: int) -> None:
        s = split_count(k, t, s) if s > 1 else 1
        if (t, s) not in found and plan_legal(be, (t, s), m, n, k, z):
            found.append((t, s))

    bt, bs = base
    if bs > 1:
        add(bt, min(2 * bs, MAX_SPLITS))
        add(bt, bs // 2)
    elif math.ceil(m / bt.bm) * math.ceil(n / bt.bn) * z < TARGET_WORKGROUPS and math.ceil(k / bt.bk) >= 4:
        add(bt, 2)
    large = TILES["large"] if tile_legal(be, TILES["large"]) else LARGE_16K
    # The huge tile only where it fills the GPU unsplit: with fewer of its workgroups than that (small convs as
    # implicit GEMM) it lost to the 64 x 64 tile every time (BENCHMARKS.md), so timing it there is waste.
    ht = TILES["huge"]
    huge = [ht] if math.ceil(m / ht.bm) * math.ceil(n / ht.bn) * z >= HUGE_MIN_WORKGROUPS else []
    for t in (*huge, large, WIDE if n >= m else TALL, TILES["medium"], TILES["small"]):
        if t != bt and tile_legal(be, t):
            add(t, _natural_splits(be, t, m, n, k, z))
    return found[:MAX_CANDIDATES]


# ---- problem signature ---------------------------------------------------------------------------------------
def _loader_signature(ld: Loader, z: int) -> str:
    cs = getattr(ld, "cs", None)
    if cs is not None:  # conv.Im2colLoader: the gather's cost depends on the whole conv geometry
        return "im2col(" + ",".join(str(v) for v in vars(cs).values()) + ")"
    quad, vec4 = getattr(ld, "quad", None), getattr(ld, "vec4", None)
    if quad is not None:  # matmul.StridedLoader: the unit-stride direction (transposes) and vec4 loads
        return f"{quad}{'4' if vec4 else '1'}" + ("b" if z > 1 and getattr(ld, "sz", 1) == 0 else "")
    return type(ld).__name__


def size_class(v: int) -> int:
    """The size a tuned choice is kept under: exact up to 64, then the next power of two. Shapes that change from
    run to run (a sequence length, a batch) meet one tuning per class, not one per value; the entry is checked
    for legality at each member (_entry_plan)."""
    return v if v <= 64 else 1 << (v - 1).bit_length()


def problem_key(name: str, m: int, n: int, k: int, z: int, a: Loader, b: Loader, dtype: str = "f32") -> str:
    m, n, k, z = (size_class(v) for v in (m, n, k, z))
    return f"{name} {dtype} z{z} m{m} n{n} k{k} A:{_loader_signature(a, z)} B:{_loader_signature(b, z)}"


# ---- per-backend state -----------------------------------------------------------------------------------------
class Tuner:
    """The autotune state of one backend: its cache (re-opened if the cache directory changes) and counters."""

    def __init__(self, be: WgpuBackend) -> None:
        self.be = be
        self.ident = adapter_identity(dict(be.adapter.info), be.rt.name, be.rt.version())
        self.version = generator_version()
        self._cache: TuneCache | None = None
        self.local = threading.local()  # the model-level on/off of the thread planning
        self.lock = threading.Lock()
        # hits: choices served from the cache; tuned: problems timed; timed: candidate kernels timed;
        # skipped: problems too small to tune; seconds: wall time spent tuning (recording + compiling + timing).
        self.stats: dict[str, float] = {"hits": 0, "tuned": 0, "timed": 0, "skipped": 0, "seconds": 0.0}

    @property
    def cache(self) -> TuneCache:
        path = cache_path(cache_dir(), self.ident)
        if self._cache is None or self._cache.path != path:
            self._cache = TuneCache(path, self.ident, self.version)
        return self._cache

    def count(self, key: str, v: float = 1) -> None:
        self.stats[key] += v
        report = getattr(self.local, "report", None)
        if report is not None:
            report[key] += v

    def enabled(self) -> bool:
        scoped = getattr(self.local, "enabled", None)
        if scoped is not None:
            return scoped
        chosen = settings.AUTOTUNE.get()
        if chosen is not None:
            return chosen
        return self.be.adapter.info.get("adapter_type") != "CPU"


def tuner(be: WgpuBackend) -> Tuner:
    t = getattr(be, "_autotuner", None)
    if t is None:
        t = be._autotuner = Tuner(be)
    return t


@kernel("autotune_scope")
@contextlib.contextmanager
def scope(be: WgpuBackend, enabled: bool | None) -> Iterator[dict[str, float]]:
    """Turn tuning on/off for what this thread records inside the block (None: the default rule). Yields a report
    of what tuning did inside it (the `stats` counters, this thread's share)."""
    t = tuner(be)
    old, old_report = getattr(t.local, "enabled", None), getattr(t.local, "report", None)
    report = dict.fromkeys(t.stats, 0)
    t.local.enabled, t.local.report = enabled, report
    try:
        yield report
    finally:
        t.local.enabled, t.local.report = old, old_report
        if old_report is not None:  # nested: the outer block saw this work too
            for key, v in report.items():
                old_report[key] += v
        elif report["tuned"] or report["hits"]:
            log.info("autotune: %d GEMM shapes tuned (%d kernels timed) in %.2f s, %d from the cache (%s)",
                     report["tuned"], report["timed"], report["seconds"], report["hits"], t.cache.path)


# ---- timing --------------------------------------------------------------------------------------------------
def _encode_pass(encoder: Any, steps: list, timestamps: dict | None = None) -> None:
    cpass = encoder.begin_compute_pass(timestamp_writes=timestamps) if timestamps else encoder.begin_compute_pass()
    for st in steps:
        cpass.set_pipeline(st.pipeline)
        cpass.set_bind_group(0, st.bind_group)
        cpass.dispatch_workgroups(*st.grid)
    cpass.end()


class _Saved:
    """A byte range of a buffer copied aside and back by commands in the timing submits."""

    def __init__(self, be: WgpuBackend, preserve: tuple[Any, int, int] | None) -> None:
        self.buf, self.off, size = preserve if preserve is not None else (None, 0, 0)
        self.size = -(-size // 4) * 4
        self.copy = (be.device.create_buffer(size=self.size, usage=wgpu.BufferUsage.COPY_SRC
                                             | wgpu.BufferUsage.COPY_DST) if self.size else None)

    def save(self, encoder: Any) -> None:
        if self.copy is not None:
            encoder.copy_buffer_to_buffer(self.buf, self.off, self.copy, 0, self.size)

    def restore(self, encoder: Any) -> None:
        if self.copy is not None:
            encoder.copy_buffer_to_buffer(self.copy, 0, self.buf, self.off, self.size)

    def destroy(self) -> None:
        if self.copy is not None:
            self.copy.destroy()


def _time_gpu(be: WgpuBackend, runs: list[list], reps: int, saved: _Saved) -> list[float] | None:
    """Timestamp queries around each candidate's pass, all in one submit; None if the stamps make no sense."""
    n = len(runs)
    count = 2 * n * reps
    qs = be.device.create_query_set(type="timestamp", count=count)
    resolve = be.device.create_buffer(size=8 * count, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    try:
        encoder = be.device.create_command_encoder()
        saved.save(encoder)
        for steps in runs:  # warm-up: caches, clocks
            _encode_pass(encoder, steps)
        for r in range(reps):
            for i, steps in enumerate(runs):
                q = 2 * (r * n + i)
                _encode_pass(encoder, steps, {"query_set": qs, "beginning_of_pass_write_index": q,
                                              "end_of_pass_write_index": q + 1})
        saved.restore(encoder)
        encoder.resolve_query_set(qs, 0, count, resolve, 0)
        be.queue.submit([encoder.finish()])
        ticks = np.frombuffer(be.queue.read_buffer(resolve), np.uint64).reshape(reps, n, 2).astype(np.float64)
    finally:
        resolve.destroy()
        qs.destroy()
    span = ticks[:, :, 1] - ticks[:, :, 0]
    span[span <= 0] = np.inf  # a driver writing zeros, or a counter that wrapped: not a sample
    best = span.min(axis=0) * be.rt.timestamp_period(be.queue) / 1e6
    return list(best) if np.isfinite(best).all() else None


def _time_host(be: WgpuBackend, runs: list[list], reps: int, saved: _Saved) -> list[float]:
    """The host clock around submit + wait of each candidate (a constant overhead, the same for all)."""
    encoder = be.device.create_command_encoder()
    saved.save(encoder)
    for steps in runs:  # warm-up
        _encode_pass(encoder, steps)
    be.queue.submit([encoder.finish()])
    be.synchronize()
    best = [math.inf] * len(runs)
    for _ in range(reps):
        for i, steps in enumerate(runs):
            encoder = be.device.create_command_encoder()
            _encode_pass(encoder, steps)
            t0 = time.perf_counter()
            be.queue.submit([encoder.finish()])
            be.synchronize()
            best[i] = min(best[i], (time.perf_counter() - t0) * 1e3)
    encoder = be.device.create_command_encoder()
    saved.restore(encoder)
    be.queue.submit([encoder.finish()])
    return best


def time_candidates(be: WgpuBackend, runs: list[list], preserve: tuple[Any, int, int] | None,
                    reps: int = REPS) -> list[float]:
    """Milliseconds per candidate (min over `reps`); `runs` are recorded steps (dispatches only). `preserve`:
    (GPUBuffer, byte offset, byte size) copied aside before the timed passes and restored after them."""
    assert all(type(st) is Dispatch for steps in runs for st in steps)
    saved = _Saved(be, preserve)
    try:
        ms = _time_gpu(be, runs, reps, saved) if "timestamp-query" in be.features else None
        return ms if ms is not None else _time_host(be, runs, reps, saved)
    finally:
        saved.destroy()


# ---- the hook --------------------------------------------------------------------------------------------------
def _entry_plan(be: WgpuBackend, entry: dict[str, Any], m: int, n: int, k: int, z: int) -> Plan | None:
    """The plan a cache entry holds, if it is well formed and legal here (a hand-edited file, other limits)."""
    try:
        plan = (Tile.parse(entry["tile"]), int(entry["splits"]))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return plan if plan_legal(be, plan, m, n, k, z) else None


def _measure(be: WgpuBackend, key: str, cands: list[Plan], record: Callable[[Plan], list], out_handle: Any,
             windows: dict[int, tuple[int, int]] | None) -> list[float] | None:
    """Milliseconds per candidate (inf: it failed to build); None when timing itself failed."""
    runs = [record(cands[0])]  # the heuristic's plan: if it fails, so would the untuned path; let it raise
    for c in cands[1:]:
        try:
            runs.append(record(c))
        except Exception as e:  # a driver refusing one tile (registers, say) rules out that tile only
            log.debug("autotune %s: candidate %s split %d failed: %s", key, c[0], c[1], e)
            runs.append([])
    kept = [i for i, r in enumerate(runs) if r]
    if isinstance(out_handle, int):
        window = (windows or {}).get(out_handle)
        buf = be.buffer(out_handle)
        preserve = (buf, *window) if window else (buf, 0, buf.size)
    else:  # a scratch buffer of the caller's own (Winograd's products): its contents are rewritten every run
        preserve = None
    software = be.adapter.info.get("adapter_type") == "CPU"
    try:
        timed = time_candidates(be, [runs[i] for i in kept], preserve, CPU_REPS if software else REPS)
    except Exception as e:  # a driver failure while tuning must not fail the load: the heuristic still works
        warnings.warn(f"ember autotune: timing {key} failed ({type(e).__name__}: {e}); using the heuristic",
                      stacklevel=4)
        return None
    ms = [math.inf] * len(cands)
    for i, v in zip(kept, timed, strict=True):
        ms[i] = v
    return ms


def _counted(record: Callable[[Plan], list], bar: progress.Task) -> Callable[[Plan], list]:
    """`record` that advances the progress bar by one candidate each call."""
    def counted(plan: Plan) -> list:
        try:
            return record(plan)
        finally:
            bar.advance()

    return counted


def choose(be: WgpuBackend, name: str, m: int, n: int, k: int, z: int, out_handle: Any,
           make_a: Callable[[Bindings, Tile], Loader], make_b: Callable[[Bindings, Tile], Loader],
           windows: dict[int, tuple[int, int]] | None, record: Callable[[Plan], list],
           dtype: str | None = None, types: dict[Any, str] | None = None) -> Plan:
    """(tile, K splits) for a GEMM problem: plan_gemm's heuristic, or with tuning on the cached / timed best.
    `record(plan)` records the problem's steps with that plan (record_gemm_kernel). `dtype` for the key: by
    default the element types the kernel's bindings declare."""
    t = tuner(be)
    if not t.enabled():
        return tiles.plan_gemm(be, m, n, k, z)
    if 2 * m * n * k * z < (MIN_TUNE_FLOP if be.adapter.info["adapter_type"] == "CPU" else MIN_TUNE_FLOP_GPU):
        t.count("skipped")
        return tiles.plan_gemm(be, m, n, k, z)
    base = tiles.plan_gemm(be, m, n, k, z)
    probe = Bindings(out_handle, windows, types)  # loaders built only to read their layout, for the key
    la, lb = make_a(probe, base[0]), make_b(probe, base[0])
    if dtype is None:  # storage types change what a tile costs (f16 operands halve the loads)
        dtype = "+".join(sorted(set(re.findall(r"\b(f16|f32|bf16|i32|u32)\b", "\n".join(probe.declarations())))))
    key = problem_key(name, m, n, k, z, la, lb, dtype)
    with t.lock:
        entry = t.cache.get(key)
        plan = None if entry is None else _entry_plan(be, entry, m, n, k, z)
        if plan is not None:
            t.count("hits")
            return plan
        cands = candidates(be, m, n, k, z)
        if len(cands) < 2:
            return base
        t0 = time.perf_counter()
        try:
            with progress.task(f"autotune {name} {m}x{n}x{k}" + (f" x{z}" if z > 1 else "") +
                               f": {len(cands)} tile configs", total=len(cands)) as bar:
                ms = _measure(be, key, cands, _counted(record, bar), out_handle, windows)
        finally:
            t.count("seconds", time.perf_counter() - t0)
        if ms is None:
            return base
        best = min(range(len(cands)), key=lambda i: ms[i])
        if ms[0] <= ms[best] * (1 + KEEP_MARGIN):
            best = 0
        tile, splits = cands[best]
        t.count("tuned")
        t.count("timed", sum(math.isfinite(v) for v in ms))
        t.cache.put(key, {"tile": str(tile), "splits": splits,
                          "ms": round(ms[best], 6), "heuristic_ms": round(ms[0], 6),
                          "candidates": {f"{c[0]}/s{c[1]}": round(v, 6) if math.isfinite(v) else None
                                         for c, v in zip(cands, ms, strict=True)}})
        log.info("autotune %s: %s split %d, %.4f ms (heuristic %s split %d: %.4f ms)", key, tile, splits,
                 ms[best], base[0], base[1], ms[0])
        return cands[best]
