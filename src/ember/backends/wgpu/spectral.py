"""Discrete Fourier transforms on the GPU: kernels/dft.wgsl (ComputeBackend.record_dft)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ...core.view import View
from .program import grid_1d, kernel

if TYPE_CHECKING:
    from .backend import WgpuBackend

MAX_LENGTH = 65535


@kernel("record_dft")
def record_dft(be: WgpuBackend, x: View, out: View, length: int, inverse: bool, onesided: bool) -> list[Any]:
    outer, lin, inner, channels = x.shape
    lout = out.shape[1]
    if not (x.is_contiguous() and out.is_contiguous()):
        raise ValueError("wgpu dft: views must be contiguous")
    if x.dtype != np.float32 or out.dtype != np.float32:
        raise NotImplementedError(f"wgpu DFT: float32 tensors only, got {x.dtype}")
    if length > MAX_LENGTH:
        # The phase k*n is formed in u32 before its reduction mod N.
        raise NotImplementedError(f"wgpu DFT: transform length {length} above {MAX_LENGTH}")
    total = outer * lout * inner
    if total == 0:
        return []
    half = inverse and onesided
    src = be.kernel_source("dft", TOTAL=total, INNER=inner, LOUT=lout, LIN=lin, N=length, C=channels,
                           TERMS=length if half else min(lin, length), HALF=int(half), OUT_C=out.shape[3],
                           X_OFFSET=x.offset, SIGN="1.0" if inverse else "-1.0",
                           SCALE=repr(1.0 / length) if inverse else "1.0")
    return [be.dispatch(be.pipeline("dft", src), [x.handle, out.handle], grid_1d(math.ceil(total / 256)), "dft")]
