"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, a gather kernel and reductions."""

from __future__ import annotations

from ..core.dtypes import kind_of
from ..core.expr import FLOAT, Expr, call, const, coord, inp, load
from .base import Context, Op, Tensor, register
from .elementwise import emit
from .exprs import float_const, kernel
from .reduce import reduce_axes
from .shape import reshape_view


def nll(ctx: Context, op: Op, logp: Tensor, target: Tensor, weight: Tensor | None, reduction: str,
        ignore: int | None) -> Tensor:
    """-logp[n, target[n, d...], d...] * weight[target], 0 where target == ignore_index, then reduced
    (mean: divided by the total weight of the targets not ignored, as onnx.reference)."""
    if logp.rank < 2 or target.shape != logp.shape[:1] + logp.shape[2:]:
        raise ValueError(f"{op.node.describe()}: input {logp.shape} and target {target.shape} do not match")
    tk = kind_of(target.dtype)
    t = inp(1, tk)
    rest = [coord(d) for d in range(1, target.rank)]
    ins: list[Tensor] = [logp, target]
    picked = call("neg", load(0, coord(0), t, *rest, kind=FLOAT))
    w: Expr | None = None
    if weight is not None:
        ins.append(weight)
        w = load(2, t, kind=FLOAT)
    valid = call("ne", t, const(ignore, tk)) if ignore is not None else None
    loss = picked if w is None else call("mul", picked, w)
    if valid is not None:
        loss = call("where", valid, loss, float_const(0.0))
    per = kernel(ctx, loss, ins, logp.dtype, target.shape)
    if reduction == "none":
        return per
    if reduction not in ("sum", "mean"):
        raise op.fail(f"reduction {reduction!r} is not supported")
    axes = list(range(target.rank))
    total = reduce_axes(ctx, "sum", per, axes)
    if reduction == "sum":
        return total
    if w is None and valid is None:
        return emit(ctx, op, call("div", inp(0), float_const(float(target.size))), [total], logp.dtype)
    wt = w if w is not None else float_const(1.0)
    if valid is not None:
        wt = call("where", valid, wt, float_const(0.0))
    weights = kernel(ctx, wt, ins, logp.dtype, target.shape)
    return emit(ctx, op, call("div", inp(0), inp(1)), [total, reduce_axes(ctx, "sum", weights, axes)], logp.dtype)


@register("NegativeLogLikelihoodLoss", 12)
class NegativeLogLikelihoodLoss(Op):
    attrs = {"reduction": "mean", "ignore_index": None}

    def run(self, ctx: Context, x: Tensor, target: Tensor, weight: Tensor | None = None) -> list[Tensor]:
        return [nll(ctx, self, x, target, weight, self.attr["reduction"], self.attr["ignore_index"])]


@register("SoftmaxCrossEntropyLoss", 12)
class SoftmaxCrossEntropyLoss(Op):
    attrs = {"reduction": "mean", "ignore_index": None}

    def run(self, ctx: Context, x: Tensor, target: Tensor, weight: Tensor | None = None) -> list[Tensor]:
        if x.dtype.kind != "f":
            raise self.fail(f"scores of {x.dtype} are not supported")
        # log_softmax over the class axis: x - logsumexp(x), one reduction and one kernel.
        lse = reshape_view(ctx, reduce_axes(ctx, "logsumexp", x, [1]), x.shape[:1] + (1,) + x.shape[2:])
        logp = emit(ctx, self, call("sub", inp(0), inp(1)), [x, lse], x.dtype)
        loss = nll(ctx, self, logp, target, weight, self.attr["reduction"], self.attr["ignore_index"])
        return [loss, logp]
