"""Winograd convolution F(m x m, 3 x 3) for 3x3, stride-1, undilated, ungrouped convolutions.

A 3x3 convolution computed on (m + 2) x (m + 2) input tiles that each give an m x m output tile, as
(alpha = m + 2):

    U[xi, nu, k, c] = (G  g[k, c]  G^T)[xi, nu]            the filter, transformed once at load
    V[xi, nu, c, t] = (B^T d[c, t] B)[xi, nu]             input tile t of channel c
    M[xi, nu]       = U[xi, nu] @ V[xi, nu]                alpha^2 independent (K x C) @ (C x T) products
    Y[k, t]         = A^T M[:, :, k, t] A                  the m x m output tile

F(2, 3) does 16 products of K x C x (N*HW/4) instead of one of K x 9C x N*HW (2.25x fewer multiply-adds); F(4, 3)
does 36 of K x C x (N*HW/16) (4x fewer) at some cost in rounding: its transforms have entries up to 8 and 1/24.

Layouts shared by every backend (what `record_conv_winograd` receives and produces):
- U: (alpha*alpha, K, C), row-major, filter-transform position p = xi * alpha + nu first.
- Tiles: t = (n * tiles_h + th) * tiles_w + tw over N x tiles_h x tiles_w, tiles_h = ceil(P / m) for the
  P x Q output; input tile t starts at row th*m - pad_top, column tw*m - pad_left (zeros outside the input).
"""

from __future__ import annotations

from fractions import Fraction as Fr

import numpy as np

# Interpolation points: 0, 1, -1 (F(2,3)); 0, 1, -1, 2, -2 (F(4,3)); plus the point at infinity.
_MATRICES: dict[int, tuple[list, list, list]] = {
    2: (
        [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],  # B^T (4 x 4)
        [[1, 0, 0], [Fr(1, 2), Fr(1, 2), Fr(1, 2)], [Fr(1, 2), Fr(-1, 2), Fr(1, 2)], [0, 0, 1]],  # G (4 x 3)
        [[1, 1, 1, 0], [0, 1, -1, -1]],  # A^T (2 x 4)
    ),
    4: (
        [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
         [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[Fr(1, 4), 0, 0], [Fr(-1, 6), Fr(-1, 6), Fr(-1, 6)], [Fr(-1, 6), Fr(1, 6), Fr(-1, 6)],
         [Fr(1, 24), Fr(1, 12), Fr(1, 6)], [Fr(1, 24), Fr(-1, 12), Fr(1, 6)], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
    ),
}
TILES = tuple(_MATRICES)


def matrices(m: int) -> tuple[list, list, list]:
    """(B^T, G, A^T) of F(m, 3) as exact rationals (kernel generators print them as literals)."""
    if m not in _MATRICES:
        raise ValueError(f"Winograd F({m}, 3) is not available; output tiles {TILES} are")
    return _MATRICES[m]


def float_matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bt, g, at = matrices(m)
    return tuple(np.array([[float(v) for v in row] for row in mat]) for mat in (bt, g, at))


def eligible(kernel: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...], groups: int) -> bool:
    """Winograd applies to 2-D 3x3 convolutions with stride 1, no dilation, one group."""
    return tuple(kernel) == (3, 3) and tuple(strides) == (1, 1) and tuple(dilations) == (1, 1) and groups == 1


def tiles(p: int, q: int, m: int) -> tuple[int, int]:
    """(tiles_h, tiles_w) covering a P x Q output with m x m tiles."""
    return -(-p // m), -(-q // m)


def transform_weights(w: np.ndarray, m: int) -> np.ndarray:
    """U = G g G^T for every (k, c): (K, C, 3, 3) -> (alpha*alpha, K, C) float32, computed in float64."""
    if w.ndim != 4 or w.shape[2:] != (3, 3):
        raise ValueError(f"Winograd weights must be (K, C, 3, 3), got {w.shape}")
    _, g, _ = float_matrices(m)
    u = np.einsum("ai,kcij,bj->abkc", g, w.astype(np.float64), g)
    a = m + 2
    return np.ascontiguousarray(u.reshape(a * a, w.shape[0], w.shape[1]), dtype=np.float32)


def reference(x: np.ndarray, u: np.ndarray, pads: tuple[int, int, int, int], m: int,
              out_hw: tuple[int, int]) -> np.ndarray:
    """The whole algorithm in float64 numpy over the shared layouts: x (N, C, H, W), U as transform_weights
    gives -> (N, K, P, Q). The specification the backends' kernels follow (tests compare against it)."""
    bt, _, at = float_matrices(m)
    a = m + 2
    n, c, h, w = x.shape
    k = u.shape[1]
    p, q = out_hw
    th, tw = tiles(p, q, m)
    top, left = pads[0], pads[1]
    # Pad so every tile's (alpha x alpha) window lies inside: rows [-top, th*m + 2 - top).
    xp = np.zeros((n, c, th * m + 2, tw * m + 2))
    src = x[:, :, max(0, -top):, max(0, -left):].astype(np.float64)
    r0, c0 = max(0, top), max(0, left)
    rows, cols = min(src.shape[2], xp.shape[2] - r0), min(src.shape[3], xp.shape[3] - c0)
    xp[:, :, r0:r0 + rows, c0:c0 + cols] = src[:, :, :rows, :cols]
    win = np.lib.stride_tricks.sliding_window_view(xp, (a, a), axis=(2, 3))[:, :, ::m, ::m]  # N,C,th,tw,a,a
    v = np.einsum("ai,nctsij,bj->abcnts", bt, win, bt).reshape(a * a, c, n * th * tw)
    mm = np.matmul(u.astype(np.float64), v).reshape(a, a, k, n, th, tw)
    y = np.einsum("ia,abknts,jb->nktisj", at, mm, at).reshape(n, k, th * m, tw * m)
    return y[:, :, :p, :q]
