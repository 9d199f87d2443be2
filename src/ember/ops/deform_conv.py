"""DeformConv: bilinear samples at learned offsets, then a grouped MatMul."""

from __future__ import annotations

from ..core.expr import FLOAT, Expr, call, coord, inp, load
from .base import Context, Op, Tensor, call_op, register
from .elementwise import emit
from .exprs import float_const, int_const, kernel
from .shape import reshape_view


@register("DeformConv", 19)
class DeformConv(Op):
    """Deformable conv: one index kernel samples every (channel, tap, output position) bilinearly at its
    offset position (zeros outside, times the mask), then a grouped MatMul with the weights."""

    attrs = {"dilations": None, "group": 1, "kernel_shape": None, "offset_group": 1, "pads": None, "strides": None}

    def run(self, ctx: Context, x: Tensor, w: Tensor, offset: Tensor, b: Tensor | None = None,
            mask: Tensor | None = None) -> list[Tensor]:
        if x.rank != 4 or x.dtype.kind != "f":
            raise self.fail("only 2-D float DeformConv is supported")
        n, c, h, wd = x.shape
        oc, icpg, kh, kw = w.shape
        g, og_n = self.attr["group"], self.attr["offset_group"]
        if c != icpg * g or oc % g or c % og_n:
            raise ValueError(f"{self.node.describe()}: input {x.shape}, weight {w.shape}, group {g} disagree")
        sh, sw = self.attr["strides"] or [1, 1]
        dh, dw = self.attr["dilations"] or [1, 1]
        pt, pl = (self.attr["pads"] or [0, 0, 0, 0])[:2]
        oh, ow = offset.shape[2:]
        ch, i, j, yo, xo = coord(1), coord(2), coord(3), coord(4), coord(5)
        og = call("div", ch, int_const(c // og_n))
        tap = call("add", call("mul", call("add", call("mul", og, int_const(kh)), i), int_const(kw)), j)

        def off(axis: int) -> Expr:
            return load(2, coord(0), call("add", call("mul", tap, int_const(2)), int_const(axis)), yo, xo, kind=FLOAT)

        py = call("add", call("to_float", call("add", call("mul", yo, int_const(sh)), call("mul", i, int_const(dh)))),
                  call("add", float_const(-pt), off(0)))
        px = call("add", call("to_float", call("add", call("mul", xo, int_const(sw)), call("mul", j, int_const(dw)))),
                  call("add", float_const(-pl), off(1)))
        y0, x0 = call("floor", py), call("floor", px)
        fy, fx = call("sub", py, y0), call("sub", px, x0)
        iy, ix = call("to_int", y0), call("to_int", x0)
        terms = []
        for dy, wy in ((0, call("sub", float_const(1.0), fy)), (1, fy)):
            for dx, wx in ((0, call("sub", float_const(1.0), fx)), (1, fx)):
                ty = call("add", iy, int_const(dy)) if dy else iy
                tx = call("add", ix, int_const(dx)) if dx else ix
                ok = call("and", call("and", call("ge", ty, int_const(0)), call("lt", ty, int_const(h))),
                          call("and", call("ge", tx, int_const(0)), call("lt", tx, int_const(wd))))
                v = call("where", ok, load(0, coord(0), ch, ty, tx, kind=FLOAT), float_const(0.0))
                terms.append(call("mul", v, call("mul", wy, wx)))
        val = call("add", call("add", terms[0], terms[1]), call("add", terms[2], terms[3]))
        ins = [x, w, offset]
        if mask is not None:
            ins.append(mask)
            val = call("mul", val, load(3, coord(0), tap, yo, xo, kind=FLOAT))
        cols = kernel(ctx, val, ins, x.dtype, (n, c, kh, kw, oh, ow))
        k = icpg * kh * kw
        cols4 = reshape_view(ctx, cols, (n, g, k, oh * ow))
        w4 = reshape_view(ctx, w, (1, g, oc // g, k))
        y = reshape_view(ctx, call_op(ctx, self, "MatMul", w4, cols4)[0], (n, oc, oh, ow))
        if b is not None:
            y = emit(ctx, self, call("add", inp(0), inp(1)), [y, reshape_view(ctx, b, (oc, 1, 1))], x.dtype)
        return [y]
