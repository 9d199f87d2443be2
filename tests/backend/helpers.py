"""Moving arrays through a ComputeBackend in tests, with outputs poisoned first."""

from __future__ import annotations

import numpy as np

import ember


def upload(be: ember.ComputeBackend, a: np.ndarray) -> int:
    a = np.ascontiguousarray(a, np.float32)
    h = be.alloc(max(a.nbytes, 4))
    be.copy_htod(h, a)
    return h


def poisoned(be: ember.ComputeBackend, n: int) -> int:
    """An output allocation filled with NaN, so an element the op forgets to write shows up."""
    return upload(be, np.full(max(n, 1), np.nan, np.float32))


def download(be: ember.ComputeBackend, h: int, shape: tuple[int, ...] | int) -> np.ndarray:
    out = np.empty(shape, np.float32)
    be.copy_dtoh(out, h)
    return out


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| relative to max |ref| (NaN/inf positions must match exactly)."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    special = ~np.isfinite(ref)
    if not np.array_equal(np.isnan(got), np.isnan(ref)) or not np.array_equal(got[special & ~np.isnan(ref)],
                                                                                 ref[special & ~np.isnan(ref)]):
        return float("inf")
    finite = ~special
    if not finite.any():
        return 0.0
    scale = max(np.abs(ref[finite]).max(), 1e-30)
    return float(np.abs(got[finite] - ref[finite]).max() / scale)
