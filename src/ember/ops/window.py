"""Window functions (Hann, Hamming, Blackman): a cosine sum over the position, one kernel."""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from ..core.expr import Expr, call, coord
from .base import Context, Op, Tensor, host_ints, register
from .exprs import float_const, kernel


class Window(Op):
    host_inputs = (0,)
    attrs = {"periodic": 1, "output_datatype": 1}
    terms: tuple[tuple[float, float], ...]  # sum of coef * cos(k * 2 pi n / N)

    def run(self, ctx: Context, size: Tensor) -> list[Tensor]:
        n = host_ints(self, size, "size")[0]
        denom = n if self.attr["periodic"] else n - 1
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(self.attr["output_datatype"]))
        ni = call("to_float", coord(0))
        e: Expr | None = None
        for coef, k in self.terms:
            t = float_const(coef)
            if k:
                t = call("mul", t, call("cos", call("mul", ni, float_const(k * 2 * math.pi / denom))))
            e = t if e is None else call("add", e, t)
        assert e is not None
        if dt.kind != "f":
            e = call("to_int", e)
        return [kernel(ctx, e, [], dt, (n,))]
register("HannWindow", 17)(type("HannWindow", (Window,), {"terms": ((0.5, 0), (-0.5, 1))}))
register("HammingWindow", 17)(type("HammingWindow", (Window,), {"terms": ((25 / 46, 0), (-21 / 46, 1))}))
register("BlackmanWindow", 17)(type("BlackmanWindow", (Window,), {"terms": ((0.42, 0), (-0.5, 1), (0.08, 2))}))
