"""Pooling: MaxPool, AveragePool and LpPool on the backend's pool (3-D as two 2-D pools, MaxPool's
Indices output as an index kernel), the global pools, and MaxUnpool."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from ..core.dtypes import kind_of
from ..core.expr import BOOL, INT, Expr, call, const, coord, inp, load
from .base import Context, Op, Tensor, declare_counters, host_ints, register
from .conv import spatial_pads, to_2d
from .exprs import all_exprs, contiguous_strides, int_const, kernel, sum_exprs
from .reduce import reduce_axes
from .scatter import scatter
from .shape import reshape_view

declare_counters("conv.maxpool")  # a Conv and the MaxPool reading it run as one kernel


class Pool(Op):
    f16 = True
    attrs = {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": None, "kernel_shape": None, "pads": None,
             "strides": None, "storage_order": 0, "count_include_pad": 0, "p": 2}
    kind: str

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        want_indices = len(self.node.outputs) > 1 and bool(self.node.outputs[1])
        r = x.rank - 2
        if r not in (1, 2, 3):
            raise self.fail(f"{r}-D pooling is not supported (1-D, 2-D and 3-D are)")
        kernel = tuple(self.attr["kernel_shape"])
        strides = tuple(self.attr["strides"] or [1] * r)
        dil = tuple(self.attr["dilations"] or [1] * r)
        pads = spatial_pads(self, x.shape[2:], kernel, strides, dil)
        out_sp = []
        for i in range(r):
            span = x.shape[2 + i] + pads[i] + pads[i + r] - ((kernel[i] - 1) * dil[i] + 1)
            o = (-(-span // strides[i]) if self.attr["ceil_mode"] else span // strides[i]) + 1
            if self.attr["ceil_mode"] and (o - 1) * strides[i] >= x.shape[2 + i] + pads[i]:
                o -= 1  # the last window must start inside the input or its left padding
            out_sp.append(o)
        shape = (*x.shape[:2], *out_sp)
        values = self.run_values(ctx, x, shape, kernel, strides, dil, pads)
        if want_indices:  # the window unrolled in one index kernel
            return [values, pool_argmax(ctx, x, shape, kernel, strides, dil, pads, self.attr["storage_order"])]
        return [values]

    def run_values(self, ctx: Context, x: Tensor, shape: tuple[int, ...], kernel: tuple, strides: tuple, dil: tuple,
                   pads: list[int]) -> Tensor:
        r = x.rank - 2
        if x.dtype.kind != "f":
            if self.kind != "max":
                raise self.fail(f"{self.node.op_type} of {x.dtype} is not supported")
            # Integer max pooling: the window unrolled in an index kernel.
            return pool_argmax(ctx, x, shape, kernel, strides, dil, pads, 0, values=True)
        lz = x.lazy
        if self.kind == "max" and r == 2 and lz is not None and lz.pool is not None and not lz.inputs and x.uses <= 1:
            # Conv (+ its epilogue) read by this MaxPool only: one step computes both, the conv never written whole.
            out = ctx.new(x.dtype, shape)
            ctx.record(lz.pool(out.view, None if lz.expr.op == "in" else lz.expr, kernel, strides,
                               (pads[0], pads[1], pads[2], pads[3]), dil), lz.origin)
            ctx.count("conv.maxpool")
            return out
        out = ctx.new(x.dtype, shape)
        if r == 3:
            return self.pool3d(ctx, x, out, kernel, strides, dil, pads)
        if r == 1:
            kernel, strides, dil, pads = (1, *kernel), (1, *strides), (1, *dil), [0, pads[0], 0, pads[1]]
        ctx.record(ctx.backend.record_pool(self.kind, ctx.contiguous(to_2d(ctx, x)), to_2d(ctx, out).view, kernel,
                                           strides, (pads[0], pads[1], pads[2], pads[3]), dil,
                                           bool(self.attr["count_include_pad"]), int(self.attr["p"])))
        return out

    def pool3d(self, ctx: Context, x: Tensor, out: Tensor, kernel: tuple, strides: tuple, dil: tuple,
               pads: list[int]) -> Tensor:
        """3-D pooling as two 2-D pools: over (H, W) for every depth slice, then over D. Max, Lp and both
        average modes separate exactly: a window's element count is the product of its per-dim counts."""
        n, c, d, h, w = x.shape
        _, _, od, oh, ow = out.shape
        inc, p = bool(self.attr["count_include_pad"]), int(self.attr["p"])
        x4 = reshape_view(ctx, x, (n * c * d, 1, h, w))
        mid = ctx.new(x.dtype, (n * c * d, 1, oh, ow))
        ctx.record(ctx.backend.record_pool(self.kind, ctx.contiguous(x4), mid.view, kernel[1:], strides[1:],
                                           (pads[1], pads[2], pads[4], pads[5]), dil[1:], inc, p))
        mid4 = reshape_view(ctx, mid, (n * c, 1, d, oh * ow))
        o4 = reshape_view(ctx, out, (n * c, 1, od, oh * ow))
        ctx.record(ctx.backend.record_pool(self.kind, mid4.view, o4.view, (kernel[0], 1), (strides[0], 1),
                                           (pads[0], 0, pads[3], 0), (dil[0], 1), inc, p))
        return out
register("MaxPool", 1)(type("MaxPool", (Pool,), {"kind": "max"}))
register("AveragePool", 1)(type("AveragePool", (Pool,), {"kind": "avg"}))
register("LpPool", 2)(type("LpPool", (Pool,), {"kind": "lp"}))


class GlobalPool(Op):
    f16 = True
    fn: str
    attrs = {"p": 2}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        if x.rank < 2:
            raise ValueError(f"{self.node.describe()}: input {x.shape} needs rank >= 2 (N, C, spatial...)")
        flat = reshape_view(ctx, x, x.shape[:2] + (math.prod(x.shape[2:]),))
        out = reduce_axes(ctx, self.fn, flat, [2])
        return [reshape_view(ctx, out, x.shape[:2] + (1,) * (x.rank - 2))]
register("GlobalAveragePool", 1)(type("GlobalAveragePool", (GlobalPool,), {"fn": "mean"}))
register("GlobalMaxPool", 1)(type("GlobalMaxPool", (GlobalPool,), {"fn": "max"}))


def pool_argmax(ctx: Context, x: Tensor, out_shape: Sequence[int], ksize: Sequence[int], strides: Sequence[int],
                dil: Sequence[int], pads: Sequence[int], storage_order: int, values: bool = False) -> Tensor:
    """The flat input index of each max-pool window's maximum (the first, in window order, among equals), or
    with `values` the maximum itself (any dtype): the window's taps unrolled in one index kernel."""
    r = x.rank - 2
    size = x.shape[2:]
    kind = kind_of(x.dtype)
    # Flat index within the (n, c) plane: row-major, or column-major for storage_order 1.
    plane = contiguous_strides(size) if not storage_order else [math.prod(size[:i]) for i in range(r)]
    best: Expr | None = None
    found: Expr = const(False, BOOL)
    idx: Expr = int_const(-1)
    for kk in itertools.product(*(range(k) for k in ksize)):
        pos, ok = [], []
        for i in range(r):
            p = call("add", call("mul", coord(2 + i), int_const(strides[i])), int_const(kk[i] * dil[i] - pads[i]))
            pos.append(p)
            ok += [call("ge", p, int_const(0)), call("lt", p, int_const(size[i]))]
        v = load(0, coord(0), coord(1), *pos, kind=kind)
        flat = sum_exprs([call("mul", p, int_const(s)) for p, s in zip(pos, plane, strict=True)])
        valid = all_exprs(ok)
        take = valid if best is None else call("and", valid, call("or", call("not", found), call("gt", v, best)))
        best = v if best is None else call("where", take, v, best)
        idx = call("where", take, flat, idx)
        found = call("or", found, valid)
    if values:
        assert best is not None
        return kernel(ctx, best, [x], x.dtype, out_shape)
    base = call("mul", call("add", call("mul", coord(0), int_const(x.shape[1])), coord(1)), int_const(math.prod(size)))
    return kernel(ctx, call("add", base, idx), [x], np.dtype(np.int64), out_shape)


@register("MaxUnpool", 9)
class MaxUnpool(Op):
    host_inputs = (2,)
    attrs = {"kernel_shape": None, "pads": None, "strides": None}

    def run(self, ctx: Context, x: Tensor, indices: Tensor, output_shape: Tensor | None = None) -> list[Tensor]:
        r = x.rank - 2
        if output_shape is not None:
            shape = host_ints(self, output_shape, "output_shape")
        else:
            k, st = self.attr["kernel_shape"], self.attr["strides"] or [1] * r
            pads = self.attr["pads"] or [0] * (2 * r)
            shape = [*x.shape[:2], *((x.shape[2 + i] - 1) * st[i] + k[i] - pads[i] - pads[i + r] for i in range(r))]
        zeros = ctx.const(np.zeros(shape, x.dtype))
        return [scatter(ctx, zeros, call("to_int", inp(0, INT)), [indices], x, "none")]
