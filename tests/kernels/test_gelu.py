"""Gate for the elementwise GELU ops through record_elementwise: "gelu" (erf form, 0.5 x (1 + erf(x / √2)))
and "gelu_tanh" (0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))), on every backend.

Oracle: per element, in float64 Python (math.erf, math.tanh). Tensors of every size in SIZES and 70,000,
magnitudes near 1 / 4 / 1e4 / 1e-4, errors relative to max|ref| of the tensor; then a dense sweep of x in
bands of |x|, both signs (relative to each band's max|ref|). See gate.py for the methodology.

Known failures, reported to the owner of elementwise.py, marked xfail (not strict) so that a fix shows as XPASS:
* the left tail, x in [-8, -3] on its own: both backends compute 0.5 x (1 + erf) / 0.5 x (1 + tanh) in f32, and
  1 + erf(x/√2) cancels (|gelu| < 4e-3 there, per-element error up to 100% near x = -5.5); relative to that
  band's max|ref| the error is ~2e-5 to 1 (cpu too). The random tests reflect inputs in (-12, -3) to positive so
  that a small tensor cannot consist of tail values alone. Fix: x * Φ(x) with an erfc that is accurate in
  relative terms for the erf form; x * sigmoid(2u) (= 0.5 x (1 + tanh u), no cancellation) for the tanh form.
* the "erf" op alone on wgpu: erf_f32 (Abramowitz-Stegun 7.1.26) has an absolute error up to ~6e-7 (its
  comment says 1.5e-7), so its relative error passes 1e-5 for |x| below ~0.046 (1e-3 at |x| = 1e-4).
  GELU itself is unaffected (erf is multiplied by x there).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember.backends.expr import call, inp

from .gate import SIZES, TOL, check, run_twice, sample, upload

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def ref_one(op: str, v: float) -> float:
    if op == "gelu":
        return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))
    if op == "gelu_tanh":
        return 0.5 * v * (1.0 + math.tanh(SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)))
    if op == "erf":
        return math.erf(v)
    raise ValueError(op)


def reference(op: str, x: np.ndarray) -> np.ndarray:
    return np.array([ref_one(op, v) for v in x.reshape(-1).tolist()], np.float64).reshape(x.shape)


def run_op(be: ember.ComputeBackend, op: str, x: np.ndarray) -> np.ndarray:
    hx, xv = upload(be, x)
    ho, ov = upload(be, np.zeros_like(x))
    try:
        return run_twice(be, be.record_elementwise(call(op, inp(0)), [xv], ov), ov)
    finally:
        be.free(hx)
        be.free(ho)


@pytest.mark.parametrize("magnitude", ["normal", "wide", "large", "tiny"])
@pytest.mark.parametrize("d", [*SIZES, 70_000])
@pytest.mark.parametrize("op", ["gelu", "gelu_tanh"])
def test_gelu(be: ember.ComputeBackend, rng: np.random.Generator, op: str, d: int, magnitude: str) -> None:
    x = sample(rng, (d,), magnitude)
    x = np.where((x > -12) & (x < -3), -x, x)  # the left tail alone is test_gelu_left_tail's
    check(run_op(be, op, x), reference(op, x), d, (op, d, magnitude))


def sweep(lo: float, hi: float) -> np.ndarray:
    """Both signs of |x| in [lo, hi): a geometric grid plus random points, as float32."""
    mags = np.concatenate([np.geomspace(lo, hi, 4001, endpoint=False),
                           np.exp(np.random.default_rng().uniform(math.log(lo), math.log(hi), 4000))])
    return np.concatenate([mags, -mags]).astype(np.float32)


BANDS = [(1e-8, 1e-6), (1e-6, 1e-4), (1e-4, 1e-2), (1e-2, 0.5), (0.5, 2.0), (2.0, 6.0), (6.0, 1e4)]


@pytest.mark.parametrize("band", BANDS, ids=[f"{lo:g}-{hi:g}" for lo, hi in BANDS])
@pytest.mark.parametrize("op", ["gelu", "gelu_tanh", "erf"])
def test_gelu_sweep(be: ember.ComputeBackend, request: pytest.FixtureRequest, op: str, band: tuple) -> None:
    if op == "erf" and be.name == "wgpu" and band[1] <= 0.01:
        request.applymarker(pytest.mark.xfail(reason="erf_f32 (elementwise.py): absolute error ~6e-7, relative "
                                              "error > 1e-5 for |x| < 0.046", strict=False))
    x = sweep(*band)
    got, ref = run_op(be, op, x), reference(op, x)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    worst = float(x[np.argmax(np.abs(got - ref))])
    assert err < TOL, f"{op} over |x| in {band}: relative error {err:.3g}, worst at x = {worst!r}"


@pytest.mark.xfail(reason="0.5 x (1 + erf) and 0.5 x (1 + tanh) cancel in f32 for x < -3 (elementwise.py)",
                   strict=False)
@pytest.mark.parametrize("op", ["gelu", "gelu_tanh"])
def test_gelu_left_tail(be: ember.ComputeBackend, op: str) -> None:
    x = -np.geomspace(3.0, 8.0, 20001).astype(np.float32)
    got, ref = run_op(be, op, x), reference(op, x)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    worst = float(x[np.argmax(np.abs(got - ref))])
    assert err < TOL, f"{op} over x in [-8, -3]: relative error {err:.3g}, worst at x = {worst!r}"
