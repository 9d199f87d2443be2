"""Gather on the GPU: kernels/gather.wgsl."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ...core.view import View
from .program import grid_1d, kernel, sizes_buffer, sizes_decl, storage_type

if TYPE_CHECKING:
    from .backend import WgpuBackend


@kernel("record_gather")
def record_gather(be: WgpuBackend, data: View, indices: View, axis: int, out: View,
                  runtime_sizes: bool = False) -> list[Any]:
    """`runtime_sizes`: the sizes in a uniform buffer, not in the source (one pipeline for every size)."""
    if not (data.is_contiguous() and indices.is_contiguous() and out.is_contiguous()):
        raise ValueError("wgpu gather: views must be contiguous")
    outer = math.prod(data.shape[:axis])
    inner = math.prod(data.shape[axis + 1:])
    nidx = indices.size
    total = outer * nidx * inner
    if total == 0:
        return []
    t = storage_type(data.dtype)
    sizes = {"TOTAL": total, "INNER": inner, "NIDX": nidx, "DIM": data.shape[axis], "IDX_OFFSET": indices.offset,
             "DATA_OFFSET": data.offset}
    buffers: list[Any] = [data.handle, indices.handle, out.handle]
    if runtime_sizes:
        decl = sizes_decl(3, len(sizes))
        lets = "\n".join(f"    let {k} = u32(sz[{i // 4}][{i % 4}]);" for i, k in enumerate(sizes))
        buffers.append(sizes_buffer(be, list(sizes.values())))
    else:
        decl = "\n".join(f"const {k}: u32 = {v}u;" for k, v in sizes.items())
        lets = ""
    src = be.kernel_source("gather", T=t, SIZES=decl, SIZE_LETS=lets)
    pipeline = be.pipeline("gather", src)
    return [be.dispatch(pipeline, buffers, grid_1d(-(-total // 256)), "gather")]
