"""ai.onnx.ml ops: Binarizer, ArrayFeatureExtractor."""

from __future__ import annotations

from ..core.dtypes import kind_of
from ..core.expr import INT, call, const, coord, inp, load
from .base import Context, Op, Tensor, register
from .elementwise import emit
from .exprs import kernel, zero
from .shape import reshape_view


@register("Binarizer", 1, domain="ai.onnx.ml")
class Binarizer(Op):
    attrs = {"threshold": 0.0}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        k = kind_of(x.dtype)
        e = call("where", call("gt", inp(0, k), const(self.attr["threshold"], k)), const(1, k), zero(k))
        return [emit(ctx, self, e, [x], x.dtype)]


@register("ArrayFeatureExtractor", 1, domain="ai.onnx.ml")
class ArrayFeatureExtractor(Op):
    """data[..., indices] (flattened indices); a 1-D input gives one row, as onnxruntime."""

    def run(self, ctx: Context, x: Tensor, indices: Tensor) -> list[Tensor]:
        n = indices.size
        shape = (1, n) if x.rank == 1 else x.shape[:-1] + (n,)
        flat = reshape_view(ctx, indices, (n,))
        lead = [coord(d) for d in range(x.rank - 1)]
        e = load(0, *lead, load(1, coord(len(shape) - 1), kind=INT), kind=kind_of(x.dtype))
        return [kernel(ctx, e, [x, flat], x.dtype, shape)]
