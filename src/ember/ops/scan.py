"""CumSum and CumProd: the backend's scan primitive."""

from __future__ import annotations

from .base import Context, Op, Tensor, host_ints, norm_axis, register


class Cumulative(Op):
    host_inputs = (1,)
    attrs = {"exclusive": 0, "reverse": 0}
    fn: str

    def run(self, ctx: Context, x: Tensor, axis: Tensor) -> list[Tensor]:
        a = norm_axis(self, host_ints(self, axis, "axis")[0], x.rank)
        out = ctx.new(x.dtype, x.shape)
        if out.size:
            ctx.record(ctx.backend.record_scan(self.fn, ctx.contiguous(x), out.view, a, bool(self.attr["exclusive"]),
                                               bool(self.attr["reverse"])))
        return [out]
register("CumSum", 11)(type("CumSum", (Cumulative,), {"fn": "sum"}))
register("CumProd", 26)(type("CumProd", (Cumulative,), {"fn": "prod"}))
