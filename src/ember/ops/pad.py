"""Pad and CenterCropPad: a constant pad is a fill and a strided copy of the input; reflect/edge/wrap pads
and crops are one gather kernel whose source indices are computed."""

from __future__ import annotations

from ..core.dtypes import kind_of
from ..core.expr import Expr, call, const, coord, load
from ..core.view import View
from .base import Context, Op, Tensor, host_ints, host_shape, norm_axis, register
from .exprs import all_exprs, int_const, kernel, zero
from .shape import copy_into, slice_view


def pad_source(mode: str, c: Expr, before: int, n: int) -> Expr:
    """The input index that output index `c` reads in a reflect/edge/wrap pad (edge: load clamps)."""
    i = call("sub", c, int_const(before)) if before else c
    if mode == "edge":
        return i
    if mode == "wrap":
        return call("mod", i, int_const(n))
    if n == 1:
        return int_const(0)
    period = 2 * (n - 1)  # reflect: a triangle wave over the input, as numpy.pad's "reflect"
    m = call("mod", i, int_const(period))
    return call("where", call("ge", m, int_const(n)), call("sub", int_const(period), m), m)


def padded(ctx: Context, x: Tensor, mode: str, before: list[int], after: list[int]) -> Tensor:
    shape = [d + b + e for d, b, e in zip(x.shape, before, after, strict=True)]
    idx = [pad_source(mode, coord(a), before[a], x.shape[a]) for a in range(x.rank)]
    return kernel(ctx, load(0, *idx, kind=kind_of(x.dtype)), [x], x.dtype, shape)


@register("Pad", 1)
class Pad(Op):
    f16 = True
    host_inputs = (1, 2, 3)
    attrs = {"mode": "constant", "pads": None, "value": 0.0, "paddings": None}

    def run(self, ctx: Context, x: Tensor, pads: Tensor | None = None, value: Tensor | None = None,
            axes: Tensor | None = None) -> list[Tensor]:
        mode = self.attr["mode"]
        if mode not in ("constant", "reflect", "edge", "wrap"):
            raise self.fail(f"mode {mode!r} is not supported")
        p = host_ints(self, pads, "pads") if pads is not None else (self.attr["pads"] or self.attr["paddings"])
        fill = self.attr["value"]
        if value is not None:
            if not value.is_const:
                raise self.fail("the constant_value input must be known when the plan is built")
            fill = value.value.reshape(-1)[0].item() if value.value.size else 0
        ax = host_ints(self, axes, "axes") if axes is not None else list(range(x.rank))
        ax = [norm_axis(self, a, x.rank) for a in ax]
        before, after = [0] * x.rank, [0] * x.rank
        for i, a in enumerate(ax):
            before[a], after[a] = p[i], p[i + len(ax)]
        shape = [d + b + e for d, b, e in zip(x.shape, before, after, strict=True)]
        if any(d < 0 for d in shape):
            raise ValueError(f"{self.node.describe()}: pads {p} crop more than the input {x.shape}")
        if mode != "constant":  # reflect/edge/wrap: one gather kernel, source indices computed
            return [padded(ctx, x, mode, before, after)]
        out = ctx.new(x.dtype, shape)
        if out.size:
            ctx.record(ctx.backend.record_elementwise(const(fill, kind_of(x.dtype)), [], out.view))
            src = x
            for a in range(x.rank):  # negative pads crop the input
                if before[a] < 0 or after[a] < 0:
                    src = slice_view(ctx, src, a, max(-before[a], 0), x.shape[a] - max(-after[a], 0))
            offset = sum(max(b, 0) * s for b, s in zip(before, out.view.strides, strict=True))
            copy_into(ctx, ctx.view(src), View(out.view.handle, x.dtype, src.shape, out.view.strides, offset))
        return [out]


@register("CenterCropPad", 18)
class CenterCropPad(Op):
    host_inputs = (1,)
    attrs = {"axes": None}

    def run(self, ctx: Context, x: Tensor, shape: Tensor) -> list[Tensor]:
        want = host_shape(self, shape)
        axes = [norm_axis(self, a, x.rank) for a in (self.attr["axes"] or range(x.rank))]
        src, before, out_shape = x, [0] * x.rank, list(x.shape)
        for a, s in zip(axes, want, strict=True):
            dim = x.shape[a]
            if s < dim:  # crop: the extra element of an odd difference comes off the end
                start = (dim - s) // 2
                src = slice_view(ctx, src, a, start, start + s)
            elif s > dim:
                before[a] = (s - dim) // 2
            out_shape[a] = s
        idx = [call("sub", coord(a), int_const(before[a])) if before[a] else coord(a) for a in range(x.rank)]
        inside = all_exprs([call("and", call("ge", i, int_const(0)), call("lt", i, int_const(src.shape[a])))
                            for a, i in enumerate(idx) if src.shape[a] != out_shape[a]])
        kind = kind_of(x.dtype)
        e = load(0, *idx, kind=kind)
        if inside is not None:
            e = call("where", inside, e, zero(kind))
        return [kernel(ctx, e, [src], x.dtype, out_shape)]
