"""View: a strided window on a device allocation — the vocabulary ops and backends share for tensors in memory."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class View:
    """A strided window on an allocation, in elements of `dtype` (the logical, numpy dtype).

    Broadcasting is a stride of 0; a transpose or slice is a permutation or step in `strides`. The
    runtime's elementwise, matmul and reduce primitives take Views, so Transpose/Expand/Slice need no copy
    kernel of their own.
    """

    handle: int
    dtype: np.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @staticmethod
    def contiguous(handle: int, dtype: Any, shape: Sequence[int], offset: int = 0) -> View:
        shape = tuple(int(d) for d in shape)
        strides, acc = [], 1
        for d in reversed(shape):
            strides.append(acc)
            acc *= d
        return View(handle, np.dtype(dtype), shape, tuple(reversed(strides)), offset)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        """Row-major without gaps. A size-1 dim's stride is never used, so any value passes (a transposed or
        sliced view of a single row is still one run of memory)."""
        acc = 1
        for d, s in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if d != 1 and s != acc:
                return False
            acc *= d
        return True

    def extent(self) -> int:
        """Elements from the start of the allocation that this view can touch."""
        if self.size == 0:
            return 0
        return self.offset + sum((d - 1) * s for d, s in zip(self.shape, self.strides, strict=True) if s > 0) + 1

    def broadcast_to(self, shape: Sequence[int]) -> View:
        shape = tuple(shape)
        pad = len(shape) - len(self.shape)
        if pad < 0:
            raise ValueError(f"cannot broadcast shape {self.shape} to {shape}")
        src_shape = (1,) * pad + self.shape
        src_strides = (0,) * pad + self.strides
        strides = []
        for d_src, s, d in zip(src_shape, src_strides, shape, strict=True):
            if d_src == d:
                strides.append(s if d != 1 else 0)
            elif d_src == 1:
                strides.append(0)
            else:
                raise ValueError(f"cannot broadcast shape {self.shape} to {shape}")
        return View(self.handle, self.dtype, shape, tuple(strides), self.offset)

    def merged(self, shape: Sequence[int]) -> View | None:
        """The same elements as `shape`, where each new dim merges consecutive old dims, without a copy;
        None if the strides do not allow it (then the caller copies)."""
        shape = tuple(shape)
        if math.prod(shape) != self.size:
            return None
        dims = [(d, s) for d, s in zip(self.shape, self.strides, strict=True)]
        strides, i = [], 0
        for want in shape:
            if want == 1:
                strides.append(0)
                continue
            group, prod = [], 1
            while prod < want:
                if i >= len(dims):
                    return None
                group.append(dims[i])
                prod *= dims[i][0]
                i += 1
            if prod != want:
                return None
            real = [(d, s) for d, s in group if d != 1]
            for (_d0, s0), (d1, s1) in zip(real, real[1:], strict=False):
                if s0 != s1 * d1:
                    return None
            strides.append(real[-1][1] if real else 0)
        if any(d != 1 for d, _ in dims[i:]):
            return None
        return View(self.handle, self.dtype, shape, tuple(strides), self.offset)

    def reshaped(self, shape: Sequence[int]) -> View | None:
        """The same elements in row-major order as `shape`, without a copy: each run of old dims that lies evenly
        in memory is split or merged into new dims (numpy's and torch's view rule); None where no strides can
        express it (then the caller copies)."""
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) != self.size:
            return None
        if self.size == 0 or self.is_contiguous():
            return View.contiguous(self.handle, self.dtype, shape, self.offset)
        old = [(d, s) for d, s in zip(self.shape, self.strides, strict=True) if d != 1]
        strides = [0] * len(shape)
        i, j = len(old) - 1, len(shape) - 1
        while i >= 0:
            k = i  # old[k..i] is one evenly strided run
            while k > 0 and old[k - 1][1] == old[k][1] * old[k][0]:
                k -= 1
            run, acc = math.prod(d for d, _ in old[k:i + 1]), 1
            while acc < run:
                if j < 0:
                    return None
                strides[j] = old[i][1] * acc
                acc *= shape[j]
                j -= 1
            if acc != run:
                return None
            i = k - 1
        while j >= 0:
            if shape[j] != 1:
                return None
            j -= 1
        return View(self.handle, self.dtype, shape, tuple(strides), self.offset)

    def permute(self, perm: Sequence[int]) -> View:
        return View(self.handle, self.dtype, tuple(self.shape[p] for p in perm),
                    tuple(self.strides[p] for p in perm), self.offset)
