"""2-D pooling on the cpu backend: max pooling as running maxima over clipped taps (no padded copy), average and
Lp pooling over a padded copy."""

from __future__ import annotations

import functools

import numpy as np

from . import parallel
from .steps import Step, seq
from .windows import taps

# Max pooling splits over the pool's threads from this many row maxima (N * C * output rows * input columns).
_SPLIT_ELEMENTS = 1 << 16


def max_pool(xv: np.ndarray, dst: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int],
             pads: tuple[int, int, int, int], dilation: tuple[int, int]) -> Step:
    """Running maximum over the taps, each clipped to the input: no padded copy. A tap that covers the whole
    output starts it; windows made of padding only stay -inf."""
    p, q = dst.shape[-2:]
    pairs = [(dst[..., o[0], o[1]], xv[..., i[0], i[1]]) for _, o, i in taps(xv, dst, kernel, stride, pads, dilation)]
    full = next((k for k, (d, _) in enumerate(pairs) if d.shape[-2:] == (p, q)), None)
    first = pairs.pop(full)[1] if full is not None else None

    def step() -> None:
        if first is None:
            dst.fill(-np.inf)
        else:
            np.copyto(dst, first)
        for d, src in pairs:
            np.maximum(d, src, out=d)  # propagates NaN, as MaxPool must

    return step


def record_pool(kind: str, xv: np.ndarray, dst: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int],
                pads: tuple[int, int, int, int], dilation: tuple[int, int], count_include_pad: bool,
                p: int = 2) -> list[Step]:
    n, c, h, w = xv.shape
    (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw) = kernel, stride, pads, dilation
    oh, ow = dst.shape[2:]
    if kind == "max":
        # Separable: the maximum over each window's rows (strided rows, each read whole), then over its
        # columns; NaN propagates through both. Bands of channels over the pool's threads.
        pool = parallel.pool()
        parts = pool.size if pool is not None and n * c * oh * w >= _SPLIT_ELEMENTS else 1
        rows = np.empty((n, c, oh, w), xv.dtype)
        tasks = []
        for c0, c1 in parallel.spans(c, parts):
            tasks.append(seq(max_pool(xv[:, c0:c1], rows[:, c0:c1], (kh, 1), (sh, 1), (pt, 0, pb, 0), (dh, 1)),
                             max_pool(rows[:, c0:c1], dst[:, c0:c1], (1, kw), (1, sw), (0, pl, 0, pr), (1, dw))))
        return [functools.partial(pool.run, tasks) if pool is not None and len(tasks) > 1 else tasks[0]]
    # Pad far enough that every window (ceil_mode ones too) lies inside; the padding is -inf for max,
    # 0 for sums, and a 0/1 mask counts the real elements for the average.
    eh = max(0, (oh - 1) * sh + (kh - 1) * dh + 1 - (h + pt))
    ew = max(0, (ow - 1) * sw + (kw - 1) * dw + 1 - (w + pl))
    fill = -np.inf if kind == "max" else 0
    padded = np.full((n, c, h + pt + eh, w + pl + ew), fill, xv.dtype)
    interior = padded[:, :, pt:pt + h, pl:pl + w]
    offsets = [(i * dh, j * dw) for i in range(kh) for j in range(kw)]

    def window(src: np.ndarray, i: int, j: int) -> np.ndarray:
        return src[..., i: i + sh * (oh - 1) + 1: sh, j: j + sw * (ow - 1) + 1: sw]

    count = None
    if kind == "avg":
        mask = np.zeros((1, 1, h + pt + eh, w + pl + ew), xv.dtype)
        # count_include_pad counts the declared padding, never the extra ceil_mode overhang.
        if count_include_pad:
            mask[:, :, : h + pt + pb, : w + pl + pr] = 1
        else:
            mask[:, :, pt:pt + h, pl:pl + w] = 1
        count = sum(window(mask, i, j) for i, j in offsets)

    def step() -> None:
        # One vectorised operation per window offset (kh*kw of them), not a 6-D strided reduction.
        interior[...] = xv
        if kind == "max":
            with np.errstate(invalid="ignore"):
                np.copyto(dst, window(padded, *offsets[0]))
                for i, j in offsets[1:]:
                    np.maximum(dst, window(padded, i, j), out=dst)  # propagates NaN, as MaxPool must
        elif kind == "avg":
            np.copyto(dst, window(padded, *offsets[0]))
            for i, j in offsets[1:]:
                dst[...] += window(padded, i, j)
            dst[...] /= count
        else:
            acc = sum(np.power(np.abs(window(padded, i, j)), p) for i, j in offsets)
            dst[...] = np.power(acc, 1.0 / p)

    return [step]
