"""The WebGPU runtimes under the wgpu backend: wgpu-native (through wgpu-py) and Dawn (through wgpudawn)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import threading
import time
from dataclasses import dataclass
from typing import Any

from ... import settings


@dataclass(frozen=True)
class MatrixConfig:
    """One subgroup-matrix shape an adapter offers: `component` x `component` products accumulated in `result`,
    M x N x K per subgroup (Dawn's chromium-experimental-subgroup-matrix; f16 -> f32 16 x 16 x 16 on NVIDIA)."""

    component: str  # WGSL scalar type of the left/right operands: "f16", "f32", "i8", "u8"
    result: str  # WGSL scalar type of the result: "f16", "f32", "i32", "u32"
    m: int
    n: int
    k: int


# ---- runtimes ----------------------------------------------------------------------------------------------------
RUNTIMES = ("wgpu-native", "dawn")
DAWN_MISSING = ("the Dawn WebGPU runtime is not installed: pip install 'ember[dawn]' (the wgpudawn package), or "
                "choose webgpu='wgpu-native'")


class Runtime:
    """One WebGPU implementation: its Python module (wgpu-py's API), its C entry points (webgpu.h names, cffi `lib`;
    `libf` raises the errors the implementation reports) and what the two implementations do differently."""

    name = ""
    module = ""
    api_module = ""
    features: tuple[str, ...] = ()  # optional device features this runtime asks for where the adapter has them

    def __init__(self) -> None:
        self.mod = importlib.import_module(self.module)
        self.api = importlib.import_module(self.api_module)
        self.ffi, self.lib, self.libf = self.api.ffi, self.api.lib, self.api.libf
        self.null = self.ffi.NULL
        self._adapters: tuple[Any, ...] | None = None
        self._lock = threading.Lock()

        @self.ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
        def map_done(status: int, message: Any, cell: Any, _unused: Any) -> None:
            self.ffi.cast("int *", cell)[0] = status

        self.map_callback = map_done  # kept on the runtime: a cffi callback must outlive every call into it

    # ---- adapters and devices ----
    def _enumerate(self) -> tuple[Any, ...]:
        settings.default_runtime_dir()
        try:
            return tuple(self.mod.gpu.enumerate_adapters_sync())
        except Exception:  # no Vulkan loader, no driver: no adapters
            return ()

    def adapters(self) -> tuple[Any, ...]:
        with self._lock:
            if self._adapters is None:
                self._adapters = self._enumerate()
            return self._adapters

    def fresh(self, adapter: Any) -> Any:
        """An adapter object that can still make a device (Dawn's make one each)."""
        return adapter

    def create_device(self, adapter: Any, features: list[str], limits: dict[str, int], trusted: bool) -> Any:
        return adapter.request_device_sync(required_features=features, required_limits=limits, label="ember")

    def create_shader_module(self, device: Any, code: str, label: str, trusted: bool) -> Any:
        return device.create_shader_module(code=code, label=label)

    def matrix_configs(self, adapter: Any) -> tuple[MatrixConfig, ...]:
        return ()

    # ---- waiting ----
    map_early = True  # download_later asks for its map right after its copy's submit (map_start says why)

    def map_read(self, device: Any, buf: Any, size: int, spin_s: float) -> bytes:
        """The first `size` bytes of MAP_READ buffer `buf`, after all submitted work: mapped and waited for on this
        thread (wgpu-py's map_async waits through its poll thread: a hand-off per call). Spins `spin_s` seconds
        before blocking in the driver."""
        return self.map_finish(device, buf, size, self.map_start(buf, size), spin_s)

    def map_start(self, buf: Any, size: int, queue: Any = None) -> tuple[Any, Any]:
        """Ask for `buf` to be mapped for reading: (its status cell, its future) for map_finish. `queue`: more work
        will be submitted before the wait, which must not wait for it (Dawn: see there)."""
        lib, ffi = self.lib, self.ffi
        cell = ffi.new("int[1]")
        info = ffi.new("WGPUBufferMapCallbackInfo *")
        info.mode = lib.WGPUCallbackMode_AllowProcessEvents
        info.callback = self.map_callback
        info.userdata1 = cell
        return cell, lib.wgpuBufferMapAsync(buf._internal, lib.WGPUMapMode_Read, 0, size, info[0])

    def map_finish(self, device: Any, buf: Any, size: int, started: tuple[Any, Any], spin_s: float,
                   index: int | None = None) -> bytes:
        """map_start's map waited for (spinning `spin_s` seconds before blocking), read and unmapped; `index`: the
        submission that wrote the buffer, where the runtime numbers them (a wait need not outlast it)."""
        lib, ffi = self.lib, self.ffi
        cell, future = started
        deadline = time.perf_counter() + spin_s
        while cell[0] == 0:  # the callback may also run on wgpu-py's poll thread: wait until it has
            self.wait(device, future, time.perf_counter() >= deadline, index)
        if cell[0] != lib.WGPUMapAsyncStatus_Success:
            raise RuntimeError(f"{self.name}: mapping a readback buffer failed (status {cell[0]})")
        raw = buf._internal
        try:
            return ffi.buffer(lib.wgpuBufferGetConstMappedRange(raw, 0, size), size)[:]
        finally:
            lib.wgpuBufferUnmap(raw)

    def wait(self, device: Any, future: Any, block: bool, index: int | None = None) -> None:
        raise NotImplementedError

    def timestamp_period(self, queue: Any) -> float:
        """Nanoseconds per timestamp-query tick."""
        return 1.0

    def version(self) -> str:
        return str(self.mod.__version__)


class WgpuNative(Runtime):
    name, module, api_module = "wgpu-native", "wgpu", "wgpu.backends.wgpu_native._api"
    # wgpu maps a buffer once the submissions using it have run, whenever it is asked; a map asked for while
    # later work is queued makes its next submit wait (lavapipe): ask at the read.
    map_early = False
    features = ("timestamp-query", "timestamp-query-inside-passes", "shader-f16", "subgroup")

    def create_shader_module(self, device: Any, code: str, label: str, trusted: bool) -> Any:
        """`trusted` skips naga's bounds clamps and loop-bounding counters: many times faster on NVIDIA
        (BENCHMARKS.md), but an out-of-bounds index is then undefined behaviour, so only for kernels whose bounds the
        host has checked. wgpu-py has no public call for it: this reaches wgpu-native through wgpu-py's cffi handles
        (wgpu is pinned to 0.32.x for that reason)."""
        if not trusted:
            return device.create_shader_module(code=code, label=label)
        api, ffi, lib = self.api, self.ffi, self.lib
        source = api.new_struct_p("WGPUShaderSourceWGSL *", code=api.to_c_string_view(code))
        source[0].chain.next = ffi.NULL
        source[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
        chain = ffi.cast("WGPUChainedStruct *", source)
        descriptor = api.new_struct_p("WGPUShaderModuleDescriptor *", nextInChain=chain,
                                      label=api.to_c_string_view(label))
        module_id = api.libf.wgpuDeviceCreateShaderModuleTrusted(device._internal, descriptor, 0)
        if module_id == ffi.NULL:
            raise RuntimeError(f"wgpu: trusted shader module creation failed for kernel {label!r}")
        return api.GPUShaderModule(label, module_id, device)

    def wait(self, device: Any, future: Any, block: bool, index: int | None = None) -> None:
        # A blocking poll without an index waits for everything submitted: a decode's next step too.
        at = self.null if index is None else self.ffi.new("WGPUSubmissionIndex *", index)
        self.lib.wgpuDevicePoll(device._internal, 1 if block else 0, at)

    def timestamp_period(self, queue: Any) -> float:
        return float(self.lib.wgpuQueueGetTimestampPeriod(queue._internal))


class Dawn(Runtime):
    """Dawn through wgpudawn. Trusted modules are a device's toggles here (no robustness clamps, no validation, no
    workgroup-memory zeroing); a checked backend gets a device without them."""

    name, module, api_module = "dawn", "wgpudawn", "wgpudawn.backends.dawn._api"
    features = ("timestamp-query", "shader-f16", "subgroups", "chromium-experimental-subgroup-matrix",
                # Dawn's objects are not thread-safe without it (the thread tests crash)
                "implicit-device-synchronization")
    # allow_unsafe_apis: experimental features (subgroup matrices); vulkan_enable_f16_on_nvidia: Dawn keeps shader-f16
    # off on NVIDIA's Vulkan driver by default, and with it the f16 matrix configs.
    ENABLE = ("allow_unsafe_apis", "vulkan_enable_f16_on_nvidia")
    # Timestamps rounded to ~65 us on the H200 otherwise: every GPU time and autotune figure would be noise.
    DISABLE = ("timestamp_quantization",)
    TRUSTED = ("disable_robustness", "skip_validation", "disable_workgroup_init")

    def __init__(self) -> None:
        super().__init__()
        self.extras = importlib.import_module("wgpudawn.backends.dawn.extras")
        toggles = self.extras.all_toggles()
        self.trusted_toggles = [t for t in self.TRUSTED if t in toggles]
        try:
            self.extras.set_instance_extras(enable_toggles=[t for t in self.ENABLE if t in toggles],
                                            disable_toggles=[t for t in self.DISABLE if t in toggles])
        except RuntimeError:  # the application made Dawn's instance first: its toggles stand
            pass

    def fresh(self, adapter: Any) -> Any:
        # Each Dawn adapter object makes one device: enumerate again, take the one at the same place.
        index = self.adapters().index(adapter)
        again = self._enumerate()
        return again[index] if index < len(again) else adapter

    def create_device(self, adapter: Any, features: list[str], limits: dict[str, int], trusted: bool) -> Any:
        return self.extras.request_device_sync(self.fresh(adapter), required_features=features, required_limits=limits,
                                               label="ember", enable_toggles=self.trusted_toggles if trusted else [])

    def matrix_configs(self, adapter: Any) -> tuple[MatrixConfig, ...]:
        if "chromium-experimental-subgroup-matrix" not in adapter.features:
            return ()
        found = self.extras.get_adapter_properties(adapter).get("subgroup_matrix_configs", [])
        return tuple(MatrixConfig(str(c["component_type"]), str(c["result_component_type"]), int(c["m"]), int(c["n"]),
                                  int(c["k"])) for c in found)

    def map_start(self, buf: Any, size: int, queue: Any = None) -> tuple[Any, Any]:
        started = super().map_start(buf, size)
        if queue is not None:
            # Dawn records the map's own commands into the next submit and completes the map after it: an empty
            # submit now makes that the copy's, not the next decode step's (which the read would then wait for).
            self.lib.wgpuQueueSubmit(queue._internal, 0, self.ffi.NULL)
        return started

    def wait(self, device: Any, future: Any, block: bool, index: int | None = None) -> None:
        instance = self.api.get_wgpu_instance()
        if not block:
            self.lib.wgpuInstanceProcessEvents(instance)
            return
        wait_info = self.ffi.new("WGPUFutureWaitInfo *")
        wait_info.future.id = future.id
        self.lib.wgpuInstanceWaitAny(instance, 1, wait_info, 100_000_000)


_MADE: dict[str, Runtime] = {}
_MADE_LOCK = threading.Lock()


def runtime(name: str) -> Runtime:
    """The runtime called `name` ("wgpu-native" or "dawn"), made once per process."""
    if name not in RUNTIMES:
        raise ValueError(f"webgpu: expected one of {('auto', *RUNTIMES)}, got {name!r}")
    with _MADE_LOCK:
        made = _MADE.get(name)
        if made is None:
            if name == "dawn" and not dawn_installed():
                raise RuntimeError(f"backend 'wgpu': {DAWN_MISSING}")
            made = _MADE[name] = WgpuNative() if name == "wgpu-native" else Dawn()
        return made


@functools.cache
def dawn_installed() -> bool:
    return importlib.util.find_spec("wgpudawn") is not None


def resolve(choice: str | None = None) -> str:
    """The runtime a backend uses: `choice` (webgpu=...), else EMBER_WEBGPU; "auto" takes Dawn where it is installed
    and one of its adapters offers matrix configs (the only reason to prefer it today), else wgpu-native."""
    choice = choice or settings.WEBGPU.get() or "auto"
    if choice == "auto":
        return "dawn" if auto_takes_dawn() else "wgpu-native"
    if choice not in RUNTIMES:
        raise ValueError(f"webgpu: expected one of {('auto', *RUNTIMES)}, got {choice!r}")
    return choice


@functools.cache
def auto_takes_dawn() -> bool:
    # Asked once per process: enumerating Dawn's adapters costs tens of milliseconds.
    if not dawn_installed():
        return False
    try:
        # Only where wgpu-native sees a hardware adapter: software ones (lavapipe) have no matrix units, and Dawn's
        # enumeration warns on stderr about drivers it rejects.
        if all(a.info["adapter_type"] == "CPU" for a in runtime("wgpu-native").adapters()):
            return False
        dawn = runtime("dawn")
        return any(dawn.matrix_configs(a) for a in dawn.adapters() if a.info["adapter_type"] != "CPU")
    except Exception:  # a broken install must not break wgpu-native users
        return False
