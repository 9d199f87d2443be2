"""Ops whose result is known while planning (host values, no step): Shape, Size, Constant,
ConstantOfShape, Range, EyeLike."""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from .base import Context, Op, Tensor, host_shape, register


@register("Shape", 1)
class Shape(Op):
    attrs = {"start": 0, "end": None}
    reads_data = False

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        return [ctx.const(np.array(x.shape[self.attr["start"]:self.attr["end"]], np.int64))]


@register("Size", 1)
class Size(Op):
    reads_data = False

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        return [ctx.const(np.array(x.size, np.int64))]


@register("Constant", 1)
class Constant(Op):
    attrs = {"value": None, "value_float": None, "value_floats": None, "value_int": None, "value_ints": None,
             "value_string": None, "value_strings": None, "sparse_value": None}

    def run(self, ctx: Context) -> list[Tensor]:
        a = self.attr
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

    def run(self, ctx: Context, shape: Tensor) -> list[Tensor]:
        dims = host_shape(self, shape)
        val = self.attr["value"] if self.attr["value"] is not None else np.zeros(1, np.float32)
        return [ctx.const(np.full(dims, val.reshape(-1)[0], val.dtype))]


@register("Range", 11)
class Range(Op):
    host_inputs = (0, 1, 2)
    def run(self, ctx: Context, start: Tensor, limit: Tensor, delta: Tensor) -> list[Tensor]:
        for t, what in ((start, "start"), (limit, "limit"), (delta, "delta")):
            if not t.is_const:
                raise self.fail(f"the {what} input must be known when the plan is built")
        s, lim, d = start.value.item(), limit.value.item(), delta.value.item()
        n = max(int(math.ceil((lim - s) / d)), 0)
        return [ctx.const((s + np.arange(n) * d).astype(start.dtype))]


@register("EyeLike", 9)
class EyeLike(Op):
    attrs = {"dtype": None, "k": 0}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        dt = helper.tensor_dtype_to_np_dtype(self.attr["dtype"]) if self.attr["dtype"] is not None else x.dtype
        return [ctx.const(np.eye(x.shape[0], x.shape[1], self.attr["k"], dtype=dt))]
