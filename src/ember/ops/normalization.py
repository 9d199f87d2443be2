"""Normalisations: BatchNormalization, InstanceNormalization, GroupNormalization,
LpNormalization, MeanVarianceNormalization, LRN, and `normalize`, which they and LayerNormalization's fallback
build on (the fused LayerNorm and RMSNorm kernels are in transformer.py)."""

from __future__ import annotations

import math

import numpy as np

from ..core.expr import FLOAT, call, const, inp
from .base import Context, Op, Tensor, norm_axis, register
from .elementwise import emit
from .exprs import float_const
from .reduce import reduce_axes
from .shape import reshape_view


def channel_shape(x: Tensor) -> tuple[int, ...]:
    """Shape that broadcasts a per-channel vector over NC... (C, 1, 1, ...)."""
    return (x.shape[1],) + (1,) * (x.rank - 2)


@register("BatchNormalization", 1)
class BatchNormalization(Op):
    attrs = {"epsilon": 1e-5, "momentum": 0.9, "spatial": 1, "is_test": 0, "training_mode": 0}

    def run(self, ctx: Context, x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor) -> list[Tensor]:
        cs = channel_shape(x)
        if self.attr["training_mode"]:
            return self._training(ctx, x, scale, bias, mean, var, cs)
        eps = self.attr["epsilon"]
        if all(t.is_const for t in (scale, bias, mean, var)):
            # Inference BN is an affine map: fold it to y = x * a + b with a, b computed once, here.
            a = scale.value.astype(np.float64) / np.sqrt(var.value.astype(np.float64) + eps)
            b = bias.value.astype(np.float64) - mean.value.astype(np.float64) * a
            ta, tb = ctx.const(a.astype(x.dtype).reshape(cs)), ctx.const(b.astype(x.dtype).reshape(cs))
            return [emit(ctx, self, call("add", call("mul", inp(0), inp(1)), inp(2)), [x, ta, tb], x.dtype)]
        ins = [x] + [reshape_view(ctx, t, cs) for t in (scale, bias, mean, var)]
        e = call("add", call("mul", call("div", call("sub", inp(0), inp(3)),
                                         call("sqrt", call("add", inp(4), const(eps, FLOAT)))), inp(1)), inp(2))
        return [emit(ctx, self, e, ins, x.dtype)]


    def _training(self, ctx: Context, x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor,
                  cs: tuple[int, ...]) -> list[Tensor]:
        """Training mode (opset 14+): normalised by the batch's own statistics (population variance over every
        axis but the channels); the running mean and variance updated with `momentum`."""
        axes = [i for i in range(x.rank) if i != 1]
        eps, m = float(self.attr["epsilon"]), float(self.attr["momentum"])
        y, batch_mean, inv = normalize(ctx, self, x, axes, eps, stats=True)
        y = emit(ctx, self, call("add", call("mul", inp(0), inp(1)), inp(2)),
                 [y, reshape_view(ctx, scale, cs), reshape_view(ctx, bias, cs)], x.dtype)
        bm = reshape_view(ctx, batch_mean, (x.shape[1],))
        # var = 1 / inv^2 - eps: the batch's population variance, from the statistics normalize kept.
        bv = emit(ctx, self, call("sub", call("div", const(1.0, FLOAT), call("mul", inp(0), inp(0))),
                                  const(eps, FLOAT)), [reshape_view(ctx, inv, (x.shape[1],))], x.dtype)
        running = [emit(ctx, self, call("add", call("mul", inp(0), const(m, FLOAT)),
                                        call("mul", inp(1), const(1.0 - m, FLOAT))), [old, new], x.dtype)
                   for old, new in ((mean, bm), (var, bv))]
        return [y, *running]


@register("InstanceNormalization", 1)
class InstanceNormalization(Op):
    attrs = {"epsilon": 1e-5}

    def run(self, ctx: Context, x: Tensor, scale: Tensor, bias: Tensor) -> list[Tensor]:
        cs = channel_shape(x)
        axes = list(range(2, x.rank))
        y = normalize(ctx, self, x, axes, self.attr["epsilon"])
        return [emit(ctx, self, call("add", call("mul", inp(0), inp(1)), inp(2)),
                     [y, reshape_view(ctx, scale, cs), reshape_view(ctx, bias, cs)], x.dtype)]


def normalize(ctx: Context, op: Op, x: Tensor, axes: list[int], eps: float, stats: bool = False) -> Tensor | tuple:
    """(x - mean) / sqrt(var + eps) over `axes` (two reductions + two elementwise kernels)."""
    keep = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    mean = reshape_view(ctx, reduce_axes(ctx, "mean", x, axes), keep)
    d = emit(ctx, op, call("sub", inp(0), inp(1)), [x, mean], x.dtype)
    var = reshape_view(ctx, reduce_axes(ctx, "sumsq", d, axes), keep)
    n = math.prod(x.shape[a] for a in axes)
    inv = emit(ctx, op, call("div", const(1.0), call("sqrt", call("add", call("div", inp(0), const(float(n))),
                                                                    const(eps)))), [var], x.dtype)
    y = emit(ctx, op, call("mul", inp(0), inp(1)), [d, inv], x.dtype)
    return (y, mean, inv) if stats else y


@register("GroupNormalization", 18)
class GroupNormalization(Op):
    attrs = {"num_groups": 1, "epsilon": 1e-5, "stash_type": 1}

    def run(self, ctx: Context, x: Tensor, scale: Tensor, bias: Tensor) -> list[Tensor]:
        g = self.attr["num_groups"]
        n, c = x.shape[:2]
        if c % g:
            raise ValueError(f"{self.node.describe()}: {c} channels do not split into {g} groups")
        x3 = reshape_view(ctx, x, (n, g, x.size // (n * g) if n * g else 0))
        y = normalize(ctx, self, x3, [2], self.attr["epsilon"])
        if scale.size == c:  # opset 21: per channel
            y, shp = reshape_view(ctx, y, x.shape), (c,) + (1,) * (x.rank - 2)
        else:  # opset 18: per group
            shp = (g, 1)
        out = emit(ctx, self, call("add", call("mul", inp(0), inp(1)), inp(2)),
                   [y, reshape_view(ctx, scale, shp), reshape_view(ctx, bias, shp)], x.dtype)
        return [reshape_view(ctx, out, x.shape)]


@register("LpNormalization", 1)
class LpNormalization(Op):
    attrs = {"axis": -1, "p": 2}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        axis = norm_axis(self, self.attr["axis"], x.rank)
        p = self.attr["p"]
        if p not in (1, 2):
            raise self.fail(f"p = {p} is not supported (1 and 2 are)")
        keep = tuple(1 if i == axis else d for i, d in enumerate(x.shape))
        norm = reshape_view(ctx, reduce_axes(ctx, "l1" if p == 1 else "l2", x, [axis]), keep)
        e = call("where", call("eq", inp(1), float_const(0.0)), float_const(0.0), call("div", inp(0), inp(1)))
        return [emit(ctx, self, e, [x, norm], x.dtype)]


@register("MeanVarianceNormalization", 9)
class MeanVarianceNormalization(Op):
    attrs = {"axes": [0, 2, 3]}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        axes = sorted({norm_axis(self, a, x.rank) for a in self.attr["axes"]})
        keep = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        mean = reshape_view(ctx, reduce_axes(ctx, "mean", x, axes), keep)
        d = emit(ctx, self, call("sub", inp(0), inp(1)), [x, mean], x.dtype)
        var = reshape_view(ctx, reduce_axes(ctx, "sumsq", d, axes), keep)
        n = math.prod(x.shape[a] for a in axes)
        e = call("div", inp(0), call("add", call("sqrt", call("div", inp(1), float_const(float(n)))),
                                     float_const(1e-9)))
        return [emit(ctx, self, e, [d, var], x.dtype)]


@register("LRN", 1)
class LRN(Op):
    attrs = {"alpha": 1e-4, "beta": 0.75, "bias": 1.0, "size": 1}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        n, c = x.shape[:2]
        rest = math.prod(x.shape[2:])
        size = self.attr["size"]
        sq = emit(ctx, self, call("mul", inp(0), inp(0)), [reshape_view(ctx, x, (n, 1, c, rest))], x.dtype)
        # The channel-window sum of squares is an average pool over C (window `size`, count_include_pad).
        avg = ctx.new(x.dtype, (n, 1, c, rest))
        lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
        ctx.record(ctx.backend.record_pool("avg", ctx.view(sq), avg.view, (size, 1), (1, 1), (lo, 0, hi, 0), (1, 1),
                                           True))
        a = self.attr
        e = call("div", inp(0), call("pow", call("add", const(a["bias"]), call("mul", const(a["alpha"]), inp(1))),
                                    const(a["beta"])))
        y = emit(ctx, self, e, [reshape_view(ctx, x, (n, 1, c, rest)), avg], x.dtype)
        return [reshape_view(ctx, y, x.shape)]
