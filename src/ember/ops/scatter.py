"""Scatters: a copy of the data, an offsets kernel, then the backend's scatter primitive."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..core.dtypes import kind_of
from ..core.expr import Expr, call, coord, inp, load
from ..core.view import View
from .base import Context, Op, Tensor, norm_axis, register
from .exprs import check_indices, coords, flat_offset, int_const, kernel, wrap_index


def scatter(ctx: Context, data: Tensor, offsets: Expr, offset_inputs: Sequence[Tensor | View], updates: Tensor,
            reduction: str) -> Tensor:
    """out = data, then out.flat[offsets] (reduction)= updates, offsets an int Expr over the updates' shape."""
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise ValueError(f"unknown scatter reduction {reduction!r}")
    out = kernel(ctx, inp(0, kind_of(data.dtype)), [data], data.dtype, data.shape)
    if updates.size and out.size:
        offs = kernel(ctx, offsets, offset_inputs, np.dtype(np.int32), updates.shape)
        ctx.record(ctx.backend.record_scatter(out.view, offs.view, ctx.contiguous(updates), reduction))
    return out


@register("ScatterElements", 11)
class ScatterElements(Op):
    attrs = {"axis": 0, "reduction": "none"}

    def run(self, ctx: Context, data: Tensor, indices: Tensor, updates: Tensor) -> list[Tensor]:
        axis = norm_axis(self, self.attr["axis"], data.rank)
        if indices.shape != updates.shape or indices.rank != data.rank:
            raise ValueError(f"{self.node.describe()}: indices {indices.shape} and updates {updates.shape} "
                             f"do not match data {data.shape}")
        check_indices(self, indices, data.shape[axis])
        k = wrap_index(call("to_int", inp(0, kind_of(indices.dtype))), data.shape[axis])
        off = flat_offset([k if d == axis else coord(d) for d in range(data.rank)], data.shape)
        return [scatter(ctx, data, off, [indices], updates, self.attr["reduction"])]


@register("Scatter", 9)
class Scatter(ScatterElements):
    """The pre-opset-11 name of ScatterElements."""


@register("ScatterND", 11)
class ScatterND(Op):
    attrs = {"reduction": "none"}

    def run(self, ctx: Context, data: Tensor, indices: Tensor, updates: Tensor) -> list[Tensor]:
        q, m = indices.rank, indices.shape[-1]
        if updates.shape != indices.shape[:-1] + data.shape[m:]:
            raise ValueError(f"{self.node.describe()}: updates {updates.shape} do not match indices "
                             f"{indices.shape} and data {data.shape}")
        lead = coords(q - 1)
        ik = kind_of(indices.dtype)
        idx = [wrap_index(call("to_int", load(0, *lead, int_const(j), kind=ik)), data.shape[j]) for j in range(m)]
        idx += [coord(q - 1 + t) for t in range(data.rank - m)]
        return [scatter(ctx, data, flat_offset(idx, data.shape), [indices], updates, self.attr["reduction"])]


@register("TensorScatter", 24)
class TensorScatter(Op):
    """A KV-cache write: update[b, ..., s, ...] goes to cache position write_indices[b] + s along `axis`
    (modulo the cache length in circular mode)."""

    attrs = {"mode": "linear", "axis": -2}

    def run(self, ctx: Context, cache: Tensor, update: Tensor, write_indices: Tensor | None = None) -> list[Tensor]:
        axis = norm_axis(self, self.attr["axis"], cache.rank)
        length = cache.shape[axis]
        pos = coord(axis)
        ins: list[Tensor] = []
        if write_indices is not None:
            ins.append(write_indices)
            pos = call("add", call("to_int", load(0, coord(0), kind=kind_of(write_indices.dtype))), pos)
        if self.attr["mode"] == "circular":
            pos = call("mod", pos, int_const(length))
        idx = [pos if d == axis else coord(d) for d in range(cache.rank)]
        return [scatter(ctx, cache, flat_offset(idx, cache.shape), ins, update, "none")]
