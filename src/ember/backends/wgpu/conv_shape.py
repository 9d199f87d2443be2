"""A 2-D convolution's geometry (NCHW, filter (K, C/groups, R, S)) as the wgpu conv kernels see it."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.expr import Expr
from ...core.view import View
from .shader.bindings import Bindings
from .shader.epilogue import Epilogue
from .shader.wgsl import addr


@dataclass
class ConvShape:
    n: int
    c: int
    h: int
    w: int
    k: int
    cg: int
    r: int
    s: int
    p: int
    q: int
    sh: int
    sw: int
    pt: int
    pl: int
    dh: int
    dw: int
    groups: int

    @property
    def kg(self) -> int:
        return self.k // self.groups


def check_conv_shape(x: View, w: View, out: View, stride: tuple[int, int], pads: tuple[int, int, int, int],
                dilation: tuple[int, int], groups: int) -> ConvShape:
    for name, v in (("x", x), ("w", w), ("out", out)):
        if len(v.shape) != 4:
            raise ValueError(f"conv: {name} must be 4-D, got shape {v.shape}")
        if not v.is_contiguous():
            raise ValueError(f"conv: {name} must be a contiguous view, got strides {v.strides} for shape {v.shape}")
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = stride, pads, dilation
    if groups < 1 or c % groups or k % groups or cg != c // groups:
        raise ValueError(f"conv: groups={groups} does not fit input channels {c}, filter {w.shape}")
    if min(sh, sw, dh, dw) < 1 or min(pt, pl, pb, pr) < 0:
        raise ValueError(f"conv: bad stride {stride}, dilation {dilation} or pads {pads}")
    p = (h + pt + pb - dh * (r - 1) - 1) // sh + 1
    q = (wd + pl + pr - dw * (s - 1) - 1) // sw + 1
    if out.shape != (n, k, p, q):
        raise ValueError(f"conv: out shape {out.shape}, expected {(n, k, p, q)}")
    return ConvShape(n, c, h, wd, k, cg, r, s, p, q, sh, sw, pt, pl, dh, dw, groups)


def per_image_epilogue(cs: ConvShape, x: View, w: View, bias: View | None, out: View, act: Expr | None,
                        types: dict[int, str], res3: View | None) -> tuple[Bindings, Epilogue]:
    """Bindings (x, w, bias, residual, out) and the epilogue of the kernels that compute whole images' outputs
    (depthwise, direct): epi(acc, z = image, m = channel, n = p*Q + q)."""
    binds = Bindings(out.handle, types=types)
    for v in (x, w, bias, res3):
        if v is not None:
            binds.add(v.handle, False)
    pq = cs.p * cs.q
    ep = Epilogue(addr(out.offset, [("z", cs.k * pq), ("m", pq), ("n", 1)]), act=act)
    if bias is not None:
        ep.bias_index = addr(bias.offset, [("m", bias.strides[0])])
        ep.bias_handle = bias.handle
    if res3 is not None:
        ep.residual_index = addr(res3.offset, list(zip("zmn", res3.strides, strict=True)))
        ep.residual_handle = res3.handle
    return binds, ep

