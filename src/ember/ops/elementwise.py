"""Elementwise ONNX ops: each builds an Expr; one generated kernel per node, numpy broadcasting included."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from onnx import helper

from ..core.dtypes import kind_of
from ..core.expr import BOOL, FLOAT, INT, Expr, call, const, inp
from ..core.view import View
from .base import Context, Lazy, Op, Tensor, register
from .exprs import float_const
from .shape import reshape_view


def broadcast_shape(op: Op, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{op.node.describe()}: input shapes {shapes} do not broadcast") from None


# Fused expressions stay well below what shader compilers accept (naga and Dawn reject deep ones).
MAX_FUSED_NODES = 96


def substitute(e: Expr, mapping: dict[int, Expr]) -> Expr:
    if e.op == "in":
        return mapping[e.value]
    if not e.args:
        return e
    return Expr(e.op, tuple(substitute(a, mapping) for a in e.args), e.value, e.kind)


def emit(ctx: Context, op: Op, expr: Expr, inputs: list[Tensor], out_dtype: np.dtype) -> Tensor:
    """The result of an elementwise node, as a lazy value: single-use lazy inputs are inlined, scalar
    constants become literals, and a lone Conv/MatMul input takes the expression as its epilogue."""
    shape = broadcast_shape(op, [t.shape for t in inputs])
    if not ctx.fuse:
        out = ctx.new(out_dtype, shape)
        if out.size:
            views = [ctx.view(t).broadcast_to(shape) for t in inputs]
            ctx.record(ctx.backend.record_elementwise(expr, views, out.view))
        return out
    mapping: dict[int, Expr] = {}
    new_inputs: list[Tensor] = []
    nodes = 1
    for i, t in enumerate(inputs):
        lz = t.lazy
        if t.is_const and t.size == 1 and t.dtype.kind in "fiub" and not (t.dtype.kind == "f" and t.dtype.itemsize > 4):
            mapping[i] = const(t.value.item(), kind_of(t.dtype))
        elif lz is not None and lz.anchor is None and t.uses == 1 and lz.expr.size() + expr.size() <= MAX_FUSED_NODES:
            base = len(new_inputs)
            new_inputs.extend(lz.inputs)
            mapping[i] = substitute(lz.expr, {j: inp(base + j, kind_of(x.dtype)) for j, x in enumerate(lz.inputs)})
            nodes += lz.nodes
        else:
            mapping[i] = inp(len(new_inputs), kind_of(t.dtype))
            new_inputs.append(t)
    fused = substitute(expr, mapping)
    # The same tensor read twice (x * sigmoid(x)) is one binding.
    unique: list[Tensor] = []
    remap: dict[int, Expr] = {}
    for j, t in enumerate(new_inputs):
        k = next((n for n, u in enumerate(unique) if u is t), None)
        if k is None:
            k = len(unique)
            unique.append(t)
        remap[j] = inp(k, kind_of(t.dtype))
    fused = substitute(fused, remap)
    if fused.op == "add" and len(unique) == 2 and all(a.op == "in" for a in fused.args):
        for ai in (0, 1):
            a, b = unique[fused.args[ai].value], unique[fused.args[1 - ai].value]
            lz = a.lazy
            if (lz is not None and lz.takes_bias > 0 and lz.expr.op == "in" and a.uses == 1
                    and a.shape == shape and a.dtype == b.dtype == out_dtype and all(b is not x for x in lz.inputs)):
                # MatMul + bias (or + residual): the matmul adds it in its epilogue.
                return Tensor(out_dtype, shape, lazy=Lazy(inp(0), [*lz.inputs, b], lz.anchor, lz.nodes + nodes,
                                                          lz.origin, lz.deps, takes_bias=lz.takes_bias - 1))
    if (len(unique) == 1 and unique[0].lazy is not None and unique[0].lazy.anchor is not None
            and unique[0].uses == 1 and unique[0].shape == shape and fused.kind == FLOAT
            and unique[0].dtype == out_dtype):
        base = unique[0].lazy
        epilogue = substitute(fused, {0: base.expr})
        return Tensor(out_dtype, shape, lazy=Lazy(epilogue, base.inputs, base.anchor, base.nodes + nodes, base.origin,
                                             base.deps, pool=base.pool, flat=base.flat))
    if not unique:
        out = ctx.new(out_dtype, shape)
        if out.size:
            ctx.record(ctx.backend.record_elementwise(fused, [], out.view))
        return out
    return Tensor(out_dtype, shape, lazy=Lazy(fused, unique, nodes=nodes, origin=ctx.node))


def anchored(ctx: Context, dtype: np.dtype, shape: tuple[int, ...], record: Callable[..., list],
             deps: list[View | None], takes_bias: int = 0, flat: bool = False) -> Tensor:
    """A Conv/MatMul result, computed when first read, so following adds (up to `takes_bias` tensors) and an
    activation join its epilogue. `record(out, act, *addends)` records the kernel; `deps` are the views it reads
    (kept alive); `flat`: it writes row-major at out's offset whatever out's shape, so a Reshape of it stays lazy."""
    deps = [d for d in deps if d is not None]
    t = Tensor(np.dtype(dtype), tuple(shape), lazy=Lazy(inp(0), [], record, origin=ctx.node, deps=deps,
                                                   takes_bias=int(takes_bias), flat=flat))
    if not ctx.fuse:
        ctx.view(t)
    return t


def args(inputs: list[Tensor]) -> list[Expr]:
    return [inp(i, kind_of(t.dtype)) for i, t in enumerate(inputs)]


class Unary(Op):
    """An op whose result is `build(x, attrs)` with the input's dtype."""
    f16 = True

    build: Callable[..., Expr]

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        return [emit(ctx, self, self.build(inp(0, kind_of(x.dtype))), [x], x.dtype)]


def unary(op_type: str, since: int, build: Callable[[Expr], Expr], attrs: dict | None = None,
          domain: str = "") -> None:
    if attrs:
        def b(self: Op, x: Expr) -> Expr:
            return build(x, **self.attr)
    else:
        def b(self: Op, x: Expr) -> Expr:
            return build(x)
    cls = type(op_type, (Unary,), {"attrs": attrs or {}, "build": b})
    register(op_type, since, domain)(cls)


for _name, _function in {"Abs": "abs", "Neg": "neg", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
                   "Reciprocal": "reciprocal", "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sign": "sign",
                   "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Sin": "sin", "Cos": "cos",
                   "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh",
                   "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh", "Softplus": "softplus",
                   "Softsign": "softsign"}.items():
    unary(_name, 1, lambda x, f=_function: call(f, x))


def _where_neg(x: Expr, neg: Expr) -> Expr:
    return call("where", call("lt", x, float_const(0.0)), neg, x)


def _exp_minus_one(x: Expr) -> Expr:
    return call("sub", call("exp", x), float_const(1.0))


unary("LeakyRelu", 1, lambda x, alpha: _where_neg(x, call("mul", float_const(alpha), x)), {"alpha": 0.01})
unary("Elu", 1, lambda x, alpha: _where_neg(x, call("mul", float_const(alpha), _exp_minus_one(x))), {"alpha": 1.0})
unary("Selu", 1, lambda x, alpha, gamma: call("mul", float_const(gamma), call(
    "where", call("le", x, float_const(0.0)), call("mul", float_const(alpha), _exp_minus_one(x)), x)),
    {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875})
unary("Celu", 12, lambda x, alpha: call("add", call("max", float_const(0.0), x), call(
    "min", float_const(0.0), call("mul", float_const(alpha), _exp_minus_one(call("div", x, float_const(alpha)))))),
    {"alpha": 1.0})
unary("HardSigmoid", 1, lambda x, alpha, beta: call("max", float_const(0.0), call(
    "min", float_const(1.0), call("add", call("mul", float_const(alpha), x), float_const(beta)))),
    {"alpha": 0.2, "beta": 0.5})
unary("HardSwish", 14, lambda x: call("mul", x, call("max", float_const(0.0), call(
    "min", float_const(1.0), call("add", call("mul", float_const(1.0 / 6.0), x), float_const(0.5))))))
unary("ThresholdedRelu", 10, lambda x, alpha: call("where", call("gt", x, float_const(alpha)), x, float_const(0.0)),
      {"alpha": 1.0})
unary("Silu", 1, lambda x: call("mul", x, call("sigmoid", x)), domain="ai.ember")  # ai.ember.Silu: see onnx/optimize.py
unary("Mish", 18, lambda x: call("mul", x, call("tanh", call("softplus", x))))
unary("Shrink", 9, lambda x, bias, lambd: call(
    "where", call("lt", x, float_const(-lambd)), call("add", x, float_const(bias)),
    call("where", call("gt", x, float_const(lambd)), call("sub", x, float_const(bias)), float_const(0.0))),
    {"bias": 0.0, "lambd": 0.5})


@register("Swish", 24)
class Swish(Op):
    attrs = {"alpha": 1.0}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        e = call("mul", inp(0), call("sigmoid", call("mul", float_const(self.attr["alpha"]), inp(0))))
        return [emit(ctx, self, e, [x], x.dtype)]


@register("IsNaN", 9)
class IsNaN(Op):
    f16 = True
    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        return [emit(ctx, self, call("isnan", inp(0)), [x], np.dtype(bool))]


@register("IsInf", 10)
class IsInf(Op):
    f16 = True
    attrs = {"detect_negative": 1, "detect_positive": 1}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        neg, pos = self.attr["detect_negative"], self.attr["detect_positive"]
        fn = "isinf" if neg and pos else "isposinf" if pos else "isneginf" if neg else None
        expr = call(fn, inp(0)) if fn else const(False, BOOL)
        return [emit(ctx, self, expr, [x], np.dtype(bool))]


@register("Not", 1)
class Not(Op):
    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        return [emit(ctx, self, call("not", inp(0, BOOL)), [x], np.dtype(bool))]


class Binary(Op):
    f16 = True
    fn: str
    result_bool = False
    attrs = {"broadcast": 0, "axis": None}

    def run(self, ctx: Context, a: Tensor, b: Tensor) -> list[Tensor]:
        if a.dtype != b.dtype:
            raise self.fail(f"operand dtypes differ: {a.dtype} and {b.dtype}")
        if self.attr["broadcast"] and self.attr["axis"] is not None:
            # Before opset 7, B broadcasts from `axis` of A rather than from the right.
            axis = self.attr["axis"] % a.rank
            b = reshape_view(ctx, b, b.shape + (1,) * (a.rank - axis - b.rank))
        out_dtype = np.dtype(bool) if self.result_bool else a.dtype
        return [emit(ctx, self, call(self.fn, *args([a, b])), [a, b], out_dtype)]


for _name, _function, _since in [("Add", "add", 1), ("Sub", "sub", 1), ("Mul", "mul", 1), ("Div", "div", 1)]:
    register(_name, _since)(type(_name, (Binary,), {"fn": _function}))
for _name, _function, _since in [("Equal", "eq", 7), ("Less", "lt", 7), ("Greater", "gt", 7),
                           ("LessOrEqual", "le", 12), ("GreaterOrEqual", "ge", 12), ("And", "and", 7),
                           ("Or", "or", 7), ("Xor", "xor", 7)]:
    register(_name, _since)(type(_name, (Binary,), {"fn": _function, "result_bool": True}))


@register("Pow", 7)
class Pow(Op):
    f16 = True
    def run(self, ctx: Context, x: Tensor, y: Tensor) -> list[Tensor]:
        ex, ey = args([x, y])
        if kind_of(y.dtype) != kind_of(x.dtype):
            ey = call("to_float" if kind_of(x.dtype) == FLOAT else "to_int", ey)
        return [emit(ctx, self, call("pow", ex, ey), [x, y], x.dtype)]


@register("Mod", 10)
class Mod(Op):
    f16 = True
    attrs = {"fmod": 0}

    def run(self, ctx: Context, a: Tensor, b: Tensor) -> list[Tensor]:
        fn = "fmod" if self.attr["fmod"] else "mod"
        return [emit(ctx, self, call(fn, *args([a, b])), [a, b], a.dtype)]


@register("PRelu", 7)
class PRelu(Op):
    f16 = True
    def run(self, ctx: Context, x: Tensor, slope: Tensor) -> list[Tensor]:
        ex, es = args([x, slope])
        return [emit(ctx, self, _where_neg(ex, call("mul", es, ex)), [x, slope], x.dtype)]


class Variadic(Op):
    """Max/Min/Sum/Mean over any number of broadcast inputs, folded into one kernel."""
    f16 = True

    fn: str
    mean = False

    def run(self, ctx: Context, *xs: Tensor) -> list[Tensor]:
        ex = args(list(xs))
        acc = ex[0]
        for e in ex[1:]:
            acc = call(self.fn, acc, e)
        if self.mean:
            acc = call("div", acc, const(len(xs), kind_of(xs[0].dtype)))
        return [emit(ctx, self, acc, list(xs), xs[0].dtype)]


for _name, _function, _mean in [("Max", "max", False), ("Min", "min", False), ("Sum", "add", False),
                          ("Mean", "add", True)]:
    register(_name, 1)(type(_name, (Variadic,), {"fn": _function, "mean": _mean}))


@register("Where", 9)
class Where(Op):
    f16 = True
    def run(self, ctx: Context, c: Tensor, x: Tensor, y: Tensor) -> list[Tensor]:
        return [emit(ctx, self, call("where", *args([c, x, y])), [c, x, y], x.dtype)]


@register("Clip", 6)
class Clip(Op):
    f16 = True
    attrs = {"min": -math.inf, "max": math.inf}

    def run(self, ctx: Context, x: Tensor, lo: Tensor | None = None, hi: Tensor | None = None) -> list[Tensor]:
        k = kind_of(x.dtype)
        e = inp(0, k)
        inputs = [x]
        if self.node.opset < 11:
            lo_v, hi_v = self.attr["min"], self.attr["max"]
            if lo_v != -math.inf:
                e = call("max", e, const(lo_v, k))
            if hi_v != math.inf:
                e = call("min", e, const(hi_v, k))
        else:
            for bound, fn in ((lo, "max"), (hi, "min")):
                if bound is None:
                    continue
                if bound.is_const:
                    e = call(fn, e, const(bound.value.item(), k))
                else:
                    inputs.append(bound)
                    e = call(fn, e, inp(len(inputs) - 1, k))
        return [emit(ctx, self, e, inputs, x.dtype)]


def cast_expr(e: Expr, to: np.dtype) -> Expr:
    k = kind_of(to)
    if e.kind == k:
        return e
    return call({FLOAT: "to_float", INT: "to_int", BOOL: "to_bool"}[k], e)


@register("Cast", 6)
class Cast(Op):
    # Under precision="f16" its input is not widened first: a float16 value cast to float32 is a lazy widening
    # that the next float16 op narrows back to the value itself (planner._Precision.convert).
    f16 = True
    any_float = (0,)
    attrs = {"to": 1, "saturate": 1, "round_mode": "up"}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        try:
            to = np.dtype(helper.tensor_dtype_to_np_dtype(self.attr["to"]))
        except Exception:
            raise self.fail(f"cast to ONNX type {self.attr['to']} is not supported") from None
        if to.kind not in "fiub" or x.dtype.kind not in "fiub":
            raise self.fail(f"cast {x.dtype} -> {to} is not supported")
        if x.dtype == to:
            return [x]
        return [emit(ctx, self, cast_expr(inp(0, kind_of(x.dtype)), to), [x], to)]


@register("CastLike", 15)
class CastLike(Op):
    attrs = {"saturate": 1, "round_mode": "up"}

    def run(self, ctx: Context, x: Tensor, like: Tensor) -> list[Tensor]:
        if x.dtype == like.dtype:
            return [x]
        return [emit(ctx, self, cast_expr(inp(0, kind_of(x.dtype)), like.dtype), [x], like.dtype)]


@register("Identity", 1)
class Identity(Op):
    """Dropped: its output is its input (no step)."""
    f16 = True

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        return [x]


@register("Dropout", 1)
class Dropout(Op):
    """Inference mode: the identity, and an all-true mask when the mask output is used. Training mode with a ratio
    of 0 drops nothing: the same. A random drop (training with a ratio above 0) is not supported."""
    f16 = True

    host_inputs = (1, 2)

    attrs = {"ratio": 0.5, "seed": 0, "is_test": 0, "consumed_inputs": []}

    def run(self, ctx: Context, x: Tensor, ratio: Tensor | None = None, training: Tensor | None = None) -> list[Tensor]:
        if training is not None and (not training.is_const or bool(training.value)):
            p = float(np.asarray(ratio.value).reshape(-1)[0]) if ratio is not None and ratio.is_const else \
                float(self.attr["ratio"])
            if p != 0.0:
                raise self.fail(f"training-mode Dropout (random drops, ratio {p}) is not supported")
        outs = [x]
        if len(self.node.outputs) > 1 and self.node.outputs[1]:
            outs.append(ctx.const(np.ones(x.shape, bool)))
        return outs


__all__ = ["INT", "Binary", "Unary", "broadcast_shape", "emit"]
