"""wgpu backend: storage buffers behind handles, kernels from kernels/*.wgsl, one submit per execute().

The device side lives here: memory, the pipeline cache, dispatch recording, encoding and replay, readback and
profiling. The kernels live in their own modules, which register their record functions in program.KERNELS;
the ComputeBackend methods at the bottom look them up there (this module imports no kernel module).

Kernels are specialised by baking shapes into the WGSL text (a plan per input-shape signature); pipelines are
cached by that text, so replaying the same shapes creates no new pipelines (`pipelines_created` counts them).
"""

from __future__ import annotations

import contextlib
import functools
import re
import string
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from importlib import resources
from typing import Any

import numpy as np
import wgpu

from ... import settings
from ...core.expr import Expr
from ...core.view import View
from ..base import ComputeBackend, OutOfMemoryError
from . import device as dev
from . import encode, program, readback, timing
from .program import BUFFER_ALIGN, KERNELS, NUMPY_STORAGE, WORKGROUPS_PER_DIM, Copy, Dispatch, Replay, storage_type
from .runtime import Runtime, resolve, runtime

# WGSL that uses f16 and so needs `enable f16;` (WgpuBackend.pipeline adds it).
USES_F16 = re.compile(r"\bf16\b|vec[234]h\b")
# WGSL that uses subgroup operations: Dawn wants `enable subgroups;` for them (naga does not).
USES_SUBGROUPS = re.compile(r"\bsubgroup[A-Z_]\w*|\bsubgroup_(size|invocation_id|id)\b")


def _give_back(total: list[int], size: int) -> None:
    total[0] -= size


class WgpuBackend(ComputeBackend):
    name, conv_residual, max_elements = "wgpu", True, 2**31 - 1  # i32 index math in the kernels
    asynchronous = True  # a run returns once submitted

    def __init__(self, adapter: int | str | None = None, power_preference: str | None = None,
                 safe: bool = False, webgpu: str | None = None) -> None:
        # safe: checked shader modules whatever EMBER_CHECKED_SHADERS says; webgpu: the runtime (runtime.resolve)
        super().__init__()
        self.rt: Runtime = runtime(resolve(webgpu))
        self._adapter_opt, self._safe = adapter, safe
        self._power = power_preference
        self._bufs: dict[int, Any] = {}
        self._spare = encode.SpareBuffers()  # freed buffers kept for alloc(overwritten=True)
        self._holding = False  # inside held_submits()
        self._read_pool: dict[int, list] = {}  # download_later's staging buffers by size, ready for another read
        self._pending = encode.Pending()  # small public-op replays waiting for one submit (flush() first)
        self._recycled: set[int] = set()  # live handles whose buffers go back to _spare when freed
        # Least recently used first; bounded by settings.PIPELINE_CACHE. Shaders are specialised per shape, so a model
        # fed many shapes would otherwise keep every compiled pipeline for the life of the process. A plan's steps
        # hold the pipelines they dispatch, so dropping one from the cache never breaks a recorded plan.
        self._pipelines: OrderedDict[tuple, Any] = OrderedDict()
        self._templates: dict[str, string.Template] = {}
        self.pipelines_created = 0
        self.pipelines_evicted = 0
        self.dispatches = 0
        self._scratch: dict[str, weakref.ref] = {}
        self._private_bytes = [0]  # bytes of the live private scratch buffers (each gives its size back when freed)

    # ---- life cycle -------------------------------------------------------------------------------
    def _init_device(self) -> None:
        self.adapter = dev.select_adapter(self._adapter_opt, self._power, self.rt)
        self.checked = self._safe or dev.checked_shaders_forced()
        self.device = dev.create_device(self.adapter, self.rt, trusted=not self.checked)
        self.queue = self.device.queue
        self.limits = dict(self.device.limits)
        self.features = set(self.device.features)
        # The subgroup-matrix shapes kernels may use (matmul_sgmat.py); none on wgpu-native.
        cfgs = self.rt.matrix_configs(self.adapter)
        self.matrix_configs = cfgs if "chromium-experimental-subgroup-matrix" in self.features else ()
        self.max_binding = int(self.limits["max-storage-buffer-binding-size"])
        self.max_buffer = int(self.limits["max-buffer-size"])
        self._sync_buf = self.device.create_buffer(size=16, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        self._sync_staging = self.device.create_buffer(size=16, usage=wgpu.BufferUsage.MAP_READ
                                                       | wgpu.BufferUsage.COPY_DST)
        self._sync_lock = threading.Lock()  # synchronize's staging buffer is mapped by one waiter at a time

    def device_lost(self, error: BaseException) -> bool:
        # wgpu-native says so in the validation error of the first call after the loss ("Parent device is lost").
        text = str(error).lower()
        if self.lost is None and ("device is lost" in text or "device lost" in text):
            self.lost = next((line.strip() for line in str(error).splitlines()[::-1] if "lost" in line.lower()),
                             "device lost")
        return self.lost is not None

    @property
    def adapter_name(self) -> str:
        return dev._describe(self.adapter)

    # Dispatch labels of the kernel arms plans count (select_counters): the label is the counter's name.
    ARM_COUNTERS = frozenset({"matmul.subgroup_matrix", "matmul.subgroup_matrix_emulated", "conv.subgroup_matrix",
                              "conv.subgroup_matrix_emulated"})

    def select_counters(self, steps: list) -> dict[str, int]:
        found: dict[str, int] = {}
        for st in steps:
            if type(st) is Dispatch and st.label in self.ARM_COUNTERS:
                found[st.label] = found.get(st.label, 0) + 1
        return found

    def runtime_info(self) -> dict[str, Any]:
        mode = settings.MATRIX.get()
        if mode == "emulate":
            arm = "emulated (EMBER_MATRIX=emulate)"
        elif mode == "off":
            arm = "off (EMBER_MATRIX=off)"
        elif self.matrix_configs:
            arm = "subgroup_matrix" + (" (large products)" if mode == "auto" else "")
        elif self.rt.name == "dawn":
            arm = "none: the adapter offers no subgroup-matrix configs"
        else:
            arm = "none: wgpu-native has no matrix units (webgpu='dawn' does, where the adapter offers them)"
        configs = [f"{c.component}->{c.result} {c.m}x{c.n}x{c.k}" for c in self.matrix_configs]
        return {"backend": self.name, "webgpu": self.rt.name, "version": self.rt.version(),
                "adapter": self.adapter_name, "matrix_configs": configs, "matrix": arm}

    def _api_context(self, tuned: bool) -> tuple:
        # What the public ops' recording reads besides their arguments: wrapper encoding (prepare's form), and for
        # gemm / conv / attention whether tiles are tuned (autotune.py's rule: a thread's autotune_scope, else
        # EMBER_AUTOTUNE, else on for hardware adapters) and the direct-conv switch.
        py_encode = (settings.WGPU_PY_ENCODE.get(), settings.MATRIX.get())  # MATRIX: which kernel a product takes
        if not tuned:
            return (py_encode,)
        tuner = getattr(self, "_autotuner", None)  # autotune.py's state for this backend, made on first use
        tune = tuner.enabled() if tuner is not None else settings.AUTOTUNE.get()
        if tune is None:
            tune = self.adapter.info["adapter_type"] != "CPU"
        return (py_encode, tune, settings.DIRECT_CONV.get())

    def autotune_scope(self, enabled: bool | None) -> Any:
        """A context manager: GEMM/conv tile autotune on/off (None: EMBER_AUTOTUNE, else on for hardware adapters)
        for what this thread records inside it; yields a dict counting what tuning did there. See autotune.py."""
        return KERNELS["autotune_scope"](self, enabled)

    # ---- memory -----------------------------------------------------------------------------------
    def _device_alloc(self, handle: int, nbytes: int) -> None:
        size = -(-nbytes // BUFFER_ALIGN) * BUFFER_ALIGN
        if size > self.max_buffer:
            raise OutOfMemoryError(f"wgpu: {nbytes} bytes exceed the adapter's max buffer size {self.max_buffer}")
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        try:
            buf = self.device.create_buffer(size=size, usage=usage)
        except self.rt.mod.GPUOutOfMemoryError:
            self._spare.release()  # the kept buffers may be what is missing
            try:
                buf = self.device.create_buffer(size=size, usage=usage)
            except self.rt.mod.GPUOutOfMemoryError as e:
                raise OutOfMemoryError(f"wgpu: out of device memory allocating {nbytes} bytes: {e}") from e
        self._bufs[handle] = buf

    def flush(self) -> None:
        """Submit the public-op replays waiting in _pending: before anything else touches the queue or a buffer."""
        if self._pending.cbs:
            self._pending.flush(self.queue)

    def _device_free(self, handle: int) -> None:
        self.flush()
        buf = self._bufs.pop(handle)
        if handle in self._recycled:  # an output copy's buffer: kept for the next run's
            self._recycled.discard(handle)
            return self._spare.keep(buf)
        buf.destroy()

    def _device_alloc_recycled(self, handle: int, nbytes: int) -> None:
        size = -(-nbytes // BUFFER_ALIGN) * BUFFER_ALIGN
        buf = self._spare.take(size)
        if buf is None:
            self._device_alloc(handle, self._spare.size(size))
        else:
            self._bufs[handle] = buf
        self._recycled.add(handle)

    def _device_write(self, handle: int, offset: int, data: memoryview) -> None:
        self.flush()
        n = data.nbytes
        if n % 4:
            # write_buffer sizes must be multiples of 4: merge the last partial word with what is there.
            whole = n - n % 4
            if whole:
                self.queue.write_buffer(self._bufs[handle], offset, data[:whole])
            word = bytearray(self._device_read(handle, offset + whole, 4))
            word[: n % 4] = data[whole:]
            data, offset = memoryview(bytes(word)), offset + whole
        if data.nbytes:
            self.queue.write_buffer(self._bufs[handle], offset, data)

    def _device_read(self, handle: int, offset: int, nbytes: int) -> memoryview:
        self.flush()
        size = -(-nbytes // 4) * 4
        if settings.WGPU_PY_ENCODE.get() or not size:
            return memoryview(self.queue.read_buffer(self._bufs[handle], offset, size)).cast("B")[:nbytes]
        staging = self.device.create_buffer(size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        try:
            return memoryview(self._read_via(self._bufs[handle], offset, size, staging))[:nbytes]
        finally:
            staging.destroy()

    def _device_synchronize(self) -> None:
        self.flush()
        # queue.on_submitted_work_done_async is broken in wgpu-py 0.32 (callback signature mismatch);
        # mapping a buffer for reading completes only after all submitted work, so read 4 bytes.
        if settings.WGPU_PY_ENCODE.get():
            self.queue.read_buffer(self._sync_buf, 0, 4)
            return
        with self._sync_lock:
            self._read_via(self._sync_buf, 0, 4, self._sync_staging)

    def _read_via(self, src: Any, offset: int, size: int, staging: Any) -> bytes:
        """`size` bytes of GPUBuffer `src` from `offset`, after all submitted work, through the MAP_READ buffer
        `staging`: queue.read_buffer's one copy, submit and map, in raw calls and waited for on this thread (wgpu-py's
        map waits through its poll thread: a hand-off per call)."""
        self._submit_copies([Copy(src, offset, staging, 0, size)])
        return self._map_read(staging, size)

    def _submit_copies(self, copies: list) -> None:
        self._submit([encode.encode_copies(self.device, copies)])

    def _submit(self, cbs: list) -> None:
        """Submit raw command buffers and release them, or hold them for the end of held_submits()."""
        if self._holding:
            self._pending.cbs += cbs
            return
        rt = self.rt
        try:
            self._pending.submitted(encode.submit(rt.libf, self.queue, rt.ffi.new("WGPUCommandBuffer[]", cbs)))
        finally:
            for cb in cbs:
                rt.lib.wgpuCommandBufferRelease(cb)

    @contextlib.contextmanager
    def held_submits(self) -> Iterator[None]:
        """base.held_submits: the plans' runs and readback copies inside go to the queue in one submit at the end
        (a submit costs more than the command buffers it carries: most of all on Dawn). Anything else reaching
        the queue inside (a write, a read, a free) submits what is held first, so the queue order stays."""
        if self._holding:
            yield
            return
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
            self.flush()

    def after_submit(self, fn: Callable[[], None]) -> None:
        """Call fn once what is held (held_submits, the public ops' pending replays) has been submitted: now when
        nothing is."""
        if self._pending.cbs:
            self._pending.after.append(fn)
        else:
            fn()

    def buffer(self, handle: int) -> Any:
        return self._bufs[handle]

    def scratch(self, role: str, nbytes: int) -> Any:
        """A storage buffer of at least `nbytes` for a kernel sequence's transient data (split-K partial sums,
        Winograd's transformed tiles). The sequence's own while the private scratch alive stays within
        SCRATCH_PRIVATE_BYTES (sharing costs a few % of GPU time, see there); past it, shared by every sequence
        recorded for `role`: each writes it before reading it within one command buffer, and the queue runs
        command buffers one at a time, so sequences never see each other's data: a model's many Winograd convs,
        each with a V and an M of its own, then share one buffer per role (BENCHMARKS.md, "scratch"). The
        recorded steps hold the buffer (Dispatch.keep); when none does, it is freed (weak references here)."""
        size = -(-max(nbytes, 16) // BUFFER_ALIGN) * BUFFER_ALIGN
        budget = int(settings.SCRATCH_PRIVATE_MB.get() * (1 << 20))
        private = not settings.SHARED_SCRATCH.get() or self._private_bytes[0] + size <= budget
        if private:
            buf = self.device.create_buffer(size=size, usage=wgpu.BufferUsage.STORAGE, label=f"scratch: {role}")
            self._private_bytes[0] += size
            weakref.finalize(buf, _give_back, self._private_bytes, size)  # a running sum: no walk per request
            return buf
        ref = self._scratch.get(role)
        buf = ref() if ref is not None else None
        if buf is None or buf.size < nbytes:
            # A bigger request gets a new buffer; steps recorded earlier keep the smaller one alive.
            buf = self.device.create_buffer(size=size, usage=wgpu.BufferUsage.STORAGE,
                                            label=f"scratch (shared): {role}")
            self._scratch[role] = weakref.ref(buf)
        return buf

    def upload(self, handle: int, array: np.ndarray) -> None:
        """Write a logical-dtype array, converting to the device's storage type."""
        self._device_write(handle, 0, memoryview(np.ascontiguousarray(program.to_storage(array))).cast("B"))

    def download(self, view: View) -> np.ndarray:
        st = NUMPY_STORAGE[storage_type(view.dtype)]
        n = view.size
        if not view.is_contiguous():
            raise ValueError("download: the view must be contiguous")
        if n == 0:
            return np.empty(view.shape, view.dtype)
        raw = np.frombuffer(self._device_read(view.handle, view.offset * st.itemsize, n * st.itemsize), st)
        return program.from_storage(raw, view.dtype).reshape(view.shape)

    def record_readback(self, view: View) -> tuple[list, Any]:
        return readback.record_readback(self, view)

    def download_later(self, view: View) -> Any:
        """base.download_later: the copy into a staging buffer submitted now, mapped by read()."""
        aligned = view.offset * NUMPY_STORAGE[storage_type(view.dtype)].itemsize % 4 == 0
        if settings.WGPU_PY_ENCODE.get() or not view.size or not aligned or not view.is_contiguous():
            return super().download_later(view)
        if not self._holding:
            self.flush()
        return readback.download_later(self, view)

    def storage_itemsize(self, dtype: Any) -> int:
        return NUMPY_STORAGE[storage_type(dtype)].itemsize

    # ---- kernels ----------------------------------------------------------------------------------
    def kernel_source(self, name: str, **spec: Any) -> str:
        """kernels/<name>.wgsl with ${NAME} placeholders filled from spec."""
        tpl = self._templates.get(name)
        if tpl is None:
            text = resources.files(__package__).joinpath("kernels", f"{name}.wgsl").read_text()
            tpl = self._templates[name] = string.Template(text)
        return tpl.substitute({k: str(v) for k, v in spec.items()})

    def pipeline(self, label: str, source: str, *, trusted: bool = True) -> Any:
        """A compute pipeline for WGSL `source` (entry point `main`), built once and cached."""
        trusted = trusted and not self.checked
        key = (source, trusted)  # looked up before the f16 scan below, which costs more than the lookup
        with self._memory_lock:  # plans of several threads share the cache
            p = self._pipelines.get(key)
            if p is not None:
                self._pipelines.move_to_end(key)
                return p
        if USES_F16.search(source) and not source.lstrip().startswith("enable f16;"):
            if "shader-f16" not in self.features:
                raise NotImplementedError(f"wgpu: kernel {label!r} stores float16, but this adapter "
                                          f"({self.adapter_name}) lacks the shader-f16 feature")
            source = "enable f16;\n" + source
        if self.rt.name == "dawn" and "enable subgroups;" not in source and USES_SUBGROUPS.search(source):
            source = "enable subgroups;\n" + source
        module = self.rt.create_shader_module(self.device, source, label, trusted)
        p = self.device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"},
                                                label=label)
        with self._memory_lock:
            self._pipelines[key] = p
            self.pipelines_created += 1
            bound = settings.PIPELINE_CACHE.get()
            while len(self._pipelines) > bound:
                self._pipelines.popitem(last=False)
                self.pipelines_evicted += 1
        return p

    def dispatch(self, pipeline: Any, buffers: list[Any] | dict[int, Any], grid: tuple[int, int, int],
                 label: str = "") -> Dispatch:
        """A recorded dispatch; `buffers` (handles or GPUBuffers) are bound at 0, 1, 2, ... of group 0,
        or at the binding numbers a dict gives. An entry (handle or GPUBuffer, byte offset, byte size) binds
        that sub-range only (offset a multiple of min-storage-buffer-offset-alignment, size of 4)."""
        entries, keep = [], []
        items = buffers.items() if isinstance(buffers, dict) else enumerate(buffers)
        for i, b in items:
            b, offset, size = b if isinstance(b, tuple) else (b, 0, None)
            buf = self._bufs[b] if isinstance(b, int) else b
            if not isinstance(b, int):
                keep.append(buf)
            size = buf.size - offset if size is None else size
            if size > self.max_binding:
                raise NotImplementedError(
                    f"wgpu: kernel {label!r} binds {size} bytes of a buffer, above this adapter's "
                    f"max-storage-buffer-binding-size {self.max_binding}")
            entries.append({"binding": i, "resource": {"buffer": buf, "offset": offset, "size": size}})
        group = self.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
        if max(grid) > WORKGROUPS_PER_DIM:
            raise AssertionError(f"kernel {label!r}: grid {grid} exceeds 65,535 workgroups per dimension")
        return Dispatch(pipeline, group, grid, label, tuple(keep), tuple(entries))

    def record_copy(self, src: int, dst: int, nbytes: int) -> list:
        size = -(-nbytes // 4) * 4  # copy sizes must be multiples of 4; buffers are padded to 16
        return [Copy(self._bufs[src], 0, self._bufs[dst], 0, size)]

    def profile(self, steps: list, method: str | None = None) -> list[float]:
        """Per-step GPU time in ms from timestamp queries: method "marginal" (default on hardware GPUs) or "isolated"
        (default on software adapters); timing.py says how each works."""
        return timing.profile(self, steps, method)

    def gpu_time(self, steps: list, reps: int = 5) -> float:
        """GPU milliseconds of one run of `steps` in the stream, the minimum of at least `reps` (timing.py)."""
        return timing.gpu_time(self, steps, reps)

    def execute(self, steps: list) -> None:
        if not steps:
            return
        self.flush()
        encoder = self.device.create_command_encoder()
        self.encode(encoder, steps)
        self.queue.submit([encoder.finish()])

    def encode(self, encoder: Any, steps: list) -> None:
        """Encode steps into a wgpu-py command encoder (encode.encode_steps)."""
        encode.encode_steps(encoder, steps, not settings.WGPU_PY_ENCODE.get())
        self.dispatches += len(steps)

    def prepare(self, steps: list) -> Replay | list:
        """Resolve steps to raw handles for execute_prepared (the steps themselves with EMBER_WGPU_PY_ENCODE)."""
        if settings.WGPU_PY_ENCODE.get():
            return steps
        segments: list = []
        cur: list | None = None
        pipeline = group = None
        for st in steps:
            if type(st) is Dispatch:
                if cur is None:  # a new pass starts with nothing bound
                    cur, pipeline, group = [], None, None
                    segments.append(cur)
                # Redundant sets cost a cffi call and a recorded command each: skip them. A new pipeline
                # always gets its bind group set again (an "auto" layout belongs to one pipeline).
                same = st.pipeline is pipeline
                cur.append((None if same else st.pipeline._internal,
                            None if same and st.bind_group is group else st.bind_group._internal, *st.grid))
                pipeline, group = st.pipeline, st.bind_group
            else:
                cur = None
                segments.append((st.src._internal, st.src_offset, st.dst._internal, st.dst_offset, st.size))
        return Replay(list(steps), segments, [])

    def execute_prepared(self, prepared: Replay | list, before: list | tuple = (),
                         after: list | tuple = ()) -> None:
        """One submit: execute() without wgpu-py's wrappers. The buffer was encoded right after the previous run's
        submit, while the GPU ran it, so a stream of runs pays no encoding on the critical path (command buffers
        are single-use; one encoded early is valid if submitted after this run's input writes)."""
        if type(prepared) is not Replay:
            self.execute([*before, *prepared, *after])
            return
        if not self._holding:
            self.flush()
        extra = before or after
        if extra and not all(type(st) is Copy for st in (*before, *after)):
            self.execute([*before, *prepared.steps, *after])
            return
        if self._holding and extra:
            # Held (a decode step): encoding overlaps the device's work anyway: one command buffer, none ahead.
            while prepared.ahead:
                self.rt.lib.wgpuCommandBufferRelease(prepared.ahead.pop())
            self._submit([encode.encode_replay(self.device, prepared, before=before, after=after)])
            self.dispatches += len(prepared.steps)
            return
        cb = prepared.ahead.pop() if prepared.ahead else self.encode_prepared(prepared)
        # This run's copies (device-array feeds in, outputs out) get command buffers of their own, submitted with
        # the prepared one: the model's steps keep their encoded-once form.
        cbs = [encode.encode_copies(self.device, before), cb] if before else [cb]
        if after:
            cbs.append(encode.encode_copies(self.device, after))
        self._submit(cbs)
        self.dispatches += len(prepared.steps)
        if settings.ENCODE_AHEAD.get():
            prepared.ahead.append(self.encode_prepared(prepared))

    def replay_prepared(self, prepared: Replay | list) -> None:
        """execute_prepared for a form that ran through it once without an error (the public ops' cache hits): the
        submit and the next command buffer's encoding without wgpu-py's error capture (encode.replay_checked_before
        says why that is sound)."""
        if type(prepared) is not Replay:
            return self.execute(prepared)
        encode.replay_checked_before(self.device, self.queue, prepared, self._pending)
        self.dispatches += len(prepared.steps)
        if settings.ENCODE_AHEAD.get():
            prepared.ahead.append(encode.encode_replay(self.device, prepared, checked=False))

    def release_prepared(self, prepared: Replay | list) -> None:
        """Drop a Replay's command buffer encoded ahead (before its buffers are freed)."""
        if type(prepared) is Replay:
            lib = self.rt.lib
            while prepared.ahead:
                lib.wgpuCommandBufferRelease(prepared.ahead.pop())

    def encode_prepared(self, replay: Replay) -> Any:
        """Encode a Replay into a new raw command buffer (the caller submits and releases it): encode.py."""
        return encode.encode_replay(self.device, replay)

    def input_writer(self, handle: int, dtype: Any) -> Any:
        """upload() for a plan input: an array already in the storage dtype, C-contiguous and a whole number of
        words goes straight to wgpuQueueWriteBuffer (cheaper per input than queue.write_buffer's wrapper);
        anything else takes upload(). (A persistent mapped staging buffer per input was tried and was no faster,
        see BENCHMARKS.md.)"""
        upload = self.upload
        if settings.WGPU_PY_ENCODE.get() or NUMPY_STORAGE[storage_type(dtype)] != np.dtype(dtype):
            return functools.partial(upload, handle)
        ffi = self.rt.ffi
        write, queue, target, dtype = self.rt.libf.wgpuQueueWriteBuffer, self.queue._internal, self._bufs[handle], \
            np.dtype(dtype)

        def write_input(array: np.ndarray) -> None:
            if self._pending.cbs:  # queue order: what the public ops left waiting goes first
                self.flush()
            n = array.nbytes
            if array.dtype == dtype and array.flags.c_contiguous and n % 4 == 0 and n:
                write(queue, target._internal, 0, ffi.from_buffer(array), n)
            else:
                upload(handle, array)

        return write_input

    def _map_read(self, staging: Any, size: int) -> bytes:
        return readback.map_read(self, staging, size)

    # ---- primitives: the ComputeBackend methods, each forwarded to the kernel registered under its name -------
    RUNTIME_SIZES = frozenset({"record_elementwise", "record_gather", "record_attention_views", "record_matmul",
                               "record_norm"})  # sizes in a uniform buffer, not in the kernel's source

    def record_elementwise(self, expr: Expr, inputs: list[View], out: View, runtime_sizes: bool = False) -> list:
        return KERNELS["record_elementwise"](self, expr, inputs, out, runtime_sizes)

    def probe_sizes(self, method: str, args: tuple, kwargs: dict) -> tuple | None:
        return KERNELS["probe_sizes"](self, method, args, kwargs)

    def sizes_writer(self, steps: list, grids: list[tuple[int, int, int]]) -> tuple[list, Any]:
        return KERNELS["sizes_writer"](self, steps, grids)

    def join_sizes_writers(self, steps: list[list], writers: list, ranges: list[list[tuple[int, int]]]) -> tuple:
        return KERNELS["join_sizes_writers"](self, steps, writers, ranges)

    def uniform_buffer(self, data: bytes) -> Any:
        """A small uniform buffer holding `data`, a dispatch's own (program.sizes_buffer); resize.py may re-bind it."""
        usage = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
        return self.device.create_buffer_with_data(data=data, usage=usage)

    matmul_residual = True

    def select_index_kernels(self) -> bool:
        return True

    def select_concat_kernel(self, parts: int, dtype: Any, skewed: bool) -> bool:
        return KERNELS["select_concat_kernel"](parts, dtype, skewed)

    def record_matmul(self, a: View, b: View, out: View, *, alpha: float = 1.0, bias: View | None = None,
                      beta: float = 1.0, act: Expr | None = None, residual: View | None = None,
                      runtime_sizes: bool = False) -> list:
        return KERNELS["record_matmul"](self, a, b, out, alpha=alpha, bias=bias, beta=beta, act=act,
                                        residual=residual, runtime_sizes=runtime_sizes)

    def record_conv(self, x: View, w: View, bias: View | None, out: View, stride: tuple[int, int],
                    pads: tuple[int, int, int, int], dilation: tuple[int, int], groups: int,
                    act: Expr | None = None, residual: View | None = None, const_weight: bool = False) -> list:
        return KERNELS["record_conv"](self, x, w, bias, out, stride, pads, dilation, groups, act, residual)

    # Winograd F(2, 3) and F(4, 3) for 3x3 stride-1 convs (winograd.py: kernels, scratch; winograd_cost.py: costs).
    winograd_tiles = (2, 4)

    def winograd_tile(self, n: int, c: int, k: int, p: int, q: int, dtype: Any) -> int | None:
        return KERNELS["winograd_tile"](self, n, c, k, p, q, dtype)

    def record_conv_winograd(self, x: View, u: View, bias: View | None, out: View, pads: tuple[int, int, int, int],
                             m: int, act: Expr | None = None, residual: View | None = None) -> list:
        return KERNELS["record_conv_winograd"](self, x, u, bias, out, pads, m, act, residual)

    def record_reduce_axes(self, op: str, x: View, out: View, n_reduce: int) -> list:
        return KERNELS["record_reduce_axes"](self, op, x, out, n_reduce)

    def record_pool(self, kind: str, x: View, out: View, kernel: tuple[int, int], stride: tuple[int, int],
                    pads: tuple[int, int, int, int], dilation: tuple[int, int], count_include_pad: bool,
                    p: int = 2) -> list:
        return KERNELS["record_pool"](self, kind, x, out, kernel, stride, pads, dilation, count_include_pad, p)

    def record_gather(self, data: View, indices: View, axis: int, out: View, runtime_sizes: bool = False) -> list:
        return KERNELS["record_gather"](self, data, indices, axis, out, runtime_sizes)

    def record_attention_views(self, q: View, k: View, v: View, mask: View | None, out: View, scale: float,
                               causal: bool, runtime_sizes: bool = False) -> list:
        return KERNELS["record_attention_views"](self, q, k, v, mask, out, scale, causal, runtime_sizes)

    def record_norm(self, kind: str, x: View, scale: View | None, bias: View | None, out: View, n: int,
                    eps: float, runtime_sizes: bool = False) -> list:
        return KERNELS["record_norm"](self, kind, x, scale, bias, out, n, eps, runtime_sizes)

    def record_softmax(self, x: View, out: View, n: int, log: bool) -> list:
        return KERNELS["record_softmax"](self, x, out, n, log)

    # ---- loop primitives (loops.py) ------------------------------------------------------------------------
    def record_scan(self, op: str, x: View, out: View, axis: int, exclusive: bool, reverse: bool) -> list:
        return KERNELS["record_scan"](self, op, x, out, axis, exclusive, reverse)

    def record_topk(self, x: View, values: View, indices: View, axis: int, k: int, largest: bool) -> list:
        return KERNELS["record_topk"](self, x, values, indices, axis, k, largest)

    def record_scatter(self, out: View, offsets: View, updates: View, reduction: str) -> list:
        return KERNELS["record_scatter"](self, out, offsets, updates, reduction)

    def record_dft(self, x: View, out: View, length: int, inverse: bool, onesided: bool) -> list:
        return KERNELS["record_dft"](self, x, out, length, inverse, onesided)

    def record_matmul_nbits(self, a: View, packed: View, scales: View, zeros: View | None, out: View,
                            **kw: Any) -> list:
        return KERNELS["record_matmul_nbits"](self, a, packed, scales, zeros, out, **kw)
