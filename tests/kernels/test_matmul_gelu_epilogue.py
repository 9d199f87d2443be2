"""Gate for MatMul + bias + GELU in one kernel: record_matmul(a, b, out, bias=bias, beta=1.0, act=gelu(inp 0)),
the exact (erf) form "gelu" and the tanh form "gelu_tanh", on every backend.

Oracle: float64 Python loops: each element math.fsum of a row of a times a column of b over K, plus the bias
(one vector broadcast along the rows), then GELU written in its non-cancelling forms: 0.5 x erfc(-x / √2) and
x sigmoid(2u) with u = √(2/π) (x + 0.044715 x³). Shapes walk M, N, K over {1, 3, 17, 64, 129} and K up to 1024,
with b stored as (K, N) or as a Linear weight (N, K) seen transposed; errors relative to max|ref| of each batch
matrix at 1e-4 (a product over a long dot product, as matmul is judged in this project); fresh inputs at
magnitudes near 1, 4, 1e4 and 1e-4; outputs poisoned with NaN before each of two runs that must be bitwise
identical.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember.core.expr import call, inp

from .gate import row_errors, run_twice, upload

TOL = 1e-4
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
OPS = ["gelu", "gelu_tanh"]


def gelu(op: str, x: float) -> float:
    if op == "gelu":
        return 0.5 * x * math.erfc(-x / math.sqrt(2.0))
    z = 2.0 * SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
    sig = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
    return x * sig


def reference(op: str, a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """(B, M, K) @ (B, K, N) + bias (N,) then GELU, in float64 loops."""
    nb, m, _ = a.shape
    n = b.shape[2]
    out = np.empty((nb, m, n), np.float64)
    bl = bias.tolist()
    for z in range(nb):
        cols = b[z].T.tolist()
        for i, row in enumerate(a[z].tolist()):
            for j, col in enumerate(cols):
                out[z, i, j] = gelu(op, math.fsum(x * y for x, y in zip(row, col, strict=True)) + bl[j])
    return out


def run_case(be: ember.ComputeBackend, rng: np.random.Generator, op: str, nb: int, m: int, n: int, k: int,
             magnitude: str = "normal", b_layout: str = "kn") -> None:
    mag = {"normal": 1.0, "wide": 4.0, "large": 1e4, "tiny": 1e-4}[magnitude]
    a = rng.standard_normal((nb, m, k)).astype(np.float32)
    # b scaled by 1/√K so a @ b is near `mag` whatever K is: the interesting part of GELU at magnitude 1.
    b = (mag / math.sqrt(k) * rng.standard_normal((nb, k, n))).astype(np.float32)
    bias = (mag * rng.standard_normal(n)).astype(np.float32)
    handles = []
    try:
        ha, av = upload(be, a, pad=1)
        handles.append(ha)
        if b_layout == "nk":  # a Linear weight (N, K), read transposed through the view's strides
            hb, bv = upload(be, b.transpose(0, 2, 1), pad=2)
            bv = bv.permute((0, 2, 1))
        else:
            hb, bv = upload(be, b, pad=2)
        handles.append(hb)
        hbias, biasv = upload(be, bias, pad=3)
        handles.append(hbias)
        ho, ov = upload(be, np.zeros((nb, m, n), np.float32))
        handles.append(ho)
        steps = be.record_matmul(av, bv, ov, bias=biasv.broadcast_to((nb, m, n)), beta=1.0, act=call(op, inp(0)))
        got = np.asarray(run_twice(be, steps, ov), np.float64)
    finally:
        for h in handles:
            be.free(h)
    ref = reference(op, a, b, bias)
    err = row_errors(got, ref, m * n)  # one row per batch matrix
    worst = int(np.argmax(err))
    assert err[worst] < TOL, (f"{op} {(nb, m, n, k)} {magnitude} {b_layout}: batch {worst} relative error "
                              f"{err[worst]:.3g} >= {TOL}")


# A walk over M, N, K in {1, 3, 17, 64, 129} (each size in each position, edge tiles everywhere) plus K up to
# 1024; each shape compiles its own kernel on wgpu, hence no full cross product.
SHAPES = [(1, 1, 1), (3, 3, 3), (17, 17, 17), (64, 64, 64), (129, 129, 129), (1, 129, 17), (129, 1, 64),
          (3, 17, 129), (17, 3, 1), (64, 129, 3), (129, 17, 1), (17, 64, 1024), (3, 129, 1024), (1, 3, 1024),
          (64, 1, 1000)]


@pytest.mark.parametrize("m,n,k", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
@pytest.mark.parametrize("op", OPS)
def test_shapes(be: ember.ComputeBackend, rng: np.random.Generator, op: str, m: int, n: int, k: int) -> None:
    run_case(be, rng, op, 1, m, n, k)


@pytest.mark.parametrize("magnitude", ["wide", "large", "tiny"])
@pytest.mark.parametrize("m,n,k", [(17, 64, 129), (3, 17, 1024)])
@pytest.mark.parametrize("op", OPS)
def test_magnitudes(be: ember.ComputeBackend, rng: np.random.Generator, op: str, m: int, n: int, k: int,
                    magnitude: str) -> None:
    run_case(be, rng, op, 1, m, n, k, magnitude)


@pytest.mark.parametrize("m,n,k", [(17, 129, 64), (129, 3, 17), (1, 64, 1024)])
@pytest.mark.parametrize("op", OPS)
def test_linear_weight_and_batch(be: ember.ComputeBackend, rng: np.random.Generator, op: str, m: int, n: int,
                                 k: int) -> None:
    """b as a Linear weight (N, K) seen transposed, two batch matrices sharing the bias."""
    run_case(be, rng, op, 2, m, n, k, b_layout="nk")
