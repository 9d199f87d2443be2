"""Winograd F(m, 3) convolution on the cpu backend: the layouts and algorithm of ember.ops.winograd, in numpy.

Per run, over all tiles at once:
1. the input, padded, is copied into scratch split by row and column phase (row = g*m + phase), so that a
   tile's alpha = m + 2 rows (columns) are m phase planes plus two of them shifted by one grid row (column);
2. B^T d B, separable: columns, then rows, each a few ufunc calls over flat contiguous runs of those planes
   (Layout computes one extra grid row and column of garbage tiles so the runs need no edges), into V
   (alpha^2, C, tiles);
3. the alpha^2 BLAS products M[p] = U[p] @ V[p], one batched np.matmul;
4. the bias, added once per tile (to M[1, 1], which A^T . A spreads over the whole output tile with weight 1);
5. A^T M A, separable again, into a contiguous tile grid; then one pass scatters the tiles into the output,
   adding the residual (where the runtime fused one) and applying the activation on the way.

`split` cuts the conv into parts for the pool's threads (images, bands of tile rows, or ranges of output
channels after one shared input transform), each part a task that runs its own products with OpenBLAS held to
one thread (backends/cpu/parallel.one_blas_thread). Every buffer is a view of the backend's shared scratch made
at record time and the transforms are precompiled into lists of ufunc calls with their `out=` targets, so a
run allocates nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ...ops import winograd

Step = Callable[[], None]
Prog = list[tuple[Any, tuple, np.ndarray]]  # (ufunc, args, out)


def input_transform(m: int, d: list[np.ndarray], r: list[np.ndarray], tmp: list[np.ndarray]) -> Prog:
    """Ufunc calls computing r = B^T d along one axis (d: alpha input rows, r: alpha outputs, tmp: 2 temporaries
    of their shape; no r may alias a d)."""
    add, sub, mul = np.add, np.subtract, np.multiply
    if m == 2:  # B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
        return [(sub, (d[0], d[2]), r[0]), (add, (d[1], d[2]), r[1]), (sub, (d[2], d[1]), r[2]),
                (sub, (d[1], d[3]), r[3])]
    if m == 4:
        # r0 = 4d0 - 5d2 + d4            r3 = (d4 - d2) + 2(d3 - d1)     r5 = 4d1 - 5d3 + d5
        # r1 = (d4 - 4d2) + (d3 - 4d1)   r4 = (d4 - d2) - 2(d3 - d1)
        # r2 = (d4 - 4d2) - (d3 - 4d1)
        a, b = tmp
        four, two = np.float32(4), np.float32(2)
        return [(mul, (d[2], four), a), (sub, (d[4], a), a), (mul, (d[1], four), b), (sub, (d[3], b), b),
                (add, (a, b), r[1]), (sub, (a, b), r[2]),
                (sub, (d[4], d[2]), a), (sub, (d[3], d[1]), b), (mul, (b, two), b),
                (add, (a, b), r[3]), (sub, (a, b), r[4]),
                (sub, (d[0], d[2]), r[0]), (mul, (r[0], four), r[0]), (add, (r[0], a), r[0]),
                (sub, (d[1], d[3]), r[5]), (mul, (r[5], four), r[5]), (sub, (d[5], d[3]), a), (add, (r[5], a), r[5])]
    raise ValueError(f"no cpu Winograd transforms for F({m}, 3)")


def output_transform(m: int, s: list[np.ndarray], y: list[np.ndarray], tmp: list[np.ndarray]) -> Prog:
    """Ufunc calls computing y = A^T s along one axis (s: alpha rows, y: m outputs, tmp: 4 temporaries)."""
    add, sub, mul = np.add, np.subtract, np.multiply
    if m == 2:  # A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]
        return [(add, (s[0], s[1]), y[0]), (add, (y[0], s[2]), y[0]), (sub, (s[1], s[2]), y[1]),
                (sub, (y[1], s[3]), y[1])]
    if m == 4:
        # a = s1 + s2, b = s1 - s2, c = s3 + s4, d = s3 - s4:
        # y0 = s0 + a + c, y1 = b + 2d, y2 = a + 4c, y3 = b + 8d + s5
        a, b, c, d = tmp
        return [(add, (s[1], s[2]), a), (sub, (s[1], s[2]), b), (add, (s[3], s[4]), c), (sub, (s[3], s[4]), d),
                (add, (s[0], a), y[0]), (add, (y[0], c), y[0]),
                (mul, (c, np.float32(4)), c), (add, (a, c), y[2]),
                (mul, (d, np.float32(2)), a), (add, (b, a), y[1]),
                (mul, (d, np.float32(8)), d), (add, (b, d), y[3]), (add, (y[3], s[5]), y[3])]
    raise ValueError(f"no cpu Winograd transforms for F({m}, 3)")


class Layout:
    """Sizes of one Winograd conv and where its buffers lie in the scratch (float32 element offsets).

    Tiles are computed over a grid of (tiles_h + 1) x (tiles_w + 1) per image, one more than the output needs:
    a tile's alpha = m + 2 rows span two rows of the input split by phase (row = g*m + phase), so with that
    extra row and column every transform step is one ufunc over a flat, contiguous run (shifted by 0 or 1
    grid position), and the extra tiles (garbage, never read back) cost less than short strided loops would.
    """

    def __init__(self, xshape: tuple[int, ...], k: int, out_hw: tuple[int, int], pads: tuple[int, int, int, int],
                 m: int, kparts: int = 1) -> None:
        n, c, h, w = xshape
        p, q = out_hw
        th, tw = winograd.tiles(p, q, m)
        a = m + 2
        self.n, self.c, self.h, self.w, self.k, self.p, self.q, self.m, self.a = n, c, h, w, k, p, q, m, a
        self.th, self.tw = th, tw
        self.hq, self.wq = th + 1, tw + 1
        self.g = n * self.hq * self.wq  # grid positions per channel
        # The products' columns: one image's last grid row is garbage only, left out (its tiles stay unset).
        self.cols = th * self.wq if n == 1 else self.g
        self.pads = pads
        cg, kg = c * self.g, k * self.g
        self.offsets: dict[str, int] = {}
        self.sizes: dict[str, int] = {}
        self.elems = 0
        # The output channels may be split into kparts ranges, each one task (products and output transform).
        self.kranges = _ranges(k, kparts)
        kh = max(b - a_ for a_, b in self.kranges) * self.g
        # xq and cols die once v is made; v once the products ran (all of them: z may reuse it only with one
        # task); y reuses xq's space where it fits.
        self._place("xq", m * m * cg)  # the padded input split by row and column phase (cph, rph, C, N, Hq, Wq)
        self._place("cols", a * m * cg)  # B^T along columns: (nu, rph, C, N, Hq, Wq)
        self._place("v", a * a * cg)  # (alpha^2, C, G)
        self._place("m", a * a * kg)  # (alpha^2, K, G)
        self._place("z", m * a * kg, reuse="v" if len(self.kranges) == 1 else None)  # A^T along rows: (i, nu, K, G)
        self._place("y", m * m * kg, reuse="xq")  # the output tiles: (i, j, K, N, Hq, Wq)
        self._place("tmp", 2 * max(m * cg, a * cg))  # the input transform's temporaries
        for i in range(len(self.kranges)):  # each task's own for the output transform
            self._place(f"tmp{i}", 4 * a * kh)

    def _place(self, name: str, size: int, reuse: str | None = None) -> None:
        if reuse is not None and size <= self._room(reuse):
            self.offsets[name] = self.offsets[reuse]
        else:
            self.offsets[name] = self.elems
            self.elems += -(-size // 16) * 16  # 64-byte aligned blocks
        self.sizes[name] = size

    def _room(self, name: str) -> int:
        """Elements from `name`'s offset to the next buffer placed after it (xq runs on into cols)."""
        start = self.offsets[name]
        later = [o for o in self.offsets.values() if o > start]
        return (min(later) if later else self.elems) - start

    def take(self, buf: np.ndarray, name: str, shape: tuple[int, ...]) -> np.ndarray:
        o = self.offsets[name]
        assert math.prod(shape) <= self.sizes[name]
        return buf[o:o + math.prod(shape)].reshape(shape)


def _phase_span(phase: int, m: int, pad: int, size: int, grid: int) -> tuple[int, int]:
    """Grid positions [lo, hi) whose padded coordinate g*m + phase holds input (g*m + phase - pad in [0, size))."""
    lo = max(0, -(-(pad - phase) // m))
    hi = min(grid, (size - 1 + pad - phase) // m + 1)
    return lo, max(lo, hi)


def build(lay: Layout, xv: np.ndarray, uv: np.ndarray, bv: np.ndarray | None, dst: np.ndarray, buf: np.ndarray,
          epilogue: Callable[..., Step | None], res: np.ndarray | None = None) -> tuple[Step, list[Step]]:
    """The steps of one conv over the scratch `buf` (float32 elements): xv (N, C, H, W), uv (alpha^2, K, C),
    bv (K,) or None, dst (N, K, P, Q); `epilogue(out, res)` makes the step computing out = act(out + res) in
    place (res: the same part of the residual `res` (N, K, P, Q), or None), or returns None where there is
    nothing to do.

    Returns the input transform, then one task per range of output channels (lay.kranges: products, output
    transform, bias and activation), which may run side by side once the input transform ran."""
    n, c, k, m, a = lay.n, lay.c, lay.k, lay.m, lay.a
    hq, wq, g = lay.hq, lay.wq, lay.g
    top, left = lay.pads[0], lay.pads[1]
    cg, kg = c * g, k * g

    def temps(name: str, shape: tuple[int, ...], count: int) -> list[np.ndarray]:
        flat = lay.take(buf, name, (lay.sizes[name],))
        size, part = math.prod(shape), lay.sizes[name] // count
        return [flat[i * part: i * part + size].reshape(shape) for i in range(count)]

    # 1. The padded input by phases: xq[cph, rph, c, n, gr, gc] = x[n, c, gr*m + rph - top, gc*m + cph - left].
    xq = lay.take(buf, "xq", (m, m, c, n, hq, wq))
    src = xv.transpose(1, 0, 2, 3)
    copies, zeros = [], []
    for rph in range(m):
        r0, r1 = _phase_span(rph, m, top, lay.h, hq)
        for cph in range(m):
            c0, c1 = _phase_span(cph, m, left, lay.w, wq)
            plane = xq[cph, rph]
            if r1 > r0 and c1 > c0:
                sr, sc = r0 * m + rph - top, c0 * m + cph - left
                copies.append((plane[:, :, r0:r1, c0:c1], src[:, :, sr:sr + (r1 - r0 - 1) * m + 1:m,
                                                             sc:sc + (c1 - c0 - 1) * m + 1:m]))
                strips = (plane[:, :, :r0], plane[:, :, r1:], plane[:, :, r0:r1, :c0], plane[:, :, r0:r1, c1:])
            else:
                strips = (plane,)
            zeros += [z for z in strips if z.size]
    # 2. B^T along columns: tile column gc reads grid columns gc (phases 0..m-1) and gc + 1 (phases 0, 1), so
    # each input is the phase plane shifted by 0 or 1 element; the last element (a garbage column) stays unset.
    xqf = xq.reshape(m, m * cg)
    cols = lay.take(buf, "cols", (a, m * cg))
    span = m * cg - 1
    prog = input_transform(m, [xqf[j % m, j // m: j // m + span] for j in range(a)], [r[:span] for r in cols],
                           temps("tmp", (span,), 2))
    zeros.append(cols[:, span:])
    # 3. B^T along rows, the same way one grid row (wq elements) apart.
    colsr = cols.reshape(a, m, cg)
    v = lay.take(buf, "v", (a * a, c, g))
    vr = v.reshape(a, a, cg)
    span = cg - wq
    prog += input_transform(m, [colsr[:, i % m, (i // m) * wq: (i // m) * wq + span] for i in range(a)],
                            [vr[xi, :, :span] for xi in range(a)], temps("tmp", (a, span), 2))
    zeros.append(vr[:, :, span:])  # garbage tiles, but finite

    def transform_in() -> None:
        for z_ in zeros:
            z_.fill(0)
        for d_, s_ in copies:
            np.copyto(d_, s_)
        # No np.errstate around the arithmetic: it cost 20 us a task with two threads running (measured), and
        # the tiles are finite unless the input is not (then numpy warns, as the direct conv's product does).
        for fn, args, out in prog:
            fn(*args, out=out)

    mm = lay.take(buf, "m", (a * a, k, g))
    mr = mm.reshape(a, a, kg)
    z = lay.take(buf, "z", (m, a, kg))
    y = lay.take(buf, "y", (m, m, kg))
    y6 = y.reshape(m, m, k, n, hq, wq)
    vc = v[:, :, :lay.cols]
    return transform_in, [_output_task(lay, i, k0, k1, uv, vc, mm, mr, z, y6, dst, res, bv, buf, epilogue)
                          for i, (k0, k1) in enumerate(lay.kranges)]


def _output_task(lay: Layout, i: int, k0: int, k1: int, uv: np.ndarray, vc: np.ndarray, mm: np.ndarray,
                 mr: np.ndarray, z: np.ndarray, y6: np.ndarray, dst: np.ndarray, res: np.ndarray | None,
                 bv: np.ndarray | None, buf: np.ndarray, epilogue: Callable[..., Step | None]) -> Step:
    """Output channels [k0, k1): their products, A^T M A, bias, the tiles into the output, the activation."""
    m, a, g = lay.m, lay.a, lay.g
    ks = slice(k0 * g, k1 * g)
    span = (k1 - k0) * g
    flat = lay.take(buf, f"tmp{i}", (lay.sizes[f"tmp{i}"],))
    part = lay.sizes[f"tmp{i}"] // 4

    def temps(shape: tuple[int, ...]) -> list[np.ndarray]:
        return [flat[j * part: j * part + math.prod(shape)].reshape(shape) for j in range(4)]

    uk, mk = uv[:, k0:k1], mm[:, k0:k1, :lay.cols]
    post: Prog = []
    if bv is not None:  # A^T[:, 1] = A[1, :] = 1: added to M[1, 1], the bias reaches the whole tile
        post.append((np.add, (mm[a + 1, k0:k1], bv[k0:k1].reshape(-1, 1)), mm[a + 1, k0:k1]))
    # 4. A^T M A: rows into z (i, nu, K*G), then columns into y (i, j, K*G); contiguous runs of this range.
    post += output_transform(m, [mr[xi][:, ks] for xi in range(a)], [z[r][:, ks] for r in range(m)],
                             temps((a, span)))
    post += output_transform(m, [z[:, nu, ks] for nu in range(a)], [y6.reshape(m, m, -1)[:, j, ks] for j in range(m)],
                             temps((m, span)))
    # 5. The tiles into the output: y[i, j, k, n, gr, gc] -> out[n, k, gr*m + i, gc*m + j]; then the residual
    # and activation in place over this range of the output. Copies are the fastest strided pass numpy has:
    # the activation (and residual) fused into these strided writes took 1.8x (3.3x) as long as the copies
    # plus one contiguous pass (measured on a 64 x 28 x 56 band).
    out_t = dst.transpose(1, 0, 2, 3)
    scatter = []
    for r in range(min(m, lay.p)):
        for j in range(min(m, lay.q)):
            d = out_t[k0:k1, :, r::m, j::m]
            scatter.append((d, y6[r, j, k0:k1, :, :d.shape[2], :d.shape[3]]))
    last = epilogue(dst[:, k0:k1], res[:, k0:k1] if res is not None else None)

    tail = mm[:, k0:k1, lay.cols:]  # tiles the products skip (an image's last grid row): kept finite

    def run() -> None:
        np.matmul(uk, vc, out=mk)
        if tail.size:
            tail.fill(0)
        for fn, args, out in post:
            fn(*args, out=out)
        for d_, s_ in scatter:
            np.copyto(d_, s_)
        if last is not None:
            last()

    return run


Piece = tuple[tuple[slice, slice], tuple[slice, slice], Layout]


def split(xshape: tuple[int, ...], k: int, out_hw: tuple[int, int], pads: tuple[int, int, int, int], m: int,
          parts: int) -> list[Piece]:
    """The conv as up to `parts` independent Winograd convs over parts of the output, for the pool's threads:
    (x index, out index, Layout) each, the indices over (N, H) and (N, P). Where the transformed filter
    outweighs the tiles (more output channels than tiles), one conv whose output channels split instead
    (Layout.kranges), so that each thread reads its part of the filter only. Else images split first; one
    image splits into bands of tile rows, each reading its input rows (padding where they run out)."""
    n, c, h, w = xshape
    p, q = out_hw
    top, left, _, right = pads
    th, tw = winograd.tiles(p, q, m)
    if parts > 1 and k > n * th * tw and k >= 8 * parts:
        return [((slice(None), slice(None)), (slice(None), slice(None)), Layout(xshape, k, out_hw, pads, m, parts))]
    if n >= parts or th < 2:
        out = []
        for n0, n1 in _ranges(n, parts if n >= parts else 1):
            out.append(((slice(n0, n1), slice(None)), (slice(n0, n1), slice(None)),
                        Layout((n1 - n0, c, h, w), k, out_hw, pads, m)))
        return out
    out = []
    for r0, r1 in _ranges(th, parts):
        p0, p1 = r0 * m, min(p, r1 * m)
        lo, hi = p0 - top, p1 + 2 - top  # the input rows (padding included) this band's windows read
        a = min(max(0, lo), h)
        b = max(a, min(h, hi))
        band = (a - lo, left, hi - b, right)
        out.append(((slice(None), slice(a, b)), (slice(None), slice(p0, p1)),
                    Layout((n, c, b - a, w), k, (p1 - p0, q), band, m)))
    return out


def _ranges(total: int, parts: int) -> list[tuple[int, int]]:
    parts = max(1, min(parts, total))
    return [(total * i // parts, total * (i + 1) // parts) for i in range(parts)]


def choose(n: int, c: int, k: int, p: int, q: int, dtype: Any) -> int | None:
    """The cpu's cost model: which F(m, 3) runs this conv fastest, or None for im2col + BLAS.

    Measured on this project's 2-core machine (AMD EPYC, AVX-512, OpenBLAS 0.3.31 held to one thread per pool
    thread) with bench/bench_cpu_winograd.py: ms per conv, C = K channels in and out, S x S, pads 1, 4 convs with
    their own weights run back to back (weights from memory, as in a network), p20 of 25 runs:

        N x C x S     direct  F(2,3)  F(4,3)       N x C x S    direct  F(2,3)  F(4,3)
        1 x  64 x 56    1.89    1.47    1.63       8 x  64 x 56  16.24    9.54    9.45
        1 x 128 x 28    1.49    1.18    1.36       8 x 128 x 28  14.08    7.39    7.32
        1 x 256 x 14    1.74    1.48    2.12       8 x 256 x 14  12.20    7.32    9.17
        1 x 512 x  7    2.87    4.42    6.34       8 x 512 x  7  13.87   11.42   13.13
        1 x  32 x 56    0.55    0.47    0.78       2 x 512 x  7   3.74    4.23    7.01
        1 x  32 x 28    0.22    0.23    0.53       4 x 512 x  7   6.98    6.76    8.84
        1 x  64 x 14    0.21    0.22    0.50       1 x 256 x  7   0.66    0.82    1.61
        1 x  16 x 56    0.25    0.30    0.63       1 x 1024 x 4   3.30    7.53   14.16

    The transforms cost per tile and channel, the products save per tile and channel pair: Winograd needs
    channels (32 and up) and enough tiles to spread its transformed filter over (16/9 the weight's bytes for
    F(2,3), read per run): 16 tiles (7x7 at batch 1) are too few, 49 (14x14) enough. F(4,3) is never clearly
    ahead (1% at batch 8 on 56x56 and 28x28, well behind elsewhere: 36 short products, 4x the weight's
    bytes) and rounds more, so F(2,3) is the only default; EMBER_WINOGRAD=4 still runs it.
    """
    if np.dtype(dtype) != np.float32 or min(c, k) < 32:
        return None
    th, tw = winograd.tiles(p, q, 2)
    return 2 if n * th * tw >= 40 else None
