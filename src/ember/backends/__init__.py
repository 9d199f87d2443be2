"""Backend registry: which backends exist, which work on this machine, and how to get one."""

from __future__ import annotations

from typing import Any

from .. import settings
from .base import BinaryOp, ComputeBackend, DeviceLostError, OutOfMemoryError, ReduceOp, UnaryOp, View

ALIASES = {"gpu": "wgpu", "webgpu": "wgpu", "numpy": "cpu", "wgpu": "wgpu", "cpu": "cpu"}
ORDER = ["wgpu", "cpu"]  # best first

__all__ = ["ALIASES", "BinaryOp", "ComputeBackend", "DeviceLostError", "OutOfMemoryError", "ReduceOp", "UnaryOp",
           "View",
           "available_backends", "backend", "canonical_name"]


def canonical_name(name: str) -> str:
    if not isinstance(name, str) or name.lower() not in ALIASES:
        valid = ", ".join(["auto", *sorted(ALIASES)])
        raise ValueError(f"unknown backend {name!r}; valid names: {valid}")
    return ALIASES[name.lower()]


def available_backends() -> list[str]:
    """Backends usable on this machine, best first; wgpu only where an adapter can be created."""
    from .wgpu.device import adapters_available

    return [b for b in ORDER if b != "wgpu" or adapters_available()]


def backend(name: str = "auto", **opts: Any) -> ComputeBackend:
    """An initialised backend. "auto" = EMBER_BACKEND if set, else the best available one."""
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
            raise ValueError(f"cpu backend takes no options, got {sorted(opts)}")
        return CpuBackend().init()
    from .wgpu import WgpuBackend

    return WgpuBackend(**opts).init()
