"""Input upload on the wgpu backend: where the time of writing a model input to the GPU goes.

    PYTHONPATH=src python bench/bench_upload.py [--mb 4.8] [--repeat 50]

Medians of `repeat`, µs, for one float32 array of `mb` MB (ResNet-18 batch 8's input is 4.8 MB):
  host_copy        np.copyto into a reused host array (the machine's single-thread memcpy)
  write_buffer     wgpuQueueWriteBuffer alone (wgpu copies into its staging memory; no GPU work waited for)
  write+sync       the same, then submit an empty command buffer and wait for the GPU
  chunked/P+sync   P writes of 1/P each, a submit after each (GPU transfer overlaps the next memcpy), then wait
  mapped_copy/tN   a persistent MAP_WRITE staging buffer kept mapped: copy into its mapped range with N threads
  mapped_run/tN    the whole staging round: copy (N threads), unmap, copy_buffer_to_buffer, submit, wait, map again
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import wgpu  # noqa: E402

import ember  # noqa: E402
from ember.backends.wgpu import backend as wb  # noqa: E402


def med_us(fn, repeat: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=float, default=4.8)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    be = ember.backend("wgpu")
    be._require_init()
    lib = wb._raw_lib()
    ffi = wb._FFI
    n = int(args.mb * 1e6) // 4 * 4
    src = np.random.default_rng(0).standard_normal(n // 4).astype(np.float32)
    host = np.empty_like(src)
    device, queue = be.device, be.queue
    target = device.create_buffer(size=n, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST)
    res: dict[str, float] = {}
    print(f"adapter: {be.adapter_name}; {n / 1e6:.2f} MB")

    res["host_copy"] = med_us(lambda: np.copyto(host, src), args.repeat)

    def write() -> None:
        lib.wgpuQueueWriteBuffer(queue._internal, target._internal, 0, ffi.from_buffer(src), n)

    def sync() -> None:
        queue.submit([device.create_command_encoder().finish()])
        be._device_synchronize()

    res["write_buffer"] = med_us(lambda: (write(), None)[1], args.repeat)
    sync()
    res["write+sync"] = med_us(lambda: (write(), sync()), args.repeat)
    res["sync"] = med_us(sync, args.repeat)

    def chunked(parts: int) -> None:
        # Each chunk's copy is submitted before the next chunk is staged: the GPU's transfer of chunk i
        # overlaps the host's memcpy of chunk i + 1.
        step = -(-n // parts // 4) * 4
        view = ffi.from_buffer(src)
        for off in range(0, n, step):
            size = min(step, n - off)
            lib.wgpuQueueWriteBuffer(queue._internal, target._internal, off, view + off, size)
            queue.submit([])
        sync()

    for parts in (2, 4, 8):
        res[f"chunked/{parts}+sync"] = med_us(lambda parts=parts: chunked(parts), args.repeat)

    staging = device.create_buffer(size=n, usage=wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC,
                                   mapped_at_creation=True)

    def mapped() -> np.ndarray:
        ptr = lib.wgpuBufferGetMappedRange(staging._internal, 0, n)
        return np.frombuffer(ffi.buffer(ptr, n), np.float32)

    pool = ThreadPoolExecutor(16)
    for threads in (1, 2, 4, 8, 16):
        parts = np.array_split(np.arange(src.size), threads)
        bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]

        def copy(dst: np.ndarray, bounds=bounds) -> None:
            if len(bounds) == 1:
                np.copyto(dst, src)
                return
            list(pool.map(lambda b: np.copyto(dst[b[0]:b[1]], src[b[0]:b[1]]), bounds))

        view = mapped()
        res[f"mapped_copy/t{threads}"] = med_us(lambda copy=copy, view=view: copy(view), args.repeat)
        del view

        def round_trip(copy=copy) -> None:
            copy(mapped())
            staging.unmap()
            enc = device.create_command_encoder()
            enc.copy_buffer_to_buffer(staging, 0, target, 0, n)
            queue.submit([enc.finish()])
            staging.map_sync(wgpu.MapMode.WRITE)

        res[f"mapped_run/t{threads}"] = med_us(round_trip, args.repeat)
    staging.unmap()
    for k, v in res.items():
        print(f"  {k:>16}: {v:8.1f} µs   ({n / v / 1e3:6.1f} GB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
