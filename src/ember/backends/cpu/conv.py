"""2-D convolutions on the cpu backend (record_conv): one function per strategy, and `select`, which picks one.

The strategies, in the order `select` tries them:
- `depthwise`: shifted multiply-adds over bands of channels, or the compiled depthwise kernel;
- `pointwise`: a 1x1 conv at stride 1, whose input already is the product's right-hand matrix;
- `strided_pointwise`: a 1x1 conv at a stride (a ResNet shortcut), each task copying the positions it reads;
- `native_direct`: the compiled direct conv over a weight packed once (no column matrix);
- `im2col_by_channels`: a weight-heavy conv split by input channels, each part its own columns and partial output
  (the compiled GEMM over packed slices of the weight where the columns are few);
- `im2col_bands`: im2col into the backend's shared scratch, then products writing the output in place.

Each returns the `Build` of a scratch step (steps.scratch_step); record_conv wraps it with the residual pass and
declares what the step reads and writes (parallel.Access).
"""

from __future__ import annotations

import functools

import numpy as np

from ...core.expr import Expr
from . import native, parallel
from .elementwise import clamp_bounds, epilogue, residual_pass
from .steps import Build, Scratch, Step, scratch_step, seq
from .windows import im2col, padded_rows, row_band, taps

# Convs (one group, no dilation, a window) through the compiled direct conv where it is available.
DIRECT_NATIVE = True

# Outputs per depthwise band: small enough that a band's 2 * r * s passes stay in the core's cache.
_DEPTHWISE_BAND = 65536


class ConvJob:
    """One conv's arrays and geometry, and how its products split over the pool's threads: what every strategy
    reads. xv (N, C, H, W), wv (K, C / groups, R, S), dst (N, K, P, Q); act has no residual left in it."""

    def __init__(self, xv: np.ndarray, wv: np.ndarray, bias: np.ndarray | None, dst: np.ndarray,
                 stride: tuple[int, int], pads: tuple[int, int, int, int], dilation: tuple[int, int], groups: int,
                 act: Expr | None) -> None:
        self.xv, self.wv, self.dst = xv, wv, dst
        self.stride, self.pads, self.dilation, self.groups, self.act = stride, pads, dilation, groups, act
        self.n, self.c, self.h, self.wd = xv.shape
        self.k, self.cg, self.r, self.s = wv.shape
        self.p, self.q = dst.shape[2:]
        self.sh, self.sw = stride
        self.kg, self.kk = self.k // groups, self.cg * self.r * self.s
        # The bias per output plane, per row of an output matrix, and flat.
        self.bias_planes = bias.reshape(-1, 1, 1) if bias is not None else None
        self.bias_rows = bias.reshape(-1, 1) if bias is not None else None
        self.bias_flat = self.bias_rows.reshape(-1) if self.bias_rows is not None else None
        self.pool = parallel.pool()
        # Products split over the pool's threads (each with one OpenBLAS thread), by output channels where the
        # weight outweighs the columns (each thread then reads part of it), else by columns or rows of output.
        self.blas_pool = parallel.blas_pool()
        macs = self.n * self.k * self.p * self.q * self.kk
        self.parts = self.blas_pool.size if self.blas_pool is not None and macs >= parallel.SPLIT_MACS else 1
        self.by_k = self.kg >= self.parts and self.kg * groups > self.n * self.p * self.q
        self.seconds = macs / parallel.MACS_PER_S  # one thread's time for the products (spans)


def record_conv(xv: np.ndarray, wv: np.ndarray, bias: np.ndarray | None, dst: np.ndarray, stride: tuple[int, int],
                pads: tuple[int, int, int, int], dilation: tuple[int, int], groups: int, act: Expr | None,
                residual: np.ndarray | None, const_weight: bool, scratch: Scratch) -> list[Step]:
    """dst = act(conv(xv, wv) + bias + residual) as one step."""
    # With a residual, the parts add their bias only; one pass over the output then adds the residual and
    # applies the activation.
    first = last = None
    if residual is not None:
        first, last = residual_pass(act, dst, residual)
        act = None
    job = ConvJob(xv, wv, bias, dst, stride, pads, dilation, groups, act)
    build, uses_scratch = select(job, const_weight, scratch)
    step = scratch_step(scratch if uses_scratch else None, build, first, last)
    access = parallel.Access([xv, wv, job.bias_planes, residual], [dst], uses_scratch)
    step.access = access  # type: ignore[attr-defined]
    return [step]


def select(job: ConvJob, const_weight: bool, scratch: Scratch) -> tuple[Build, bool]:
    """The strategy for this conv, and whether its step uses the shared scratch."""
    # The compiled kernels pack the weight once, at record time: only for a weight that stays the same.
    native_ok = const_weight and native.available() and job.xv.dtype == np.float32
    unpadded_1x1 = job.groups == 1 and job.r == job.s == 1 and not any(job.pads)
    if job.groups == job.c and job.cg == 1 and job.k == job.c:
        return depthwise(job), False
    if unpadded_1x1 and job.sh == job.sw == 1:
        return pointwise(job), False
    if unpadded_1x1:
        return strided_pointwise(job), False
    if (native_ok and DIRECT_NATIVE and job.groups == 1 and job.dilation == (1, 1) and job.r * job.s > 1
            and job.sw <= 2):
        return native_direct(job), False
    if job.by_k and job.groups == 1 and job.parts > 1 and job.c >= job.parts:
        return im2col_by_channels(job, scratch, native_ok), True
    return im2col_bands(job, scratch), True


# ---- the pieces the strategies share --------------------------------------------------------------------------
def _bias_and_act(job: ConvJob, o: np.ndarray, ch: slice) -> Step:
    """Bias add and activation in place on o, output channels `ch` of one image (depthwise)."""
    b = job.bias_planes[ch] if job.bias_planes is not None else None
    finish = epilogue(job.act, o)

    def run() -> None:
        if b is not None:
            np.add(o, b, out=o)
        if finish is not None:
            finish()

    return run


def _product(job: ConvJob, wm: np.ndarray, cols: np.ndarray, o2: np.ndarray, ch: slice) -> Step:
    """One BLAS product into the output matrix o2 (channels `ch` by positions), then its bias and activation."""
    b = job.bias_rows[ch] if job.bias_rows is not None else None
    finish = epilogue(job.act, o2)

    def run() -> None:
        np.matmul(wm, cols, out=o2)
        if b is not None:
            np.add(o2, b, out=o2)
        if finish is not None:
            finish()

    return run


def _products(job: ConvJob, wm: np.ndarray, cols: np.ndarray, o2: np.ndarray, k0: int, split: int) -> list[Step]:
    """_product() over `split` parts of the output channels (job.by_k) or of the columns."""
    if job.by_k:
        return [_product(job, wm[a:b], cols, o2[a:b], slice(k0 + a, k0 + b))
                for a, b in parallel.spans(len(wm), split, job.seconds)]
    return [_product(job, wm, cols[:, a:b], o2[:, a:b], slice(k0, k0 + len(wm)))
            for a, b in parallel.spans(cols.shape[1], split, job.seconds)]


def _region(job: ConvJob, tasks: list[Step]) -> list[Step]:
    """The tasks as one parallel region over the BLAS pool, where there are several."""
    return [parallel.Region(job.blas_pool, tasks)] if len(tasks) > 1 and job.blas_pool is not None else tasks


def _reserve_columns(job: ConvJob, scratch: Scratch, row_bands: int, partials: int) -> None:
    """Room in the scratch for the column matrices of `row_bands` bands of output rows and `partials` elements of
    partial outputs."""
    scratch.reserve((job.n * job.groups * job.kk * (job.p + row_bands) * job.q + partials) * job.xv.dtype.itemsize)


# ---- the strategies -------------------------------------------------------------------------------------------
def depthwise(job: ConvJob) -> Build:
    """Shifted multiply-adds over bands of channels, each small enough that its passes stay in the core's cache;
    a multiple of the pool's threads bands keeps the cores even. The compiled depthwise kernel (native.py) fuses
    the bias and an activation that is a clamp (Relu, Clip, none), and reads the weight as it runs."""
    xv, wv, dst, n, c = job.xv, job.wv, job.dst, job.n, job.c
    threads = job.pool.size if job.pool is not None else 1
    bands = -(-n * c * job.p * job.q // _DEPTHWISE_BAND)
    bands = -(-bands // threads) * threads
    bounds = clamp_bounds(job.act)
    planes = xv.strides[2:] == (4 * job.wd, 4) and dst.strides[2:] == (4 * job.q, 4)
    fused = (bounds is not None and job.dilation == (1, 1) and job.sw <= 2 and xv.dtype == np.float32 and planes
             and wv.flags.c_contiguous and native.available())
    bias = job.bias_flat

    def build(_: np.ndarray | None) -> list[Step]:
        tasks = []
        for c0, c1 in parallel.spans(c, bands):
            if fused:
                assert bounds is not None
                tasks.append(native.depthwise_step(xv[:, c0:c1], wv[c0:c1], job.stride, job.pads, dst[:, c0:c1],
                                                   bias[c0:c1] if bias is not None else None, *bounds))
                continue
            run = _depthwise_numpy(xv[:, c0:c1], wv[c0:c1], dst[:, c0:c1], (job.r, job.s), job.stride, job.pads,
                                   job.dilation)
            tasks.append(seq(run, *(_bias_and_act(job, dst[i, c0:c1], slice(c0, c1)) for i in range(n))))
        return [parallel.Region(job.pool, tasks)] if job.pool is not None else tasks

    return build


def _depthwise_numpy(xv: np.ndarray, wv: np.ndarray, dst: np.ndarray, kernel: tuple[int, int],
                     stride: tuple[int, int], pads: tuple[int, int, int, int], dilation: tuple[int, int]) -> Step:
    """r*s shifted multiply-adds (C tiny matmuls would be slower). Taps are read when the step runs: the
    weight may be computed by an earlier step.

    The input is first split into its sh*sw stride phases, padding included (one padded copy at stride
    1), so that every tap reads its phase at a fixed offset. Flattening each phase's plane then makes a
    tap's window one long run per channel: the output is computed on rows as wide as the phase (the
    extra columns are discarded), where 2-D windows would give numpy inner loops of q elements.
    """
    n, c = xv.shape[:2]
    _, _, p, q = dst.shape
    (r, s), (sh, sw), (dh, dw) = kernel, stride, dilation
    offsets = [(divmod(i * dh, sh), divmod(j * dw, sw)) for i in range(r) for j in range(s)]
    ph_w = ((s - 1) * dw) // sw + q
    ph_h = ((r - 1) * dh) // sh + p + 1  # one more row: the last windows run past their row's end
    phases = np.zeros((sh, sw, n, c, ph_h, ph_w), xv.dtype)
    fills = [(phases[a, b][..., o[0], o[1]], xv[..., t[0], t[1]])
             for (a, b), o, t in taps(xv, phases, stride, stride, pads, (1, 1))]
    flat = phases.reshape(sh, sw, n, c, ph_h * ph_w)
    span = p * ph_w
    windows = [flat[a, b, :, :, u * ph_w + v: u * ph_w + v + span] for (u, a), (v, b) in offsets]
    weights = wv.reshape(1, c, r * s)
    # float16 sums in float32, as numpy's (and ONNX's reference) float16 products do; rounded once into dst.
    work = np.float32 if xv.dtype == np.float16 else xv.dtype
    acc, tmp = np.empty((n, c, span), work), np.empty((n, c, span), work)
    valid = acc.reshape(n, c, p, ph_w)[..., :q]

    def compute() -> None:
        for d, src in fills:
            np.copyto(d, src)
        for t, win in enumerate(windows):
            tap = weights[..., t, None].astype(work, copy=False)
            if t == 0:
                np.multiply(win, tap, out=acc)
            else:
                np.multiply(win, tap, out=tmp)
                np.add(acc, tmp, out=acc)
        np.copyto(dst, valid)

    return compute


def pointwise(job: ConvJob) -> Build:
    """1x1 at stride 1, no padding: the input already is the product's right-hand matrix."""
    n, c, k = job.n, job.c, job.k
    wmat, xmat = job.wv.reshape(k, c), job.xv.reshape(n, c, job.h * job.wd)
    omat = job.dst.reshape(n, k, job.p * job.q)

    def build(_: np.ndarray | None) -> list[Step]:
        per = 1 if n >= job.parts else job.parts
        return _region(job, [t for i in range(n) for t in _products(job, wmat, xmat[i], omat[i], 0, per)])

    return build


def strided_pointwise(job: ConvJob) -> Build:
    """1x1 at a stride, no padding (a ResNet shortcut): each task copies the input positions it reads (all, where
    it takes a range of output channels; else its rows of them) into memory of its own and multiplies that. No
    im2col and no shared scratch, so the step may share a parallel region with a sibling conv reading the same
    input (CpuBackend.execute)."""
    xv, n, c, k, p, q, parts = job.xv, job.n, job.c, job.k, job.p, job.q, job.parts
    wmat, omat = job.wv.reshape(k, c), job.dst.reshape(n, k, p * q)
    sub = xv[:, :, ::job.sh, ::job.sw][:, :, :p, :q]

    def task(i: int, k0: int, k1: int, p0: int, p1: int) -> Step:
        own = np.empty((c, p1 - p0, q), xv.dtype)
        mul = _product(job, wmat[k0:k1], own.reshape(c, -1), omat[i, k0:k1, p0 * q:p1 * q], slice(k0, k1))
        return seq(functools.partial(np.copyto, own, sub[i, :, p0:p1]), mul)

    def build(_: np.ndarray | None) -> list[Step]:
        if n >= parts:
            tasks = [task(i, 0, k, 0, p) for i in range(n)]
        elif job.by_k:
            tasks = [task(i, k0, k1, 0, p) for i in range(n) for k0, k1 in parallel.spans(k, parts, job.seconds)]
        else:
            tasks = [task(i, 0, k, p0, p1) for i in range(n) for p0, p1 in parallel.spans(p, parts, job.seconds)]
        return _region(job, tasks)

    return build


def native_direct(job: ConvJob) -> Build:
    """The compiled direct conv (native.conv_step): no column matrix, the im2col runs a block of output columns
    at a time inside the call. Each task copies the input rows it reads into a padded buffer of its own, computes
    its part channels-last (bias, and an activation that is a clamp, fused), and copies it transposed into the
    output. Split by output channels (panels of the packed weight) where the weight outweighs the columns, else
    by images, else by bands of output rows."""
    xv, dst, n, k, p, q, parts = job.xv, job.dst, job.n, job.k, job.p, job.q, job.parts
    bounds = clamp_bounds(job.act)
    rows = native.PANEL_ROWS
    panels = -(-k // rows)
    if job.by_k and parts > 1 and panels >= parts:
        splits = [((0, n), (a * rows, min(k, b * rows)), (0, p)) for a, b in parallel.spans(panels, parts, job.seconds)]
    elif n >= parts:
        splits = [((a, b), (0, k), (0, p)) for a, b in parallel.spans(n, parts, job.seconds)]
    else:
        splits = [((0, n), (0, k), band) for band in parallel.spans(p, parts, job.seconds)]
    packs = {ks: native.pack(job.wv.reshape(k, job.kk)[ks[0]:ks[1]]) for _, ks, _ in splits}
    bias = job.bias_flat

    def task(images: tuple[int, int], ks: tuple[int, int], out_rows: tuple[int, int]) -> Step:
        (i0, i1), (k0, k1), (p0, p1) = images, ks, out_rows
        xp, inside, (xa, xb) = padded_rows(xv, job.pads, job.sh, job.r, p0, p1)
        y = np.empty((p1 - p0, q, k1 - k0), xv.dtype)
        conv = native.conv_step(packs[ks], xp, (job.r, job.s), job.stride, y,
                                bias[k0:k1] if bias is not None else None, *(bounds or ()))
        yt = y.transpose(2, 0, 1)
        steps: list[Step] = []
        for i in range(i0, i1):
            out_i = dst[i, k0:k1, p0:p1]
            steps += [functools.partial(np.copyto, inside, xv[i, :, xa:xb]), conv,
                      functools.partial(np.copyto, out_i, yt)]
            if bounds is None:  # an activation the kernel does not fuse
                finish = epilogue(job.act, out_i)
                assert finish is not None
                steps.append(finish)
        return seq(*steps)

    def build(_: np.ndarray | None) -> list[Step]:
        return _region(job, [task(*split) for split in splits])

    return build


def im2col_by_channels(job: ConvJob, scratch: Scratch, native_ok: bool) -> Build:
    """A weight-heavy conv of one group split by input channels (the product's K): each thread fills its
    channels' columns and multiplies them into a partial output of its own (the first straight into the output),
    then one pass sums the partials and adds the bias. Against a split by output channels (im2col first, whole, on
    one thread), the im2col runs split too. The columns and partials live in the shared scratch.

    Each part's slice of the weight is packed once here for the compiled GEMM (native.py), where OpenBLAS would
    pack it from memory on every run: that wins where the columns are few (native.MAX_COLUMNS); with more,
    OpenBLAS's packing pays for itself."""
    xv, dst, n, c, k, p, q, parts = job.xv, job.dst, job.n, job.c, job.k, job.p, job.q, job.parts
    rs, kk = job.r * job.s, job.kk
    partials = (parts - 1) * n * k * p * q
    _reserve_columns(job, scratch, 1, partials)
    wmat = job.wv.reshape(k, kk)
    c_parts = parallel.spans(c, parts, job.seconds)
    packed = ([native.pack(wmat[:, c0 * rs:c1 * rs]) for c0, c1 in c_parts]
              if p * q <= native.MAX_COLUMNS and native_ok else None)

    def build(buf: np.ndarray | None) -> list[Step]:
        assert buf is not None
        size = n * kk * p * q
        cols = buf.view(xv.dtype)[:size].reshape(n, kk, p * q)
        rest = buf.view(xv.dtype)[size: size + partials].reshape(parts - 1, n, k, p * q)
        omat = dst.reshape(n, k, p * q)
        assert np.may_share_memory(omat, dst)
        outs = [omat, *rest]
        c6 = cols.reshape(n, c, job.r, job.s, p, q)
        tasks = []
        for t, (c0, c1) in enumerate(c_parts):
            fill = im2col(xv[:, c0:c1], c6[:, c0:c1], job.stride, job.pads, job.dilation)
            k0, k1 = c0 * rs, c1 * rs
            if packed is not None:
                muls = [native.gemm_step(packed[t], cols[i, k0:k1], outs[t][i]) for i in range(n)]
            else:
                muls = [functools.partial(np.matmul, wmat[:, k0:k1], cols[i, k0:k1], out=outs[t][i])
                        for i in range(n)]
            tasks.append(seq(fill, *muls))
        finish = epilogue(job.act, omat)
        bias = job.bias_rows

        def total() -> None:
            for o in rest:
                np.add(omat, o, out=omat)
            if bias is not None:
                np.add(omat, bias, out=omat)
            if finish is not None:
                finish()

        return [*_region(job, tasks), total]

    return build


def im2col_bands(job: ConvJob, scratch: Scratch) -> Build:
    """im2col, then products writing the output in place. The column matrices live in the backend's shared
    scratch buffer, so they stay in cache from one conv to the next where each conv's own would be written cold.
    Split over the threads by bands of output rows, each band's im2col and products one task; where the weight
    outweighs the columns (job.by_k: grouped convs, or too few input channels for im2col_by_channels), the im2col
    runs whole and the products split by output channels."""
    xv, dst, n, groups, kg, kk = job.xv, job.dst, job.n, job.groups, job.kg, job.kk
    parts, by_k = job.parts, job.by_k
    r_ext = (job.r - 1) * job.dilation[0] + 1
    row_bands = [(0, job.p)] if by_k or parts == 1 else parallel.spans(job.p, parts, job.seconds)
    _reserve_columns(job, scratch, len(row_bands), 0)
    wmat = job.wv.reshape(groups, kg, kk)
    whole = by_k or len(row_bands) == 1  # one band: its im2col, then its products split

    def build(buf: np.ndarray | None) -> list[Step]:
        assert buf is not None
        tasks, off = [], 0
        for p0, p1 in row_bands:
            (a, b), (top, bottom) = row_band(job.h, job.pads[0], job.sh, r_ext, p0, p1)
            pb = p1 - p0
            size = n * groups * kk * pb * job.q
            cols = buf.view(xv.dtype)[off: off + size].reshape(n, groups, kk, pb * job.q)
            off += size
            c6 = cols.reshape(n, job.c, job.r, job.s, pb, job.q)
            ob = dst[:, :, p0:p1].reshape(n, groups, kg, pb * job.q)
            assert np.may_share_memory(ob, dst)
            fill = im2col(xv[:, :, a:b], c6, job.stride, (top, job.pads[1], bottom, job.pads[3]), job.dilation)
            prods = [t for i in range(n) for g in range(groups)
                     for t in _products(job, wmat[g], cols[i, g], ob[i, g], g * kg, parts if by_k else 1)]
            tasks += [fill, *_region(job, prods)] if whole else [seq(fill, *prods)]
        return tasks if whole else _region(job, tasks)

    return build
