"""TopK: the backend's top-k primitive."""

from __future__ import annotations

import numpy as np

from .base import Context, Op, Tensor, host_ints, norm_axis, register


@register("TopK", 1)
class TopK(Op):
    host_inputs = (1,)
    attrs = {"axis": -1, "k": None, "largest": 1, "sorted": 1}

    def run(self, ctx: Context, x: Tensor, k_t: Tensor | None = None) -> list[Tensor]:
        k = host_ints(self, k_t, "K")[0] if k_t is not None else self.attr["k"]
        axis = norm_axis(self, self.attr["axis"], x.rank)
        if not 0 <= k <= x.shape[axis]:
            raise ValueError(f"{self.node.describe()}: k = {k} is out of range for axis of size {x.shape[axis]}")
        shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
        values, indices = ctx.new(x.dtype, shape), ctx.new(np.int64, shape)
        if values.size:
            ctx.record(ctx.backend.record_topk(ctx.contiguous(x), values.view, indices.view, axis, k,
                                               bool(self.attr["largest"])))
        return [values, indices]
