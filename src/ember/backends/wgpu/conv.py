"""2-D convolution on the wgpu backend (NCHW, filter (K, C/groups, R, S)), bias + activation fused.

record_conv picks the kernel:
- float16 x and w where conv_sgmat.plan_conv_sgmat takes it (EMBER_MATRIX): implicit GEMM on the matrix units.
- 1x1, stride 1, no padding, one group: a batched matmul (weights broadcast over the batch; matmul.py).
- depthwise (C/groups == 1, groups == C): conv_depthwise.py, one output per thread.
- few input channels and a large window (an image model's stem): conv_direct.py, input patch and filter staged
  in workgroup memory (direct_geometry says which).
- everything else: implicit GEMM with the generated tiled GEMM kernel (conv_igemm.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.expr import Expr
from ...core.view import View
from .conv_depthwise import record_depthwise
from .conv_direct import direct_geometry, record_direct
from .conv_igemm import record_implicit_gemm
from .conv_sgmat import plan_conv_sgmat, record_conv_sgmat
from .conv_shape import check_conv_shape
from .matmul import record_matmul
from .program import kernel
from .shader.bindings import check_operands, require_float

if TYPE_CHECKING:
    from .backend import WgpuBackend


@kernel("record_conv")
def record_conv(be: WgpuBackend, x: View, w: View, bias: View | None, out: View, stride: tuple[int, int],
                pads: tuple[int, int, int, int], dilation: tuple[int, int], groups: int,
                act: Expr | None = None, residual: View | None = None) -> list:
    """out = act(conv(x, w) + bias + residual): bias per output channel, residual (a residual connection) of
    out's shape, read in the epilogue of whichever kernel computes the conv."""
    types = require_float("conv", x=x, w=w, bias=bias, out=out, residual=residual)
    cs = check_conv_shape(x, w, out, tuple(stride), tuple(pads), tuple(dilation), int(groups))
    if bias is not None and (len(bias.shape) != 1 or bias.shape[0] != cs.k):
        raise ValueError(f"conv: bias must have shape ({cs.k},), got {bias.shape}")
    res3 = None
    if residual is not None:
        res3 = residual.merged((cs.n, cs.k, cs.p * cs.q)) if residual.shape == out.shape else None
        if res3 is None:
            raise ValueError(f"conv: residual must have the output's shape {out.shape} with P and Q mergeable "
                             f"strides, got shape {residual.shape} strides {residual.strides}")
    check_operands(be, out, x=x, w=w, bias=bias, residual=residual)
    if out.size == 0:
        return []
    if x.size == 0 or w.size == 0:
        raise ValueError("conv: empty input or filter with a non-empty output")

    sgm = plan_conv_sgmat(be, cs, x, w, out, types)  # f16 on the matrix units (conv_sgmat.py), before the rest
    if sgm is not None:
        return record_conv_sgmat(be, cs, sgm, x, w, bias, out, act, types, res3)
    if (groups == 1 and cs.r == cs.s == 1 and (cs.sh, cs.sw) == (1, 1) and not any(pads)):
        hw = cs.h * cs.w
        a = View(w.handle, w.dtype, (cs.n, cs.k, cs.c), (0, cs.c, 1), w.offset)
        b = View(x.handle, x.dtype, (cs.n, cs.c, hw), (cs.c * hw, hw, 1), x.offset)
        o = View(out.handle, out.dtype, (cs.n, cs.k, hw), (cs.k * hw, hw, 1), out.offset)
        bv = None if bias is None else View(bias.handle, bias.dtype, (cs.n, cs.k, hw), (0, bias.strides[0], 0),
                                            bias.offset)
        return record_matmul(be, a, b, o, alpha=1.0, bias=bv, beta=1.0, act=act, residual=res3)
    if cs.cg == 1 and groups == cs.c:
        return record_depthwise(be, cs, x, w, bias, out, act, types, res3)
    g = direct_geometry(be, cs)
    if g is not None:
        return record_direct(be, cs, g, x, w, bias, out, act, types, res3)
    return record_implicit_gemm(be, cs, x, w, bias, out, act, types, res3)
