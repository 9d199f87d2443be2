"""Reductions over the last axes on the cpu backend: float sums accumulate in float64, empty reductions give the
identity."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .steps import Step


def _arg(fn: Callable, last: bool) -> Callable:
    def reduce(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        (axis,) = axes
        if last:
            flipped = np.flip(x, axis)
            return x.shape[axis] - 1 - fn(flipped, axis=axis)
        return fn(x, axis=axis)

    return reduce


def _lowest(dtype: np.dtype) -> Any:
    return -np.inf if dtype.kind == "f" else False if dtype.kind == "b" else np.iinfo(dtype).min


def _highest(dtype: np.dtype) -> Any:
    return np.inf if dtype.kind == "f" else True if dtype.kind == "b" else np.iinfo(dtype).max


def _acc(x: np.ndarray) -> Any:
    """Accumulate float sums in float64: numpy adds along a strided axis one element at a time, and float32
    drifts over long rows."""
    return np.float64 if x.dtype.kind == "f" else None


def _logsumexp(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0)
    return (np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True, dtype=_acc(x))) + m).squeeze(axes)


_REDUCERS: dict[str, Callable[[np.ndarray, tuple[int, ...]], Any]] = {
    "sum": lambda x, a: np.sum(x, axis=a, dtype=_acc(x)),
    "mean": lambda x, a: np.mean(x, axis=a, dtype=_acc(x)) if x.dtype.kind == "f" else np.sum(x, axis=a) // math.prod(
        x.shape[i] for i in a),
    # Empty reductions give the identity (-inf / +inf), as ONNX specifies.
    "max": lambda x, a: np.max(x, axis=a, initial=_lowest(x.dtype)),
    "min": lambda x, a: np.min(x, axis=a, initial=_highest(x.dtype)),
    "prod": lambda x, a: np.prod(x, axis=a),
    "sumsq": lambda x, a: np.sum(x * x, axis=a, dtype=_acc(x)),
    "l1": lambda x, a: np.sum(np.abs(x), axis=a, dtype=_acc(x)),
    "l2": lambda x, a: np.sqrt(np.sum(x * x, axis=a, dtype=_acc(x))),
    "logsum": lambda x, a: np.log(np.sum(x, axis=a, dtype=_acc(x))),
    "logsumexp": _logsumexp,
    "argmax": _arg(np.argmax, False),
    "argmin": _arg(np.argmin, False),
    "argmax_last": _arg(np.argmax, True),
    "argmin_last": _arg(np.argmin, True),
}


def record_reduce_axes(op: str, xv: np.ndarray, dst: np.ndarray, n_reduce: int) -> list[Step]:
    axes = tuple(range(xv.ndim - n_reduce, xv.ndim))
    fn = _REDUCERS[op]

    def step() -> None:
        with np.errstate(all="ignore"):
            dst[...] = fn(xv, axes)

    return [step]
