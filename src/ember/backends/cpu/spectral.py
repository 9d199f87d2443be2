"""Discrete Fourier transforms on the cpu backend (ComputeBackend.record_dft): numpy's FFT."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def dft_step(xv: np.ndarray, dst: np.ndarray, length: int, inverse: bool, onesided: bool) -> Callable[[], None]:
    """A step computing the transform of typed array xv (outer, L, inner, 1 | 2) into dst (outer, L', inner, 2),
    or, for a real inverse of a one-sided spectrum, (outer, length, inner, 1)."""
    lout = dst.shape[1]

    def step() -> None:
        signal = xv[..., 0] if xv.shape[-1] == 1 else xv[..., 0] + 1j * xv[..., 1]
        signal = signal.astype(np.complex128)
        if inverse and onesided:
            dst[..., 0] = np.fft.irfft(signal, n=length, axis=1)
            return
        spectrum = (np.fft.ifft if inverse else np.fft.fft)(signal, n=length, axis=1)[:, :lout]
        dst[..., 0] = spectrum.real
        dst[..., 1] = spectrum.imag

    return step
