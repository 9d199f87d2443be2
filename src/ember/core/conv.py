"""What a 2-D convolution is, independent of how a backend runs it: the op builds a `ConvSpec`, the backend's
kernel selection (`ComputeBackend.select_conv`) picks the algorithm for it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ConvSpec:
    """A 2-D convolution, NCHW, filter (K, C/groups, R, S); a 1-D one arrives as H = 1. pads are (top, left,
    bottom, right). `const_weight`: the filter is a model constant (a backend may transform it once, at load)."""

    x_shape: tuple[int, int, int, int]
    w_shape: tuple[int, int, int, int]
    out_shape: tuple[int, int, int, int]
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilations: tuple[int, int]
    groups: int
    dtype: np.dtype
    const_weight: bool

    @property
    def kernel(self) -> tuple[int, int]:
        return self.w_shape[2], self.w_shape[3]
