"""Feeds from other array libraries, read onto the host as numpy arrays without importing any of them.

Model.run (and so InferenceSession.run) takes, besides numpy arrays, lists and scalars:
  - torch tensors (anything with `detach` and `numpy` methods): detached first, so requires_grad=True is fine;
    one on another device (CUDA, MPS: `.device.type != "cpu"`) is copied to the host with `.cpu()`; a
    non-contiguous one (a transpose) is made contiguous later, as a numpy feed is;
  - objects with `__array__` (numpy's protocol): np.asarray;
  - objects with only `__dlpack__` (DLPack, host memory): np.from_dlpack.
The dtype rule is then the same as for numpy feeds (a value converts only within its kind: model.cast_feed).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["host_array", "is_torch_like"]


def is_torch_like(value: Any) -> bool:
    """A torch.Tensor, by its methods (ember does not import torch): `detach` and `numpy`."""
    return callable(getattr(value, "detach", None)) and callable(getattr(value, "numpy", None))


def _from_torch(name: str, tensor: Any) -> np.ndarray:
    t = tensor.detach()  # a tensor that requires grad refuses .numpy()
    device = getattr(t, "device", None)
    if getattr(device, "type", "cpu") != "cpu":  # CUDA, MPS, XPU, ...: through the host
        t = t.cpu()
    for resolve in ("resolve_conj", "resolve_neg"):  # lazy conjugate/negative views refuse .numpy() too
        method = getattr(t, resolve, None)
        if callable(method):
            t = method()
    try:
        return np.asarray(t.numpy())
    except (TypeError, RuntimeError) as e:  # bfloat16 and other dtypes numpy lacks
        raise ValueError(f"input {name!r}: cannot read the {type(tensor).__name__} (dtype "
                         f"{getattr(tensor, 'dtype', '?')}) as a numpy array: {e}; convert it first (e.g. "
                         f".float())") from e


def host_array(name: str, value: Any) -> np.ndarray:
    """`value` (the feed for input `name`) as a numpy array on the host, a view where no copy is needed."""
    if isinstance(value, np.ndarray):
        return value
    if is_torch_like(value):
        return _from_torch(name, value)
    if hasattr(value, "__array__"):
        return np.asarray(value)
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (BufferError, RuntimeError, TypeError, ValueError) as e:
            raise ValueError(f"input {name!r}: cannot read the {type(value).__name__} through DLPack: {e} "
                             "(np.from_dlpack reads host memory only: copy it to the CPU first)") from e
    return np.asarray(value)
