"""Scaled dot-product attention on the cpu backend: numpy products, heads (else images) over the pool's threads."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import native_rows, parallel, resizable
from .steps import Step


def attention_numpy(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: Any, mask: np.ndarray | None) -> np.ndarray:
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if mask is not None:
        s = s + mask
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)  # a fully masked row gives zeros, not NaN
    e = np.exp(s - m)
    den = e.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(den > 0, e / np.where(den > 0, den, 1), 0)
    return np.matmul(p.astype(q.dtype), v)


def record_attention(qv: np.ndarray, kv: np.ndarray, vv: np.ndarray, mv: np.ndarray | None, dst: np.ndarray,
                     scale: float, causal: bool) -> list[Step]:
    rep = qv.shape[1] // kv.shape[1]
    sq, skv = qv.shape[2], kv.shape[2]
    causal_mask = None
    if causal:
        i, j = np.arange(sq)[:, None], np.arange(skv)[None, :]
        causal_mask = np.where(j <= i + (skv - sq), 0.0, -np.inf).astype(qv.dtype)

    # Heads (else images) over the pool's threads when the products are large enough to split.
    pool = parallel.blas_pool()
    batch, heads = qv.shape[:2]
    axis = 1 if pool is not None and heads >= pool.size else 0
    split = (pool is not None and batch * heads * sq * skv * qv.shape[3] * 2 >= parallel.SPLIT_MACS
             and qv.shape[axis] >= pool.size)

    if not split:  # a few query rows (a decode step's): the compiled kernel where it takes the case
        fast = native_rows.attention_step(qv, kv, vv, mv, dst, scale, causal)
        if fast is not None:
            return [fast]

    def step() -> None:
        q, keys, values, m = qv, kv, vv, mv
        if qv.dtype == np.float16:  # float32 work, one rounding into dst
            q, keys, values = (a.astype(np.float32) for a in (qv, kv, vv))
            m = None if mv is None else mv.astype(np.float32)
        keys = np.repeat(keys, rep, axis=1) if rep > 1 else keys
        values = np.repeat(values, rep, axis=1) if rep > 1 else values
        if causal_mask is not None:
            m = causal_mask if m is None else m + causal_mask
        sc = q.dtype.type(scale)
        if not split:
            dst[...] = attention_numpy(q, keys, values, sc, m)
            return

        def part(lo: int, hi: int) -> Step:
            ix = (slice(None), slice(lo, hi)) if axis == 1 else (slice(lo, hi),)
            mm = m[ix] if m is not None and m.ndim == 4 else m

            def run() -> None:
                dst[ix] = attention_numpy(q[ix], keys[ix], values[ix], sc, mm)

            return run

        assert pool is not None
        pool.run([part(lo, hi) for lo, hi in parallel.spans(qv.shape[axis], pool.size)])

    return [step]


def direct(buffers: list[np.ndarray], ranks: list[int], masked: bool, scale: float,
           causal: bool) -> resizable.Direct | None:
    """A Resizable's direct hook for a float32 attention call (q, k, v, [mask], out: their buffers and ranks): the
    compiled kernel reading each move's numbers itself; None where the library is not there."""
    if not native_rows.available():
        return None
    launch = native_rows.AttentionViews(1 + sum(2 * r + 1 for r in ranks), ranks,
                                        [(b.ctypes.data, b.nbytes) for b in buffers], masked, causal, scale,
                                        tuple(buffers))

    def move(numbers: np.ndarray | list[int]) -> list[Step] | None:
        return [launch.step] if launch.move(numbers) else None  # else make's arrays (and their checks) decide

    return move
