"""Runtime sizes moved without recording again: what a live plan (ember/plan/live.py) needs of this backend.

`probe_sizes` runs a RUNTIME_SIZES record function on a stand-in for the backend that makes nothing on the
device: pipelines are their WGSL source, bind groups the slots they would bind, uniform buffers the int32s they
would hold. Two calls on the same buffers whose probes have the same structure (same sources and slots) record
the same dispatches, apart from the uniform values and grids. `sizes_writer` gives recorded dispatches
other grids and a function writing new values into their uniform buffers (wgpuQueueWriteBuffer: ordered after
the work already submitted, before the next submit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import wgpu

from .program import KERNELS, Dispatch, kernel

if TYPE_CHECKING:
    from .backend import WgpuBackend


class _Uniform:
    __slots__ = ("values",)

    def __init__(self, data: bytes) -> None:
        self.values = np.frombuffer(data, np.int32)


class _Stand:
    """The backend as a record function sees it while probing: everything it asks is the backend's answer,
    nothing it makes is made."""

    def __init__(self, be: WgpuBackend) -> None:
        self._be = be

    def __getattr__(self, name: str) -> Any:
        return getattr(self._be, name)

    def pipeline(self, label: str, source: str, *, trusted: bool = True) -> Any:
        return ("pipeline", label, source, trusted)

    def uniform_buffer(self, data: bytes) -> _Uniform:
        return _Uniform(data)

    def dispatch(self, pipeline: Any, buffers: list[Any] | dict[int, Any], grid: tuple[int, int, int],
                 label: str = "") -> Dispatch:
        items = list(buffers.items() if isinstance(buffers, dict) else enumerate(buffers))
        bound = tuple((i, "sizes") if isinstance(b, _Uniform) else (i, b) for i, b in items)
        return Dispatch(pipeline, bound, tuple(grid), label, tuple(b for _, b in items if isinstance(b, _Uniform)))


@kernel("probe_sizes")
def probe_sizes(be: WgpuBackend, method: str, args: tuple, kwargs: dict) -> tuple | None:
    """(structure, per dispatch its uniform int32s, per dispatch its grid) of `method` with runtime sizes."""
    if method not in be.RUNTIME_SIZES:
        return None
    steps = KERNELS[method](_Stand(be), *args, **{**kwargs, "runtime_sizes": True})
    if not all(type(st) is Dispatch and len(st.keep) == 1 for st in steps):
        return None  # a step without exactly one uniform array: not one this probe can move
    # The kernels and the slots they bind; which buffers fill the slots is the call's arguments' business (the
    # same at every point of a template, a plan's own buffers in each plan).
    structure = tuple((st.pipeline, tuple(i for i, _ in st.bind_group), st.label) for st in steps)
    return structure, [st.keep[0].values for st in steps], [st.grid for st in steps]


@kernel("sizes_writer")
def sizes_writer(be: WgpuBackend, steps: list, grids: list[tuple[int, int, int]]
                 ) -> tuple[list, Callable[[list[np.ndarray]], None]]:
    """(the steps with these grids, a function writing one int32 array per dispatch into its uniform buffer)."""
    # The bare call, not wgpu-py's error-capturing wrapper (~1-3 µs each, a decode step writes one per moving
    # dispatch): every write lands inside a live uniform buffer of the plan's own, made here with its size; what
    # could still fail is a lost device, which the run's checked pass end / finish / submit then raise.
    ffi, write, queue = be.rt.ffi, be.rt.lib.wgpuQueueWriteBuffer, be.queue._internal
    targets, moved = [], []
    for st, grid in zip(steps, grids, strict=True):
        uniform = [b for b in st.keep if b.usage & wgpu.BufferUsage.UNIFORM]
        if type(st) is not Dispatch or len(uniform) != 1:
            raise ValueError(f"sizes_writer: step {st!r} was not recorded with runtime sizes")
        data = np.zeros(uniform[0].size // 4, np.int32)  # the words written; the queue copies them at once
        targets.append((uniform[0]._internal, data, ffi.from_buffer(data), uniform[0].size))
        moved.append(st._replace(grid=tuple(grid)))

    def write_sizes(values: list[np.ndarray]) -> None:
        be.flush()  # queue order: work held back (held_submits, public ops) goes before the writes
        for (target, data, pointer, size), v in zip(targets, values, strict=True):
            data[:v.size] = v
            write(queue, target, 0, pointer, size)

    return moved, write_sizes
