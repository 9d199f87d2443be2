"""A conv and the max pooling that reads it, in one parallel region (ComputeBackend.record_conv_maxpool): the conv
by bands of rows as conv.im2col_bands does, each band followed by its rows of the pooling. A band computes the
conv rows its pooling rows read (the one row two bands share, twice) into memory of its own, so the pooling
reads them from cache rather than the conv's whole output back from memory."""

from __future__ import annotations

import numpy as np

from ...core.expr import Expr
from . import native, parallel
from .elementwise import clamp_bounds, epilogue
from .pooling import max_pool
from .steps import Scratch, Step, scratch_step
from .windows import im2col, padded_rows, row_band

# Per band: its pooling rows [i0, i1), the conv rows [a, b) they read and the pooling's (top, bottom) padding there.
Band = tuple[int, int, tuple[int, int], tuple[int, int]]


def fits(wshape: tuple[int, ...], out_shape: tuple[int, ...], groups: int) -> bool:
    """Convs that record_conv splits by bands of output rows (more output positions than channels, not 1x1): a
    ResNet stem. Their max pooling then runs in the same bands."""
    n, k, p, q = out_shape
    return groups == 1 and wshape[2:] != (1, 1) and n * p * q >= k


class _ConvPool:
    """One fused conv and max pooling: the arrays, the conv's geometry and the pooling's, shared by the bands."""

    def __init__(self, xv: np.ndarray, wv: np.ndarray, bias: np.ndarray | None, dst: np.ndarray,
                 stride: tuple[int, int], pads: tuple[int, int, int, int], dilation: tuple[int, int],
                 act: Expr | None, conv_hw: tuple[int, int], kernel: tuple[int, int], pool_stride: tuple[int, int],
                 pool_pads: tuple[int, int, int, int], pool_dilation: tuple[int, int]) -> None:
        self.xv, self.dst, self.act = xv, dst, act
        self.stride, self.pads, self.dilation = stride, pads, dilation
        self.n, self.c, self.h, _ = xv.shape
        self.k, _, self.r, self.s = wv.shape
        self.p, self.q = conv_hw
        self.kk = self.c * self.r * self.s
        self.wmat = wv.reshape(self.k, self.kk)
        self.bias_rows = bias.reshape(-1, 1) if bias is not None else None
        self.bias_flat = bias.reshape(-1) if bias is not None else None
        (self.kh, self.kw), (self.psh, self.psw), (self.ppt, self.ppl, _, self.ppr) = kernel, pool_stride, pool_pads
        self.pdh, self.pdw = pool_dilation
        self.r_ext, self.p_ext = (self.r - 1) * dilation[0] + 1, (self.kh - 1) * self.pdh + 1
        # Where every window holds input (pads smaller than the window), max and relu commute.
        holds_input = (max(pool_pads[0], pool_pads[2]) < self.p_ext
                       and max(self.ppl, self.ppr) < (self.kw - 1) * self.pdw + 1)
        self.relu_after = holds_input and act is not None and act.op == "relu" and act.args[0].op == "in"

    def bands(self, parts: int, seconds: float) -> list[Band]:
        oh = self.dst.shape[2]
        return [(i0, i1, *row_band(self.p, self.ppt, self.psh, self.p_ext, i0, i1))
                for i0, i1 in parallel.spans(oh, parts, seconds)]


def record_conv_maxpool(xv: np.ndarray, wv: np.ndarray, bias: np.ndarray | None, dst: np.ndarray,
                        stride: tuple[int, int], pads: tuple[int, int, int, int], dilation: tuple[int, int],
                        act: Expr | None, conv_hw: tuple[int, int], kernel: tuple[int, int],
                        pool_stride: tuple[int, int], pool_pads: tuple[int, int, int, int],
                        pool_dilation: tuple[int, int], const_weight: bool, scratch: Scratch) -> list[Step]:
    """dst = MaxPool(act(conv(xv) + bias)) as one step: a parallel region of bands, each through the compiled
    direct conv where it applies (numpy_band, native_band)."""
    job = _ConvPool(xv, wv, bias, dst, stride, pads, dilation, act, conv_hw, kernel, pool_stride, pool_pads,
                    pool_dilation)
    pool = parallel.blas_pool()
    macs = job.n * job.k * job.p * job.q * job.kk
    parts = pool.size if pool is not None and macs >= parallel.SPLIT_MACS else 1
    bands = job.bands(parts, macs / parallel.MACS_PER_S)
    # The compiled direct conv fuses an activation that is a clamp: monotonic, so it commutes with the max.
    bounds = clamp_bounds(act)
    packed = (native.pack(job.wmat) if const_weight and native.available() and xv.dtype == np.float32
              and dilation == (1, 1) and bounds is not None else None)
    if packed is None:
        scratch.reserve(sum(job.n * job.kk * (b - a) * job.q for _, _, (a, b), _ in bands) * xv.dtype.itemsize)

    def build(buf: np.ndarray | None) -> list[Step]:
        tasks, off = [], 0
        for band in bands:
            if packed is not None:
                assert bounds is not None
                tasks.append(native_band(job, band, packed, bounds))
                continue
            assert buf is not None
            tasks.append(numpy_band(job, band, buf, off))
            _, _, (a, b), _ = band
            off += job.n * job.kk * (b - a) * job.q
        return [parallel.Region(pool, tasks)] if len(tasks) > 1 and pool is not None else tasks

    return [scratch_step(scratch if packed is None else None, build)]


def numpy_band(job: _ConvPool, band: Band, buf: np.ndarray, off: int) -> Step:
    """The band through im2col (its columns in the scratch from element `off`) and OpenBLAS, then the pooling's
    maxima down the rows and across them."""
    i0, i1, (a, b), (top, bottom) = band
    xv, dst, n, c, k, q, kk = job.xv, job.dst, job.n, job.c, job.k, job.q, job.kk
    pb = b - a
    cols = buf.view(xv.dtype)[off: off + n * kk * pb * q].reshape(n, kk, pb * q)
    conv = np.empty((n, k, pb, q), xv.dtype)  # the band's own: bands share a row
    rows = np.empty((n, k, i1 - i0, q), xv.dtype)
    (xa, xb), (ctop, cbot) = row_band(job.h, job.pads[0], job.stride[0], job.r_ext, a, b)
    fill = im2col(xv[:, :, xa:xb], cols.reshape(n, c, job.r, job.s, pb, q), job.stride,
                  (ctop, job.pads[1], cbot, job.pads[3]), job.dilation)
    o2 = conv.reshape(n, k, pb * q)
    # max(relu(a), relu(b)) = relu(max(a, b)): a Relu runs on the pooled rows, a quarter of the conv's.
    relu_after = job.relu_after
    finish = epilogue(job.act, dst[:, :, i0:i1] if relu_after else conv)
    down = max_pool(conv, rows, (job.kh, 1), (job.psh, 1), (top, 0, bottom, 0), (job.pdh, 1))
    across = max_pool(rows, dst[:, :, i0:i1], (1, job.kw), (1, job.psw), (0, job.ppl, 0, job.ppr), (1, job.pdw))
    wmat, bias = job.wmat, job.bias_rows

    def run() -> None:
        fill()
        for i in range(n):
            np.matmul(wmat, cols[i], out=o2[i])
        if bias is not None:
            np.add(o2, bias, out=o2)
        if finish is not None and not relu_after:
            finish()
        down()
        across()
        if finish is not None and relu_after:
            finish()

    return run


def native_band(job: _ConvPool, band: Band, packed: native.Packed, bounds: tuple[float, float]) -> Step:
    """The band through the compiled direct conv (native.conv_step), an image at a time (its buffers are one
    image's, whatever the batch): the image's input rows copied into a padded buffer of the band's own (the
    padding zeros written once, here), the conv with bias and activation into channels-last rows (no column
    matrix: the im2col runs a block of columns at a time in cache), then the pooling over those rows and one
    transposing copy into the output's rows."""
    i0, i1, (a, b), (top, bottom) = band
    xv, dst, k, q = job.xv, job.dst, job.k, job.q
    xp, inside, (xa, xb) = padded_rows(xv, job.pads, job.stride[0], job.r, a, b)
    conv = np.empty((b - a, q, k), xv.dtype)
    rows = np.empty((i1 - i0, q, k), xv.dtype)
    pooled = np.empty((i1 - i0, dst.shape[3], k), xv.dtype)
    conv_one = native.conv_step(packed, xp, (job.r, job.s), job.stride, conv, job.bias_flat, *bounds)
    # The pooling on (K, rows, cols) views of channels-last buffers, then one transposing copy into the output:
    # faster than pooling straight into the output's strided NCHW rows.
    down = max_pool(conv.transpose(2, 0, 1), rows.transpose(2, 0, 1), (job.kh, 1), (job.psh, 1),
                    (top, 0, bottom, 0), (job.pdh, 1))
    across = max_pool(rows.transpose(2, 0, 1), pooled.transpose(2, 0, 1), (1, job.kw), (1, job.psw),
                      (0, job.ppl, 0, job.ppr), (1, job.pdw))
    pooled_t = pooled.transpose(2, 0, 1)
    images = [(xv[i, :, xa:xb], dst[i, :, i0:i1]) for i in range(job.n)]

    def run() -> None:
        for src, out_rows in images:
            np.copyto(inside, src)
            conv_one()
            down()
            across()
            np.copyto(out_rows, pooled_t)

    return run
