"""Gate for the fused RMSNorm kernel, record_norm("rmsnorm"), on every backend.

Oracle: per row, in float64 Python loops: x / sqrt(fsum(x²) / n + eps) * scale (+ bias when given). Rows of
every size in SIZES, one row and three, 70,000 rows, a 100,000-element row, magnitudes near 1 / 1e4 /
1e4 + noise / 1e-4; see gate.py for the methodology.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember.backends.base import View

from .gate import F32, MAGNITUDES, SIZES, check, run_twice, sample, upload


def rmsnorm_ref(x: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None, eps: float) -> np.ndarray:
    n = x.shape[-1]
    sc = [1.0] * n if scale is None else [float(v) for v in scale.reshape(-1)]
    bi = [0.0] * n if bias is None else [float(v) for v in bias.reshape(-1)]
    eps = float(np.float32(eps))  # the value the kernels use
    out = []
    for row in x.reshape(-1, n).tolist():
        r = 1.0 / math.sqrt(math.fsum(v * v for v in row) / n + eps)
        out.append([v * r * s + b for v, s, b in zip(row, sc, bi, strict=True)])
    return np.array(out, np.float64).reshape(x.shape)


def eps_for(magnitude: str) -> float:
    # Tiny inputs (mean square 1e-8) with a tiny eps, so that the data, not eps, sets the scale.
    return 1e-12 if magnitude == "tiny" else 1e-6


def run_rmsnorm(be: ember.ComputeBackend, x: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None,
                eps: float) -> np.ndarray:
    n = x.shape[-1]
    hx, xv = upload(be, x)
    ho, ov = upload(be, np.zeros_like(x))
    hs, sv = upload(be, scale) if scale is not None else (None, None)
    hb, bv = upload(be, bias) if bias is not None else (None, None)
    try:
        return run_twice(be, be.record_norm("rmsnorm", xv, sv, bv, ov, n, eps), ov)
    finally:
        for h in (hx, ho, hs, hb):
            if h is not None:
                be.free(h)


@pytest.mark.parametrize("magnitude", MAGNITUDES)
@pytest.mark.parametrize("batch", [(), (3,)], ids=["1row", "3rows"])
@pytest.mark.parametrize("d", SIZES)
def test_rmsnorm(be: ember.ComputeBackend, rng: np.random.Generator, d: int, batch: tuple, magnitude: str) -> None:
    x = sample(rng, (*batch, d), magnitude)
    scale = sample(rng, (d,), "normal")
    eps = eps_for(magnitude)
    got = run_rmsnorm(be, x, scale, None, eps)
    check(got, rmsnorm_ref(x, scale, None, eps), d, (d, batch, magnitude))


@pytest.mark.parametrize("d", [1, 3, 33])
def test_rmsnorm_many_rows(be: ember.ComputeBackend, rng: np.random.Generator, d: int) -> None:
    rows = 70_000 if d < 33 else 7_000
    x = np.concatenate([sample(rng, (rows // 2, d), "normal"), sample(rng, (rows - rows // 2, d), "tiny")])
    scale = sample(rng, (d,), "normal")
    got = run_rmsnorm(be, x, scale, None, 1e-12)
    check(got, rmsnorm_ref(x, scale, None, 1e-12), d, (d, rows))


def test_rmsnorm_many_workgroups(be: ember.ComputeBackend, rng: np.random.Generator,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """70,000 rows, one per workgroup: more than 65,535 workgroups, spread over the grid's y."""
    if be.name == "wgpu":
        from ember.backends.wgpu import norm

        monkeypatch.setattr(norm, "MAX_ROWS_PER_GROUP", 1)
    x = sample(rng, (70_000, 2), "large")
    got = run_rmsnorm(be, x, None, None, 1e-6)
    check(got, rmsnorm_ref(x, None, None, 1e-6), 2, "70,000 workgroups")


def test_rmsnorm_long_row(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """100,000 elements a row: the lanes loop over global memory (no register cache)."""
    x = np.stack([sample(rng, (100_000,), "offset"), sample(rng, (100_000,), "tiny")])
    scale = sample(rng, (100_000,), "normal")
    got = run_rmsnorm(be, x, scale, None, 1e-12)
    check(got, rmsnorm_ref(x, scale, None, 1e-12), 100_000, "100k row")


@pytest.mark.parametrize("d", [7, 128, 1000])
def test_rmsnorm_views(be: ember.ComputeBackend, rng: np.random.Generator, d: int) -> None:
    """No scale, a bias, a stride-0 (broadcast) scale, a strided scale, views at an offset, in place."""
    x = np.stack([sample(rng, (d,), m) for m in MAGNITUDES])
    s, b = sample(rng, (2 * d,), "normal"), sample(rng, (d,), "normal")
    hx, xv = upload(be, x, pad=5)
    ho, ov = upload(be, np.zeros_like(x), pad=3)
    hs, _ = upload(be, s, pad=1)
    hb, bv = upload(be, b)
    try:
        strided = View(hs, F32, (d,), (2,), 1)  # every other element of s
        bcast = View(hs, F32, (1, d), (0, 0), 2)  # s[1] broadcast
        cases = [(None, None, None, None), (None, None, bv, b), (bcast, np.full(d, s[1]), None, None),
                 (strided, s[::2], bv, b)]
        for sv, sref, bview, bref in cases:
            got = run_twice(be, be.record_norm("rmsnorm", xv, sv, bview, ov, d, 1e-6), ov)
            check(got, rmsnorm_ref(x, sref, bref, 1e-6), d, (d, sv, bview))

        def reset() -> None:
            be.upload(hx, np.concatenate([np.zeros(5, np.float32), x.reshape(-1)]))

        got = run_twice(be, be.record_norm("rmsnorm", xv, strided, None, xv, d, 1e-6), xv, before=reset)
        check(got, rmsnorm_ref(x, s[::2], None, 1e-6), d, (d, "in place"))
    finally:
        for h in (hx, ho, hs, hb):
            be.free(h)


def test_rmsnorm_zero_and_nan_rows(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """A zero row stays zero (eps > 0); a NaN makes its row NaN; an inf, its own element NaN (inf * 0) and the
    rest of its row zero."""
    d = 300
    x = sample(rng, (4, d), "normal")
    x[0] = 0.0
    x[1, 17] = np.nan
    x[2, 5] = np.inf
    got = run_rmsnorm(be, x, None, None, 1e-6)
    np.testing.assert_array_equal(got[0], np.zeros(d, np.float32))
    assert np.isnan(got[1]).all() and np.isnan(got[2, 5]) and (got[2, np.arange(d) != 5] == 0).all()
    check(got, rmsnorm_ref(x, None, None, 1e-6), d, "special rows")


def test_rmsnorm_without_subgroups(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The workgroup-memory tree (devices without the 'subgroup' feature), with and without register caching."""
    be = wgpu_be  # a wgpu-only check: runs on wgpu, never skipped
    from ember.backends.wgpu import norm

    monkeypatch.setattr(norm, "USE_SUBGROUPS", False)
    for cache in (norm.CACHE_MAX, 0):
        monkeypatch.setattr(norm, "CACHE_MAX", cache)
        for d, rows in ((33, 70), (4096, 3)):
            x = sample(rng, (rows, d), "large")
            scale = sample(rng, (d,), "normal")
            got = run_rmsnorm(be, x, scale, None, 1e-6)
            check(got, rmsnorm_ref(x, scale, None, 1e-6), d, (d, rows, cache))
