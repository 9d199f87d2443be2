"""Gather on the GPU: kernels/gather.wgsl."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ...core.view import View
from .program import grid_1d, kernel, storage_type

if TYPE_CHECKING:
    from .backend import WgpuBackend


@kernel("record_gather")
def record_gather(be: WgpuBackend, data: View, indices: View, axis: int, out: View) -> list[Any]:
    if not (data.is_contiguous() and indices.is_contiguous() and out.is_contiguous()):
        raise ValueError("wgpu gather: views must be contiguous")
    outer = math.prod(data.shape[:axis])
    inner = math.prod(data.shape[axis + 1:])
    nidx = indices.size
    total = outer * nidx * inner
    if total == 0:
        return []
    t = storage_type(data.dtype)
    src = be.kernel_source("gather", T=t, TOTAL=total, INNER=inner, NIDX=nidx, DIM=data.shape[axis],
                           IDX_OFFSET=indices.offset, DATA_OFFSET=data.offset)
    pipeline = be.pipeline("gather", src)
    return [be.dispatch(pipeline, [data.handle, indices.handle, out.handle], grid_1d(-(-total // 256)), "gather")]
