"""Feeds from other array libraries, read onto the host as numpy arrays without importing any of them.

Model.run (and so InferenceSession.run) takes, besides numpy arrays, lists and scalars:
  - torch tensors (anything with `detach` and `numpy` methods): detached first, so requires_grad=True is fine;
    one on another device (CUDA, MPS: `.device.type != "cpu"`) is copied to the host with `.cpu()`; a
    non-contiguous one (a transpose) is made contiguous later, as a numpy feed is;
  - objects with `__array__` (numpy's protocol): np.asarray;
  - objects with only `__dlpack__` (DLPack, host memory): np.from_dlpack.
The dtype rule is then the same as for numpy feeds (a value converts only within its kind: cast_feed).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["cast_feed", "host_array", "host_value", "is_torch_like", "shape_key"]


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


def host_value(name: str, value: Any, kind: str) -> Any:
    """A feed of a sequence or optional input, as the host ops take it (lists of arrays, None)."""
    if kind == "optional" and value is None:
        return None
    if kind == "optional" and isinstance(value, (list, tuple)):  # an optional holding a sequence
        return [host_array(name, v) for v in value]
    if kind == "sequence":
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"input {name!r}: a sequence input takes a list of arrays, got {type(value).__name__}")
        return [host_array(name, v) for v in value]
    return host_array(name, value)


def shape_key(v: Any) -> Any:
    """What a plan is keyed by for a feed: its shape; a sequence's element shapes; () for an empty optional."""
    if isinstance(v, list):
        return ("sequence", tuple(tuple(np.shape(x)) for x in v))
    return () if v is None else tuple(v.shape)


def cast_feed(name: str, value: Any, expected: np.dtype) -> np.ndarray:
    """The casting rule for feeds: a value converts only within its kind (float->float, int->int at a
    width that holds every value, bool->bool). int->float, float->int or anything -> bool is refused,
    so a wrong feed never turns into a silently different number."""
    arr = host_array(name, value)  # torch tensors, __array__ and __dlpack__ objects too (ember.interop)
    if arr.dtype == expected:
        return arr
    if expected.kind == "O":  # strings: any text array (they run on the host, ops/reference.py)
        if arr.dtype.kind not in "USO":
            raise ValueError(f"input {name!r}: expected strings, got dtype {arr.dtype}")
        return arr.astype(object)
    kinds = {"f": "f", "i": "i", "u": "i", "b": "b"}
    got_kind, want_kind = kinds.get(arr.dtype.kind), kinds.get(expected.kind)
    if got_kind is None or got_kind != want_kind:
        raise ValueError(f"input {name!r}: expected dtype {expected}, got {arr.dtype} (ember casts only within "
                         f"a kind: float->float, int->int)")
    if want_kind == "i" and arr.size:
        info = np.iinfo(expected)
        lo, hi = arr.min(), arr.max()
        if lo < info.min or hi > info.max:
            raise ValueError(f"input {name!r}: values [{lo}, {hi}] do not fit in the expected dtype {expected}")
    return arr.astype(expected)
