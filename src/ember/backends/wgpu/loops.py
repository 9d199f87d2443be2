"""Loop primitives on the GPU (ComputeBackend.record_scan/record_topk/record_scatter): kernels/scan.wgsl,
topk.wgsl, scatter.wgsl."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ...core.view import View
from .program import DF64, df64_library, grid_1d, kernel, storage_type
from .shader.wgsl import PRELUDE

if TYPE_CHECKING:
    from .backend import WgpuBackend

# f16 lines (float16 models) run in f16 like numpy's float16 cumsum; precision="f16" plans keep these ops in f32.
_IDENT = {("sum", "f32"): "0.0", ("sum", "f16"): "0.0", ("sum", "i32"): "0i", ("prod", "f32"): "1.0",
          ("prod", "f16"): "1.0", ("prod", "i32"): "1i", ("sum", DF64): "df(0.0)", ("prod", DF64): "df(1.0)"}
_COMBINE = {"none": "v", "add": "cur + v", "mul": "cur * v", "max": "max(cur, v)", "min": "min(cur, v)"}


def _lines(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _numeric(dtype: Any, what: str, df64: bool = False) -> str:
    """The storage type of a scan/topk operand; float64 (double-float) only where the kernel has df64 math."""
    t = storage_type(dtype)
    if t == "u32":
        raise NotImplementedError(f"wgpu {what}: bool tensors are not supported")
    if t == DF64 and not df64:
        raise NotImplementedError(f"wgpu {what}: float64 tensors are not supported (no double-float kernel)")
    return t


@kernel("record_scan")
def record_scan(be: WgpuBackend, op: str, x: View, out: View, axis: int, exclusive: bool, reverse: bool,
                ) -> list[Any]:
    if not (x.is_contiguous() and out.is_contiguous()):
        raise ValueError("wgpu scan: views must be contiguous")
    t = _numeric(x.dtype, "scan", df64=True)
    outer, n, inner = _lines(x.shape, axis)
    if outer * n * inner == 0:
        return []
    combine = ("df_add(acc, v)" if op == "sum" else "df_mul(acc, v)") if t == DF64 else \
        ("acc + v" if op == "sum" else "acc * v")
    src = be.kernel_source("scan", T=t, LINES=outer * inner, N=n, INNER=inner, IDENT=_IDENT[op, t],
                             LIBRARY=PRELUDE + df64_library() if t == DF64 else "",
                             INIT="    df_init(nwg);" if t == DF64 else "",
                             COMBINE=combine, EXCLUSIVE=str(exclusive).lower(),
                             REVERSE=str(reverse).lower(), X_OFF=x.offset, O_OFF=out.offset)
    pipeline = be.pipeline(f"scan:{op}", src)
    return [be.dispatch(pipeline, [x.handle, out.handle], grid_1d(-(-(outer * inner) // 256)), f"scan:{op}")]


@kernel("record_topk")
def record_topk(be: WgpuBackend, x: View, values: View, indices: View, axis: int, k: int, largest: bool,
                ) -> list[Any]:
    if not (x.is_contiguous() and values.is_contiguous() and indices.is_contiguous()):
        raise ValueError("wgpu topk: views must be contiguous")
    t = _numeric(x.dtype, "topk")
    outer, n, inner = _lines(x.shape, axis)
    total = outer * n * inner
    if total == 0 or k == 0:
        return []
    src = be.kernel_source("topk", T=t, TOTAL=total, N=n, INNER=inner, K=k, CMP=">" if largest else "<",
                             X_OFF=x.offset, V_OFF=values.offset, I_OFF=indices.offset)
    pipeline = be.pipeline("topk", src)
    return [be.dispatch(pipeline, [x.handle, values.handle, indices.handle], grid_1d(-(-total // 256)), "topk")]


@kernel("record_scatter")
def record_scatter(be: WgpuBackend, out: View, offsets: View, updates: View, reduction: str) -> list[Any]:
    if not (out.is_contiguous() and offsets.is_contiguous() and updates.is_contiguous()):
        raise ValueError("wgpu scatter: views must be contiguous")
    t = storage_type(out.dtype)
    m = updates.size
    if m == 0 or out.size == 0:
        return []
    if t in ("u32", DF64) and reduction != "none":
        raise NotImplementedError(f"wgpu scatter: reductions over {out.dtype} tensors are not supported")
    serial = reduction != "none"
    src = be.kernel_source("scatter", T=t, M=m, SIZE=out.size, COMBINE=_COMBINE[reduction],
                             SERIAL=str(serial).lower(), OUT_OFF=out.offset, OFF_OFF=offsets.offset,
                             UPD_OFF=updates.offset)
    pipeline = be.pipeline(f"scatter:{reduction}", src)
    grid = (1, 1, 1) if serial else grid_1d(-(-m // 256))
    return [be.dispatch(pipeline, [offsets.handle, updates.handle, out.handle], grid, f"scatter:{reduction}")]
