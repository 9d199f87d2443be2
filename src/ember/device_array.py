"""Tensors that stay on a backend's device between model runs (chained models, decode loops)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .backends.base import ComputeBackend
from .core.view import View


class DeviceArray:
    """An array in device memory: `model.run(..., keep_on_device=True)` returns these, and a model on the same
    backend takes them as feeds with a device-side copy instead of a host round trip."""

    def __init__(self, backend: ComputeBackend, handle: int, dtype: Any, shape: tuple[int, ...]) -> None:
        self.backend = backend
        self.handle = handle
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)

    @classmethod
    def from_numpy(cls, backend: ComputeBackend, array: np.ndarray) -> DeviceArray:
        array = np.ascontiguousarray(array)
        handle = backend.alloc(max(array.size, 1) * backend.storage_itemsize(array.dtype))
        if array.size:
            backend.upload(handle, array)
        return cls(backend, handle, array.dtype, array.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numpy(self) -> np.ndarray:
        return self.backend.download(View.contiguous(self.handle, self.dtype, self.shape))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, backend={self.backend.name!r})"

    def __del__(self) -> None:
        try:
            if self.handle in self.backend._sizes:
                self.backend.free(self.handle)
        except Exception:  # interpreter shutdown: the device may already be gone
            pass
