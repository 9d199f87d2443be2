"""The weight pool: a model's constants on its backend, uploaded once and shared by every plan of the model.

Plans of one model differ in their input shapes, not in their weights, so a constant one plan uploads is the
buffer the next plan reads too. A constant is keyed by what guarantees equal contents:

- identity, for a graph initializer and any numpy view of one (a reshape, a slice): the root array the view
  looks into (held here, so its id cannot be reused), the view's byte offset and layout;
- a transform of an identity-keyed constant (`Context.derived`: precision="f16"'s float16 copy of a weight),
  keyed by the transform and the source's key;
- content (SHA-256 of the bytes uploaded), for everything else: constants made while planning, such as a
  Winograd-transformed filter or a causal mask, whose values may or may not be the same across plans.

Every key also holds the uploaded dtype and element count. Entries are counted by the plans that hold them and
freed when the last one is freed, so constants that only some shapes need (a mask per sequence length) go with
the plans that used them, and the pool never holds more than the live plans read. A pool belongs to one
backend; constant folding plans on a cpu backend of its own and never sees it. A model's initializers are taken
as read-only once it is loaded: a later plan reads what the first one uploaded.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import numpy as np

from ..backends.base import ComputeBackend

Key = Hashable


def root_array(a: np.ndarray) -> np.ndarray:
    """The array owning the memory that `a` (perhaps a view of a view) looks into."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class WeightPool:
    """Constants of one model on one backend, shared by its plans (see the module docstring)."""

    def __init__(self, backend: ComputeBackend, stable: Iterable[np.ndarray] = ()) -> None:
        self.backend = backend
        # Arrays whose contents stay as they are for the pool's life (the graph's initializers), by id of their
        # root: a view into one is keyed by identity. Held, so an id here always names the same array.
        self._roots: dict[int, np.ndarray] = {}
        self._entries: dict[Key, list[int]] = {}  # key -> [handle, nbytes, plans holding it]
        self._lock = threading.Lock()  # plans of one model are built under its lock; build_plan is public too
        self.bytes = 0  # device bytes of the live entries
        self.uploads = 0  # entries uploaded since the pool was made
        self.register(stable)

    def register(self, arrays: Iterable[np.ndarray]) -> None:
        """Mark arrays (and so every view of them) as keyed by identity: their contents must not change."""
        for a in arrays:
            if isinstance(a, np.ndarray):
                root = root_array(a)
                self._roots.setdefault(id(root), root)

    def identity_key(self, value: Any, aliases: dict[int, tuple[np.ndarray, Key]]) -> Key | None:
        """The key of a registered array's view, or of a value `aliases` (Context.derived) names; None for
        anything else."""
        if not isinstance(value, np.ndarray):
            return None
        alias = aliases.get(id(value))
        if alias is not None and alias[0] is value:
            return alias[1]
        root = root_array(value)
        if self._roots.get(id(root)) is not root:
            return None
        offset = value.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        layout = (value.nbytes,) if value.flags.c_contiguous else (value.shape, value.strides)
        return ("weight", id(root), offset, value.dtype.str, layout)

    def key(self, value: Any, dtype: np.dtype, size: int,
            aliases: dict[int, tuple[np.ndarray, Key]]) -> tuple[Key, np.ndarray | None]:
        """(key, the array to upload where computing the key made it already) for a constant uploaded as
        `size` elements of `dtype`."""
        ident = self.identity_key(value, aliases)
        if ident is not None:
            return (ident, dtype.str, size), None
        arr = np.ascontiguousarray(value, dtype)
        digest = hashlib.sha256(arr.reshape(-1).view(np.uint8).data).digest()
        return ("content", digest, dtype.str, size), arr

    def acquire(self, key: Key, nbytes: int, make: Callable[[], np.ndarray]) -> int:
        """The handle of the entry under `key`, uploaded now from make() if there is none; the caller holds it
        until it passes the key to release()."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                be = self.backend
                handle = be.alloc(nbytes)
                try:
                    be.upload(handle, make())
                except BaseException:
                    be.free(handle)
                    raise
                entry = self._entries[key] = [handle, nbytes, 0]
                self.bytes += nbytes
                self.uploads += 1
            entry[2] += 1
            return entry[0]

    def release(self, keys: Iterable[Key]) -> None:
        """Drop one hold on each key; an entry no plan holds any more is freed."""
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None:  # freed by close() already
                    continue
                entry[2] -= 1
                if entry[2] <= 0:
                    del self._entries[key]
                    self.bytes -= entry[1]
                    self.backend.free(entry[0])

    def __len__(self) -> int:
        return len(self._entries)

    def close(self) -> None:
        """Free every entry, held or not (the model is closing). The pool stays usable: a later plan uploads
        again."""
        with self._lock:
            entries, self._entries = self._entries, {}
            self.bytes = 0
            for handle, _, _ in entries.values():
                self.backend.free(handle)


__all__ = ["WeightPool", "root_array"]
