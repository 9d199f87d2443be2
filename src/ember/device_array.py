"""Tensors that stay on a backend's device between model runs (chained models, decode loops)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .backends.base import ComputeBackend
from .core.view import View

_DLPACK_CPU = (1, 0)  # DLPack's (device type kDLCPU, device id)


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
        array = np.require(array, requirements="C")  # np.ascontiguousarray would make a 0-d array 1-d
        handle = backend.alloc(max(array.size, 1) * backend.storage_itemsize(array.dtype))
        if array.size:
            backend.upload(handle, array)
        return cls(backend, handle, array.dtype, array.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numpy(self) -> np.ndarray:
        return self.backend.download(View.contiguous(self.handle, self.dtype, self.shape))

    def read_later(self) -> Callable[[], np.ndarray]:
        """read(): what numpy() would return now, with the read started now and waited for in read(): work
        submitted in between (a decode's next step) runs behind the read instead of ahead of it."""
        return self.backend.download_later(View.contiguous(self.handle, self.dtype, self.shape))

    # numpy's and DLPack's protocols: np.asarray(a), np.array(a), np.from_dlpack(a), torch.from_dlpack(a), ... read
    # the array back to the host. What they get is always a host copy, on the CPU (device (kDLCPU, 0)), never a view
    # of device memory: writing to it leaves the DeviceArray as it was.

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """A host copy (numpy's __array__ protocol); copy=False raises ValueError, since device memory is always
        copied to reach the host."""
        if copy is False:
            raise ValueError("a DeviceArray lives in device memory: reading it on the host is always a copy "
                             "(copy=False cannot be honoured)")
        a = self.numpy()
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule of a host copy (the device is the CPU: __dlpack_device__); copy=False raises
        BufferError, since device memory is always copied to reach the host."""
        if copy is False:
            raise BufferError("a DeviceArray lives in device memory: its DLPack export is a host copy "
                              "(copy=False cannot be honoured)")
        if stream is not None:
            raise BufferError("a DeviceArray's DLPack export is a host copy on the CPU: stream must be None")
        if dl_device is not None and tuple(dl_device) != _DLPACK_CPU:
            raise BufferError(f"a DeviceArray's DLPack export is a host copy on the CPU {_DLPACK_CPU}, not on "
                              f"device {tuple(dl_device)}")
        host = self.numpy()
        return host.__dlpack__() if max_version is None else host.__dlpack__(max_version=max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(kDLCPU, 0): the DLPack export is a host copy, whatever device the array lives on."""
        return _DLPACK_CPU

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, backend={self.backend.name!r})"

    def __del__(self) -> None:
        try:
            if self.handle in self.backend._sizes:
                self.backend.free(self.handle)
        except Exception:  # interpreter shutdown: the device may already be gone
            pass
