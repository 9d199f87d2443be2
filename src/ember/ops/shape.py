"""Shape and layout ops. Most are views (no step): Reshape, Transpose, Slice, Split, Expand, Squeeze.

A view is a new (shape, strides, offset) on the same allocation; kernels read strided inputs directly, and
`Context.contiguous` copies only where a kernel needs dense data.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from ..core.expr import const, inp
from ..core.view import View
from .base import Context, Op, T, kind_of, register


def norm_axis(op: Op, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"{op.node.describe()}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def host_ints(op: Op, t: T | None, what: str) -> list[int] | None:
    """Values of an input that must be known while planning (shape arithmetic runs on the host)."""
    if t is None:
        return None
    if not t.is_const:
        raise op.fail(f"the {what} input must be known when the plan is built (it is computed on the device)")
    return [int(v) for v in np.asarray(t.value).reshape(-1)]


def reshape_view(ctx: Context, x: T, shape: tuple[int, ...]) -> T:
    if x.is_const:
        return ctx.const(x.value.reshape(shape))
    v = ctx.contiguous(x)
    return T(x.dtype, tuple(shape), view=View.contiguous(v.handle, x.dtype, shape, v.offset))


def strided(x: T, ctx: Context, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> T:
    v = ctx.view(x)
    return T(x.dtype, shape, view=View(v.handle, x.dtype, shape, strides, offset))


def copy_into(ctx: Context, src: View, dst: View) -> None:
    if src.size:
        ctx.record(ctx.backend.record_elementwise(inp(0, kind_of(src.dtype)), [src], dst))


@register("Reshape", 1)
class Reshape(Op):
    f16 = True
    host_inputs = (1,)
    attrs = {"shape": None, "allowzero": 0}

    def run(self, ctx: Context, x: T, shape: T | None = None) -> list[T]:
        want = list(self.a["shape"]) if shape is None else host_ints(self, shape, "shape")
        out = []
        for i, d in enumerate(want):
            if d == 0 and not self.a["allowzero"]:
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
    attrs = {"axis": 1}

    def run(self, ctx: Context, x: T) -> list[T]:
        axis = self.a["axis"]
        axis = axis + x.rank if axis < 0 else axis
        return [reshape_view(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


class _Axes(Op):
    f16 = True
    host_inputs = (1,)
    attrs = {"axes": None}

    def axes(self, t: T | None) -> list[int] | None:
        return host_ints(self, t, "axes") if t is not None else self.a["axes"]


@register("Squeeze", 1)
class Squeeze(_Axes):
    def run(self, ctx: Context, x: T, axes_t: T | None = None) -> list[T]:
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
    def run(self, ctx: Context, x: T, axes_t: T | None = None) -> list[T]:
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
    attrs = {"perm": None}

    def run(self, ctx: Context, x: T) -> list[T]:
        perm = self.a["perm"] or list(range(x.rank))[::-1]
        if sorted(perm) != list(range(x.rank)):
            raise ValueError(f"{self.node.describe()}: perm {perm} is not a permutation of {x.rank} axes")
        return [T(x.dtype, tuple(x.shape[p] for p in perm), view=ctx.view(x).permute(perm))]


@register("Concat", 1)
class Concat(Op):
    f16 = True
    attrs = {"axis": 1}

    def run(self, ctx: Context, *xs: T) -> list[T]:
        xs = tuple(x for x in xs if x is not None)
        axis = norm_axis(self, self.a["axis"], xs[0].rank)
        for x in xs:
            if x.rank != xs[0].rank or any(d != e for i, (d, e) in enumerate(zip(x.shape, xs[0].shape, strict=True))
                                           if i != axis):
                raise ValueError(f"{self.node.describe()}: shapes {[x.shape for x in xs]} differ off axis {axis}")
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        out = ctx.new(xs[0].dtype, shape)
        pos = 0
        for x in xs:
            if x.size:
                dst = View(out.view.handle, out.dtype, x.shape, out.view.strides, pos * out.view.strides[axis])
                copy_into(ctx, ctx.view(x), dst)
            pos += x.shape[axis]
        return [out]


def slice_view(ctx: Context, x: T, axis: int, start: int, stop: int, step: int = 1) -> T:
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
    strides[axis] *= step
    return T(x.dtype, tuple(shape), view=View(v.handle, x.dtype, tuple(shape), tuple(strides), offset))


@register("Slice", 1)
class Slice(Op):
    f16 = True
    host_inputs = (1, 2, 3, 4)
    attrs = {"starts": None, "ends": None, "axes": None}

    def run(self, ctx: Context, x: T, starts: T | None = None, ends: T | None = None, axes: T | None = None,
            steps: T | None = None) -> list[T]:
        if self.node.opset < 10:
            s, e, ax, st = self.a["starts"], self.a["ends"], self.a["axes"], None
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

    def run(self, ctx: Context, x: T, split: T | None = None) -> list[T]:
        axis = norm_axis(self, self.a["axis"], x.rank)
        sizes = host_ints(self, split, "split") if split is not None else self.a["split"]
        n = len(self.node.outputs)
        dim = x.shape[axis]
        if not sizes:
            parts = self.a["num_outputs"] or n
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
    host_inputs = (1,)
    def run(self, ctx: Context, x: T, shape: T) -> list[T]:
        want = host_ints(self, shape, "shape")
        try:
            out = tuple(np.broadcast_shapes(x.shape, tuple(want)))
        except ValueError:
            raise ValueError(f"{self.node.describe()}: cannot expand {x.shape} to {want}") from None
        return [T(x.dtype, out, view=ctx.view(x).broadcast_to(out))]


@register("Tile", 6)
class Tile(Op):
    f16 = True
    host_inputs = (1,)
    def run(self, ctx: Context, x: T, repeats: T) -> list[T]:
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


@register("Pad", 1)
class Pad(Op):
    f16 = True
    host_inputs = (1, 2, 3)
    attrs = {"mode": "constant", "pads": None, "value": 0.0, "paddings": None}

    def run(self, ctx: Context, x: T, pads: T | None = None, value: T | None = None, axes: T | None = None) -> list[T]:
        mode = self.a["mode"]
        if mode not in ("constant", "reflect", "edge", "wrap"):
            raise self.fail(f"mode {mode!r} is not supported")
        p = host_ints(self, pads, "pads") if pads is not None else (self.a["pads"] or self.a["paddings"])
        fill = self.a["value"]
        if value is not None:
            if not value.is_const:
                raise self.fail("the constant_value input must be known when the plan is built")
            fill = value.value.reshape(-1)[0].item() if value.value.size else 0
        ax = host_ints(self, axes, "axes") if axes is not None else list(range(x.rank))
        ax = [norm_axis(self, a, x.rank) for a in ax]
        before, after = [0] * x.rank, [0] * x.rank
        for i, a in enumerate(ax):
            before[a], after[a] = p[i], p[i + len(ax)]
        shape = [d + b + e for d, b, e in zip(x.shape, before, after, strict=True)]
        if any(d < 0 for d in shape):
            raise ValueError(f"{self.node.describe()}: pads {p} crop more than the input {x.shape}")
        if mode != "constant":
            from .index import padded  # reflect/edge/wrap: one gather kernel, source indices computed

            return [padded(ctx, x, mode, before, after)]
        out = ctx.new(x.dtype, shape)
        if out.size:
            ctx.record(ctx.backend.record_elementwise(const(fill, kind_of(x.dtype)), [], out.view))
            src = x
            for a in range(x.rank):  # negative pads crop the input
                if before[a] < 0 or after[a] < 0:
                    src = slice_view(ctx, src, a, max(-before[a], 0), x.shape[a] - max(-after[a], 0))
            offset = sum(max(b, 0) * s for b, s in zip(before, out.view.strides, strict=True))
            copy_into(ctx, ctx.view(src), View(out.view.handle, x.dtype, src.shape, out.view.strides, offset))
        return [out]


@register("Shape", 1)
class Shape(Op):
    attrs = {"start": 0, "end": None}

    def run(self, ctx: Context, x: T) -> list[T]:
        return [ctx.const(np.array(x.shape[self.a["start"]:self.a["end"]], np.int64))]


@register("Size", 1)
class Size(Op):
    def run(self, ctx: Context, x: T) -> list[T]:
        return [ctx.const(np.array(x.size, np.int64))]


@register("Constant", 1)
class Constant(Op):
    attrs = {"value": None, "value_float": None, "value_floats": None, "value_int": None, "value_ints": None,
             "value_string": None, "value_strings": None, "sparse_value": None}

    def run(self, ctx: Context) -> list[T]:
        a = self.a
        if a["value"] is not None:
            return [ctx.const(a["value"])]
        for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                           ("value_ints", np.int64)):
            if a[key] is not None:
                return [ctx.const(np.array(a[key], dtype))]
        raise self.fail("only numeric Constant values are supported")


@register("ConstantOfShape", 9)
class ConstantOfShape(Op):
    host_inputs = (0,)
    attrs = {"value": None}

    def run(self, ctx: Context, shape: T) -> list[T]:
        dims = host_ints(self, shape, "shape")
        val = self.a["value"] if self.a["value"] is not None else np.zeros(1, np.float32)
        return [ctx.const(np.full(dims, val.reshape(-1)[0], val.dtype))]


@register("Range", 11)
class Range(Op):
    host_inputs = (0, 1, 2)
    def run(self, ctx: Context, start: T, limit: T, delta: T) -> list[T]:
        for t, what in ((start, "start"), (limit, "limit"), (delta, "delta")):
            if not t.is_const:
                raise self.fail(f"the {what} input must be known when the plan is built")
        s, lim, d = start.value.item(), limit.value.item(), delta.value.item()
        n = max(int(math.ceil((lim - s) / d)), 0)
        return [ctx.const((s + np.arange(n) * d).astype(start.dtype))]


@register("EyeLike", 9)
class EyeLike(Op):
    attrs = {"dtype": None, "k": 0}

    def run(self, ctx: Context, x: T) -> list[T]:
        dt = helper.tensor_dtype_to_np_dtype(self.a["dtype"]) if self.a["dtype"] is not None else x.dtype
        return [ctx.const(np.eye(x.shape[0], x.shape[1], self.a["k"], dtype=dt))]


@register("Gather", 1)
class Gather(Op):
    f16 = True
    attrs = {"axis": 0}

    def run(self, ctx: Context, data: T, indices: T) -> list[T]:
        axis = norm_axis(self, self.a["axis"], data.rank)
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


class _SpaceDepth(Op):
    f16 = True
    attrs = {"blocksize": 1, "mode": "DCR"}


@register("DepthToSpace", 1)
class DepthToSpace(_SpaceDepth):
    def run(self, ctx: Context, x: T) -> list[T]:
        n, c, h, w = x.shape
        b = self.a["blocksize"]
        if self.a["mode"] == "DCR":
            tmp, perm = (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)
        else:
            tmp, perm = (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)
        return [permute_copy(ctx, x, tmp, perm, (n, c // (b * b), h * b, w * b))]


@register("SpaceToDepth", 1)
class SpaceToDepth(_SpaceDepth):
    def run(self, ctx: Context, x: T) -> list[T]:
        n, c, h, w = x.shape
        b = self.a["blocksize"]
        perm = (0, 3, 5, 1, 2, 4) if self.a["mode"] == "DCR" else (0, 1, 3, 5, 2, 4)
        return [permute_copy(ctx, x, (n, c, h // b, b, w // b, b), perm, (n, c * b * b, h // b, w // b))]


def permute_copy(ctx: Context, x: T, tmp: tuple[int, ...], perm: tuple[int, ...], final: tuple[int, ...]) -> T:
    v = reshape_view(ctx, x, tmp)
    t = T(x.dtype, tuple(tmp[p] for p in perm), view=ctx.view(v).permute(perm))
    return reshape_view(ctx, t, final)
