"""Runtime sizes moved without recording again: what a live plan (ember/plan/live.py) needs of this backend.

`probe_sizes` runs a RUNTIME_SIZES record function on a stand-in for the backend that makes nothing on the
device: pipelines are their WGSL source, bind groups the slots they would bind, uniform buffers the int32s they
would hold. Two calls on the same buffers whose probes have the same structure (same sources and slots) record
the same dispatches, apart from the uniform values and grids. `sizes_writer` gives recorded dispatches
other grids, and `join_sizes_writers` binds a plan's moving dispatches to one uniform Arena that a move writes at
once (wgpuQueueWriteBuffer: ordered after the work already submitted, before the next submit).
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


class SizesWriter:
    """The uniform buffers of recorded dispatches whose sizes move (sizes_writer), one a dispatch in the steps'
    order: what join_sizes_writers binds to an Arena. Called with one int32 array a dispatch, it writes them into
    those buffers one by one (a live plan writes its Arena instead)."""

    def __init__(self, be: WgpuBackend, uniforms: list[Any]) -> None:
        self.be, self.uniforms = be, uniforms

    def __call__(self, values: list[np.ndarray]) -> None:
        be = self.be
        be.flush()  # queue order: work held back (held_submits, public ops) goes before the writes
        for u, v in zip(self.uniforms, values, strict=True):
            data = np.zeros(u.size // 4, np.int32)
            data[:v.size] = v
            be.queue.write_buffer(u, 0, data)


class Arena:
    """The sizes of a live plan's moving dispatches in one uniform buffer, each dispatch's at an offset of its own
    (its bind group made again to bind there), so a move writes them all with one wgpuQueueWriteBuffer: one
    scatter of the sizes vector into the host copy, one write."""

    def __init__(self, be: WgpuBackend, steps: list[list], writers: list[SizesWriter],
                 ranges: list[list[tuple[int, int]]]) -> None:
        align = int(be.limits.get("min-uniform-buffer-offset-alignment", 256))
        uniforms = [u for w in writers for u in w.uniforms]
        slots = [-(-u.size // align) * align for u in uniforms]
        offsets = np.cumsum([0, *slots])
        self.nbytes = int(offsets[-1])
        self.buffer = be.device.create_buffer(size=max(self.nbytes, 16),
                                              usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        self.host = np.zeros(self.nbytes // 4, np.int32)
        dst, src = [], []
        self.steps: list[list] = []
        k = 0
        for rs, moved in zip(ranges, steps, strict=True):
            out = []
            for (lo, hi), st in zip(rs, moved, strict=True):
                u, at = uniforms[k], int(offsets[k])
                if hi - lo > u.size // 4:
                    raise ValueError(f"sizes_writer: {hi - lo} values for a uniform of {u.size // 4} words")
                dst.extend(range(at // 4, at // 4 + hi - lo))
                src.extend(range(lo, hi))
                out.append(self._rebind(be, st, u, at))
                k += 1
            self.steps.append(out)
        self.dst = np.array(dst, np.intp)
        self.src = np.array(src, np.intp)
        self.be = be
        self._pointer = be.rt.ffi.from_buffer(self.host)

    def _rebind(self, be: WgpuBackend, st: Dispatch, uniform: Any, offset: int) -> Dispatch:
        entries = [{"binding": e["binding"], "resource": {**e["resource"], "buffer": self.buffer, "offset": offset}}
                   if e["resource"]["buffer"] is uniform else e for e in st.entries]
        if len(st.entries) == 0 or entries == list(st.entries):
            raise ValueError(f"sizes_writer: dispatch {st.label!r} binds no uniform of its own")
        group = be.device.create_bind_group(layout=st.pipeline.get_bind_group_layout(0), entries=entries)
        keep = tuple(b for b in st.keep if b is not uniform) + (self.buffer,)
        return st._replace(bind_group=group, keep=keep, entries=tuple(entries))

    def __call__(self, sizes: np.ndarray) -> None:
        self.host[self.dst] = sizes[self.src]
        be = self.be
        be.flush()  # queue order: work held back (held_submits, public ops) goes before the write
        # The bare call, not wgpu-py's error-capturing wrapper: the write lands inside the arena, made here with its
        # size; what could still fail is a lost device, which the run's checked pass end / finish / submit raise.
        be.rt.lib.wgpuQueueWriteBuffer(be.queue._internal, self.buffer._internal, 0, self._pointer, self.nbytes)


@kernel("sizes_writer")
def sizes_writer(be: WgpuBackend, steps: list, grids: list[tuple[int, int, int]]) -> tuple[list, SizesWriter]:
    """(the steps with these grids, a SizesWriter naming their uniform buffers)."""
    uniforms, moved = [], []
    for st, grid in zip(steps, grids, strict=True):
        uniform = [b for b in st.keep if b.usage & wgpu.BufferUsage.UNIFORM] if type(st) is Dispatch else []
        if len(uniform) != 1:
            raise ValueError(f"sizes_writer: step {st!r} was not recorded with runtime sizes")
        uniforms.append(uniform[0])
        moved.append(st._replace(grid=tuple(grid)))
    return moved, SizesWriter(be, uniforms)


@kernel("join_sizes_writers")
def join_sizes_writers(be: WgpuBackend, steps: list[list], writers: list[SizesWriter],
                       ranges: list[list[tuple[int, int]]]) -> tuple[list[list], Callable[[np.ndarray], None]]:
    """base.join_sizes_writers: the steps bound to one Arena of sizes, and the Arena's write."""
    arena = Arena(be, steps, writers, ranges)
    return arena.steps, arena
