"""Winograd F(m, 3) convolution on the cpu backend: the layouts and algorithm of ember.core.winograd, in numpy.

Per run, over all tiles at once:
1. the input is copied into a padded buffer of the conv's own (its padding zeros written once), split by row
   and column phase (row = g*m + phase), one strided copy per group of phases with the same span, so that a
   tile's alpha = m + 2 rows (columns) are m phase planes plus two of them shifted by one grid row (column);
2. B^T d B, separable: columns, then rows, each over flat contiguous runs of those planes (Layout computes one
   extra grid row and column of garbage tiles so the runs need no edges), into V (alpha^2, C, tiles): F(4,3)
   as a batched product with the small B^T (after one copy of the two shifted planes), F(2,3) as four ufuncs;
3. the alpha^2 BLAS products M[p] = U[p] @ V[p], one batched np.matmul;
4. the bias, added once per tile (to M[1, 1], which A^T . A spreads over the whole output tile with weight 1);
5. A^T M A, separable again, as two batched products with A^T into a contiguous tile grid; then copies move
   the tiles into the output and one pass adds the residual (where the runtime fused one) and applies the
   activation.

The transforms are a few large numpy calls rather than one ufunc per matrix entry: with two threads running
them, every call costs more than its work on convs this size (the GIL changes hands), and F(4,3) went from
128 calls a conv to ~20.

`split` cuts the conv into parts for the pool's threads (images, bands of tile rows, or ranges of output
channels after an input transform split over ranges of input channels), each part a task that runs its own
products with OpenBLAS held to one thread (backends/cpu/parallel.one_blas_thread). Every buffer but the padded
input is a view of the backend's shared scratch made at record time and the transforms are precompiled into
lists of calls with their `out=` targets, so a run allocates nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ...core import winograd
from ...core.expr import Expr
from . import parallel
from .elementwise import epilogue, own_residual
from .steps import Scratch, Step, scratch_step, seq

Prog = list[tuple[Any, tuple, np.ndarray | None]]  # (ufunc or function, args, out= or None)


def input_transform(m: int, d: list[np.ndarray], r: list[np.ndarray]) -> Prog:
    """Ufunc calls computing r = B^T d along one axis for F(2,3) (d: alpha input rows, r: alpha outputs; no r may
    alias a d). F(4,3) runs its transforms as products instead (build_steps)."""
    add, sub = np.add, np.subtract
    if m == 2:  # B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
        return [(sub, (d[0], d[2]), r[0]), (add, (d[1], d[2]), r[1]), (sub, (d[2], d[1]), r[2]),
                (sub, (d[1], d[3]), r[3])]
    raise ValueError(f"no cpu Winograd transforms for F({m}, 3)")


class Layout:
    """Sizes of one Winograd conv and where its buffers lie in the scratch (float32 element offsets).

    Tiles are computed over a grid of (tiles_h + 1) x (tiles_w + 1) per image, one more than the output needs:
    a tile's alpha = m + 2 rows span two rows of the input split by phase (row = g*m + phase), so with that
    extra row and column every transform step is one call over a flat, contiguous run (shifted by 0 or 1
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
        self.kranges = _ranges(k, kparts, a * a * k * c * self.cols / parallel.MACS_PER_S)
        # The padded input split by phases (xq) is each conv's own, outside the scratch (build_steps): its padding
        # zeros are written once. cols dies once v is made, v once the products ran (all of them: z may reuse
        # it only with one task); y reuses cols' space where it fits.
        # cols: B^T along columns, (nu, row phase, C, N, Hq, Wq); with F(4,3) alpha row phases, the last two
        # copies of the first two shifted by a grid row, so that B^T along rows is one batched product.
        self._place("cols", a * (a if m > 2 else m) * cg)
        self._place("v", a * a * cg)  # (alpha^2, C, G)
        self._place("m", a * a * kg)  # (alpha^2, K, G)
        self._place("z", m * a * kg, reuse="v" if len(self.kranges) == 1 else None)  # A^T along rows: (i, nu, K, G)
        self._place("y", m * m * kg, reuse="cols")  # the output tiles: (i, j, K, N, Hq, Wq) (F(4,3): j last)

    def _place(self, name: str, size: int, reuse: str | None = None) -> None:
        if reuse is not None and size <= self._room(reuse):
            self.offsets[name] = self.offsets[reuse]
        else:
            self.offsets[name] = self.elems
            self.elems += -(-size // 16) * 16  # 64-byte aligned blocks
        self.sizes[name] = size

    def _room(self, name: str) -> int:
        """Elements from `name`'s offset to the next buffer placed after it."""
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


def _phase_groups(m: int, pad: int, size: int, grid: int) -> list[tuple[int, int, int, int]]:
    """The phases 0..m-1 of one axis grouped by their span: (first phase, phases, lo, hi) per run of
    consecutive phases with the same [lo, hi), so that one strided copy moves a whole group."""
    out: list[tuple[int, int, int, int]] = []
    for ph in range(m):
        lo, hi = _phase_span(ph, m, pad, size, grid)
        if out and out[-1][2:] == (lo, hi):
            out[-1] = (out[-1][0], out[-1][1] + 1, lo, hi)
        else:
            out.append((ph, 1, lo, hi))
    return out


def build_steps(lay: Layout, xv: np.ndarray, uv: np.ndarray, bv: np.ndarray | None, dst: np.ndarray,
                buf: np.ndarray, epilogue: Callable[..., Step | None], res: np.ndarray | None = None,
                cparts: int = 1) -> tuple[list[Step], list[Step]]:
    """The steps of one conv over the scratch `buf` (float32 elements): xv (N, C, H, W), uv (alpha^2, K, C),
    bv (K,) or None, dst (N, K, P, Q); `epilogue(out, res)` makes the step computing out = act(out + res) in
    place (res: the same part of the residual `res` (N, K, P, Q), or None), or returns None where there is
    nothing to do.

    Returns the input transform as up to `cparts` tasks over ranges of input channels, then one task per range
    of output channels (lay.kranges: products, output transform, bias and activation); the tasks of each list
    may run side by side, the second list's once the first's all ran.

    Every numpy call here costs more than its work on small convs when two threads run them (each hands the
    GIL over), so the transforms are few
    large calls: grouped phase copies, and the transforms along an axis as one (batched) product with the
    small B^T or A^T, not one ufunc per matrix entry (F(4,3): 128 calls a conv before, ~20 now)."""
    n, c, k, m, a = lay.n, lay.c, lay.k, lay.m, lay.a
    hq, wq, g = lay.hq, lay.wq, lay.g
    top, left = lay.pads[0], lay.pads[1]
    cg = c * g
    bt, _, at = (mat.astype(np.float32) for mat in winograd.float_matrices(m))

    # 1. The padded input by phases: xq[cph, rph, c, n, gr, gc] = x[n, c, gr*m + rph - top, gc*m + cph - left],
    # in memory of this conv's own whose padding (and garbage grid positions) stay zero from here on. F(4,3)
    # adds rows m, m+1: rows 0, 1 one grid column on (filled by a copy per run). One more column lets the
    # rows be read one element on as (rows, m, C*G) views.
    rows_x = a if m > 2 else m
    xqe = np.zeros((rows_x, m * cg + 1), np.float32)
    xq = xqe[:m, :m * cg].reshape(m, m, c, n, hq, wq)
    x3 = xqe[:, :m * cg].reshape(rows_x, m, cg)  # [cph (or F(4,3)'s row), rph, C*G]
    x3s = xqe[:, 1:].reshape(rows_x, m, cg)  # the same one grid column on
    cols = lay.take(buf, "cols", (a, rows_x, cg))
    v = lay.take(buf, "v", (a * a, c, g))
    vr = v.reshape(a, a, cg)
    steps = []
    # The channels split into `cparts` ranges, each transformed by its own step (for the pool's threads): the
    # transforms never mix channels; tile runs end a grid position (row) short of a range's end, where they
    # would read the next range's first column (row), and that garbage column (row) is zeroed instead.
    for c0, c1 in _ranges(c, cparts, a * a * cg * parallel.TRANSFORM_S):
        copies = []
        for rph, nr, r0, r1 in _phase_groups(m, top, lay.h, hq):
            for cph, nc, g0, g1 in _phase_groups(m, left, lay.w, wq):
                if r1 <= r0 or g1 <= g0:
                    continue
                sr, sc = r0 * m + rph - top, g0 * m + cph - left
                # (c, n, rph in group, gr, cph in group, gc) on both sides: phases of a group are consecutive
                # input rows (columns), one element apart.
                d = xq[cph:cph + nc, rph:rph + nr, c0:c1, :, r0:r1, g0:g1].transpose(2, 3, 1, 4, 0, 5)
                copies.append((d, _split_axes(xv[:, c0:c1, sr:, sc:], m, (nr, r1 - r0), (nc, g1 - g0))))
        lo, hi = c0 * g, c1 * g
        span, rspan = hi - lo - 1, hi - lo - wq
        fills = [cols[:, :m, hi - 1:hi], vr[:, :, lo + rspan:hi]]  # garbage tiles, but finite
        prog: Prog = []
        if m > 2:
            # 2. B^T along columns: tile column gc reads grid columns gc (phases 0..m-1) and gc + 1 (phases 0,
            # 1): rows m, m+1 of xqe, so B^T is one product (batched over row phases).
            prog.append((np.copyto, (x3[m:, :, lo:lo + span], x3s[:2, :, lo:lo + span]), None))
            prog += _product(bt, x3[:, :, lo:lo + span].transpose(1, 0, 2),
                             cols[:, :m, lo:lo + span].transpose(1, 0, 2))
            # 3. B^T along rows the same way, one grid row (wq elements) apart, batched over nu; V[xi, nu] is
            # written through a transposed view.
            prog.append((np.copyto, (cols[:, m:, lo:lo + rspan], cols[:, :2, lo + wq:hi]), None))
            prog += _product(bt, cols[:, :, lo:lo + rspan], vr[:, :, lo:lo + rspan].transpose(1, 0, 2))
        else:
            # F(2,3)'s B^T has two entries a row: four ufuncs an axis beat copying rows to make one product.
            prog += input_transform(m, [(x3 if j < m else x3s)[j % m, :, lo:lo + span] for j in range(a)],
                                    [r[:, lo:lo + span] for r in cols])
            prog += input_transform(m, [cols[:, i % m, lo + (i // m) * wq: lo + (i // m) * wq + rspan]
                                        for i in range(a)], [vr[xi, :, lo:lo + rspan] for xi in range(a)])
        steps.append(_transform_step(copies, fills, prog))

    mm = lay.take(buf, "m", (a * a, k, g))
    z = lay.take(buf, "z", (m, a, k * g))
    y = lay.take(buf, "y", (m, m, k * g))
    vc = v[:, :, :lay.cols]
    return steps, [_output_task(lay, k0, k1, uv, vc, mm, z, y, at, dst, res, bv, epilogue)
                   for k0, k1 in lay.kranges]


def _transform_step(copies: list[tuple[np.ndarray, np.ndarray]], fills: list[np.ndarray], prog: Prog) -> Step:
    def run() -> None:
        for d_, s_ in copies:
            np.copyto(d_, s_)
        for z_ in fills:
            z_.fill(0)
        # No np.errstate around the arithmetic: it costs more than the work with two threads running, and
        # the tiles are finite unless the input is not (then numpy warns, as the direct conv's product does).
        for fn, args, out in prog:
            if out is None:
                fn(*args)
            else:
                fn(*args, out=out)

    return run


# Elements of a transform product's right-hand block per call: OpenBLAS runs these short products (K = alpha)
# several times slower once that block outgrows the core's L2 cache, so longer runs go in chunks.
CHUNK = 1 << 17


def _product(mat: np.ndarray, src: np.ndarray, out: np.ndarray) -> Prog:
    """np.matmul(mat, src, out=out) (src and out: (..., K, L) and (..., M, L)) in chunks along L."""
    step = max(1, CHUNK // src.shape[-2])
    return [(np.matmul, (mat, src[..., i:i + step]), out[..., i:i + step]) for i in range(0, src.shape[-1], step)]


def _split_axes(x: np.ndarray, m: int, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
    """x (N, C, H, W) -> (C, N, phases, grid rows, phases, grid cols) with row = grid row * m + phase (rows,
    cols: phases and grid positions): a strided view."""
    sn, sc, sh, sw = x.strides
    assert (rows[1] - 1) * m + rows[0] <= x.shape[2] and (cols[1] - 1) * m + cols[0] <= x.shape[3]
    return np.lib.stride_tricks.as_strided(x, (x.shape[1], x.shape[0], rows[0], rows[1], cols[0], cols[1]),
                                           (sc, sn, sh, m * sh, sw, m * sw), writeable=False)


def _view(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """x reshaped, which must not copy (a copy would take the writes meant for x)."""
    v = x.reshape(shape)
    assert np.shares_memory(v, x)
    return v


def _output_task(lay: Layout, k0: int, k1: int, uv: np.ndarray, vc: np.ndarray, mm: np.ndarray, z: np.ndarray,
                 y: np.ndarray, at: np.ndarray, dst: np.ndarray, res: np.ndarray | None, bv: np.ndarray | None,
                 epilogue: Callable[..., Step | None]) -> Step:
    """Output channels [k0, k1): their products, A^T M A, bias, the tiles into the output, the activation."""
    m, a, g = lay.m, lay.a, lay.g
    ks = slice(k0 * g, k1 * g)
    uk, mk = uv[:, k0:k1], mm[:, k0:k1, :lay.cols]
    post: Prog = []
    if bv is not None:  # A^T[:, 1] = A[1, :] = 1: added to M[1, 1], the bias reaches the whole tile
        post.append((np.add, (mm[a + 1, k0:k1], bv[k0:k1].reshape(-1, 1)), mm[a + 1, k0:k1]))
    # 4. A^T M A as two batched products with the small A^T: along rows into z (i, nu, K*G), batched over nu
    # (M[xi, nu] read, z written through transposed views), then along columns into y (i, j, K*G; F(4,3):
    # (i, K*G, j)), batched over i; runs of this range of output channels.
    mr = mm.reshape(a, a, -1)
    post += _product(at, mr[:, :, ks].transpose(1, 0, 2), z[:, :, ks].transpose(1, 0, 2))
    out_t = dst.transpose(1, 0, 2, 3)
    scatter = []
    if m > 2:
        # F(4,3): the columns' A^T product written transposed, y (i, K*G, j): a tile row's m outputs then lie
        # next to each other, so each output row is one contiguous run of y (garbage tile column included),
        # and the tiles go into the output in m copies of whole rows: 16 copies of every 4th element took
        # longer than the transposed product costs.
        yt = y.reshape(m, lay.k * g, m)
        zt = z[:, :, ks].transpose(0, 2, 1)
        step = max(1, CHUNK // a)
        post += [(np.matmul, (zt[:, i:i + step], at.T), yt[:, ks][:, i:i + step])
                 for i in range(0, zt.shape[1], step)]
        y5 = yt.reshape(m, lay.k, lay.n, lay.hq, lay.wq * m)
        for r in range(min(m, lay.p)):
            d = out_t[k0:k1, :, r::m, :]
            scatter.append((d, y5[r, k0:k1, :, :d.shape[2], :d.shape[3]]))
    else:
        post += _product(at, z[:, :, ks], y[:, :, ks])
        # One copy per tile position (i, j): numpy ran one 6-D copy slower (it loops over j innermost).
        y6 = y.reshape(m, m, lay.k, lay.n, lay.hq, lay.wq)
        for r in range(min(m, lay.p)):
            for j in range(min(m, lay.q)):
                d = out_t[k0:k1, :, r::m, j::m]
                scatter.append((d, y6[r, j, k0:k1, :, :d.shape[2], :d.shape[3]]))
    # 5. Then the residual and activation in one contiguous pass over this range of the output. Fused into
    # the copies (act(y + residual) written row by row) ResNet-18 ran slower: numpy's per-row loop overhead
    # on those strided rows outweighs the pass saved; fused into strided (every m-th element) writes it took
    # longer still than copies plus one pass.
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
    # Splitting one image by output channels where its transformed filter is large (ResNet-18's 64-channel
    # F(4,3) convs) was tried: slower alone, and in the whole model no faster (that split has two parallel
    # regions, the input transform's and the products', where bands have one).
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


# One range per thread, the calling thread's first and a little larger (parallel.LEAD).
_ranges = parallel.spans


def record_conv(xv: np.ndarray, uv: np.ndarray, bv: np.ndarray | None, dst: np.ndarray, residual: np.ndarray | None,
                pads: tuple[int, int, int, int], m: int, act: Expr | None, scratch: Scratch) -> list[Step]:
    """dst = act(conv3x3(xv) + bv + residual) by F(m, 3) as one step (ComputeBackend.record_conv_winograd): uv the
    transformed filter (alpha^2, K, C)."""
    # A residual joins the epilogue, after the tiles are in the output: one that shares the output's memory
    # is copied away first.
    keep, rv = own_residual(dst, residual) if residual is not None else (None, None)
    # Split over the pool's threads, each running its part whole (transforms and products, with OpenBLAS
    # held to the calling thread): see parallel.one_blas_thread.
    pool = parallel.blas_pool()
    pieces = split(xv.shape, dst.shape[1], dst.shape[2:], pads, m, pool.size if pool is not None else 1)
    offsets = [0]
    for *_, lay in pieces:
        offsets.append(offsets[-1] + lay.elems)
    # The transforms' buffers live in the shared scratch, as im2col's do (in cache from one conv to the next).
    scratch.reserve(offsets[-1] * 4)

    def build(buf: np.ndarray | None) -> list[Step]:
        assert buf is not None
        f32 = buf[:offsets[-1] * 4].view(np.float32)
        tasks = []
        for (xi, oi, lay), o0 in zip(pieces, offsets, strict=False):
            o = dst[oi[0], :, oi[1]]
            res = rv[oi[0], :, oi[1]] if rv is not None else None
            # Output channels split over the threads: the input transform splits by input channels first.
            split_k = len(lay.kranges) > 1
            firsts, outs = build_steps(lay, xv[xi[0], :, xi[1]], uv, bv, o, f32[o0:o0 + lay.elems],
                                       functools.partial(epilogue, act), res,
                                       pool.size if split_k and pool is not None else 1)
            if split_k:
                assert pool is not None
                # One region with a barrier between the phases, where each task can have a thread of its own.
                if len(firsts) == len(outs) <= pool.size:
                    return [parallel.Phases(pool, firsts, outs)]
                return [parallel.Region(pool, firsts), parallel.Region(pool, outs)]
            tasks.append(seq(*firsts, *outs))
        if len(tasks) == 1:
            return tasks
        assert pool is not None
        return [parallel.Region(pool, tasks)]

    return [scratch_step(scratch, build, keep)]


def choose(n: int, c: int, k: int, p: int, q: int, dtype: Any) -> int | None:
    """The cpu's cost model: which F(m, 3) runs this conv fastest, or None for im2col + BLAS (fitted to
    bench/bench_cpu_winograd.py's timings: BENCHMARKS.md).

    The transforms cost per tile and channel, the products save per tile and channel pair: Winograd needs
    channels (32 and up) and enough tiles to spread its transformed filter over (16/9 the weight's bytes for
    F(2,3), read per run): a 7x7 output at batch 1 has too few, 14x14 enough.

    F(4,3) (4x fewer multiply-adds than direct, 2.25x for F(2,3)) wins where its own tiles are enough and its
    transformed filter (36/9 the weight's bytes) stays small, up to 128 x 128 channels (2.4 MB). It rounds more
    than F(2,3) (its error against a float64 conv: BENCHMARKS.md).
    """
    if np.dtype(dtype) != np.float32 or min(c, k) < 32:
        return None
    th, tw = winograd.tiles(p, q, 4)
    if n * th * tw >= 40 and c * k <= 128 * 128:
        return 4
    th, tw = winograd.tiles(p, q, 2)
    return 2 if n * th * tw >= 40 else None
