"""Gate for the fused (log)softmax kernel, record_softmax, on every backend.

Oracle: per row, in float64 Python loops: m = max(x) (NaN if the row holds one), e = exp(x - m),
s = fsum(e); softmax e / s, log-softmax (x - m) - log(s). That is ONNX's formula, so a row of all -inf gives
NaN (-inf - -inf), as onnx.reference and ONNX Runtime do for Softmax and LogSoftmax (checked, opsets 11 and
13); so does a row holding +inf. Log-softmax is the stable form ONNX Runtime computes ((x - m) - log(s): a
finite -201.3 where onnx.reference's log(softmax) underflows to -inf). Rows of every size in SIZES, one row
and three, 70,000 rows, a 100,000-element row, magnitudes near 1 / 1e4 / 1e4 + noise / 1e-4; see gate.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember

from .gate import MAGNITUDES, SIZES, check, run_twice, sample, upload


def softmax_ref(x: np.ndarray, log: bool) -> np.ndarray:
    n = x.shape[-1]
    out = []
    for row in x.reshape(-1, n).tolist():
        m = math.nan if any(math.isnan(v) for v in row) else max(row)
        d = [v - m for v in row]  # Python floats: -inf - -inf and inf - inf are NaN
        e = [math.exp(t) for t in d]
        s = math.fsum(e)
        out.append([t - math.log(s) for t in d] if log else [t / s for t in e])
    return np.array(out, np.float64).reshape(x.shape)


def run_softmax(be: ember.ComputeBackend, x: np.ndarray, log: bool) -> np.ndarray:
    n = x.shape[-1]
    hx, xv = upload(be, x)
    ho, ov = upload(be, np.zeros_like(x))
    try:
        return run_twice(be, be.record_softmax(xv, ov, n, log), ov)
    finally:
        be.free(hx)
        be.free(ho)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "logsoftmax"])
@pytest.mark.parametrize("magnitude", MAGNITUDES)
@pytest.mark.parametrize("batch", [(), (3,)], ids=["1row", "3rows"])
@pytest.mark.parametrize("d", SIZES)
def test_softmax(be: ember.ComputeBackend, rng: np.random.Generator, d: int, batch: tuple, magnitude: str,
                 log: bool) -> None:
    x = sample(rng, (*batch, d), magnitude)
    check(run_softmax(be, x, log), softmax_ref(x, log), d, (d, batch, magnitude, log))


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "logsoftmax"])
@pytest.mark.parametrize("d", [1, 3, 33])
def test_softmax_many_rows(be: ember.ComputeBackend, rng: np.random.Generator, d: int, log: bool) -> None:
    rows = 70_000 if d < 33 else 7_000
    x = np.concatenate([sample(rng, (rows // 2, d), "wide"), sample(rng, (rows - rows // 2, d), "offset")])
    check(run_softmax(be, x, log), softmax_ref(x, log), d, (d, rows, log))


def test_softmax_many_workgroups(be: ember.ComputeBackend, rng: np.random.Generator,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """70,000 rows, one per workgroup: more than 65,535 workgroups, spread over the grid's y."""
    if be.name == "wgpu":
        from ember.backends.wgpu import norm

        monkeypatch.setattr(norm, "MAX_ROWS_PER_GROUP", 1)
    x = sample(rng, (70_000, 2), "wide")
    check(run_softmax(be, x, False), softmax_ref(x, False), 2, "70,000 workgroups")


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "logsoftmax"])
def test_softmax_long_row(be: ember.ComputeBackend, rng: np.random.Generator, log: bool) -> None:
    """100,000 elements a row: the lanes loop over global memory (no register cache)."""
    x = np.stack([sample(rng, (100_000,), "wide"), sample(rng, (100_000,), "offset")])
    check(run_softmax(be, x, log), softmax_ref(x, log), 100_000, ("100k row", log))


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "logsoftmax"])
@pytest.mark.parametrize("d", [1, 5, 300])
def test_softmax_special_rows(be: ember.ComputeBackend, rng: np.random.Generator, d: int, log: bool) -> None:
    """All -inf -> NaN (ONNX); -inf entries -> 0 / -inf; a NaN or +inf -> NaN; equal entries -> 1/n; a row far
    below the others (log-softmax stays finite, -201.3, where exp underflows)."""
    x = sample(rng, (8, d), "wide")
    x[0] = -np.inf
    x[1, ::2] = -np.inf
    x[2, d // 2] = np.nan
    x[3, d - 1] = np.inf
    x[4] = 7.5
    x[5, 0], x[5, d // 2:] = 0.0, -200.0
    x[6] = np.finfo(np.float32).max
    x[7] = -np.finfo(np.float32).max
    got = run_softmax(be, x, log)
    assert np.isnan(got[0]).all() and np.isnan(got[2]).all() and np.isnan(got[3]).all()
    check(got, softmax_ref(x, log), d, ("special rows", log))


def test_softmax_in_place(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    x = sample(rng, (5, 1000), "wide")
    hx, xv = upload(be, x, pad=3)
    try:
        for log in (False, True):
            got = run_twice(be, be.record_softmax(xv, xv, 1000, log), xv,
                            before=lambda: be.upload(hx, np.concatenate([np.zeros(3, np.float32), x.reshape(-1)])))
            check(got, softmax_ref(x, log), 1000, ("in place", log))
    finally:
        be.free(hx)


def test_softmax_without_subgroups(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The workgroup-memory tree (devices without the 'subgroup' feature), with and without register caching."""
    be = wgpu_be  # a wgpu-only check: runs on wgpu, never skipped
    from ember.backends.wgpu import norm

    monkeypatch.setattr(norm, "USE_SUBGROUPS", False)
    for cache in (norm.CACHE_MAX, 0):
        monkeypatch.setattr(norm, "CACHE_MAX", cache)
        for d, rows in ((33, 70), (4096, 3)):
            x = sample(rng, (rows, d), "wide")
            x[0, :: 3] = -np.inf
            for log in (False, True):
                check(run_softmax(be, x, log), softmax_ref(x, log), d, (d, rows, cache, log))
