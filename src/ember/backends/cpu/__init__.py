"""The numpy backend: allocations are byte arrays, steps are closures over typed views of them."""

from .backend import CpuBackend

__all__ = ["CpuBackend"]
