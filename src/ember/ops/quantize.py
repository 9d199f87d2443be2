"""Quantisation: QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear, and the integer and
quantized linear algebra (MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv) on float32 products, which are
exact while the sums stay below 2^24."""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from ..core.expr import INT, call, inp
from .base import Context, Op, Tensor, call_op, norm_axis, register
from .elementwise import emit
from .exprs import float_const
from .reduce import reduce_axes
from .shape import reshape_view, slice_view

_QRANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}


def per_axis(ctx: Context, op: Op, t: Tensor | None, x: Tensor, axis: int) -> Tensor | None:
    """A scale or zero point: a scalar, or a 1-D tensor along `axis` (reshaped to broadcast over x)."""
    if t is None or t.size <= 1 or t.rank == 0:
        return t
    if t.rank != 1 or op.attr.get("block_size"):
        raise op.fail("blocked quantization is not supported")
    a = norm_axis(op, axis, x.rank)
    return reshape_view(ctx, t, tuple(t.size if i == a else 1 for i in range(x.rank)))


@register("QuantizeLinear", 10)
class QuantizeLinear(Op):
    attrs = {"axis": 1, "saturate": 1, "block_size": 0, "output_dtype": 0, "precision": 0}

    def run(self, ctx: Context, x: Tensor, scale: Tensor, zp: Tensor | None = None) -> list[Tensor]:
        if zp is not None:
            dt = zp.dtype
        elif self.attr["output_dtype"]:
            dt = np.dtype(helper.tensor_dtype_to_np_dtype(self.attr["output_dtype"]))
        else:
            dt = np.dtype(np.uint8)
        if dt.name not in _QRANGE or x.dtype.kind != "f":
            raise self.fail(f"quantizing {x.dtype} to {dt} is not supported")
        lo, hi = _QRANGE[dt.name]
        ins = [x, per_axis(ctx, self, scale, x, self.attr["axis"])]
        q = call("round", call("div", inp(0), inp(1)))  # half to even, as the spec's rounding
        if zp is not None:
            ins.append(per_axis(ctx, self, zp, x, self.attr["axis"]))
            q = call("add", q, call("to_float", inp(2, INT)))
        q = call("max", float_const(lo), call("min", float_const(hi), q))
        return [emit(ctx, self, call("to_int", q), ins, dt)]


@register("DequantizeLinear", 10)
class DequantizeLinear(Op):
    attrs = {"axis": 1, "block_size": 0, "output_dtype": 0}

    def run(self, ctx: Context, x: Tensor, scale: Tensor, zp: Tensor | None = None) -> list[Tensor]:
        if x.dtype.kind not in "iu":
            raise self.fail(f"dequantizing {x.dtype} is not supported")
        ins = [x, per_axis(ctx, self, scale, x, self.attr["axis"])]
        v = call("to_float", inp(0, INT))
        if zp is not None:
            ins.append(per_axis(ctx, self, zp, x, self.attr["axis"]))
            v = call("sub", v, call("to_float", inp(2, INT)))
        return [emit(ctx, self, call("mul", v, inp(1)), ins, scale.dtype)]


@register("DynamicQuantizeLinear", 11)
class DynamicQuantizeLinear(Op):
    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        axes = list(range(x.rank))
        hi, lo = reduce_axes(ctx, "max", x, axes), reduce_axes(ctx, "min", x, axes)
        mx, mn = call("max", float_const(0.0), inp(0)), call("min", float_const(0.0), inp(1))
        scale = call("div", call("where", call("eq", mx, mn), float_const(1.0), call("sub", mx, mn)),
                     float_const(255.0))
        y_scale = emit(ctx, self, scale, [hi, lo], x.dtype)
        initial = call("sub", float_const(0.0), call("div", call("min", float_const(0.0), inp(0)), inp(1)))
        zp = call("round", call("max", float_const(0.0), call("min", float_const(255.0), initial)))
        zpf = emit(ctx, self, zp, [lo, y_scale], x.dtype)
        q = call("add", call("round", call("div", inp(0), inp(1))), inp(2))
        q = call("max", float_const(0.0), call("min", float_const(255.0), q))
        u8 = np.dtype(np.uint8)
        y = emit(ctx, self, call("to_int", q), [x, y_scale, zpf], u8)
        return [y, y_scale, emit(ctx, self, call("to_int", inp(0)), [zpf], u8)]


def centered(ctx: Context, op: Op, x: Tensor, zp: Tensor | None, axis: int | None = None) -> Tensor:
    """float32(x - zero_point); a 1-D zero point runs along `axis` of x."""
    if zp is not None and zp.size > 1 and axis is not None:
        zp = reshape_view(ctx, zp, tuple(zp.size if i == axis % x.rank else 1 for i in range(x.rank)))
    e = call("to_float", inp(0, INT))
    ins = [x]
    if zp is not None:
        ins.append(zp)
        e = call("sub", e, call("to_float", inp(1, INT)))
    return emit(ctx, op, e, ins, np.dtype(np.float32))


def exact_chunk(a: Tensor, b: Tensor) -> int:
    """The most terms an integer dot product can have and stay exact in float32 (|x - zp| < 2^bits)."""
    return max(2 ** 24 // ((2 ** (8 * a.dtype.itemsize) - 1) * (2 ** (8 * b.dtype.itemsize) - 1)), 1)


def requantize(ctx: Context, op: Op, acc: Tensor, mult: list[Tensor], zp: Tensor | None, dtype: np.dtype) -> Tensor:
    """saturate(rint(acc * prod(scales) + zero_point)) as `dtype`."""
    lo, hi = _QRANGE[dtype.name]
    ins = [acc, *mult]
    m = inp(1)
    for i in range(2, len(mult)):
        m = call("mul", m, inp(i))
    e = call("mul", inp(0), call("div", m, inp(len(mult))))  # a_scale * b_scale / y_scale
    if zp is not None:
        ins.append(zp)
        e = call("add", e, call("to_float", inp(len(ins) - 1, INT)))
    e = call("max", float_const(lo), call("min", float_const(hi), call("round", e)))
    return emit(ctx, op, call("to_int", e), ins, dtype)


@register("MatMulInteger", 10)
class MatMulInteger(Op):
    """int32 (A - a_zp) @ (B - b_zp): float32 products over K chunks short enough to be exact, each turned
    into int32 and summed in int32."""

    def run(self, ctx: Context, a: Tensor, b: Tensor, azp: Tensor | None = None,
            bzp: Tensor | None = None) -> list[Tensor]:
        af = centered(ctx, self, a, azp, -2 if a.rank > 1 else None)
        bf = centered(ctx, self, b, bzp, -1)
        k, step = a.shape[-1], exact_chunk(a, b)
        total: Tensor | None = None
        for start in range(0, k, step):
            stop = min(start + step, k)
            part = call_op(ctx, self, "MatMul", slice_view(ctx, af, a.rank - 1, start, stop),
                           slice_view(ctx, bf, max(b.rank - 2, 0), start, stop))[0]
            if total is None:
                total = emit(ctx, self, call("to_int", inp(0)), [part], np.dtype(np.int32))
            else:
                total = emit(ctx, self, call("add", inp(0, INT), call("to_int", inp(1))), [total, part],
                             np.dtype(np.int32))
        assert total is not None
        return [total]


@register("QLinearMatMul", 10)
class QLinearMatMul(Op):
    def run(self, ctx: Context, a: Tensor, a_s: Tensor, azp: Tensor | None, b: Tensor, b_s: Tensor,
            bzp: Tensor | None, y_s: Tensor, yzp: Tensor | None = None) -> list[Tensor]:
        dt = yzp.dtype if yzp is not None else a.dtype
        if dt.name not in _QRANGE:
            raise self.fail(f"QLinearMatMul to {dt} is not supported")
        acc = call_op(ctx, self, "MatMul", centered(ctx, self, a, azp, -2), centered(ctx, self, b, bzp, -1))[0]
        scales = [per_axis(ctx, self, a_s, acc, -2), per_axis(ctx, self, b_s, acc, -1), y_s]
        return [requantize(ctx, self, acc, scales, yzp, dt)]


@register("ConvInteger", 10)
class ConvInteger(Op):
    attrs = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None, "pads": None,
             "strides": None}

    def run(self, ctx: Context, x: Tensor, w: Tensor, xzp: Tensor | None = None,
            wzp: Tensor | None = None) -> list[Tensor]:
        if math.prod(w.shape[1:]) > exact_chunk(x, w):
            raise self.fail(f"a {w.shape} integer filter could leave float32's exact range")
        acc = call_op(ctx, self, "Conv", centered(ctx, self, x, xzp), centered(ctx, self, w, wzp, 0), **self.attr)[0]
        return [emit(ctx, self, call("to_int", inp(0)), [acc], np.dtype(np.int32))]


@register("QLinearConv", 10)
class QLinearConv(Op):
    attrs = ConvInteger.attrs

    def run(self, ctx: Context, x: Tensor, x_s: Tensor, xzp: Tensor, w: Tensor, w_s: Tensor, wzp: Tensor,
            y_s: Tensor, yzp: Tensor | None = None, b: Tensor | None = None) -> list[Tensor]:
        dt = yzp.dtype if yzp is not None else x.dtype
        if dt.name not in _QRANGE:
            raise self.fail(f"QLinearConv to {dt} is not supported")
        acc = call_op(ctx, self, "Conv", centered(ctx, self, x, xzp), centered(ctx, self, w, wzp, 0), **self.attr)[0]
        if b is not None:  # int32 bias in units of x_scale * w_scale
            bias = reshape_view(ctx, b, (b.size,) + (1,) * (acc.rank - 2))
            acc = emit(ctx, self, call("add", inp(0), call("to_float", inp(1, INT))), [acc, bias], acc.dtype)
        scales = [x_s, per_axis(ctx, self, w_s, acc, 1), y_s]
        return [requantize(ctx, self, acc, scales, yzp, dt)]
