"""Index and loop primitives on the cpu backend: gather, and ComputeBackend's record_scan/record_topk/record_scatter
through numpy's cumulative ops, stable sorts and unbuffered `ufunc.at` scatters."""

from __future__ import annotations

import numpy as np

from .steps import Step

_SCAN = {"sum": np.cumsum, "prod": np.cumprod}
_SCATTER = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def record_gather(dv: np.ndarray, iv: np.ndarray, axis: int, dst: np.ndarray) -> list[Step]:
    dim = dv.shape[axis]

    def check() -> np.ndarray:
        idx = np.where(iv < 0, iv + dim, iv)
        if idx.size and (idx.min() < 0 or idx.max() >= dim):
            bad = iv[(idx < 0) | (idx >= dim)].ravel()[0]  # as fed, before negatives were wrapped
            raise ValueError(f"Gather: index {int(bad)} is out of range for an axis of size {dim} "
                             f"(valid: {-dim} ... {dim - 1})")
        return idx

    if (dst.shape != dv.shape[:axis] + iv.shape + dv.shape[axis + 1:] or dst.dtype != dv.dtype
            or np.may_share_memory(dst, dv) or np.may_share_memory(dst, iv)):
        def step() -> None:
            dst[...] = np.take(dv, check(), axis=axis)

        return [step]

    def take() -> None:
        try:  # numpy's take wraps negative indices as Gather does and raises for any out of range
            dv.take(iv, axis=axis, out=dst)
        except IndexError:
            check()
            raise

    return [take]


def record_scan(op: str, xv: np.ndarray, dst: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> list[Step]:
    fn = _SCAN[op]
    ident = 0 if op == "sum" else 1

    def step() -> None:
        src = np.flip(xv, axis) if reverse else xv
        r = fn(src, axis=axis, dtype=xv.dtype)
        if exclusive:  # shift by one: the identity first, the last partial result dropped
            r = np.concatenate([np.full_like(np.take(r, [0], axis), ident), np.delete(r, -1, axis)], axis)
        dst[...] = np.flip(r, axis) if reverse else r

    return [step]


def record_topk(xv: np.ndarray, vals: np.ndarray, idx: np.ndarray, axis: int, k: int, largest: bool) -> list[Step]:
    n = xv.shape[axis]

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


def record_scatter(out: np.ndarray, off: np.ndarray, upd: np.ndarray, reduction: str) -> list[Step]:
    dst = out.reshape(-1)  # contiguous: a view
    size = dst.size

    def step() -> None:
        o = np.clip(off.reshape(-1), 0, max(size - 1, 0))
        u = upd.reshape(-1)
        if reduction == "none":
            dst[o] = u  # duplicates: the last update wins
        else:
            _SCATTER[reduction].at(dst, o, u)

    return [step]
