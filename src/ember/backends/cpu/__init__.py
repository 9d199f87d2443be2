"""The numpy backend: allocations are byte arrays, steps are closures over typed views of them."""

from . import loops  # noqa: F401  (attaches the loop primitives)
from .backend import CpuBackend

__all__ = ["CpuBackend"]
