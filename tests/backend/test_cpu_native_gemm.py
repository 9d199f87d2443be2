"""The cpu backend's compiled GEMM over weights packed at load (backends/cpu/_gemm.c, native.py): the kernel
against a float64 oracle over panel, column-block, K-slice and column-chunk edges; its error contract; and the
convs that take it (split by input channels), with it and without."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backends.cpu import native, parallel

from . import test_cpu_split as split

needs_native = pytest.mark.skipif(not native.available(),
                                  reason="the compiled GEMM is not built here, or this CPU lacks AVX-512F")


@needs_native
@pytest.mark.parametrize("m,k,n", [
    (512, 2304, 49),   # ResNet-18 layer 4 at batch 1, one thread's input channels
    (32, 256, 7),      # exactly one panel, one K slice, one column block
    (33, 257, 8),      # one past each
    (100, 37, 13),     # short K, tails everywhere
    (1, 5, 1),
    (64, 600, 450),    # several K slices and column chunks (196 columns each)
    (96, 1152, 196),
])
def test_gemm_matches_float64(rng: np.random.Generator, m: int, k: int, n: int) -> None:
    w = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n + 3), dtype=np.float32)[:, :n]  # rows strided, as im2col columns can be
    c = np.full((m, n + 5), np.nan, np.float32)[:, :n]
    bias = rng.standard_normal(m, dtype=np.float32)
    before = native.calls()
    native.gemm_step(native.pack(w), b, c, bias)()
    assert native.calls() == before + 1
    ref = w.astype(np.float64) @ b.astype(np.float64) + bias[:, None]
    scale = np.abs(w).astype(np.float64) @ np.abs(b).astype(np.float64) + np.abs(bias)[:, None]
    assert np.all(np.abs(c - ref) <= 2e-6 * scale)


@needs_native
def test_gemm_relu_keeps_nan(rng: np.random.Generator) -> None:
    w = rng.standard_normal((40, 20), dtype=np.float32)
    b = rng.standard_normal((20, 9), dtype=np.float32)
    b[3, 4] = np.nan
    c = np.empty((40, 9), np.float32)
    native.gemm_step(native.pack(w), b, c, relu=True)()
    ref = np.maximum(w.astype(np.float64) @ b.astype(np.float64), 0)
    assert np.isnan(c[:, 4]).all()
    keep = np.ones(9, bool)
    keep[4] = False
    np.testing.assert_allclose(c[:, keep], ref[:, keep], rtol=1e-5, atol=1e-5)
    assert (c[:, keep] >= 0).all()


@needs_native
def test_gemm_rejects_bad_operands(rng: np.random.Generator) -> None:
    w = native.pack(rng.standard_normal((40, 20), dtype=np.float32))
    b = np.zeros((20, 9), np.float32)
    c = np.zeros((40, 9), np.float32)
    with pytest.raises(ValueError, match="b must be a 2-D float32 array with contiguous rows"):
        native.gemm_step(w, b.astype(np.float64), c)
    with pytest.raises(ValueError, match="c must be a 2-D float32 array with contiguous rows"):
        native.gemm_step(w, b, np.zeros((9, 40), np.float32).T)
    with pytest.raises(ValueError, match=r"a \(40, 20\) weight times b \(20, 9\) does not give c \(41, 9\)"):
        native.gemm_step(w, b, np.zeros((41, 9), np.float32))
    with pytest.raises(ValueError, match=r"a \(40, 20\) weight times b \(21, 9\)"):
        native.gemm_step(w, np.zeros((21, 9), np.float32), c)
    with pytest.raises(ValueError, match="bias of 39 for 40 rows"):
        native.gemm_step(w, b, c, np.zeros(39, np.float32))


# test_cpu_split's convs with more output channels than positions and products large enough to split: split
# by input channels.
CHANNEL_SPLITS = split.CONVS[2:6]


@pytest.mark.parametrize("native_on", [True, False], ids=["native", "numpy"])
@pytest.mark.parametrize("conv", CHANNEL_SPLITS)
def test_weight_heavy_convs_with_and_without_it(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator, conv,
                                                native_on: bool) -> None:
    """Convs split by input channels (more output channels than positions) multiply through the compiled GEMM
    where it is available, and through numpy where it is off; the same result either way."""
    if native_on and not native.available():
        pytest.skip("the compiled GEMM is not built here, or this CPU lacks AVX-512F")
    if not native_on:
        monkeypatch.setattr(native, "_LIB", None)
    monkeypatch.setattr(parallel, "pool", lambda: split._POOL)
    before = native.calls()
    split.test_conv_split_matches_reference(*conv, rng=rng)
    assert (native.calls() > before) == native_on
