"""Gathers: Gather runs the backend's gather primitive; GatherElements, GatherND, Compress and
ReverseSequence are one generated kernel each, reading the data at positions computed from the indices."""

from __future__ import annotations

import numpy as np

from ..core.dtypes import kind_of
from ..core.expr import INT, call, coord, inp, load
from .base import Context, Op, Tensor, norm_axis, register
from .exprs import check_indices, coords, int_const, kernel, wrap_index
from .shape import reshape_view, slice_view


@register("Gather", 1)
class Gather(Op):
    f16 = True
    attrs = {"axis": 0}

    def run(self, ctx: Context, data: Tensor, indices: Tensor) -> list[Tensor]:
        axis = norm_axis(self, self.attr["axis"], data.rank)
        if indices.is_const:
            idx = indices.value
            bad = (idx < -data.shape[axis]) | (idx >= data.shape[axis])
            if bad.any():
                raise ValueError(f"{self.node.describe()}: index {idx[bad].reshape(-1)[0]} out of range for axis "
                                 f"{axis} of size {data.shape[axis]}")
            if idx.ndim == 0:  # a single index is a view: no kernel
                out = slice_view(ctx, data, axis, int(idx) % data.shape[axis], int(idx) % data.shape[axis] + 1)
                return [reshape_view(ctx, out, data.shape[:axis] + data.shape[axis + 1:])]
        shape = data.shape[:axis] + indices.shape + data.shape[axis + 1:]
        out = ctx.new(data.dtype, shape)
        if out.size:
            ctx.record(ctx.backend.record_gather(ctx.contiguous(data), ctx.contiguous(indices), axis, out.view))
        return [out]


@register("GatherElements", 11)
class GatherElements(Op):
    attrs = {"axis": 0}

    def run(self, ctx: Context, data: Tensor, indices: Tensor) -> list[Tensor]:
        axis = norm_axis(self, self.attr["axis"], data.rank)
        if indices.rank != data.rank:
            raise ValueError(f"{self.node.describe()}: indices rank {indices.rank} != data rank {data.rank}")
        check_indices(self, indices, data.shape[axis])
        k = wrap_index(call("to_int", inp(1, kind_of(indices.dtype))), data.shape[axis])
        idx = [k if d == axis else coord(d) for d in range(data.rank)]
        return [kernel(ctx, load(0, *idx, kind=kind_of(data.dtype)), [data, indices], data.dtype, indices.shape)]


@register("GatherND", 11)
class GatherND(Op):
    attrs = {"batch_dims": 0}

    def run(self, ctx: Context, data: Tensor, indices: Tensor) -> list[Tensor]:
        b, q, m = self.attr["batch_dims"], indices.rank, indices.shape[-1]
        if b + m > data.rank:
            raise ValueError(f"{self.node.describe()}: index depth {m} + batch_dims {b} > data rank {data.rank}")
        shape = indices.shape[:-1] + data.shape[b + m:]
        lead = coords(q - 1)
        ik = kind_of(indices.dtype)
        idx = lead[:b] + [wrap_index(load(1, *lead, int_const(j), kind=ik), data.shape[b + j]) for j in range(m)]
        idx += [coord(q - 1 + t) for t in range(data.rank - b - m)]
        return [kernel(ctx, load(0, *idx, kind=kind_of(data.dtype)), [data, indices], data.dtype, shape)]


@register("Compress", 9)
class Compress(Op):
    """The condition is shape arithmetic (it decides the output's shape), so it must be known at plan time."""

    host_inputs = (1,)
    attrs = {"axis": None}

    def run(self, ctx: Context, x: Tensor, condition: Tensor) -> list[Tensor]:
        if not condition.is_const:
            raise self.fail("the condition input must be known when the plan is built")
        if self.attr["axis"] is None:
            x = reshape_view(ctx, x, (x.size,))
            axis = 0
        else:
            axis = norm_axis(self, self.attr["axis"], x.rank)
        keep = np.flatnonzero(np.asarray(condition.value).reshape(-1)[: x.shape[axis]]).astype(np.int32)
        shape = x.shape[:axis] + (len(keep),) + x.shape[axis + 1:]
        idx = [load(1, coord(axis), kind=INT) if d == axis else coord(d) for d in range(x.rank)]
        return [kernel(ctx, load(0, *idx, kind=kind_of(x.dtype)), [x, ctx.const(keep)], x.dtype, shape)]


@register("ReverseSequence", 10)
class ReverseSequence(Op):
    attrs = {"batch_axis": 1, "time_axis": 0}

    def run(self, ctx: Context, x: Tensor, lens: Tensor) -> list[Tensor]:
        ba, ta = self.attr["batch_axis"], self.attr["time_axis"]
        length = load(1, coord(ba), kind=INT)
        t = coord(ta)
        src = call("where", call("lt", t, length), call("sub", call("sub", length, int_const(1)), t), t)
        idx = [src if d == ta else coord(d) for d in range(x.rank)]
        return [kernel(ctx, load(0, *idx, kind=kind_of(x.dtype)), [x, lens], x.dtype, x.shape)]
