"""The replay's hot path: prepared steps into raw command buffers through the bare C functions, and
the freed buffers a resident run's output copies reuse.

A plan's steps are resolved once to native handles (`Replay`, program.py); each run encodes them here with no
wgpu-py wrapper objects or descriptors, and a run's own copies (device-array feeds in, outputs out) get a command
buffer of their own submitted with it. The caller submits and releases what these return. Validation errors of
the recorded commands surface at pass end / finish, which go through wgpu-py's error-raising wrappers (`libf`),
except in `replay_checked_before` (a public op's replay, whose steps executed through them once): see there.
"""

from __future__ import annotations

import bisect
import sys
import threading
from typing import Any

from .program import Copy, Dispatch, Replay

_APIS: dict[type, Any] = {}


def _api(obj: Any) -> Any:
    """The cffi bindings (ffi, lib, libf) of the runtime that made `obj` (a device, queue or command encoder): its
    class is defined in the runtime's `_api` module (wgpu-py 0.32's wgpu_native._api, or wgpudawn's dawn._api: the
    same webgpu.h names), so either runtime's objects encode here without being told which."""
    api = _APIS.get(type(obj))
    if api is None:
        api = _APIS[type(obj)] = sys.modules[type(obj).__module__]
    return api


def encode_steps(encoder: Any, steps: list, raw: bool) -> None:
    """Encode recorded steps into a wgpu-py command encoder: consecutive dispatches share one compute pass; copies
    go between passes.

    `raw`: dispatches go straight to wgpu-native's C functions: wgpu-py's wrappers build cffi arrays and check
    arguments on every call (a cost per dispatch from Python, BENCHMARKS.md), and recorded steps were validated
    once, when they were built. EMBER_WGPU_PY_ENCODE=1 takes the wrapper path instead (raw=False).
    """
    lib = _api(encoder).lib if raw else None
    null = _api(encoder).ffi.NULL
    cpass = None
    praw = None
    current = None
    for st in steps:
        if type(st) is Dispatch:
            if cpass is None:
                cpass = encoder.begin_compute_pass()
                praw = cpass._internal
                current = None
            if lib is not None:
                if st.pipeline is not current:
                    lib.wgpuComputePassEncoderSetPipeline(praw, st.pipeline._internal)
                    current = st.pipeline
                lib.wgpuComputePassEncoderSetBindGroup(praw, 0, st.bind_group._internal, 0, null)
                lib.wgpuComputePassEncoderDispatchWorkgroups(praw, *st.grid)
                continue
            if st.pipeline is not current:
                cpass.set_pipeline(st.pipeline)
                current = st.pipeline
            cpass.set_bind_group(0, st.bind_group)
            cpass.dispatch_workgroups(*st.grid)
        else:
            if cpass is not None:
                cpass.end()
                cpass = None
            encoder.copy_buffer_to_buffer(st.src, st.src_offset, st.dst, st.dst_offset, st.size)
    if cpass is not None:
        cpass.end()


def encode_replay(device: Any, replay: Replay, checked: bool = True, before: list | tuple = (),
                  after: list | tuple = ()) -> Any:
    """`replay` in a new raw command buffer, between the copies `before` and `after`; `checked`: pass end and
    finish through wgpu-py's wrappers, which raise the validation errors the runtime reports there (else they are
    only logged: replay_checked_before)."""
    api = _api(device)
    lib, null = api.lib, api.ffi.NULL
    libf = api.libf if checked else lib
    set_pipeline, set_group, dispatch = (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                                         lib.wgpuComputePassEncoderDispatchWorkgroups)
    encoder = lib.wgpuDeviceCreateCommandEncoder(device._internal, null)
    try:
        _copies(lib, encoder, before)
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
        _copies(lib, encoder, after)
        return libf.wgpuCommandEncoderFinish(encoder, null)
    finally:
        lib.wgpuCommandEncoderRelease(encoder)


def _copies(lib: Any, encoder: Any, copies: list | tuple) -> None:
    for st in copies:
        lib.wgpuCommandEncoderCopyBufferToBuffer(encoder, st.src._internal, st.src_offset, st.dst._internal,
                                                 st.dst_offset, st.size)


def replay_checked_before(device: Any, queue: Any, replay: Replay, pending: Pending) -> None:
    """Submit `replay` as WgpuBackend.execute_prepared does, its submit a bare wgpu-native call: for a Replay that
    already ran once through execute_prepared without an error (the public ops' cache hits, api_cache.py), whose
    next command buffer the caller then encodes ahead with encode_replay(checked=False). wgpu-py's `libf` wrappers
    capture errors around each call (~1 µs a call; three a run: pass end, finish, submit), which is what turns a
    wgpu-native validation error into a Python exception; without them an error is only logged (by wgpu-py).

    Why a replay may skip them: what pass end and finish validate is the commands and the static properties of
    what they name (pipelines, bind groups and their layouts, buffer sizes and usages, copy ranges), and a replay
    encodes the same commands over the same objects every time, so the checked first run validated them for all.
    What submit checks beyond that is the state of the buffers: alive (the cache keeps an entry only while every
    handle it binds is live, and free() drops entries before destroying a buffer) and unmapped (the public ops
    bind only alloc()'s storage buffers, never mapped). What is left is the device being lost meanwhile: the
    command buffer encoded now (none was encoded ahead: EMBER_ENCODE_AHEAD=0) goes through the checked calls, so
    a lost device raises at finish as before; one encoded ahead unchecked goes to a submit that wgpu-native 0.32
    aborts the process on after a loss, checked or not (as execute_prepared's does). Every later checked call
    (synchronize, copy_dtoh, copy_htod, a call signature not cached) raises on a lost device too.
    Plans (ember.plan) keep execute_prepared's checked calls on every run. A small replay's command buffer
    waits in `pending` for the next flush (Pending); a bigger one is submitted after what waits there.
    """
    lib = _api(device).lib
    cb = replay.ahead.pop() if replay.ahead else encode_replay(device, replay)
    if Pending.small(replay):
        pending.add(queue, cb)
        return
    pending.flush(queue)
    try:
        lib.wgpuQueueSubmit(queue._internal, 1, [cb])  # cffi passes the list as a temporary C array
    finally:
        lib.wgpuCommandBufferRelease(cb)


class Pending:
    """Command buffers of small public-op replays not submitted yet: up to `limit` go to the queue in one submit
    (a submit costs more than encoding a small call). The backend flushes them before anything else reaches the
    queue or its buffers (a write, a read, a synchronize, a free, a plan's or a first call's submit), so the
    queue runs everything in the order it was asked for; a call with more than SMALL_WORKGROUPS workgroups is
    never held back, so a big kernel starts at once."""

    SMALL_WORKGROUPS = 64

    def __init__(self, limit: int = 8) -> None:
        self.limit = limit
        self.cbs: list[Any] = []
        self.after: list[Any] = []  # called once the held buffers are submitted (WgpuBackend.after_submit)
        self.last: int | None = None  # the queue's last submission index, where the runtime numbers them
        self._lock = threading.Lock()

    @classmethod
    def small(cls, replay: Replay) -> bool:
        total = 0
        for seg in replay.segments:
            if type(seg) is not tuple:
                for d in seg:
                    total += d[2] * d[3] * d[4]
        return total <= cls.SMALL_WORKGROUPS

    def submitted(self, index: int | None) -> None:
        if index is not None:
            self.last = index

    def add(self, queue: Any, cb: Any) -> None:
        with self._lock:
            self.cbs.append(cb)
            if len(self.cbs) >= self.limit:
                self._submit(queue)

    def flush(self, queue: Any) -> None:
        with self._lock:  # held through the submit: a second thread's flush cannot overtake this one's buffers
            self._submit(queue)

    def _submit(self, queue: Any) -> None:
        cbs, self.cbs = self.cbs, []
        if not cbs:
            return
        lib = _api(queue).lib
        try:  # bare, as replay_checked_before's: each of these ran once through the checked calls
            self.submitted(submit(lib, queue, cbs))
        finally:
            for cb in cbs:
                lib.wgpuCommandBufferRelease(cb)
        after, self.after = self.after, []
        for fn in after:
            fn()


def submit(lib: Any, queue: Any, cbs: list) -> int | None:
    """Submit raw command buffers through `lib` (a runtime's bare or checked cffi calls): the submission's index
    where the runtime numbers submissions (wgpu-native: a readback then waits for that one, not for everything
    queued after it), else None."""
    for_index = getattr(lib, "wgpuQueueSubmitForIndex", None)
    if for_index is not None:
        return int(for_index(queue._internal, len(cbs), cbs))
    lib.wgpuQueueSubmit(queue._internal, len(cbs), cbs)
    return None


def encode_copies(device: Any, copies: list[Copy] | tuple[Copy, ...]) -> Any:
    """copyBufferToBuffer commands in a command buffer of their own."""
    api = _api(device)
    lib, null = api.lib, api.ffi.NULL
    encoder = lib.wgpuDeviceCreateCommandEncoder(device._internal, null)
    try:
        _copies(lib, encoder, copies)
        return api.libf.wgpuCommandEncoderFinish(encoder, null)
    finally:
        lib.wgpuCommandEncoderRelease(encoder)


def size_class(nbytes: int) -> int:
    """The size a recycled buffer of `nbytes` is made with: rounded up to 1/8 of its power of two (at most 12.5 %
    more). Idempotent: a class's size is its own class."""
    step = max(1 << max(nbytes.bit_length() - 4, 0), 16)
    return -(-nbytes // step) * step


class SpareBuffers:
    """Freed buffers kept for alloc(overwritten=True): a resident run's output copies (a decode step makes one per KV
    tensor) reuse them, since creating a buffer costs more than the copy into it. Small ones only (an eighth of
    `limit` each), up to `limit` bytes in all, the oldest destroyed first past it; release() destroys them all (an
    allocation that found no room does, before retrying).

    A tensor that grows a little per run (a decode step's KV outputs, one position longer each step) must fit a
    buffer freed a few runs before: take() hands out the smallest kept buffer of at least the size and at most a
    quarter more, and size() makes new ones with an eighth of headroom."""

    def __init__(self, limit: int = 64 << 20) -> None:
        self.limit = limit
        self.bytes = 0
        self._by_size: dict[int, list[Any]] = {}
        self._sizes: list[int] = []  # the keys of _by_size with buffers, sorted
        self._age: dict[int, Any] = {}  # id -> buffer, oldest first

    def size(self, nbytes: int) -> int:
        """The size to create a buffer of `nbytes` with, when take() found none."""
        return size_class(nbytes + nbytes // 8) if nbytes <= self.limit // 8 else nbytes

    def keep(self, buf: Any) -> None:
        size = buf.size
        if size > self.limit // 8:
            buf.destroy()
            return
        while self.bytes + size > self.limit:
            self._drop(next(iter(self._age.values()))).destroy()
        bufs = self._by_size.setdefault(size, [])
        if not bufs:
            bisect.insort(self._sizes, size)
        bufs.append(buf)
        self._age[id(buf)] = buf
        self.bytes += size

    def take(self, nbytes: int) -> Any:
        i = bisect.bisect_left(self._sizes, nbytes)
        if i == len(self._sizes) or self._sizes[i] > nbytes + nbytes // 4:
            return None
        return self._drop(self._by_size[self._sizes[i]][-1])

    def _drop(self, buf: Any) -> Any:
        size = buf.size
        bufs = self._by_size[size]
        bufs.remove(buf)
        if not bufs:
            del self._by_size[size]
            self._sizes.remove(size)
        del self._age[id(buf)]
        self.bytes -= size
        return buf

    def release(self) -> None:
        for buf in self._age.values():
            buf.destroy()
        self._by_size.clear()
        self._sizes.clear()
        self._age.clear()
        self.bytes = 0


