"""Gate for the elementwise GELU ops through record_elementwise: "gelu" (erf form, 0.5 x (1 + erf(x / √2)))
and "gelu_tanh" (0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))), on every backend.

Oracle: per element, in float64 Python (math.erf, math.tanh). Tensors of every size in SIZES and 70,000,
magnitudes near 1 / 4 / 1e4 / 1e-4, errors relative to max|ref| of the tensor; then a dense sweep of x in
bands of |x|, both signs (relative to each band's max|ref|). See gate.py for the methodology.

The oracle is exact in the left tail: 0.5 x erfc(-x/√2) and x sigmoid(2u) (= 0.5 x (1 + tanh u)) in float64,
so the kernels must not cancel there either (they use the same forms in f32).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember.core.expr import call, inp

from .gate import SIZES, TOL, check, run_twice, sample, upload

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def ref_one(op: str, v: float) -> float:
    if op == "gelu":
        return 0.5 * v * math.erfc(-v / math.sqrt(2.0))
    if op == "gelu_tanh":
        z = 2.0 * SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)
        sig = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
        return v * sig
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
    check(run_op(be, op, x), reference(op, x), d, (op, d, magnitude))


def sweep(lo: float, hi: float) -> np.ndarray:
    """Both signs of |x| in [lo, hi): a geometric grid plus random points, as float32."""
    mags = np.concatenate([np.geomspace(lo, hi, 4001, endpoint=False),
                           np.exp(np.random.default_rng().uniform(math.log(lo), math.log(hi), 4000))])
    return np.concatenate([mags, -mags]).astype(np.float32)


BANDS = [(1e-8, 1e-6), (1e-6, 1e-4), (1e-4, 1e-2), (1e-2, 0.5), (0.5, 2.0), (2.0, 6.0), (6.0, 1e4)]


@pytest.mark.parametrize("band", BANDS, ids=[f"{lo:g}-{hi:g}" for lo, hi in BANDS])
@pytest.mark.parametrize("op", ["gelu", "gelu_tanh", "erf"])
def test_gelu_sweep(be: ember.ComputeBackend, op: str, band: tuple) -> None:
    x = sweep(*band)
    got, ref = run_op(be, op, x), reference(op, x)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    worst = float(x[np.argmax(np.abs(got - ref))])
    assert err < TOL, f"{op} over |x| in {band}: relative error {err:.3g}, worst at x = {worst!r}"


@pytest.mark.parametrize("op", ["gelu", "gelu_tanh"])
def test_gelu_left_tail(be: ember.ComputeBackend, op: str) -> None:
    x = -np.geomspace(3.0, 8.0, 20001).astype(np.float32)
    got, ref = run_op(be, op, x), reference(op, x)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    worst = float(x[np.argmax(np.abs(got - ref))])
    assert err < TOL, f"{op} over x in [-8, -3]: relative error {err:.3g}, worst at x = {worst!r}"
