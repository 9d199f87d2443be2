"""GridSample and AffineGrid. The sampling positions depend on data (the grid), so the kernel
computes them."""

from __future__ import annotations

import itertools

from ..core.expr import FLOAT, Expr, call, coord, load
from .base import Context, Op, Tensor, host_ints, register
from .exprs import all_exprs, float_const, int_const, kernel, sum_exprs


def _reflect(x: Expr, lo: float, hi: float) -> Expr:
    """Reflect x about the borders until it lies in [lo, hi] (onnx.reference's _gs_reflect)."""
    rng = float_const(hi - lo)

    def side(dx: Expr, near: float, far: float) -> Expr:
        n = call("floor", call("div", dx, rng))
        r = call("sub", dx, call("mul", n, rng))
        even = call("eq", call("mod", n, float_const(2.0)), float_const(0.0))
        toward = call("add", float_const(near), r) if near < far else call("sub", float_const(near), r)
        away = call("sub", float_const(far), r) if near < far else call("add", float_const(far), r)
        return call("where", even, toward, away)

    below = side(call("sub", float_const(lo), x), lo, hi)
    above = side(call("sub", x, float_const(hi)), hi, lo)
    return call("where", call("lt", x, float_const(lo)), below, call("where", call("gt", x, float_const(hi)), above, x))


def _cubic_taps(f: Expr, a: float = -0.75) -> list[Expr]:
    def m(*xs: Expr) -> Expr:
        acc = xs[0]
        for v in xs[1:]:
            acc = call("mul", acc, v)
        return acc

    def ad(x: Expr, y: Expr) -> Expr:
        return call("add", x, y)

    def sb(x: Expr, y: Expr) -> Expr:
        return call("sub", x, y)

    x1 = ad(f, float_const(1.0))
    g = sb(float_const(1.0), f)
    x3 = sb(float_const(2.0), f)
    return [sb(m(ad(m(sb(m(float_const(a), x1), float_const(5 * a)), x1), float_const(8 * a)), x1), float_const(4 * a)),
            ad(m(sb(m(float_const(a + 2), f), float_const(a + 3)), f, f), float_const(1.0)),
            ad(m(sb(m(float_const(a + 2), g), float_const(a + 3)), g, g), float_const(1.0)),
            sb(m(ad(m(sb(m(float_const(a), x3), float_const(5 * a)), x3), float_const(8 * a)), x3), float_const(4 * a))]


@register("GridSample", 16)
class GridSample(Op):
    attrs = {"mode": "linear", "padding_mode": "zeros", "align_corners": 0}

    def run(self, ctx: Context, x: Tensor, grid: Tensor) -> list[Tensor]:
        mode = {"bilinear": "linear", "bicubic": "cubic"}.get(self.attr["mode"], self.attr["mode"])
        pad, align = self.attr["padding_mode"], bool(self.attr["align_corners"])
        if x.dtype.kind != "f" or grid.dtype.kind != "f":
            raise self.fail("GridSample needs float tensors")
        nd = x.rank - 2
        dims = x.shape[2:]
        out_shape = x.shape[:2] + grid.shape[1:-1]
        gidx = [coord(0)] + [coord(2 + k) for k in range(nd)]
        taps_per_dim: list[list[tuple[Expr, Expr | None]]] = []
        for i, n in enumerate(dims):
            g = load(1, *gidx, int_const(nd - 1 - i), kind=FLOAT)  # the grid's last dim lists x (width) first
            if align:
                v = call("mul", call("div", call("add", g, float_const(1.0)), float_const(2.0)), float_const(n - 1))
                lo, hi = 0.0, n - 1.0
            else:
                v = call("div", call("sub", call("mul", call("add", g, float_const(1.0)), float_const(n)),
                                     float_const(1.0)), float_const(2.0))
                lo, hi = -0.5, n - 0.5
            if mode == "nearest":
                v = call("round", v)  # half to even, as PyTorch
            out_of = call("or", call("lt", v, float_const(lo)), call("gt", v, float_const(hi)))
            if pad == "border":
                v = call("where", out_of, call("max", float_const(0.0), call("min", v, float_const(n - 1.0))), v)
            elif pad == "reflection":
                v = call("where", out_of, _reflect(v, lo, hi), v)
            if mode == "nearest":
                taps = [(call("to_int", v), None)]
            else:
                x0 = call("floor", v)
                f = call("sub", v, x0)
                base = call("to_int", x0)
                if mode == "linear":
                    taps = [(base, call("sub", float_const(1.0), f)), (call("add", base, int_const(1)), f)]
                else:
                    taps = [(call("add", base, int_const(k - 1)), w) for k, w in enumerate(_cubic_taps(f))]
            fixed = []
            for t, w in taps:  # a tap outside the input: 0 (zeros), clamped (border), reflected (reflection)
                valid = None
                if pad == "zeros":
                    valid = call("and", call("ge", t, int_const(0)), call("lt", t, int_const(n)))
                elif pad == "reflection":
                    t = call("to_int", _reflect(call("to_float", t), lo, hi))
                fixed.append((t, w, valid))
            taps_per_dim.append(fixed)
        terms = []
        for combo in itertools.product(*taps_per_dim):
            val = load(0, coord(0), coord(1), *[t for t, _, _ in combo], kind=FLOAT)
            valid = all_exprs([ok for _, _, ok in combo if ok is not None])
            if valid is not None:
                val = call("where", valid, val, float_const(0.0))
            for _, w, _ in combo:
                if w is not None:
                    val = call("mul", val, w)
            terms.append(val)
        return [kernel(ctx, sum_exprs(terms), [x, grid], x.dtype, out_shape)]


@register("AffineGrid", 20)
class AffineGrid(Op):
    host_inputs = (1,)
    attrs = {"align_corners": 0}

    def run(self, ctx: Context, theta: Tensor, size: Tensor) -> list[Tensor]:
        full = host_ints(self, size, "size")
        dims = full[2:]
        nd = len(dims)
        out_shape = (full[0], *dims, nd)
        # Base coordinate along spatial dim i, in [-1, 1]; x (the last dim) pairs with theta column 0.
        base = []
        for i, n in enumerate(dims):
            c = call("to_float", coord(1 + i))
            if self.attr["align_corners"]:
                b = (call("sub", call("mul", c, float_const(2.0 / (n - 1))), float_const(1.0)) if n > 1
                     else float_const(-1.0))
            else:
                b = call("sub", call("mul", call("add", call("mul", c, float_const(2.0)), float_const(1.0)),
                                     float_const(1.0 / n)), float_const(1.0))
            base.append(b)
        row = coord(1 + nd)
        terms = [call("mul", load(0, coord(0), row, int_const(j), kind=FLOAT), base[nd - 1 - j]) for j in range(nd)]
        terms.append(load(0, coord(0), row, int_const(nd), kind=FLOAT))
        return [kernel(ctx, sum_exprs(terms), [theta], theta.dtype, out_shape)]
