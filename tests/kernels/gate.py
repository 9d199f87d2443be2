"""The kernel gates' shared methodology.

Fresh random inputs every run (no fixed seed) at several magnitudes, including a large common offset
(1e4 + noise, where the one-pass E[x²] - E[x]² formula and even an f32 mean lose the deviations) and tiny
values (1e-4); the output poisoned with NaN before every run, so an element a kernel forgets to write shows;
errors relative to max|ref| of each row (of the whole tensor for elementwise ops) against a float64 oracle
written as plain Python loops; and each recorded kernel run twice on the same input, bitwise identical.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import ember
from ember.backends.base import View

TOL = 1e-5
F32 = np.dtype(np.float32)
SIZES = [1, 2, 3, 4, 7, 8, 16, 32, 33, 127, 128, 1000, 4096]
MAGNITUDES = ["normal", "large", "offset", "tiny"]


def sample(rng: np.random.Generator, shape: Sequence[int], magnitude: str) -> np.ndarray:
    z = rng.standard_normal(tuple(shape))
    if magnitude == "normal":
        v = z
    elif magnitude == "wide":
        v = 4.0 * z
    elif magnitude == "large":
        v = 1e4 * z
    elif magnitude == "offset":
        v = 1e4 + z  # magnitude 1e4, deviations of 1: the hard case for naive variance formulas
    elif magnitude == "tiny":
        v = 1e-4 * z
    else:
        raise ValueError(magnitude)
    return v.astype(np.float32)


def row_errors(got: np.ndarray, ref: np.ndarray, n: int) -> np.ndarray:
    """Per row of n: max |got - ref| / max |ref| over the row's finite ref values (a row whose ref is all zero
    must match exactly); inf where got's NaN/inf positions differ from ref's."""
    got = np.asarray(got, np.float64).reshape(-1, n)
    ref = np.asarray(ref, np.float64).reshape(-1, n)
    finite = np.isfinite(ref)
    same_special = (np.isnan(got) == np.isnan(ref)) & (finite | np.isnan(ref) | (got == ref))
    diff = np.where(finite, np.abs(np.where(finite, got, 0.0) - np.where(finite, ref, 0.0)), 0.0)
    diff = np.where(finite & ~np.isfinite(got), np.inf, diff)
    scale = np.maximum(np.where(finite, np.abs(ref), 0.0).max(axis=1), 1e-30)
    err = diff.max(axis=1) / scale
    return np.where(same_special.all(axis=1), err, np.inf)


def check(got: np.ndarray, ref: np.ndarray, n: int, what: object) -> None:
    err = row_errors(got, ref, n)
    worst = int(np.argmax(err))
    assert err[worst] < TOL, (f"{what}: row {worst} relative error {err[worst]:.3g} >= {TOL}",
                              got.reshape(-1, n)[worst][:8], ref.reshape(-1, n)[worst][:8])


def upload(be: ember.ComputeBackend, a: np.ndarray, pad: int = 0) -> tuple[int, View]:
    """A new allocation holding `pad` zeros then a (float32); the View of a in it."""
    a = np.ascontiguousarray(a, np.float32)
    h = be.alloc(max((a.size + pad) * 4, 4))
    be.upload(h, np.concatenate([np.zeros(pad, np.float32), a.reshape(-1)]))
    return h, View.contiguous(h, F32, a.shape, offset=pad)


def poison(be: ember.ComputeBackend, h: int) -> None:
    be.copy_htod(h, np.full(be.nbytes(h) // 4, np.nan, np.float32))


def run_twice(be: ember.ComputeBackend, steps: list, out: View, before: Callable[[], None] | None = None) -> np.ndarray:
    """Execute recorded steps twice, poisoning out's allocation (and calling `before`) ahead of each run; the
    two results must be bitwise identical. Returns the first."""
    results = []
    for _ in range(2):
        poison(be, out.handle)
        if before is not None:
            before()
        be.execute(steps)
        results.append(be.download(out))
    a, b = (np.ascontiguousarray(r, np.float32).view(np.uint32) for r in results)
    assert np.array_equal(a, b), f"two runs differ in {int((a != b).sum())} of {a.size} elements"
    return results[0]
