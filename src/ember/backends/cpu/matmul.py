"""Batched matrix products on the cpu backend: out = act(alpha * a @ b + beta * bias), numpy's matmul (OpenBLAS)
into the output, split over the pool's threads when large enough."""

from __future__ import annotations

import functools

import numpy as np

from ...core.expr import Expr, eval_numpy
from . import parallel
from .elementwise import epilogue
from .steps import Step


def record_matmul(av: np.ndarray, bv: np.ndarray, cv: np.ndarray | None, dst: np.ndarray, alpha: float, beta: float,
                  act: Expr | None) -> list[Step]:
    """cv: the bias already broadcast to dst's shape, or None (also where beta is 0)."""
    if av.shape[0] == 1:
        # numpy hands 2-D products to BLAS; a stride-0 batch dim of 1 would send it to a slow loop.
        av, bv, dst = av[0], bv[0], dst[0]
        cv = cv[0] if cv is not None else None
    if not any(np.may_share_memory(dst, v) for v in (av, bv, cv) if v is not None):
        return _into_output(av, bv, cv, dst, alpha, beta, act)
    dt = dst.dtype
    alpha_, beta_ = dt.type(alpha), dt.type(beta)

    def step() -> None:
        r = np.matmul(av, bv)
        if alpha != 1.0:
            r *= alpha_
        if cv is not None:
            r += cv * beta_ if beta != 1.0 else cv
        if act is not None:
            r = eval_numpy(act, [r], dt)
        dst[...] = r

    return [step]


def add_residual(dst: np.ndarray, rv: np.ndarray, act: Expr | None) -> list[Step]:
    """dst = act(dst + rv), in place: the residual of a product that already took a bias."""
    step = epilogue(act, dst, rv)
    assert step is not None
    return [step]


def _into_output(av: np.ndarray, bv: np.ndarray, cv: np.ndarray | None, dst: np.ndarray, alpha: float, beta: float,
                 act: Expr | None) -> list[Step]:
    """The product lands in the output and the epilogue runs there in place: no temporaries."""
    alpha_, beta_ = dst.dtype.type(alpha), dst.dtype.type(beta)

    def direct(av: np.ndarray, bv: np.ndarray, cv: np.ndarray | None, dst: np.ndarray) -> Step:
        finish = epilogue(act, dst)
        scaled = np.empty_like(dst) if cv is not None and beta != 1.0 else None

        def run() -> None:
            np.matmul(av, bv, out=dst)
            if alpha != 1.0:
                np.multiply(dst, alpha_, out=dst)
            if scaled is not None:
                np.add(dst, np.multiply(cv, beta_, out=scaled), out=dst)
            elif cv is not None:
                np.add(dst, cv, out=dst)
            if finish is not None:
                finish()

        return run

    pool = parallel.blas_pool()
    m, k, n = av.shape[-2], av.shape[-1], bv.shape[-1]
    if pool is None or dst.size == 0 or dst.size // (m * n) * m * n * k < parallel.SPLIT_MACS:
        return [direct(av, bv, cv, dst)]
    # Parts of the output over the pool's threads: batch, else the longer of rows and columns (a wide
    # product's threads then each read part of the weight).
    axis = 0 if dst.ndim == 3 and dst.shape[0] >= pool.size else (-2 if m >= n else -1)

    def part(v: np.ndarray, lo: int, hi: int, dim: int) -> np.ndarray:
        ix = [slice(None)] * v.ndim
        ix[dim] = slice(lo, hi)
        return v[tuple(ix)]

    tasks = []
    for lo, hi in parallel.spans(dst.shape[axis], pool.size):
        a_part = av if axis == -1 else part(av, lo, hi, axis)
        b_part = bv if axis == -2 else part(bv, lo, hi, axis)
        c_part = part(cv, lo, hi, axis) if cv is not None else None
        tasks.append(direct(a_part, b_part, c_part, part(dst, lo, hi, axis)))
    return [functools.partial(pool.run, tasks)]
