"""Masks and one-hots: Trilu, OneHot and Hardmax (after an argmax), one generated kernel each."""

from __future__ import annotations

import math

import numpy as np

from ..core.dtypes import kind_of
from ..core.expr import INT, call, const, coord, inp, load
from .base import Context, Op, Tensor, host_ints, norm_axis, register
from .exprs import int_const, kernel, wrap_index, zero
from .reduce import reduce_axes
from .shape import reshape_view


@register("Trilu", 14)
class Trilu(Op):
    host_inputs = (1,)
    attrs = {"upper": 1}

    def run(self, ctx: Context, x: Tensor, k: Tensor | None = None) -> list[Tensor]:
        kk = host_ints(self, k, "k")[0] if k is not None else 0
        r = x.rank
        diff = call("sub", coord(r - 1), coord(r - 2))
        keep = call("ge" if self.attr["upper"] else "le", diff, int_const(kk))
        kind = kind_of(x.dtype)
        return [kernel(ctx, call("where", keep, inp(0, kind), zero(kind)), [x], x.dtype, x.shape)]


@register("OneHot", 9)
class OneHot(Op):
    host_inputs = (1,)
    attrs = {"axis": -1}

    def run(self, ctx: Context, indices: Tensor, depth: Tensor, values: Tensor) -> list[Tensor]:
        if not depth.is_const:
            raise self.fail("the depth input must be known when the plan is built")
        d = int(np.asarray(depth.value).reshape(-1)[0])
        rank = indices.rank + 1
        axis = norm_axis(self, self.attr["axis"], rank)
        shape = indices.shape[:axis] + (d,) + indices.shape[axis:]
        kind = kind_of(indices.dtype)
        v = load(0, *[coord(i) for i in range(rank) if i != axis], kind=kind)
        pos = coord(axis) if kind == INT else call("to_float", coord(axis))
        hit = call("eq", pos, wrap_index(v, d))
        vk = kind_of(values.dtype)
        e = call("where", hit, load(1, int_const(1), kind=vk), load(1, int_const(0), kind=vk))
        return [kernel(ctx, e, [indices, values], values.dtype, shape)]


@register("Hardmax", 1)
class Hardmax(Op):
    attrs = {"axis": None}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        legacy = self.node.opset < 13
        axis = self.attr["axis"]
        axis = norm_axis(self, (1 if legacy else -1) if axis is None else axis, x.rank)
        src = x
        if legacy:  # before opset 13 the input is coerced to 2-D at `axis`
            src = reshape_view(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
            axis = 1
        am = reduce_axes(ctx, "argmax", src, [axis], np.dtype(np.int64))
        first = load(0, *[coord(d) for d in range(src.rank) if d != axis], kind=INT)
        kind = kind_of(x.dtype)
        e = call("where", call("eq", coord(axis), first), const(1, kind), zero(kind))
        return [reshape_view(ctx, kernel(ctx, e, [am], x.dtype, src.shape), x.shape)]
