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


class SizesWriter:
    """Writes new int32 values into the uniform buffers of recorded dispatches (wgpuQueueWriteBuffer: ordered after
    the work already submitted, before the next submit). The bare call, not wgpu-py's error-capturing wrapper
    (~1-3 µs each, a decode step writes one per moving dispatch): every write lands inside a live uniform buffer
    of the plan's own, made with its size; what could still fail is a lost device, which the run's checked pass
    end / finish / submit then raise."""

    def __init__(self, be: WgpuBackend, uniforms: list[Any]) -> None:
        self.be = be
        self.uniforms = uniforms
        self.words = [u.size // 4 for u in uniforms]
        self.arena = np.zeros(sum(self.words), np.int32)  # every target's words, the queue copies them at once
        self._set(self.arena)

    def _set(self, arena: np.ndarray) -> None:
        ffi = self.be.rt.ffi
        base = ffi.cast("char *", ffi.from_buffer(arena))
        self._keep = arena
        self.targets, at = [], 0
        for u, n in zip(self.uniforms, self.words, strict=True):
            self.targets.append((u._internal, base + 4 * at, 4 * n, at))
            at += n

    def __call__(self, values: list[np.ndarray]) -> None:
        """One int32 array a dispatch (at most its uniform's words), in the steps' order."""
        for (_, _, _, at), v in zip(self.targets, values, strict=True):
            self.arena[at:at + v.size] = v
        self.flush_writes()

    def flush_writes(self) -> None:
        be = self.be
        be.flush()  # queue order: work held back (held_submits, public ops) goes before the writes
        write, queue = be.rt.lib.wgpuQueueWriteBuffer, be.queue._internal
        for target, pointer, size, _ in self.targets:
            write(queue, target, 0, pointer, size)


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
        # The bare call (SizesWriter says why).
        be.rt.lib.wgpuQueueWriteBuffer(be.queue._internal, self.buffer._internal, 0, self._pointer, self.nbytes)


@kernel("sizes_writer")
def sizes_writer(be: WgpuBackend, steps: list, grids: list[tuple[int, int, int]]) -> tuple[list, SizesWriter]:
    """(the steps with these grids, a SizesWriter for their uniform buffers: one int32 array a dispatch)."""
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
