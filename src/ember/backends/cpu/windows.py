"""Window geometry shared by the convs and the pooling: which input rows and rectangles an output band or a
kernel tap reads, and the im2col copy built from it."""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .steps import Step

# A tap's output rectangle and the input rectangle it reads there, per kernel tap (i, j).
Tap = tuple[tuple[int, int], tuple[slice, slice], tuple[slice, slice]]


def row_band(h: int, pad: int, st: int, extent: int, p0: int, p1: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The input rows [a, b) that output rows [p0, p1) of a window op read, and the band's own (top, bottom)
    padding: a conv over x[..., a:b, :] with those pads gives exactly those output rows."""
    lo, hi = p0 * st - pad, (p1 - 1) * st + extent - pad
    a = min(max(0, lo), h)
    b = max(a, min(h, hi))
    return (a, b), (a - lo, hi - b)


def padded_rows(xv: np.ndarray, pads: tuple[int, int, int, int], sh: int, r: int, p0: int,
                p1: int) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """For output rows [p0, p1) of a conv over xv (N, C, H, W): a zeroed buffer (C, rows, padded width) holding one
    image's input rows with the padding around them, the view its input rows go into, and which input rows
    [a, b) those are. The padding is written here, once; a run copies the rows in."""
    _, c, h, wd = xv.shape
    (xa, xb), (top, bottom) = row_band(h, pads[0], sh, r, p0, p1)
    xp = np.zeros((c, top + xb - xa + bottom, pads[1] + wd + pads[3]), xv.dtype)
    return xp, xp[:, top:top + xb - xa, pads[1]:pads[1] + wd], (xa, xb)


def _span(o: int, i: int, st: int, pad: int, size: int) -> tuple[int, int]:
    """Output positions [lo, hi) (of o) whose input index lo*st + i - pad lies in [0, size)."""
    return max(0, -(-(pad - i) // st)), min(o, (size - 1 + pad - i) // st + 1)


def taps(x: np.ndarray, y: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int],
         pads: tuple[int, int, int, int], dilation: tuple[int, int]) -> list[Tap]:
    """Per kernel tap of a window op from x to y (the last two dims: height, width): (i, j), the output
    rectangle it reaches and the input rectangle it reads there (taps that only see padding are left out)."""
    (r, s), (sh, sw), (pt, pl, _, _), (dh, dw) = kernel, stride, pads, dilation
    h, w = x.shape[-2:]
    p, q = y.shape[-2:]
    out = []
    for i in range(r):
        a0, a1 = _span(p, i * dh, sh, pt, h)
        for j in range(s):
            b0, b1 = _span(q, j * dw, sw, pl, w)
            if a1 > a0 and b1 > b0:
                y0, x0 = a0 * sh + i * dh - pt, b0 * sw + j * dw - pl
                out.append(((i, j), (slice(a0, a1), slice(b0, b1)),
                            (slice(y0, y0 + sh * (a1 - a0 - 1) + 1, sh), slice(x0, x0 + sw * (b1 - b0 - 1) + 1, sw))))
    return out


def im2col(xv: np.ndarray, cols: np.ndarray, stride: tuple[int, int], pads: tuple[int, int, int, int],
           dilation: tuple[int, int]) -> Step:
    """A step copying every kernel tap of xv (n, c, h, w) into cols (n, c, r, s, p, q).

    Each tap is one copy of the input rectangle it reads into the output rectangle it covers, plus zero
    fills of the thin strips where it reads padding: no padded copy of the input is made.
    A strided conv with many taps (a 7x7/2 stem) first splits the input into its sh*sw phases (the padding
    included), so each tap copies unit-stride rows instead of gathering every other element.
    """
    n, c = xv.shape[:2]
    _, _, r, s, p, q = cols.shape
    (sh, sw), (dh, dw) = stride, dilation
    zeros: list[np.ndarray] = []
    if r * s > 4 * sh * sw:
        # phase (a, b)[u, v] = padded input[u*sh + a, v*sw + b]; tap (i, j) reads phase (i*dh % sh, j*dw % sw)
        # from (i*dh // sh, j*dw // sw) on, p x q elements.
        ph_h, ph_w = ((r - 1) * dh) // sh + p, ((s - 1) * dw) // sw + q
        phases = np.zeros((sh, sw, n, c, ph_h, ph_w), xv.dtype)
        # Filling the phases is itself a window op: an sh x sw kernel at stride (sh, sw), one tap per phase.
        pairs = [(phases[a, b][..., o[0], o[1]], xv[..., t[0], t[1]])
                 for (a, b), o, t in taps(xv, phases, stride, stride, pads, (1, 1))]
        # The taps reading one phase are evenly spaced in i and j and read it at evenly spaced offsets: one
        # strided copy per phase instead of one per tap.
        rows, cs = _phase_taps(r, dh, sh), _phase_taps(s, dw, sw)
        for a, (i0, di, ni, u0, du) in rows.items():
            for b, (j0, dj, nj, v0, dv) in cs.items():
                ph = phases[a, b, :, :, u0:, v0:]
                sn, sc, su, sv = ph.strides
                src = as_strided(ph, (n, c, ni, nj, p, q), (sn, sc, du * su, dv * sv, su, sv), writeable=False)
                pairs.append((cols[:, :, i0: i0 + di * (ni - 1) + 1: di, j0: j0 + dj * (nj - 1) + 1: dj], src))
    else:
        reach = {ij: (o, t) for ij, o, t in taps(xv, cols, (r, s), stride, pads, dilation)}
        pairs = [(cols[:, :, i, j, o[0], o[1]], xv[..., t[0], t[1]]) for (i, j), (o, t) in reach.items()]
        # The buffer is shared: where a tap reads padding, its rows are zeroed on every run.
        for i in range(r):
            for j in range(s):
                tap = cols[:, :, i, j]
                if (i, j) not in reach:
                    zeros.append(tap)
                    continue
                (tap_rows, tap_cols), _ = reach[i, j]
                strips = [tap[..., :tap_rows.start, :], tap[..., tap_rows.stop:, :],
                          tap[..., tap_rows, :tap_cols.start], tap[..., tap_rows, tap_cols.stop:]]
                zeros += [z for z in strips if z.size]

    def fill() -> None:
        for z in zeros:
            z.fill(0)
        for d, src in pairs:
            np.copyto(d, src)

    return fill


def _phase_taps(r: int, d: int, st: int) -> dict[int, tuple[int, int, int, int, int]]:
    """Per phase a of a strided window's taps along one axis (tap i reads phase i*d % st at offset i*d // st):
    (first tap, tap step, taps, first offset, offset step). Tap i and i + st read the same phase, st*d//st = d
    further on; with gcd(d, st) > 1 the step in i is st // gcd."""
    out = {}
    step = st // math.gcd(d, st)
    for i0 in range(min(r, step)):
        a, u0 = (i0 * d) % st, (i0 * d) // st
        out[a] = (i0, step, len(range(i0, r, step)), u0, step * d // st)
    return out
