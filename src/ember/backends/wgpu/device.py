"""Adapter choice and device creation for the wgpu backend, over either WebGPU runtime (runtime.py)."""

from __future__ import annotations

from typing import Any

from ... import settings
from .runtime import Runtime, runtime

# OpenGL adapters are left out: wgpu's GL backend lacks storage buffers in several stages and compute
# features this backend needs; Vulkan, Metal and D3D12 are the targets.
COMPUTE_BACKENDS = ("Vulkan", "Metal", "D3D12")
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


def compute_adapters(rt: Runtime | None = None) -> list[Any]:
    """Adapters this backend can use, best first: discrete, integrated, then software (lavapipe)."""
    rank = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
    usable = [a for a in (rt or runtime("wgpu-native")).adapters() if a.info["backend_type"] in COMPUTE_BACKENDS]
    return sorted(usable, key=lambda a: rank.get(a.info["adapter_type"], 4))


def adapters_available(rt: Runtime | None = None) -> bool:
    return bool(compute_adapters(rt))


def select_adapter(adapter: int | str | None = None, power_preference: str | None = None,
                   rt: Runtime | None = None) -> Any:
    rt = rt or runtime("wgpu-native")
    found = compute_adapters(rt)
    names = [_describe(a) for a in rt.adapters()]
    if not found:
        listed = "; ".join(names) if names else "none"
        hint = (" Dawn needs a newer Vulkan driver than wgpu-native on some systems (Mesa >= 24 for lavapipe)."
                if rt.name == "dawn" else "")
        raise RuntimeError(
            f"backend 'wgpu' ({rt.name}): no Vulkan/Metal/D3D12 adapter found (adapters seen: {listed}). Install a "
            "GPU driver with Vulkan support, or Mesa's software Vulkan driver (Debian/Ubuntu: apt-get install "
            f"mesa-vulkan-drivers).{hint}"
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


def create_device(adapter: Any, rt: Runtime, trusted: bool) -> Any:
    """A device with the optional features `rt` uses where the adapter has them and the raised limits; `trusted`:
    Dawn's toggles that play the part of wgpu-native's trusted modules (no bounds clamps, no validation)."""
    features = [f for f in rt.features if f in adapter.features]
    limits = {name: adapter.limits[name] for name in RAISED_LIMITS if name in adapter.limits}
    return rt.create_device(adapter, features, limits, trusted)


def checked_shaders_forced() -> bool:
    return bool(settings.CHECKED_SHADERS.get())
