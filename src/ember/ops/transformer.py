"""Transformer ops with fused kernels: LayerNorm, RMSNorm, GELU, Softmax.

Each runs its fused kernel when it applies and counts "<pattern>.fused"; otherwise it falls back to the
decomposition and counts "<pattern>.fallback". The ONNX ops (LayerNormalization-17, RMSNormalization-23,
Gelu-20) and the ai.ember ops that onnx/optimize.py rewrites torch's decomposed patterns into share them.
"""

from __future__ import annotations

import math

import numpy as np

from ..backends.base import View
from ..backends.expr import call, const, inp
from .base import Context, Op, T, register
from .elementwise import emit
from .reduce import reduce_axes
from .shape import norm_axis, reshape_view

EMBER = "ai.ember"
PATTERNS = ("rmsnorm", "layernorm", "softmax", "gelu", "attention")


def _vector(ctx: Context, t: T | None, n: int, name: str, op: Op) -> View | None:
    """scale/bias as n contiguous elements (broadcast over the normalised dims), or None."""
    if t is None:
        return None
    if t.size == n:
        return ctx.contiguous(reshape_view(ctx, t, (n,)))
    if t.size == 1:
        full = emit(ctx, op, inp(0), [reshape_view(ctx, t, (1,))], t.dtype)
        full = emit(ctx, op, call("add", inp(0), inp(1)), [full, ctx.const(np.zeros(n, t.dtype))], t.dtype)
        return ctx.contiguous(full)
    return None


def fused_norm(ctx: Context, op: Op, kind: str, x: T, axis: int, scale: T | None, bias: T | None,
               eps: float) -> T | None:
    """The fused row kernel when it applies (float32, normalising trailing dims, vector scale/bias)."""
    if not hasattr(ctx.backend, "record_norm") or x.dtype != np.float32 or x.size == 0:
        return None
    n = math.prod(x.shape[axis:])
    sv, bv = _vector(ctx, scale, n, "scale", op), _vector(ctx, bias, n, "bias", op)
    if (scale is not None and sv is None) or (bias is not None and bv is None):
        return None
    out = ctx.new(x.dtype, x.shape)
    ctx.record(ctx.backend.record_norm(kind, ctx.contiguous(x), sv, bv, out.view, n, float(eps)))
    return out


def decomposed_rms(ctx: Context, op: Op, x: T, axes: list[int], eps: float, scale: T | None) -> T:
    keep = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    n = math.prod(x.shape[a] for a in axes)
    ss = reshape_view(ctx, reduce_axes(ctx, "sumsq", x, axes), keep)
    inv = emit(ctx, op, call("div", const(1.0), call("sqrt", call("add", call("div", inp(0), const(float(n))),
                                                                    const(eps)))), [ss], x.dtype)
    y = emit(ctx, op, call("mul", inp(0), inp(1)), [x, inv], x.dtype)
    return emit(ctx, op, call("mul", inp(0), inp(1)), [y, scale], x.dtype) if scale is not None else y


@register("LayerNormalization", 17)
class LayerNormalization(Op):
    attrs = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}

    def run(self, ctx: Context, x: T, scale: T | None = None, bias: T | None = None) -> list[T]:
        from .nn import normalize

        axis = norm_axis(self, self.a["axis"], x.rank)
        wants_stats = len([o for o in self.node.outputs if o]) > 1
        if not wants_stats:
            y = fused_norm(ctx, self, "layernorm", x, axis, scale, bias, self.a["epsilon"])
            if y is not None:
                ctx.count("layernorm.fused")
                return [y]
        ctx.count("layernorm.fallback")
        y, mean, inv = normalize(ctx, self, x, list(range(axis, x.rank)), self.a["epsilon"], stats=True)
        ins = [y] + [t for t in (scale, bias) if t is not None]
        e = inp(0)
        if scale is not None:
            e = call("mul", e, inp(1))
        if bias is not None:
            e = call("add", e, inp(len(ins) - 1))
        return [emit(ctx, self, e, ins, x.dtype), mean, inv]


register("LayerNorm", 1, EMBER)(type("LayerNorm", (LayerNormalization,), {}))


@register("RMSNormalization", 23)
class RMSNormalization(Op):
    attrs = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}

    def run(self, ctx: Context, x: T, scale: T | None = None) -> list[T]:
        axis = norm_axis(self, self.a["axis"], x.rank)
        y = fused_norm(ctx, self, "rmsnorm", x, axis, scale, None, self.a["epsilon"])
        if y is not None:
            ctx.count("rmsnorm.fused")
            return [y]
        ctx.count("rmsnorm.fallback")
        return [decomposed_rms(ctx, self, x, list(range(axis, x.rank)), self.a["epsilon"], scale)]


register("RMSNorm", 1, EMBER)(type("RMSNorm", (RMSNormalization,), {}))


@register("Gelu", 20)
class Gelu(Op):
    """One elementwise kernel (the erf or tanh form), which a producing MatMul/Conv takes as its epilogue."""

    attrs = {"approximate": "none"}

    def run(self, ctx: Context, x: T) -> list[T]:
        fn = "gelu_tanh" if self.a["approximate"] == "tanh" else "gelu"
        ctx.count("gelu.fused")
        return [emit(ctx, self, call(fn, inp(0)), [x], x.dtype)]


register("Gelu", 1, EMBER)(type("GeluEmber", (Gelu,), {}))


def softmax(ctx: Context, op: Op, x: T, axis: int, log: bool, legacy: bool = False) -> T:
    """(Log)Softmax over `axis` (legacy: over all dims from `axis`, as opset < 13 coerces to 2-D)."""
    if legacy:
        x2 = reshape_view(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
        return reshape_view(ctx, softmax(ctx, op, x2, 1, log), x.shape)
    if hasattr(ctx.backend, "record_softmax") and x.dtype == np.float32 and x.size:
        ctx.count("softmax.fused")
        perm = [i for i in range(x.rank) if i != axis] + [axis]
        moved = T(x.dtype, tuple(x.shape[p] for p in perm), view=ctx.view(x).permute(perm))
        src = ctx.contiguous(moved)
        out = ctx.new(x.dtype, moved.shape)
        ctx.record(ctx.backend.record_softmax(src, out.view, x.shape[axis], log))
        inv = list(np.argsort(perm))
        return T(x.dtype, x.shape, view=out.view.permute(inv))
    ctx.count("softmax.fallback")
    shape3 = (math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:]))
    x3 = reshape_view(ctx, x, shape3)
    keep = (shape3[0], 1, shape3[2])
    m = reshape_view(ctx, reduce_axes(ctx, "max", x3, [1]), keep)
    e = emit(ctx, op, call("exp", call("sub", inp(0), inp(1))), [x3, m], x.dtype)
    s = reshape_view(ctx, reduce_axes(ctx, "sum", e, [1]), keep)
    if log:
        y = emit(ctx, op, call("sub", call("sub", inp(0), inp(1)), call("log", inp(2))), [x3, m, s], x.dtype)
    else:
        y = emit(ctx, op, call("div", inp(0), inp(1)), [e, s], x.dtype)
    return reshape_view(ctx, y, x.shape)


class SoftmaxBase(Op):
    attrs = {"axis": None}
    log = False

    def run(self, ctx: Context, x: T) -> list[T]:
        legacy = self.node.opset < 13
        axis = self.a["axis"]
        axis = norm_axis(self, (1 if legacy else -1) if axis is None else axis, x.rank)
        return [softmax(ctx, self, x, axis, self.log, legacy)]


register("Softmax", 1)(type("Softmax", (SoftmaxBase,), {}))
register("LogSoftmax", 1)(type("LogSoftmax", (SoftmaxBase,), {"log": True}))
