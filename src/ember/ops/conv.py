"""Conv: the backend's kernel selection (`select_conv`) picks the algorithm; a bias, an activation and a
residual join the kernel's epilogue. 1-D convolutions run as 2-D ones."""

from __future__ import annotations

import math

from ..core.conv import ConvSpec
from ..core.expr import Expr
from ..core.view import View
from .base import Context, Op, Tensor, declare_counters, register
from .elementwise import anchored
from .shape import reshape_view

# Conv counts conv.<algorithm> for each convolution whose kernel selection picked an algorithm other than record_conv's
# own ("default"; see ConvKernel.algorithm): Winograd is the one the backends have.
declare_counters("conv.winograd")


def check_window(op: Op, r: int, kernel: tuple[int, ...], strides: tuple[int, ...],
                 dilations: tuple[int, ...]) -> None:
    """ValueError unless kernel_shape, strides and dilations have one entry per spatial axis, kernel dims and
    dilations >= 1 and strides >= 1 (a wrong-length or zero attribute would otherwise index past a list or
    divide by zero)."""
    for name, values, low in (("kernel_shape", kernel, 1), ("strides", strides, 1), ("dilations", dilations, 1)):
        if len(values) != r:
            raise ValueError(f"{op.node.describe()}: {name} {list(values)} needs {r} value(s), one per spatial axis")
        if any(v < low for v in values):
            raise ValueError(f"{op.node.describe()}: {name} {list(values)} must be >= {low}")


def spatial_pads(op: Op, in_sizes: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...],
                 dilations: tuple[int, ...]) -> list[int]:
    """ONNX pads [begin..., end...] from `pads` or `auto_pad`; ValueError for a bad window (check_window) or pads
    that are not 2 * rank values >= 0."""
    r = len(in_sizes)
    check_window(op, r, kernel, strides, dilations)
    mode = op.attr.get("auto_pad", "NOTSET")
    if mode in ("NOTSET", "", None):
        pads = list(op.attr.get("pads") or [0] * (2 * r))
        if len(pads) != 2 * r or min(pads) < 0:
            raise ValueError(f"{op.node.describe()}: pads {pads} must be {2 * r} values >= 0 (begin and end per "
                             f"spatial axis)")
        return pads
    if mode == "VALID":
        return [0] * (2 * r)
    begin, end = [], []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilations, strict=True):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small = total // 2
        begin.append(small if mode == "SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    return begin + end


def to_2d(ctx: Context, t: Tensor) -> Tensor:
    """A 1-D spatial tensor (N, C, W) as (N, C, 1, W), so 1-D ops reuse the 2-D kernels."""
    return reshape_view(ctx, t, t.shape[:2] + (1,) + t.shape[2:]) if t.rank == 3 else t


@register("Conv", 1)
class Conv(Op):
    f16 = True
    attrs = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None, "pads": None,
             "strides": None}

    def run(self, ctx: Context, x: Tensor, w: Tensor, b: Tensor | None = None) -> list[Tensor]:
        r = x.rank - 2
        if r not in (1, 2):
            raise self.fail(f"{r}-D convolution is not supported (1-D and 2-D are)")
        if x.dtype.kind != "f":
            raise self.fail(f"Conv on {x.dtype} is not supported")
        kernel = tuple(w.shape[2:])
        strides = tuple(self.attr["strides"] or [1] * r)
        dil = tuple(self.attr["dilations"] or [1] * r)
        pads = spatial_pads(self, x.shape[2:], kernel, strides, dil)
        g = self.attr["group"]
        if x.shape[1] != w.shape[1] * g or w.shape[0] % g:
            raise ValueError(f"{self.node.describe()}: input {x.shape}, weight {w.shape} and group {g} disagree")
        out_sp = [(x.shape[2 + i] + pads[i] + pads[i + r] - (kernel[i] - 1) * dil[i] - 1) // strides[i] + 1
                  for i in range(r)]
        if min(out_sp) <= 0:
            raise ValueError(f"{self.node.describe()}: kernel {kernel} larger than the padded input {x.shape}")
        out_shape = (x.shape[0], w.shape[0], *out_sp)
        if math.prod(out_shape) == 0:  # an empty batch (or no filters): nothing to compute, no kernel to record
            return [ctx.new(x.dtype, out_shape)]
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
        # amplifies U's float16 rounding.
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
        res = ctx.contiguous(Tensor(residual.dtype, residual.shape, view=residual)).merged(out4)
    return res
