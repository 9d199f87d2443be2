"""ops/winograd.py: the F(m, 3) algorithm over the shared layouts matches a direct float64 convolution."""

from __future__ import annotations

import numpy as np
import pytest

from ember.core import winograd as wg


def direct(x: np.ndarray, w: np.ndarray, pads: tuple[int, int, int, int]) -> np.ndarray:
    n, c, h, width = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    p, q = xp.shape[2] - 2, xp.shape[3] - 2
    out = np.zeros((n, w.shape[0], p, q))
    for i in range(3):
        for j in range(3):
            out += np.einsum("kc,ncpq->nkpq", w[:, :, i, j].astype(np.float64), xp[:, :, i:i + p, j:j + q])
    return out


@pytest.mark.parametrize("m", wg.TILES)
@pytest.mark.parametrize("hw,pads", [((7, 7), (1, 1, 1, 1)), ((8, 5), (0, 0, 0, 0)), ((9, 11), (1, 2, 0, 1)),
                                     ((3, 3), (1, 1, 1, 1)), ((1, 1), (1, 1, 1, 1))])
def test_reference_matches_direct(m: int, hw: tuple[int, int], pads: tuple[int, int, int, int]) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, *hw))
    w = rng.standard_normal((4, 5, 3, 3))
    ref = direct(x, w, pads)
    got = wg.reference(x, wg.transform_weights(w, m), pads, m, ref.shape[2:])
    assert got.shape == ref.shape
    # U is rounded to float32; F(4, 3)'s larger transform entries amplify that rounding a little more.
    np.testing.assert_allclose(got, ref, rtol=0, atol=(2e-6 if m == 2 else 2e-5) * np.abs(ref).max())


def test_transform_weights_layout() -> None:
    w = np.zeros((2, 3, 3, 3))
    w[1, 2, 1, 1] = 1.0  # a centred delta: G e G^T is the outer product of G's middle column
    u = wg.transform_weights(w, 2)
    assert u.shape == (16, 2, 3) and u.dtype == np.float32
    col = np.array([0, 0.5, -0.5, 0])
    np.testing.assert_allclose(u[:, 1, 2].reshape(4, 4), np.outer(col, col))
    assert not u[:, 0].any() and not u[:, 1, :2].any()


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="F\\(3, 3\\)"):
        wg.matrices(3)
    with pytest.raises(ValueError, match="\\(K, C, 3, 3\\)"):
        wg.transform_weights(np.zeros((2, 3, 5, 5)), 2)
    assert wg.eligible((3, 3), (1, 1), (1, 1), 1)
    assert not wg.eligible((3, 3), (2, 2), (1, 1), 1)
    assert not wg.eligible((3, 3), (1, 1), (1, 1), 2)
