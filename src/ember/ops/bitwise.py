"""Bit ops on integer tensors: shifts, and/or/xor/not, and BitCast."""

from __future__ import annotations

import numpy as np
from onnx import helper

from ..core.dtypes import kind_of
from ..core.expr import INT, bitcast, call, inp
from .base import Context, Op, Tensor, register
from .elementwise import emit
from .exprs import int_const, zero


@register("BitShift", 11)
class BitShift(Op):
    """Shifts by a negative amount or by the bit width or more give 0 (left) or the sign fill (right), as
    onnx.reference; the backends' shifts only see amounts in range."""

    attrs = {"direction": ""}

    def run(self, ctx: Context, a: Tensor, b: Tensor) -> list[Tensor]:
        if a.dtype.kind not in "iu" or b.dtype != a.dtype:
            raise self.fail(f"BitShift of {a.dtype} by {b.dtype} is not supported")
        width = a.dtype.itemsize * 8
        x, s = inp(0, INT), inp(1, INT)
        oob = call("ge", s, int_const(width))
        if b.dtype.kind == "i":
            oob = call("or", call("lt", s, zero(INT)), oob)
        if self.attr["direction"] == "LEFT":
            e = call("where", oob, zero(INT), call("shl", x, s))
        elif self.attr["direction"] == "RIGHT":
            fill = zero(INT)
            if a.dtype.kind == "i":
                fill = call("where", call("lt", x, zero(INT)), int_const(-1), zero(INT))
            e = call("where", oob, fill, call("shr", x, s))
        else:
            raise self.fail(f"direction {self.attr['direction']!r} is not LEFT or RIGHT")
        return [emit(ctx, self, e, [a, b], a.dtype)]


class BitwiseBinary(Op):
    fn: str

    def run(self, ctx: Context, a: Tensor, b: Tensor) -> list[Tensor]:
        if a.dtype.kind not in "iu" or b.dtype != a.dtype:
            raise self.fail(f"bitwise op on {a.dtype} and {b.dtype} is not supported")
        return [emit(ctx, self, call(self.fn, inp(0, INT), inp(1, INT)), [a, b], a.dtype)]
for _name, _function in (("BitwiseAnd", "bitand"), ("BitwiseOr", "bitor"), ("BitwiseXor", "bitxor")):
    register(_name, 18)(type(_name, (BitwiseBinary,), {"fn": _function}))


@register("BitwiseNot", 18)
class BitwiseNot(Op):
    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        if x.dtype.kind not in "iu":
            raise self.fail(f"BitwiseNot of {x.dtype} is not supported")
        return [emit(ctx, self, call("bitnot", inp(0, INT)), [x], x.dtype)]


@register("BitCast", 26)
class BitCast(Op):
    attrs = {"to": 1}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        try:
            to = np.dtype(helper.tensor_dtype_to_np_dtype(self.attr["to"]))
        except Exception:
            raise self.fail(f"bitcast to ONNX type {self.attr['to']} is not supported") from None
        if to.itemsize != x.dtype.itemsize or to.kind not in "fiu" or x.dtype.kind not in "fiu":
            raise self.fail(f"bitcast {x.dtype} -> {to} is not supported")
        if to == x.dtype:
            return [x]
        return [emit(ctx, self, bitcast(inp(0, kind_of(x.dtype)), to), [x], to)]
