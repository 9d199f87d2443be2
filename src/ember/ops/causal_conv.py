"""CausalConvWithState: a depthwise causal conv1d that carries its state across calls."""

from __future__ import annotations

import numpy as np

from ..core.expr import FLOAT, Expr, call, coord, inp, load
from .base import Context, Op, Tensor, register
from .elementwise import emit
from .exprs import float_const, int_const, kernel, sum_exprs


@register("CausalConvWithState", 27)
class CausalConvWithState(Op):
    """Depthwise causal conv1d over [past_state, input] (zeros without a state), one index kernel with the k
    taps unrolled; present_state is the last k - 1 positions of that concatenation."""

    attrs = {"activation": "none"}

    def run(self, ctx: Context, x: Tensor, w: Tensor, b: Tensor | None = None,
            state: Tensor | None = None) -> list[Tensor]:
        if x.rank != 3 or w.rank != 3 or w.shape[0] != x.shape[1] or w.shape[1] != 1:
            raise ValueError(f"{self.node.describe()}: input {x.shape} and weight {w.shape} do not match")
        if x.dtype.kind != "f":
            raise self.fail(f"CausalConvWithState on {x.dtype} is not supported")
        act = self.attr["activation"]
        if act not in ("none", "silu", "swish"):
            raise self.fail(f"activation {act!r} is not supported")
        nb, c, length = x.shape
        k = w.shape[2]
        dtype, f32 = x.dtype, np.dtype(np.float32)
        if dtype != f32:  # computed in float32 (as onnx.reference), then cast back
            x, w, b, state = (t if t is None else emit(ctx, self, inp(0), [t], f32) for t in (x, w, b, state))
        ins: list[Tensor] = [x, w] + ([state] if state is not None else [])

        def padded(pos: Expr) -> Expr:  # [state, x] at position pos of the time axis
            from_x = load(0, coord(0), coord(1), call("sub", pos, int_const(k - 1)), kind=FLOAT)
            if k == 1:
                return from_x
            early = load(2, coord(0), coord(1), pos, kind=FLOAT) if state is not None else float_const(0.0)
            return call("where", call("lt", pos, int_const(k - 1)), early, from_x)

        terms = [call("mul", load(1, coord(1), int_const(0), int_const(j), kind=FLOAT),
                      padded(call("add", coord(2), int_const(j)) if j else coord(2))) for j in range(k)]
        y = sum_exprs(terms)
        if b is not None:
            ins.append(b)
            y = call("add", y, load(len(ins) - 1, coord(1), kind=FLOAT))
        if act != "none":
            y = call("mul", y, call("sigmoid", y))
        out = kernel(ctx, y, ins, dtype, x.shape)
        present = kernel(ctx, padded(call("add", coord(2), int_const(length))), ins[:3], dtype, (nb, c, k - 1))
        return [out, present]
