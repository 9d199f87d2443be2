"""Pooling on the GPU (MaxPool, AveragePool, LpPool; global pools are reductions): kernels/pool2d.wgsl."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.view import View
from .program import grid_1d, kernel, storage_type
from .shader.wgsl import PRELUDE

if TYPE_CHECKING:
    from .backend import WgpuBackend

KINDS = {"max": 0, "avg": 1, "lp": 2}


@kernel("record_pool")
def record_pool(be: WgpuBackend, kind: str, x: View, out: View, kernel: tuple[int, int], stride: tuple[int, int],
                pads: tuple[int, int, int, int], dilation: tuple[int, int], count_include_pad: bool,
                p: int = 2) -> list[Any]:
    xt, ot = storage_type(x.dtype), storage_type(out.dtype)
    if xt not in ("f32", "f16") or ot not in ("f32", "f16") or not (x.is_contiguous() and out.is_contiguous()):
        raise NotImplementedError(f"wgpu pool: needs contiguous float tensors, got {x.dtype} -> {out.dtype}")
    n, c, h, w = x.shape
    oh, ow = out.shape[2:]
    total = n * c * oh * ow
    if total == 0:
        return []
    src = be.kernel_source(
        "pool2d", PRELUDE=PRELUDE, XT=xt, OT=ot, KIND=KINDS[kind], TOTAL=total, OH=oh, OW=ow, H=h, W=w, HW=h * w,
        KH=kernel[0], KW=kernel[1], SH=stride[0], SW=stride[1], PT=pads[0], PL=pads[1], PB=pads[2], PR=pads[3],
        DH=dilation[0], DW=dilation[1], INCLUDE_PAD="true" if count_include_pad else "false", P=int(p),
        INIT="-inf_f32()" if kind == "max" else "0.0",
    )
    pipeline = be.pipeline(f"pool:{kind}", src)
    return [be.dispatch(pipeline, {0: x.handle, 1: out.handle}, grid_1d(-(-total // 256)), f"pool:{kind}")]
