"""Backend registry: which backends exist, which work on this machine, and how to get one."""

from __future__ import annotations

from typing import Any, Never

from .. import settings
from ..core.options import reject_unknown
from .base import BinaryOp, ComputeBackend, DeviceLostError, OutOfMemoryError, ReduceOp, UnaryOp, View

ALIASES = {"gpu": "wgpu", "webgpu": "wgpu", "numpy": "cpu", "wgpu": "wgpu", "cpu": "cpu"}
ORDER = ["wgpu", "cpu"]  # best first

__all__ = ["ALIASES", "BACKEND_OPTIONS", "POWER_PREFERENCES", "BinaryOp", "ComputeBackend", "DeviceLostError",
           "OutOfMemoryError", "ReduceOp", "UnaryOp", "View",
           "available_backends", "backend", "canonical_name", "check_backend_options"]


def canonical_name(name: str) -> str:
    if not isinstance(name, str) or name.lower() not in ALIASES:
        valid = ", ".join(["auto", *sorted(ALIASES)])
        raise ValueError(f"unknown backend {name!r}; valid names: {valid}")
    return ALIASES[name.lower()]


def available_backends() -> list[str]:
    """Backends usable on this machine, best first; wgpu only where an adapter can be created."""
    from .wgpu.device import adapters_available

    return [b for b in ORDER if b != "wgpu" or adapters_available()]


# ember.backend()'s options, all for the wgpu backend (the cpu backend takes none): which adapter, and which kind
# when several are present. load_onnx takes them too.
POWER_PREFERENCES = ("low-power", "high-performance")
BACKEND_OPTIONS = ("adapter", "power_preference", "safe", "webgpu")
WEBGPU_RUNTIMES = ("auto", "dawn", "wgpu-native")


def check_backend_options(adapter: Any, power_preference: Any, safe: Any = False, webgpu: Any = None) -> None:
    """TypeError/ValueError naming the option for a value of the wrong type (which device they pick is only known
    when the backend starts)."""
    if adapter is not None and (isinstance(adapter, bool) or not isinstance(adapter, (int, str))):
        raise TypeError(f"adapter: expected an adapter index (int), a substring of its name (str) or None, got "
                        f"{adapter!r}")
    if not isinstance(safe, bool):
        raise TypeError(f"safe: expected True or False, got {safe!r}")
    if power_preference is not None and power_preference not in POWER_PREFERENCES:
        raise ValueError(f"power_preference: expected one of {list(POWER_PREFERENCES)} or None, got "
                         f"{power_preference!r}")
    if webgpu is not None and webgpu not in WEBGPU_RUNTIMES:
        raise ValueError(f"webgpu: expected one of {list(WEBGPU_RUNTIMES)} or None, got {webgpu!r}")


def backend(name: str = "auto", *, adapter: int | str | None = None, power_preference: str | None = None,
            safe: bool = False, webgpu: str | None = None, **unknown: Never) -> ComputeBackend:
    """An initialised backend. "auto" = EMBER_BACKEND if set, else the best available one.

    adapter (wgpu; default None: the best compute adapter, discrete GPUs first, then integrated, virtual and
    software ones such as lavapipe): an index into that list, or a case-insensitive substring of an adapter's
    name. power_preference (wgpu, when adapter is None; default None, the same as "high-performance"):
    "low-power" puts integrated GPUs first. The cpu backend takes neither (ValueError). safe (default False): for
    models from untrusted sources, wgpu creates its shader modules with bounds checks (as EMBER_CHECKED_SHADERS
    does) instead of trusting ember's host-side shape and index checks alone; the cpu backend is always checked
    (numpy bounds-checks every index). webgpu (wgpu; default None: EMBER_WEBGPU, else "auto"): the WebGPU runtime,
    "dawn" (the wgpudawn package: `pip install ember[dawn]`; matrix units where the adapter offers subgroup-matrix
    configs), "wgpu-native" (wgpu-py), or "auto": Dawn where it is installed and offers matrix configs, else
    wgpu-native. An unknown option raises TypeError naming it, the closest valid one and every valid one."""
    reject_unknown("backend()", unknown, BACKEND_OPTIONS)
    check_backend_options(adapter, power_preference, safe, webgpu)
    opts = {k: v for k, v in (("adapter", adapter), ("power_preference", power_preference), ("webgpu", webgpu))
            if v is not None}
    if isinstance(name, str) and name.lower() == "auto":
        env = settings.BACKEND.get()
        if env and env.lower() != "auto":
            try:
                name = canonical_name(env)
            except ValueError as e:
                raise ValueError(f"EMBER_BACKEND={env!r}: {e}") from None
        else:
            name = available_backends()[0]
    name = canonical_name(name)
    if name == "cpu":
        from .cpu import CpuBackend

        if opts:
            raise ValueError(f"cpu backend takes no options, got {sorted(opts)} (adapter, power_preference and "
                             "webgpu pick a wgpu device)")
        return CpuBackend().init()
    from .wgpu import WgpuBackend

    return WgpuBackend(**opts, safe=safe).init()
