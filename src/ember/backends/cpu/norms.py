"""Row normalisations on the cpu backend: layer and RMS norms with float64 statistics, (log)softmax."""

from __future__ import annotations

import numpy as np

from ...core.view import View
from . import native_rows
from .steps import Step

NORMS = ("layernorm", "rmsnorm")


def check_rows(x: View, out: View, n: int) -> None:
    """x and out: contiguous, the same number of elements, whole rows of n (reshapes must stay views)."""
    if not (x.is_contiguous() and out.is_contiguous()):
        raise ValueError("x and out must be contiguous views")
    if n < 1 or x.size != out.size or x.size % n:
        raise ValueError(f"x ({x.size} elements) and out ({out.size}) must be whole rows of n={n}")


def check_norm(kind: str) -> None:
    if kind not in NORMS:
        raise ValueError(f"kind: unknown norm {kind!r}; valid: {', '.join(NORMS)}")


def record_norm(kind: str, xv: np.ndarray, sv: np.ndarray | None, bv: np.ndarray | None, dst: np.ndarray, n: int,
                eps: float) -> list[Step]:
    """xv, dst: (rows, n); sv and bv: any strided arrays of n elements, reshaped at run time (a reshape that has to
    copy must not freeze their contents at record time). The compiled kernel where it takes the case."""
    fast = native_rows.norm_step(kind, xv, sv, bv, dst, n, eps)
    if fast is not None:
        return [fast]

    def step() -> None:
        # Statistics in float64, two-pass: exact enough for a large common offset (1e4 + noise), where
        # float32's E[x²] - E[x]² (or even a float32 mean) loses the deviations.
        with np.errstate(all="ignore"):
            v = xv.astype(np.float64)
            if kind == "layernorm":
                v = v - v.mean(axis=1, keepdims=True)
            v *= 1.0 / np.sqrt(np.mean(v * v, axis=1, keepdims=True) + eps)
            if sv is not None:
                v *= sv.reshape(n)
            if bv is not None:
                v += bv.reshape(n)
            dst[...] = v

    return [step]


def record_softmax(xv: np.ndarray, dst: np.ndarray, log: bool) -> list[Step]:
    """xv, dst: (rows, n)."""
    ct = np.promote_types(xv.dtype, np.float32)

    def step() -> None:
        # ONNX's formula: exp(x - max) / sum. A row of all -inf gives -inf - -inf = NaN everywhere, as
        # onnx.reference and ONNX Runtime do; so does a row holding NaN or +inf.
        with np.errstate(all="ignore"):
            v = xv.astype(ct, copy=True)
            v -= v.max(axis=1, keepdims=True)
            e = np.exp(v)
            s = e.sum(axis=1, keepdims=True)
            dst[...] = v - np.log(s) if log else e / s

    return [step]
