"""Spectral ops: DFT (ONNX opset 17: axis attribute; opset 20: axis as an input)."""

from __future__ import annotations

import math

from ..core.view import View
from .base import Context, Op, Tensor, host_ints, register


class _DFT(Op):
    host_inputs = (1, 2)  # dft_length and (opset 20) axis are shape arithmetic: known while planning

    def transform(self, ctx: Context, x: Tensor, length_input: Tensor | None, axis: int) -> list[Tensor]:
        if x.dtype.kind != "f":
            raise self.fail(f"DFT of {x.dtype} is not supported (float tensors are)")
        if x.rank < 2 or x.shape[-1] not in (1, 2):
            raise ValueError(f"{self.node.describe()}: input {x.shape} must end in a dim of 1 (real) or 2 (complex)")
        if not -x.rank <= axis <= x.rank - 2 or axis == -1:
            raise ValueError(f"{self.node.describe()}: axis {axis} is outside [-{x.rank}, -2] and [0, {x.rank - 2}]"
                             f" for input {x.shape}")
        axis %= x.rank
        inverse, onesided = bool(self.attr["inverse"]), bool(self.attr["onesided"])
        # A real inverse of a one-sided spectrum (irfft) defaults to the even length that spectrum came from.
        lengths = host_ints(self, length_input, "dft_length")
        length = lengths[0] if lengths else 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
        if length < 1:
            raise ValueError(f"{self.node.describe()}: the transform length is {length} (dft_length must be >= 1)"
                             f" for input {x.shape}")
        lout = length // 2 + 1 if onesided and not inverse else length
        out_channels = 1 if inverse and onesided else 2
        out_shape = (*x.shape[:axis], lout, *x.shape[axis + 1:-1], out_channels)
        out = ctx.new(x.dtype, out_shape)
        if out.size == 0:
            return [out]
        outer, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1:-1])
        xv = ctx.contiguous(x)
        x4 = View.contiguous(xv.handle, x.dtype, (outer, x.shape[axis], inner, x.shape[-1]), xv.offset)
        o4 = View.contiguous(out.view.handle, x.dtype, (outer, lout, inner, out_channels), out.view.offset)
        ctx.record(ctx.backend.record_dft(x4, o4, length, inverse, onesided))
        return [out]


@register("DFT", 17)
class DFT17(_DFT):
    attrs = {"axis": 1, "inverse": 0, "onesided": 0}

    def run(self, ctx: Context, x: Tensor, dft_length: Tensor | None = None) -> list[Tensor]:
        return self.transform(ctx, x, dft_length, int(self.attr["axis"]))


@register("DFT", 20)
class DFT20(_DFT):
    attrs = {"inverse": 0, "onesided": 0}

    def run(self, ctx: Context, x: Tensor, dft_length: Tensor | None = None,
            axis: Tensor | None = None) -> list[Tensor]:
        axes = host_ints(self, axis, "axis")
        return self.transform(ctx, x, dft_length, axes[0] if axes else -2)
