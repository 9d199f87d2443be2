"""The replay's hot path: prepared steps into raw wgpu-native command buffers through the bare C functions, and
the freed buffers a resident run's output copies reuse.

A plan's steps are resolved once to native handles (`Replay`, program.py); each run encodes them here with no
wgpu-py wrapper objects or descriptors, and a run's own copies (device-array feeds in, outputs out) get a command
buffer of their own submitted with it. The caller submits and releases what these return. Validation errors of
the recorded commands surface at pass end / finish, which go through wgpu-py's error-raising wrappers.
"""

from __future__ import annotations

from typing import Any

from .program import Copy, Replay

_API: Any = None


def _api() -> Any:
    # wgpu-native's cffi bindings, private to wgpu-py 0.32 (pinned for that reason); imported on first use.
    global _API
    if _API is None:
        from wgpu.backends.wgpu_native import _api

        _API = _api
    return _API


def encode_replay(device: Any, replay: Replay) -> Any:
    api = _api()
    lib, libf, null = api.lib, api.libf, api.ffi.NULL
    set_pipeline, set_group, dispatch = (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                                         lib.wgpuComputePassEncoderDispatchWorkgroups)
    encoder = lib.wgpuDeviceCreateCommandEncoder(device._internal, null)
    try:
        for seg in replay.segments:
            if type(seg) is tuple:
                lib.wgpuCommandEncoderCopyBufferToBuffer(encoder, *seg)
                continue
            cpass = lib.wgpuCommandEncoderBeginComputePass(encoder, null)
            try:
                for pipeline, group, x, y, z in seg:
                    if pipeline is not None:
                        set_pipeline(cpass, pipeline)
                    if group is not None:
                        set_group(cpass, 0, group, 0, null)
                    dispatch(cpass, x, y, z)
                libf.wgpuComputePassEncoderEnd(cpass)
            finally:
                lib.wgpuComputePassEncoderRelease(cpass)
        return libf.wgpuCommandEncoderFinish(encoder, null)
    finally:
        lib.wgpuCommandEncoderRelease(encoder)


def encode_copies(device: Any, copies: list[Copy] | tuple[Copy, ...]) -> Any:
    """copyBufferToBuffer commands in a command buffer of their own."""
    api = _api()
    lib, null = api.lib, api.ffi.NULL
    encoder = lib.wgpuDeviceCreateCommandEncoder(device._internal, null)
    try:
        for st in copies:
            lib.wgpuCommandEncoderCopyBufferToBuffer(encoder, st.src._internal, st.src_offset, st.dst._internal,
                                                     st.dst_offset, st.size)
        return api.libf.wgpuCommandEncoderFinish(encoder, null)
    finally:
        lib.wgpuCommandEncoderRelease(encoder)


class SpareBuffers:
    """Freed buffers kept for alloc(overwritten=True): a resident run's output copies (a decode step makes one per KV
    tensor) reuse them, since creating a buffer costs more than the copy into it. Small ones only, up to `limit`
    bytes in all; release() destroys them (an allocation that found no room does, before retrying)."""

    def __init__(self, limit: int = 64 << 20) -> None:
        self.limit = limit
        self.bytes = 0
        self._by_size: dict[int, list[Any]] = {}

    def keep(self, buf: Any) -> None:
        if buf.size <= self.limit // 8 and self.bytes + buf.size <= self.limit:
            self._by_size.setdefault(buf.size, []).append(buf)
            self.bytes += buf.size
        else:
            buf.destroy()

    def take(self, size: int) -> Any:
        bufs = self._by_size.get(size)
        if not bufs:
            return None
        self.bytes -= size
        return bufs.pop()

    def release(self) -> None:
        for bufs in self._by_size.values():
            for buf in bufs:
                buf.destroy()
        self._by_size.clear()
        self.bytes = 0
