"""Neural-network ops: Conv, pooling, BatchNorm, InstanceNorm, LRN (Softmax and LayerNorm are in transformer.py)."""

from __future__ import annotations

import math

import numpy as np

from ..core.conv import ConvSpec
from ..core.expr import FLOAT, Expr, call, const, inp
from ..core.view import View
from .base import Context, Op, T, register
from .elementwise import anchored, emit
from .reduce import reduce_axes
from .shape import reshape_view


def spatial_pads(op: Op, in_sizes: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...],
                 dilations: tuple[int, ...]) -> list[int]:
    """ONNX pads [begin..., end...] from `pads` or `auto_pad`."""
    r = len(in_sizes)
    mode = op.a.get("auto_pad", "NOTSET")
    if mode in ("NOTSET", "", None):
        return list(op.a.get("pads") or [0] * (2 * r))
    if mode == "VALID":
        return [0] * (2 * r)
    begin, end = [], []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilations, strict=True):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small = total // 2
        begin.append(small if mode == "SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    return begin + end


def to_2d(ctx: Context, t: T) -> T:
    """A 1-D spatial tensor (N, C, W) as (N, C, 1, W), so 1-D ops reuse the 2-D kernels."""
    return reshape_view(ctx, t, t.shape[:2] + (1,) + t.shape[2:]) if t.rank == 3 else t


@register("Conv", 1)
class Conv(Op):
    f16 = True
    attrs = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None, "pads": None,
             "strides": None}

    def run(self, ctx: Context, x: T, w: T, b: T | None = None) -> list[T]:
        r = x.rank - 2
        if r not in (1, 2):
            raise self.fail(f"{r}-D convolution is not supported (1-D and 2-D are)")
        if x.dtype.kind != "f":
            raise self.fail(f"Conv on {x.dtype} is not supported")
        kernel = tuple(w.shape[2:])
        strides = tuple(self.a["strides"] or [1] * r)
        dil = tuple(self.a["dilations"] or [1] * r)
        pads = spatial_pads(self, x.shape[2:], kernel, strides, dil)
        g = self.a["group"]
        if x.shape[1] != w.shape[1] * g or w.shape[0] % g:
            raise ValueError(f"{self.node.describe()}: input {x.shape}, weight {w.shape} and group {g} disagree")
        out_sp = [(x.shape[2 + i] + pads[i] + pads[i + r] - (kernel[i] - 1) * dil[i] - 1) // strides[i] + 1
                  for i in range(r)]
        if min(out_sp) <= 0:
            raise ValueError(f"{self.node.describe()}: kernel {kernel} larger than the padded input {x.shape}")
        out_shape = (x.shape[0], w.shape[0], *out_sp)
        if r == 1:
            strides, dil, kernel = (1, *strides), (1, *dil), (1, *kernel)
            pads = [0, pads[0], 0, pads[1]]
        out4 = out_shape if r == 2 else out_shape[:2] + (1,) + out_shape[2:]
        x4 = x.shape if r == 2 else x.shape[:2] + (1,) + x.shape[2:]
        w4 = w.shape if r == 2 else w.shape[:2] + (1,) + w.shape[2:]
        spec = ConvSpec(x4, w4, out4, strides, (pads[0], pads[1], pads[2], pads[3]), dil, g, x.dtype,
                        const_weight=w.value is not None)
        chosen = ctx.backend.select_conv(spec, w.value)
        if chosen.algorithm != "default":
            ctx.count(f"conv.{chosen.algorithm}")
        xv = ctx.contiguous(to_2d(ctx, x))
        # A kernel's own filter (Winograd's U) stays float32 in a float16 model too: F(4, 3)'s output transform
        # amplified U's float16 rounding about tenfold.
        wv = ctx.view(ctx.const(chosen.weight)) if chosen.weight is not None else ctx.contiguous(to_2d(ctx, w))
        bias = ctx.contiguous(b) if b is not None else None

        def record(out: View, act: Expr | None, residual: View | None = None) -> list:
            o4 = View.contiguous(out.handle, out.dtype, out4, out.offset)
            res = residual_view(ctx, residual, out4) if residual is not None else None
            return chosen.record(xv, wv, bias, o4, act, res)

        t = anchored(ctx, x.dtype, out_shape, record, [xv, wv, bias], takes_bias=chosen.takes_residual)
        pooled = chosen.record_maxpool
        if t.lazy is not None and pooled is not None and r == 2:
            def record_pool(out: View, act: Expr | None, pool_kernel: tuple, pool_strides: tuple, pool_pads: tuple,
                            pool_dilations: tuple) -> list:
                return pooled(xv, wv, bias, out, act, pool_kernel, pool_strides, pool_pads, pool_dilations)

            t.lazy.pool = record_pool
        return [t]


def residual_view(ctx: Context, residual: View, out4: tuple[int, ...]) -> View:
    """A residual connection the conv adds in its epilogue, as a view of the 4-D output's shape whose (P, Q) dims
    merge (what the kernels index); a layout that does not is copied first."""
    n, k, p, q = out4
    res = residual.merged(out4)
    if res is None or res.merged((n, k, p * q)) is None:
        res = ctx.contiguous(T(residual.dtype, residual.shape, view=residual)).merged(out4)
    return res


class Pool(Op):
    f16 = True
    attrs = {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": None, "kernel_shape": None, "pads": None,
             "strides": None, "storage_order": 0, "count_include_pad": 0, "p": 2}
    kind: str

    def run(self, ctx: Context, x: T) -> list[T]:
        want_indices = len(self.node.outputs) > 1 and bool(self.node.outputs[1])
        r = x.rank - 2
        if r not in (1, 2, 3):
            raise self.fail(f"{r}-D pooling is not supported (1-D, 2-D and 3-D are)")
        kernel = tuple(self.a["kernel_shape"])
        strides = tuple(self.a["strides"] or [1] * r)
        dil = tuple(self.a["dilations"] or [1] * r)
        pads = spatial_pads(self, x.shape[2:], kernel, strides, dil)
        out_sp = []
        for i in range(r):
            span = x.shape[2 + i] + pads[i] + pads[i + r] - ((kernel[i] - 1) * dil[i] + 1)
            o = (-(-span // strides[i]) if self.a["ceil_mode"] else span // strides[i]) + 1
            if self.a["ceil_mode"] and (o - 1) * strides[i] >= x.shape[2 + i] + pads[i]:
                o -= 1  # the last window must start inside the input or its left padding
            out_sp.append(o)
        shape = (*x.shape[:2], *out_sp)
        values = self.run_values(ctx, x, shape, kernel, strides, dil, pads)
        if want_indices:
            from .index import pool_argmax  # the window unrolled in one index kernel

            return [values, pool_argmax(ctx, x, shape, kernel, strides, dil, pads, self.a["storage_order"])]
        return [values]

    def run_values(self, ctx: Context, x: T, shape: tuple[int, ...], kernel: tuple, strides: tuple, dil: tuple,
                   pads: list[int]) -> T:
        r = x.rank - 2
        if x.dtype.kind != "f":
            if self.kind != "max":
                raise self.fail(f"{self.node.op_type} of {x.dtype} is not supported")
            from .index import pool_argmax  # integer max pooling: the window unrolled in an index kernel

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
                                           bool(self.a["count_include_pad"]), int(self.a["p"])))
        return out

    def pool3d(self, ctx: Context, x: T, out: T, kernel: tuple, strides: tuple, dil: tuple, pads: list[int]) -> T:
        """3-D pooling as two 2-D pools: over (H, W) for every depth slice, then over D. Max, Lp and both
        average modes separate exactly: a window's element count is the product of its per-dim counts."""
        n, c, d, h, w = x.shape
        _, _, od, oh, ow = out.shape
        inc, p = bool(self.a["count_include_pad"]), int(self.a["p"])
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

    def run(self, ctx: Context, x: T) -> list[T]:
        flat = reshape_view(ctx, x, x.shape[:2] + (math.prod(x.shape[2:]),))
        out = reduce_axes(ctx, self.fn, flat, [2])
        return [reshape_view(ctx, out, x.shape[:2] + (1,) * (x.rank - 2))]


register("GlobalAveragePool", 1)(type("GlobalAveragePool", (GlobalPool,), {"fn": "mean"}))
register("GlobalMaxPool", 1)(type("GlobalMaxPool", (GlobalPool,), {"fn": "max"}))


def channel_shape(x: T) -> tuple[int, ...]:
    """Shape that broadcasts a per-channel vector over NC... (C, 1, 1, ...)."""
    return (x.shape[1],) + (1,) * (x.rank - 2)


@register("BatchNormalization", 1)
class BatchNormalization(Op):
    attrs = {"epsilon": 1e-5, "momentum": 0.9, "spatial": 1, "is_test": 0, "training_mode": 0}

    def run(self, ctx: Context, x: T, scale: T, bias: T, mean: T, var: T) -> list[T]:
        if self.a["training_mode"]:
            raise self.fail("training-mode BatchNormalization is not supported")
        cs = channel_shape(x)
        eps = self.a["epsilon"]
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


@register("InstanceNormalization", 1)
class InstanceNormalization(Op):
    attrs = {"epsilon": 1e-5}

    def run(self, ctx: Context, x: T, scale: T, bias: T) -> list[T]:
        cs = channel_shape(x)
        axes = list(range(2, x.rank))
        y = normalize(ctx, self, x, axes, self.a["epsilon"])
        return [emit(ctx, self, call("add", call("mul", inp(0), inp(1)), inp(2)),
                     [y, reshape_view(ctx, scale, cs), reshape_view(ctx, bias, cs)], x.dtype)]


def normalize(ctx: Context, op: Op, x: T, axes: list[int], eps: float, stats: bool = False) -> T | tuple:
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


@register("LRN", 1)
class LRN(Op):
    attrs = {"alpha": 1e-4, "beta": 0.75, "bias": 1.0, "size": 1}

    def run(self, ctx: Context, x: T) -> list[T]:
        n, c = x.shape[:2]
        rest = math.prod(x.shape[2:])
        size = self.a["size"]
        sq = emit(ctx, self, call("mul", inp(0), inp(0)), [reshape_view(ctx, x, (n, 1, c, rest))], x.dtype)
        # The channel-window sum of squares is an average pool over C (window `size`, count_include_pad).
        avg = ctx.new(x.dtype, (n, 1, c, rest))
        lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
        ctx.record(ctx.backend.record_pool("avg", ctx.view(sq), avg.view, (size, 1), (1, 1), (lo, 0, hi, 0), (1, 1),
                                           True))
        a = self.a
        e = call("div", inp(0), call("pow", call("add", const(a["bias"]), call("mul", const(a["alpha"]), inp(1))),
                                    const(a["beta"])))
        y = emit(ctx, self, e, [reshape_view(ctx, x, (n, 1, c, rest)), avg], x.dtype)
        return [reshape_view(ctx, y, x.shape)]


__all__ = ["View"]
