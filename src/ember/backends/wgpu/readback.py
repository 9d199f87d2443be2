"""Reading device buffers back to the host: staging copies and their maps, waited for on the calling thread."""

from __future__ import annotations

from typing import Any

import numpy as np
import wgpu

from ... import settings
from ...core.view import View
from . import program
from .program import NUMPY_STORAGE, Copy, storage_type


def record_readback(be: Any, view: View) -> tuple[list, Any]:
    """(steps, read) for a contiguous view (WgpuBackend.record_readback): a MAP_READ staging buffer of its own,
    the copy into it as steps that ride in the run's command buffer, so reading the outputs costs one map per
    output instead of queue.read_buffer's buffer creation and extra submit."""
    st = NUMPY_STORAGE[storage_type(view.dtype)]
    if not view.is_contiguous():
        raise ValueError("record_readback: the view must be contiguous")
    # Buffer copies move whole 4-byte words: an f16 view at an odd offset would need a kernel instead.
    if (view.offset * st.itemsize) % 4:
        raise NotImplementedError("record_readback: the view must start on a 4-byte boundary")
    size = -(-max(view.size * st.itemsize, 4) // 4) * 4
    staging = be.device.create_buffer(size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
    steps = [Copy(be.buffer(view.handle), view.offset * st.itemsize, staging, 0, size)] if view.size else []

    def read() -> np.ndarray:
        if view.size == 0:
            return np.empty(view.shape, view.dtype)
        raw = np.frombuffer(map_read(be, staging, size), st)[: view.size]
        return program.from_storage(raw, view.dtype).reshape(view.shape)

    return steps, read


def download_later(be: Any, view: View) -> Any:
    """WgpuBackend.download_later for a non-empty contiguous view starting on a word: the copy submitted (or
    held) now into a MAP_READ buffer from a small pool of the backend's (a decode reads one token a step), mapped
    and given back to the pool by read()."""
    st = NUMPY_STORAGE[storage_type(view.dtype)]
    size = -(-view.size * st.itemsize // 4) * 4
    pool = be._read_pool.setdefault(size, [])
    staging = pool.pop() if pool else be.device.create_buffer(
        size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
    be._submit_copies([Copy(be.buffer(view.handle), view.offset * st.itemsize, staging, 0, size)])
    started: list[Any] = []
    index: list[int | None] = []
    if be.rt.map_early and not settings.WGPU_PY_ENCODE.get():
        # The map is asked for as soon as the copy is submitted (held_submits: when it ends): asked at read(), after
        # the next step's submit, Dawn would complete it only once that step has run too.
        be.after_submit(lambda: started.append(be.rt.map_start(staging, size, be.queue)))
    else:  # asked for at read(), waited for up to the copy's submission (where the runtime numbers them)
        be.after_submit(lambda: index.append(be._pending.last))
    done: list[np.ndarray] = []

    def read() -> np.ndarray:
        if not done:  # once: the staging buffer is the pool's again after the first read
            try:
                be.flush()
                if started:
                    data = be.rt.map_finish(be.device, staging, size, started[0], spin_s(be))
                elif settings.WGPU_PY_ENCODE.get():
                    data = map_read(be, staging, size)
                else:
                    data = be.rt.map_finish(be.device, staging, size, be.rt.map_start(staging, size), spin_s(be),
                                            index[0] if index else None)
                raw = np.frombuffer(data, st)[: view.size].copy()
            finally:
                if len(pool) < 4:
                    pool.append(staging)
            done.append(program.from_storage(raw, view.dtype).reshape(view.shape))
        return done[0].copy()

    return read


def spin_s(be: Any) -> float:
    """How long a readback wait polls without blocking (WAIT_SPIN_US). Never on a software adapter (lavapipe):
    it runs the GPU work on the host's cores, and a spinning thread would take one of them."""
    return 0.0 if be.adapter.info["adapter_type"] == "CPU" else settings.WAIT_SPIN_US.get() * 1e-6


def map_read(be: Any, staging: Any, size: int) -> bytes:
    """The first `size` bytes of a MAP_READ buffer once the submitted work that writes it has run.

    wgpu-py's map_async submits an empty command buffer first and waits through its poll thread (a fixed
    cost per readback, BENCHMARKS.md); here the map is waited for on this thread (Runtime.map_read).
    """
    be.flush()  # a copy still held (held_submits) would never complete the map
    if settings.WGPU_PY_ENCODE.get():
        staging.map_async("READ").sync_wait()
        try:
            return bytes(staging.read_mapped(0, size, copy=False))
        finally:
            staging.unmap()
    return be.rt.map_read(be.device, staging, size, spin_s(be))
