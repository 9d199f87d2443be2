"""Reductions: ReduceX, ArgMax/ArgMin, and the reduce helpers Softmax and the norms build on."""

from __future__ import annotations

import numpy as np

from ..core.view import View
from .base import Context, Op, Tensor, register
from .shape import host_ints, norm_axis, reshape_view


def reduce_axes(ctx: Context, op: str, x: Tensor, axes: list[int], out_dtype: np.dtype | None = None) -> Tensor:
    """Reduce `axes` of x; the result has the kept dims only (no keepdims)."""
    keep = [i for i in range(x.rank) if i not in axes]
    out = ctx.new(out_dtype or x.dtype, [x.shape[i] for i in keep])
    if out.size:
        v = ctx.view(x).permute(keep + list(axes))
        if len(axes) > 1 and all(x.shape[a] > 0 for a in axes):
            # Merge the reduced dims into one when they are laid out contiguously (the common case).
            red_shape = [v.shape[len(keep) + i] for i in range(len(axes))]
            red_strides = [v.strides[len(keep) + i] for i in range(len(axes))]
            dense = all(red_strides[i] == red_strides[i + 1] * red_shape[i + 1] for i in range(len(axes) - 1))
            if dense:
                n = int(np.prod(red_shape))
                v = View(v.handle, v.dtype, v.shape[:len(keep)] + (n,), v.strides[:len(keep)] + (red_strides[-1],),
                         v.offset)
                ctx.record(ctx.backend.record_reduce_axes(op, v, out.view, 1))
                return out
        ctx.record(ctx.backend.record_reduce_axes(op, v, out.view, len(axes)))
    return out


class Reduce(Op):
    f16 = True
    host_inputs = (1,)
    attrs = {"axes": None, "keepdims": 1, "noop_with_empty_axes": 0}
    fn: str
    axes_input_since: int = 18

    def run(self, ctx: Context, x: Tensor, axes_t: Tensor | None = None) -> list[Tensor]:
        axes = host_ints(self, axes_t, "axes") if axes_t is not None else self.attr["axes"]
        if not axes:
            if self.attr["noop_with_empty_axes"]:
                return [x]
            axes = list(range(x.rank))
        axes = sorted({norm_axis(self, a, x.rank) for a in axes})
        out = reduce_axes(ctx, self.fn, x, axes)
        if self.attr["keepdims"]:
            out = reshape_view(ctx, out, tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
        return [out]


for _name, _function in [("ReduceSum", "sum"), ("ReduceMean", "mean"), ("ReduceMax", "max"), ("ReduceMin", "min"),
                   ("ReduceProd", "prod"), ("ReduceL1", "l1"), ("ReduceL2", "l2"), ("ReduceLogSum", "logsum"),
                   ("ReduceLogSumExp", "logsumexp"), ("ReduceSumSquare", "sumsq")]:
    register(_name, 1)(type(_name, (Reduce,), {"fn": _function}))


class Arg(Op):
    f16 = True
    attrs = {"axis": 0, "keepdims": 1, "select_last_index": 0}
    fn: str

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        axis = norm_axis(self, self.attr["axis"], x.rank)
        fn = self.fn + ("_last" if self.attr["select_last_index"] else "")
        out = reduce_axes(ctx, fn, x, [axis], np.dtype(np.int64))
        if self.attr["keepdims"]:
            out = reshape_view(ctx, out, tuple(1 if i == axis else d for i, d in enumerate(x.shape)))
        return [out]


register("ArgMax", 1)(type("ArgMax", (Arg,), {"fn": "argmax"}))
register("ArgMin", 1)(type("ArgMin", (Arg,), {"fn": "argmin"}))
