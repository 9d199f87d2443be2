"""Shape and layout ops. Most are views (no step): Reshape, Transpose, Slice, Split, Expand, Squeeze.

A view is a new (shape, strides, offset) on the same allocation; kernels read strided inputs directly, and
`Context.contiguous` copies only where a kernel needs dense data."""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..core.dtypes import kind_of
from ..core.expr import Expr, call, coord, inp, load
from ..core.view import View
from .base import Context, Lazy, Op, Tensor, host_ints, host_shape, norm_axis, register
from .exprs import int_const, kernel


def reshape_view(ctx: Context, x: Tensor, shape: tuple[int, ...]) -> Tensor:
    if x.is_const:
        return ctx.const(x.value.reshape(shape))
    lz = x.lazy
    if lz is not None and lz.anchor is not None and lz.flat and not lz.inputs and lz.pool is None and x.uses == 1:
        # A MatMul read only through this Reshape (GPT-2's Linear: Gemm on 2-D rows, then back to 3-D): still
        # lazy, so the bias, residual and activation after the Reshape join its epilogue.
        return Tensor(x.dtype, tuple(shape), lazy=Lazy(lz.expr, [], lz.anchor, lz.nodes, lz.origin, lz.deps,
                                                       takes_bias=lz.takes_bias, flat=True))
    view = ctx.view(x).reshaped(shape)
    if view is None:
        v = ctx.contiguous(x)
        view = View.contiguous(v.handle, x.dtype, shape, v.offset)
    return Tensor(x.dtype, tuple(shape), view=view)


def strided(x: Tensor, ctx: Context, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Tensor:
    v = ctx.view(x)
    return Tensor(x.dtype, shape, view=View(v.handle, x.dtype, shape, strides, offset))


def copy_into(ctx: Context, src: View, dst: View) -> None:
    if src.size:
        ctx.record(ctx.backend.record_elementwise(inp(0, kind_of(src.dtype)), [src], dst))


@register("Reshape", 1)
class Reshape(Op):
    f16 = True
    any_float = (0,)
    host_inputs = (1,)
    attrs = {"shape": None, "allowzero": 0}

    def run(self, ctx: Context, x: Tensor, shape: Tensor | None = None) -> list[Tensor]:
        want = list(self.attr["shape"]) if shape is None else host_shape(self, shape)
        out = []
        for i, d in enumerate(want):
            if d == 0 and not self.attr["allowzero"]:
                if i >= x.rank:
                    raise ValueError(f"{self.node.describe()}: shape {want} copies dim {i} of a rank-{x.rank} input")
                d = x.shape[i]
            out.append(d)
        if out.count(-1) > 1:
            raise ValueError(f"{self.node.describe()}: shape {want} has more than one -1")
        if -1 in out:
            known = math.prod(d for d in out if d != -1)
            if known == 0 or x.size % known:
                raise ValueError(f"{self.node.describe()}: cannot reshape {x.shape} to {want}")
            out[out.index(-1)] = x.size // known
        if math.prod(out) != x.size:
            raise ValueError(f"{self.node.describe()}: cannot reshape {x.shape} ({x.size} elements) to {out}")
        return [reshape_view(ctx, x, tuple(out))]


@register("Flatten", 1)
class Flatten(Op):
    f16 = True
    any_float = (0,)
    attrs = {"axis": 1}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        axis = self.attr["axis"]
        axis = axis + x.rank if axis < 0 else axis
        return [reshape_view(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


class _Axes(Op):
    f16 = True
    any_float = (0,)
    host_inputs = (1,)
    attrs = {"axes": None}

    def axes(self, t: Tensor | None) -> list[int] | None:
        return host_ints(self, t, "axes") if t is not None else self.attr["axes"]


@register("Squeeze", 1)
class Squeeze(_Axes):
    def run(self, ctx: Context, x: Tensor, axes_t: Tensor | None = None) -> list[Tensor]:
        axes = self.axes(axes_t)
        if axes is None:
            axes = [i for i, d in enumerate(x.shape) if d == 1]
        axes = {norm_axis(self, a, x.rank) for a in axes}
        for a in axes:
            if x.shape[a] != 1:
                raise ValueError(f"{self.node.describe()}: cannot squeeze dim {a} of size {x.shape[a]}")
        return [reshape_view(ctx, x, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


@register("Unsqueeze", 1)
class Unsqueeze(_Axes):
    def run(self, ctx: Context, x: Tensor, axes_t: Tensor | None = None) -> list[Tensor]:
        axes = self.axes(axes_t) or []
        rank = x.rank + len(axes)
        axes = sorted(norm_axis(self, a, rank) for a in axes)
        shape = list(x.shape)
        for a in axes:
            shape.insert(a, 1)
        return [reshape_view(ctx, x, tuple(shape))]


@register("Transpose", 1)
class Transpose(Op):
    f16 = True
    any_float = (0,)
    attrs = {"perm": None}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        perm = self.attr["perm"] or list(range(x.rank))[::-1]
        if sorted(perm) != list(range(x.rank)):
            raise ValueError(f"{self.node.describe()}: perm {perm} is not a permutation of {x.rank} axes")
        return [Tensor(x.dtype, tuple(x.shape[p] for p in perm), view=ctx.view(x).permute(perm))]


@register("Concat", 1)
class Concat(Op):
    f16 = True
    any_float = True
    attrs = {"axis": 1}

    def run(self, ctx: Context, *xs: Tensor) -> list[Tensor]:
        xs = tuple(x for x in xs if x is not None)
        axis = norm_axis(self, self.attr["axis"], xs[0].rank)
        for x in xs:
            if x.rank != xs[0].rank or any(d != e for i, (d, e) in enumerate(zip(x.shape, xs[0].shape, strict=True))
                                           if i != axis):
                raise ValueError(f"{self.node.describe()}: shapes {[x.shape for x in xs]} differ off axis {axis}")
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        # precision="f16" keeps float32 inputs (any_float): the widest float comes out, each part read as it is.
        wide = max((x.dtype for x in xs), key=lambda d: d.itemsize)
        parts = [x for x in xs if x.size]
        total = math.prod(shape)
        skewed = total <= 1 << 16 or 8 * (total - max(p.size for p in parts)) <= total if parts else False
        if len(parts) > 1 and ctx.backend.select_concat_kernel(len(parts), wide, skewed):
            return [self._picked(ctx, parts, axis, tuple(shape), wide)]
        out = ctx.new(wide, shape)
        pos = 0
        for x in xs:
            if x.size:
                dst = View(out.view.handle, out.dtype, x.shape, out.view.strides, pos * out.view.strides[axis])
                copy_into(ctx, ctx.view(x), dst)
            pos += x.shape[axis]
        return [out]

    @staticmethod
    def _picked(ctx: Context, parts: list[Tensor], axis: int, shape: tuple[int, ...], dtype: np.dtype) -> Tensor:
        k = kind_of(dtype)
        c = [coord(i) for i in range(len(shape))]
        ends = list(itertools.accumulate(p.shape[axis] for p in parts))

        def read(i: int) -> Expr:
            start = ends[i] - parts[i].shape[axis]
            at = [call("sub", e, int_const(start)) if d == axis and start else e for d, e in enumerate(c)]
            return load(i, *at, kind=k)

        expr = read(len(parts) - 1)
        for i in range(len(parts) - 2, -1, -1):
            expr = call("where", call("lt", c[axis], int_const(ends[i])), read(i), expr)
        return kernel(ctx, expr, [ctx.view(p) for p in parts], dtype, shape)


def slice_view(ctx: Context, x: Tensor, axis: int, start: int, stop: int, step: int = 1) -> Tensor:
    idx = range(*slice(start, stop, step).indices(x.shape[axis]))
    shape = list(x.shape)
    shape[axis] = len(idx)
    if x.is_const:
        sl = [slice(None)] * x.rank
        sl[axis] = slice(start, stop, step)
        return ctx.const(x.value[tuple(sl)])
    v = ctx.view(x)
    strides = list(v.strides)
    offset = v.offset + (idx.start * strides[axis] if len(idx) else 0)
    # A step past the dim takes one element (or none): its stride would only overflow a backend's int64 view.
    strides[axis] *= step if len(idx) > 1 else 1
    return Tensor(x.dtype, tuple(shape), view=View(v.handle, x.dtype, tuple(shape), tuple(strides), offset))


@register("Slice", 1)
class Slice(Op):
    f16 = True
    any_float = (0,)
    host_inputs = (1, 2, 3, 4)
    attrs = {"starts": None, "ends": None, "axes": None}

    def run(self, ctx: Context, x: Tensor, starts: Tensor | None = None, ends: Tensor | None = None,
            axes: Tensor | None = None, steps: Tensor | None = None) -> list[Tensor]:
        if self.node.opset < 10:
            s, e, ax, st = self.attr["starts"], self.attr["ends"], self.attr["axes"], None
        else:
            s, e = host_ints(self, starts, "starts"), host_ints(self, ends, "ends")
            ax, st = host_ints(self, axes, "axes"), host_ints(self, steps, "steps")
        ax = list(range(len(s))) if ax is None else ax
        st = [1] * len(s) if st is None else st
        if not len(s) == len(e) == len(ax) == len(st):
            raise ValueError(f"{self.node.describe()}: starts/ends/axes/steps lengths differ")
        out = x
        for a, b, c, d in zip(s, e, ax, st, strict=True):
            if d == 0:
                raise ValueError(f"{self.node.describe()}: step 0")
            out = slice_view(ctx, out, norm_axis(self, c, x.rank), a, b, d)
        return [out]


@register("Split", 1)
class Split(Op):
    f16 = True
    host_inputs = (1,)
    attrs = {"axis": 0, "split": None, "num_outputs": None}

    def run(self, ctx: Context, x: Tensor, split: Tensor | None = None) -> list[Tensor]:
        axis = norm_axis(self, self.attr["axis"], x.rank)
        sizes = host_ints(self, split, "split") if split is not None else self.attr["split"]
        n = len(self.node.outputs)
        dim = x.shape[axis]
        if not sizes:
            parts = self.attr["num_outputs"] or n
            chunk = -(-dim // parts)
            sizes = [min(chunk, dim - i * chunk) for i in range(parts)]
        if sum(sizes) != dim:
            raise ValueError(f"{self.node.describe()}: split sizes {sizes} do not add up to dim {dim}")
        outs, pos = [], 0
        for sz in sizes:
            outs.append(slice_view(ctx, x, axis, pos, pos + sz))
            pos += sz
        return outs


@register("Expand", 8)
class Expand(Op):
    f16 = True
    any_float = (0,)
    host_inputs = (1,)
    def run(self, ctx: Context, x: Tensor, shape: Tensor) -> list[Tensor]:
        want = host_shape(self, shape)
        try:
            out = tuple(np.broadcast_shapes(x.shape, tuple(want)))
        except ValueError:
            raise ValueError(f"{self.node.describe()}: cannot expand {x.shape} to {want}") from None
        return [Tensor(x.dtype, out, view=ctx.view(x).broadcast_to(out))]


@register("Tile", 6)
class Tile(Op):
    f16 = True
    host_inputs = (1,)
    def run(self, ctx: Context, x: Tensor, repeats: Tensor) -> list[Tensor]:
        reps = host_ints(self, repeats, "repeats")
        if len(reps) != x.rank:
            raise ValueError(f"{self.node.describe()}: {len(reps)} repeats for a rank-{x.rank} input")
        out = ctx.new(x.dtype, [d * r for d, r in zip(x.shape, reps, strict=True)])
        if out.size:
            v = ctx.view(x)
            shape2 = tuple(s for d, r in zip(x.shape, reps, strict=True) for s in (r, d))
            src = View(v.handle, x.dtype, shape2, tuple(s for st in v.strides for s in (0, st)), v.offset)
            copy_into(ctx, src, View.contiguous(out.view.handle, x.dtype, shape2))
        return [out]


class _SpaceDepth(Op):
    f16 = True
    attrs = {"blocksize": 1, "mode": "DCR"}


@register("DepthToSpace", 1)
class DepthToSpace(_SpaceDepth):
    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        n, c, h, w = x.shape
        b = self.attr["blocksize"]
        if self.attr["mode"] == "DCR":
            tmp, perm = (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)
        else:
            tmp, perm = (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)
        return [permute_copy(ctx, x, tmp, perm, (n, c // (b * b), h * b, w * b))]


@register("SpaceToDepth", 1)
class SpaceToDepth(_SpaceDepth):
    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        n, c, h, w = x.shape
        b = self.attr["blocksize"]
        perm = (0, 3, 5, 1, 2, 4) if self.attr["mode"] == "DCR" else (0, 1, 3, 5, 2, 4)
        return [permute_copy(ctx, x, (n, c, h // b, b, w // b, b), perm, (n, c * b * b, h // b, w // b))]


def permute_copy(ctx: Context, x: Tensor, tmp: tuple[int, ...], perm: tuple[int, ...],
                 final: tuple[int, ...]) -> Tensor:
    v = reshape_view(ctx, x, tmp)
    t = Tensor(x.dtype, tuple(tmp[p] for p in perm), view=ctx.view(v).permute(perm))
    return reshape_view(ctx, t, final)
