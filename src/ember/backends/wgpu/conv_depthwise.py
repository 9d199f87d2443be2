"""Depthwise 2-D convolution (C/groups == 1, groups == C): kernels/conv_depthwise.wgsl, one output per thread."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...core.expr import Expr
from ...core.view import View
from .conv_shape import ConvShape, per_image_epilogue
from .program import grid_1d
from .shader.wgsl import PRELUDE, addr, u32

if TYPE_CHECKING:
    from .backend import WgpuBackend

DEPTHWISE_WORKGROUP = 256


def record_depthwise(be: WgpuBackend, cs: ConvShape, x: View, w: View, bias: View | None, out: View,
                      act: Expr | None, types: dict[int, str], res3: View | None) -> list:
    binds, ep = per_image_epilogue(cs, x, w, bias, out, act, types, res3)
    total = cs.n * cs.k * cs.p * cs.q
    groups = math.ceil(total / DEPTHWISE_WORKGROUP)
    grid = grid_1d(groups)
    header = "\n".join([
        f"// ember depthwise conv: x {(cs.n, cs.c, cs.h, cs.w)}, w {(cs.k, 1, cs.r, cs.s)} (multiplier "
        f"{cs.k // cs.c}), stride {(cs.sh, cs.sw)}, pads top/left {(cs.pt, cs.pl)}, dilation {(cs.dh, cs.dw)}",
        "// Bindings (group 0):", *binds.comment(),
        f"// Dispatch grid: {grid} = ceil({total} outputs / {DEPTHWISE_WORKGROUP}) workgroups spread over x, y"])
    x_idx = addr(x.offset, [("xc", cs.h * cs.w), ("hu", cs.w), ("wu", 1)])
    src = be.kernel_source(
        "conv_depthwise", HEADER=header, PRELUDE=PRELUDE, BINDINGS="\n".join(binds.declarations()),
        EPILOGUE=ep.function(binds), WORKGROUP=DEPTHWISE_WORKGROUP, TOTAL=u32(total), P=u32(cs.p), Q=u32(cs.q),
        K=u32(cs.k), C=u32(cs.c), MULT=u32(cs.k // cs.c), H=u32(cs.h), W=u32(cs.w), R=u32(cs.r), S=u32(cs.s),
        SH=u32(cs.sh), SW=u32(cs.sw), PT=f"{cs.pt}i", PL=f"{cs.pl}i", DH=u32(cs.dh), DW=u32(cs.dw),
        LOAD_X=binds.scalar(x.handle, x_idx), LOAD_W=binds.scalar(w.handle, f"{w.offset}u + wk + r * {u32(cs.s)} + s"))
    return [be.dispatch(be.pipeline("conv_depthwise", src), binds.buffers(), grid, "conv_depthwise")]
