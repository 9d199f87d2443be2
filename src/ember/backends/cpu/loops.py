"""Loop primitives on the cpu backend (ComputeBackend.record_scan/record_topk/record_scatter): numpy's cumulative
ops, stable sorts and unbuffered `ufunc.at` scatters."""

from __future__ import annotations

import numpy as np

from ...core.view import View
from .backend import CpuBackend, Step

_SCAN = {"sum": np.cumsum, "prod": np.cumprod}
_SCATTER = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def record_scan(self: CpuBackend, op: str, x: View, out: View, axis: int, exclusive: bool, reverse: bool,
                ) -> list[Step]:
    xv, dst = self.array(x), self.array(out)
    fn = _SCAN[op]
    ident = 0 if op == "sum" else 1

    def step() -> None:
        src = np.flip(xv, axis) if reverse else xv
        r = fn(src, axis=axis, dtype=xv.dtype)
        if exclusive:  # shift by one: the identity first, the last partial result dropped
            r = np.concatenate([np.full_like(np.take(r, [0], axis), ident), np.delete(r, -1, axis)], axis)
        dst[...] = np.flip(r, axis) if reverse else r

    return [step]


def record_topk(self: CpuBackend, x: View, values: View, indices: View, axis: int, k: int, largest: bool,
                ) -> list[Step]:
    xv, vals, idx = self.array(x), self.array(values), self.array(indices)
    n = x.shape[axis]

    def step() -> None:
        if largest:
            # Descending with ties in index order: a stable ascending sort of the reversed line, reversed.
            order = n - 1 - np.flip(np.argsort(np.flip(xv, axis), axis=axis, kind="stable"), axis)
        else:
            order = np.argsort(xv, axis=axis, kind="stable")
        order = np.take(order, np.arange(k), axis)
        idx[...] = order
        vals[...] = np.take_along_axis(xv, order, axis)

    return [step]


def record_scatter(self: CpuBackend, out: View, offsets: View, updates: View, reduction: str) -> list[Step]:
    dst, off, upd = self.array(out).reshape(-1), self.array(offsets), self.array(updates)
    size = out.size

    def step() -> None:
        o = np.clip(off.reshape(-1), 0, max(size - 1, 0))
        u = upd.reshape(-1)
        if reduction == "none":
            dst[o] = u  # duplicates: the last update wins
        else:
            _SCATTER[reduction].at(dst, o, u)

    return [step]


for _name in ("record_scan", "record_topk", "record_scatter"):
    setattr(CpuBackend, _name, globals()[_name])
