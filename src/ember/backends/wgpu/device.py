"""Adapter choice, device creation and trusted shader modules for the wgpu backend."""

from __future__ import annotations

import functools
from typing import Any

import wgpu

from ... import settings

# OpenGL adapters are left out: wgpu's GL backend lacks storage buffers in several stages and compute
# features this backend needs; Vulkan, Metal and D3D12 are the targets.
COMPUTE_BACKENDS = ("Vulkan", "Metal", "D3D12")
OPTIONAL_FEATURES = ("timestamp-query", "timestamp-query-inside-passes", "shader-f16", "subgroup")
# Limits we raise to the adapter's maximum rather than WebGPU's conservative defaults.
RAISED_LIMITS = (
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-storage-buffers-per-shader-stage",
)


def _describe(adapter: Any) -> str:
    info = adapter.info
    return f"{info['device']} ({info['backend_type']}, {info['adapter_type']})"


@functools.cache
def _all_adapters() -> tuple[Any, ...]:
    settings.default_runtime_dir()
    try:
        return tuple(wgpu.gpu.enumerate_adapters_sync())
    except Exception:  # no Vulkan loader, no driver: no adapters
        return ()


def compute_adapters() -> list[Any]:
    """Adapters this backend can use, best first: discrete, integrated, then software (lavapipe)."""
    rank = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
    usable = [a for a in _all_adapters() if a.info["backend_type"] in COMPUTE_BACKENDS]
    return sorted(usable, key=lambda a: rank.get(a.info["adapter_type"], 4))


def adapters_available() -> bool:
    return bool(compute_adapters())


def select_adapter(adapter: int | str | None = None, power_preference: str | None = None) -> Any:
    found = compute_adapters()
    names = [_describe(a) for a in _all_adapters()]
    if not found:
        listed = "; ".join(names) if names else "none"
        raise RuntimeError(
            f"backend 'wgpu': no Vulkan/Metal/D3D12 adapter found (adapters seen: {listed}). Install a GPU "
            "driver with Vulkan support, or Mesa's software Vulkan driver (Debian/Ubuntu: apt-get install "
            "mesa-vulkan-drivers)."
        )
    if adapter is None:
        if power_preference == "low-power":
            order = {"IntegratedGPU": 0, "DiscreteGPU": 1}
            found = sorted(found, key=lambda a: order.get(a.info["adapter_type"], 2))
        elif power_preference not in (None, "high-performance"):
            raise ValueError(f"power_preference: expected 'low-power' or 'high-performance', got {power_preference!r}")
        return found[0]
    if isinstance(adapter, int) and not isinstance(adapter, bool):
        if not 0 <= adapter < len(found):
            raise ValueError(f"adapter: index {adapter} out of range; usable adapters: "
                             + "; ".join(f"{i}: {_describe(a)}" for i, a in enumerate(found)))
        return found[adapter]
    if isinstance(adapter, str):
        for a in found:
            if adapter.lower() in _describe(a).lower():
                return a
        raise RuntimeError(f"backend 'wgpu': no adapter matches {adapter!r}; usable adapters: "
                           + "; ".join(_describe(a) for a in found))
    raise ValueError(f"adapter: expected an index or a name substring, got {adapter!r}")


def create_device(adapter: Any) -> Any:
    features = [f for f in OPTIONAL_FEATURES if f in adapter.features]
    limits = {name: adapter.limits[name] for name in RAISED_LIMITS if name in adapter.limits}
    return adapter.request_device_sync(required_features=features, required_limits=limits, label="ember")


def create_shader_module(device: Any, code: str, label: str, trusted: bool) -> Any:
    """A shader module; `trusted` skips naga's bounds clamps and loop-bounding counters.

    Trusted modules run many times faster on NVIDIA (BENCHMARKS.md), but an out-of-bounds index is then
    undefined behaviour: only for kernels whose bounds the host has checked. wgpu-py has no public call for it,
    so this reaches wgpu-native through wgpu-py's cffi handles; wgpu is pinned to 0.32.x for that reason, and
    tests cover both modes.
    """
    if not trusted:
        return device.create_shader_module(code=code, label=label)
    from wgpu.backends.wgpu_native import _api

    ffi, lib = _api.ffi, _api.lib
    source = _api.new_struct_p("WGPUShaderSourceWGSL *", code=_api.to_c_string_view(code))
    source[0].chain.next = ffi.NULL
    source[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
    descriptor = _api.new_struct_p(
        "WGPUShaderModuleDescriptor *",
        nextInChain=ffi.cast("WGPUChainedStruct *", source),
        label=_api.to_c_string_view(label),
    )
    module_id = _api.libf.wgpuDeviceCreateShaderModuleTrusted(device._internal, descriptor, 0)
    if module_id == ffi.NULL:
        raise RuntimeError(f"wgpu: trusted shader module creation failed for kernel {label!r}")
    return _api.GPUShaderModule(label, module_id, device)


def checked_shaders_forced() -> bool:
    return bool(settings.CHECKED_SHADERS.get())
