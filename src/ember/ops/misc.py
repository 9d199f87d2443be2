"""Ops composed from the runtime's primitives: losses, bit ops, normalisations, windows, quantisation."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
from onnx import helper

from ..core.expr import FLOAT, INT, Expr, bitcast, call, const, coord, inp, load
from ..core.view import View
from ..ir import Node
from .base import Context, Op, T, kind_of, lookup, register
from .elementwise import emit
from .index import fc, ic, kernel, sum_exprs, zero
from .nn import normalize, to_2d
from .reduce import reduce_axes
from .shape import copy_into, host_ints, norm_axis, reshape_view, slice_view


# ---- losses -------------------------------------------------------------------------------------------------
def nll(ctx: Context, op: Op, logp: T, target: T, weight: T | None, reduction: str, ignore: int | None) -> T:
    """-logp[n, target[n, d...], d...] * weight[target], 0 where target == ignore_index, then reduced
    (mean: divided by the total weight of the targets not ignored, as onnx.reference)."""
    if logp.rank < 2 or target.shape != logp.shape[:1] + logp.shape[2:]:
        raise ValueError(f"{op.node.describe()}: input {logp.shape} and target {target.shape} do not match")
    tk = kind_of(target.dtype)
    t = inp(1, tk)
    rest = [coord(d) for d in range(1, target.rank)]
    ins: list[T] = [logp, target]
    picked = call("neg", load(0, coord(0), t, *rest, kind=FLOAT))
    w: Expr | None = None
    if weight is not None:
        ins.append(weight)
        w = load(2, t, kind=FLOAT)
    valid = call("ne", t, const(ignore, tk)) if ignore is not None else None
    loss = picked if w is None else call("mul", picked, w)
    if valid is not None:
        loss = call("where", valid, loss, fc(0.0))
    per = kernel(ctx, loss, ins, logp.dtype, target.shape)
    if reduction == "none":
        return per
    if reduction not in ("sum", "mean"):
        raise op.fail(f"reduction {reduction!r} is not supported")
    axes = list(range(target.rank))
    total = reduce_axes(ctx, "sum", per, axes)
    if reduction == "sum":
        return total
    if w is None and valid is None:
        return emit(ctx, op, call("div", inp(0), fc(float(target.size))), [total], logp.dtype)
    wt = w if w is not None else fc(1.0)
    if valid is not None:
        wt = call("where", valid, wt, fc(0.0))
    weights = kernel(ctx, wt, ins, logp.dtype, target.shape)
    return emit(ctx, op, call("div", inp(0), inp(1)), [total, reduce_axes(ctx, "sum", weights, axes)], logp.dtype)


@register("NegativeLogLikelihoodLoss", 12)
class NegativeLogLikelihoodLoss(Op):
    attrs = {"reduction": "mean", "ignore_index": None}

    def run(self, ctx: Context, x: T, target: T, weight: T | None = None) -> list[T]:
        return [nll(ctx, self, x, target, weight, self.a["reduction"], self.a["ignore_index"])]


@register("SoftmaxCrossEntropyLoss", 12)
class SoftmaxCrossEntropyLoss(Op):
    attrs = {"reduction": "mean", "ignore_index": None}

    def run(self, ctx: Context, x: T, target: T, weight: T | None = None) -> list[T]:
        if x.dtype.kind != "f":
            raise self.fail(f"scores of {x.dtype} are not supported")
        # log_softmax over the class axis: x - logsumexp(x), one reduction and one kernel.
        lse = reshape_view(ctx, reduce_axes(ctx, "logsumexp", x, [1]), x.shape[:1] + (1,) + x.shape[2:])
        logp = emit(ctx, self, call("sub", inp(0), inp(1)), [x, lse], x.dtype)
        loss = nll(ctx, self, logp, target, weight, self.a["reduction"], self.a["ignore_index"])
        return [loss, logp]


# ---- bit ops --------------------------------------------------------------------------------------------------
@register("BitShift", 11)
class BitShift(Op):
    """Shifts by a negative amount or by the bit width or more give 0 (left) or the sign fill (right), as
    onnx.reference; the backends' shifts only see amounts in range."""

    attrs = {"direction": ""}

    def run(self, ctx: Context, a: T, b: T) -> list[T]:
        if a.dtype.kind not in "iu" or b.dtype != a.dtype:
            raise self.fail(f"BitShift of {a.dtype} by {b.dtype} is not supported")
        width = a.dtype.itemsize * 8
        x, s = inp(0, INT), inp(1, INT)
        oob = call("ge", s, ic(width))
        if b.dtype.kind == "i":
            oob = call("or", call("lt", s, zero(INT)), oob)
        if self.a["direction"] == "LEFT":
            e = call("where", oob, zero(INT), call("shl", x, s))
        elif self.a["direction"] == "RIGHT":
            fill = call("where", call("lt", x, zero(INT)), ic(-1), zero(INT)) if a.dtype.kind == "i" else zero(INT)
            e = call("where", oob, fill, call("shr", x, s))
        else:
            raise self.fail(f"direction {self.a['direction']!r} is not LEFT or RIGHT")
        return [emit(ctx, self, e, [a, b], a.dtype)]


class BitwiseBinary(Op):
    fn: str

    def run(self, ctx: Context, a: T, b: T) -> list[T]:
        if a.dtype.kind not in "iu" or b.dtype != a.dtype:
            raise self.fail(f"bitwise op on {a.dtype} and {b.dtype} is not supported")
        return [emit(ctx, self, call(self.fn, inp(0, INT), inp(1, INT)), [a, b], a.dtype)]


for _name, _fn in (("BitwiseAnd", "bitand"), ("BitwiseOr", "bitor"), ("BitwiseXor", "bitxor")):
    register(_name, 18)(type(_name, (BitwiseBinary,), {"fn": _fn}))


@register("BitwiseNot", 18)
class BitwiseNot(Op):
    def run(self, ctx: Context, x: T) -> list[T]:
        if x.dtype.kind not in "iu":
            raise self.fail(f"BitwiseNot of {x.dtype} is not supported")
        return [emit(ctx, self, call("bitnot", inp(0, INT)), [x], x.dtype)]


@register("BitCast", 26)
class BitCast(Op):
    attrs = {"to": 1}

    def run(self, ctx: Context, x: T) -> list[T]:
        try:
            to = np.dtype(helper.tensor_dtype_to_np_dtype(self.a["to"]))
        except Exception:
            raise self.fail(f"bitcast to ONNX type {self.a['to']} is not supported") from None
        if to.itemsize != x.dtype.itemsize or to.kind not in "fiu" or x.dtype.kind not in "fiu":
            raise self.fail(f"bitcast {x.dtype} -> {to} is not supported")
        if to == x.dtype:
            return [x]
        return [emit(ctx, self, bitcast(inp(0, kind_of(x.dtype)), to), [x], to)]


# ---- normalisations -------------------------------------------------------------------------------------------
@register("LpNormalization", 1)
class LpNormalization(Op):
    attrs = {"axis": -1, "p": 2}

    def run(self, ctx: Context, x: T) -> list[T]:
        axis = norm_axis(self, self.a["axis"], x.rank)
        p = self.a["p"]
        if p not in (1, 2):
            raise self.fail(f"p = {p} is not supported (1 and 2 are)")
        keep = tuple(1 if i == axis else d for i, d in enumerate(x.shape))
        norm = reshape_view(ctx, reduce_axes(ctx, "l1" if p == 1 else "l2", x, [axis]), keep)
        e = call("where", call("eq", inp(1), fc(0.0)), fc(0.0), call("div", inp(0), inp(1)))
        return [emit(ctx, self, e, [x, norm], x.dtype)]


@register("MeanVarianceNormalization", 9)
class MeanVarianceNormalization(Op):
    attrs = {"axes": [0, 2, 3]}

    def run(self, ctx: Context, x: T) -> list[T]:
        axes = sorted({norm_axis(self, a, x.rank) for a in self.a["axes"]})
        keep = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        mean = reshape_view(ctx, reduce_axes(ctx, "mean", x, axes), keep)
        d = emit(ctx, self, call("sub", inp(0), inp(1)), [x, mean], x.dtype)
        var = reshape_view(ctx, reduce_axes(ctx, "sumsq", d, axes), keep)
        n = math.prod(x.shape[a] for a in axes)
        e = call("div", inp(0), call("add", call("sqrt", call("div", inp(1), fc(float(n)))), fc(1e-9)))
        return [emit(ctx, self, e, [d, var], x.dtype)]


@register("GroupNormalization", 18)
class GroupNormalization(Op):
    attrs = {"num_groups": 1, "epsilon": 1e-5, "stash_type": 1}

    def run(self, ctx: Context, x: T, scale: T, bias: T) -> list[T]:
        g = self.a["num_groups"]
        n, c = x.shape[:2]
        if c % g:
            raise ValueError(f"{self.node.describe()}: {c} channels do not split into {g} groups")
        x3 = reshape_view(ctx, x, (n, g, x.size // (n * g) if n * g else 0))
        y = normalize(ctx, self, x3, [2], self.a["epsilon"])
        if scale.size == c:  # opset 21: per channel
            y, shp = reshape_view(ctx, y, x.shape), (c,) + (1,) * (x.rank - 2)
        else:  # opset 18: per group
            shp = (g, 1)
        out = emit(ctx, self, call("add", call("mul", inp(0), inp(1)), inp(2)),
                   [y, reshape_view(ctx, scale, shp), reshape_view(ctx, bias, shp)], x.dtype)
        return [reshape_view(ctx, out, x.shape)]


@register("Swish", 24)
class Swish(Op):
    attrs = {"alpha": 1.0}

    def run(self, ctx: Context, x: T) -> list[T]:
        e = call("mul", inp(0), call("sigmoid", call("mul", fc(self.a["alpha"]), inp(0))))
        return [emit(ctx, self, e, [x], x.dtype)]


# ---- windows ----------------------------------------------------------------------------------------------------
class Window(Op):
    host_inputs = (0,)
    attrs = {"periodic": 1, "output_datatype": 1}
    terms: tuple[tuple[float, float], ...]  # sum of coef * cos(k * 2 pi n / N)

    def run(self, ctx: Context, size: T) -> list[T]:
        n = host_ints(self, size, "size")[0]
        denom = n if self.a["periodic"] else n - 1
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(self.a["output_datatype"]))
        ni = call("to_float", coord(0))
        e: Expr | None = None
        for coef, k in self.terms:
            t = fc(coef) if k == 0 else call("mul", fc(coef), call("cos", call("mul", ni, fc(k * 2 * math.pi / denom))))
            e = t if e is None else call("add", e, t)
        assert e is not None
        if dt.kind != "f":
            e = call("to_int", e)
        return [kernel(ctx, e, [], dt, (n,))]


register("HannWindow", 17)(type("HannWindow", (Window,), {"terms": ((0.5, 0), (-0.5, 1))}))
register("HammingWindow", 17)(type("HammingWindow", (Window,), {"terms": ((25 / 46, 0), (-21 / 46, 1))}))
register("BlackmanWindow", 17)(type("BlackmanWindow", (Window,), {"terms": ((0.42, 0), (-0.5, 1), (0.08, 2))}))


# ---- quantisation ---------------------------------------------------------------------------------------------
@register("DynamicQuantizeLinear", 11)
class DynamicQuantizeLinear(Op):
    def run(self, ctx: Context, x: T) -> list[T]:
        axes = list(range(x.rank))
        hi, lo = reduce_axes(ctx, "max", x, axes), reduce_axes(ctx, "min", x, axes)
        mx, mn = call("max", fc(0.0), inp(0)), call("min", fc(0.0), inp(1))
        scale = call("div", call("where", call("eq", mx, mn), fc(1.0), call("sub", mx, mn)), fc(255.0))
        y_scale = emit(ctx, self, scale, [hi, lo], x.dtype)
        initial = call("sub", fc(0.0), call("div", call("min", fc(0.0), inp(0)), inp(1)))
        zp = call("round", call("max", fc(0.0), call("min", fc(255.0), initial)))
        zpf = emit(ctx, self, zp, [lo, y_scale], x.dtype)
        q = call("add", call("round", call("div", inp(0), inp(1))), inp(2))
        q = call("max", fc(0.0), call("min", fc(255.0), q))
        u8 = np.dtype(np.uint8)
        y = emit(ctx, self, call("to_int", q), [x, y_scale, zpf], u8)
        return [y, y_scale, emit(ctx, self, call("to_int", inp(0)), [zpf], u8)]


_QRANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}


def per_axis(ctx: Context, op: Op, t: T | None, x: T, axis: int) -> T | None:
    """A scale or zero point: a scalar, or a 1-D tensor along `axis` (reshaped to broadcast over x)."""
    if t is None or t.size <= 1 or t.rank == 0:
        return t
    if t.rank != 1 or op.a.get("block_size"):
        raise op.fail("blocked quantization is not supported")
    a = norm_axis(op, axis, x.rank)
    return reshape_view(ctx, t, tuple(t.size if i == a else 1 for i in range(x.rank)))


@register("QuantizeLinear", 10)
class QuantizeLinear(Op):
    attrs = {"axis": 1, "saturate": 1, "block_size": 0, "output_dtype": 0, "precision": 0}

    def run(self, ctx: Context, x: T, scale: T, zp: T | None = None) -> list[T]:
        if zp is not None:
            dt = zp.dtype
        elif self.a["output_dtype"]:
            dt = np.dtype(helper.tensor_dtype_to_np_dtype(self.a["output_dtype"]))
        else:
            dt = np.dtype(np.uint8)
        if dt.name not in _QRANGE or x.dtype.kind != "f":
            raise self.fail(f"quantizing {x.dtype} to {dt} is not supported")
        lo, hi = _QRANGE[dt.name]
        ins = [x, per_axis(ctx, self, scale, x, self.a["axis"])]
        q = call("round", call("div", inp(0), inp(1)))  # half to even, as the spec's rounding
        if zp is not None:
            ins.append(per_axis(ctx, self, zp, x, self.a["axis"]))
            q = call("add", q, call("to_float", inp(2, INT)))
        q = call("max", fc(lo), call("min", fc(hi), q))
        return [emit(ctx, self, call("to_int", q), ins, dt)]


@register("DequantizeLinear", 10)
class DequantizeLinear(Op):
    attrs = {"axis": 1, "block_size": 0, "output_dtype": 0}

    def run(self, ctx: Context, x: T, scale: T, zp: T | None = None) -> list[T]:
        if x.dtype.kind not in "iu":
            raise self.fail(f"dequantizing {x.dtype} is not supported")
        ins = [x, per_axis(ctx, self, scale, x, self.a["axis"])]
        v = call("to_float", inp(0, INT))
        if zp is not None:
            ins.append(per_axis(ctx, self, zp, x, self.a["axis"]))
            v = call("sub", v, call("to_float", inp(2, INT)))
        return [emit(ctx, self, call("mul", v, inp(1)), ins, scale.dtype)]


# ---- ai.onnx.ml -------------------------------------------------------------------------------------------------
@register("Binarizer", 1, domain="ai.onnx.ml")
class Binarizer(Op):
    attrs = {"threshold": 0.0}

    def run(self, ctx: Context, x: T) -> list[T]:
        k = kind_of(x.dtype)
        e = call("where", call("gt", inp(0, k), const(self.a["threshold"], k)), const(1, k), zero(k))
        return [emit(ctx, self, e, [x], x.dtype)]


@register("ArrayFeatureExtractor", 1, domain="ai.onnx.ml")
class ArrayFeatureExtractor(Op):
    """data[..., indices] (flattened indices); a 1-D input gives one row, as onnxruntime."""

    def run(self, ctx: Context, x: T, indices: T) -> list[T]:
        n = indices.size
        shape = (1, n) if x.rank == 1 else x.shape[:-1] + (n,)
        flat = reshape_view(ctx, indices, (n,))
        lead = [coord(d) for d in range(x.rank - 1)]
        e = load(0, *lead, load(1, coord(len(shape) - 1), kind=INT), kind=kind_of(x.dtype))
        return [kernel(ctx, e, [x, flat], x.dtype, shape)]



# ---- scans and top-k (the backends' loop primitives) --------------------------------------------------------------
class Cumulative(Op):
    host_inputs = (1,)
    attrs = {"exclusive": 0, "reverse": 0}
    fn: str

    def run(self, ctx: Context, x: T, axis: T) -> list[T]:
        a = norm_axis(self, host_ints(self, axis, "axis")[0], x.rank)
        out = ctx.new(x.dtype, x.shape)
        if out.size:
            ctx.record(ctx.backend.record_scan(self.fn, ctx.contiguous(x), out.view, a, bool(self.a["exclusive"]),
                                               bool(self.a["reverse"])))
        return [out]


register("CumSum", 11)(type("CumSum", (Cumulative,), {"fn": "sum"}))
register("CumProd", 26)(type("CumProd", (Cumulative,), {"fn": "prod"}))


@register("TopK", 1)
class TopK(Op):
    host_inputs = (1,)
    attrs = {"axis": -1, "k": None, "largest": 1, "sorted": 1}

    def run(self, ctx: Context, x: T, k_t: T | None = None) -> list[T]:
        k = host_ints(self, k_t, "K")[0] if k_t is not None else self.a["k"]
        axis = norm_axis(self, self.a["axis"], x.rank)
        if not 0 <= k <= x.shape[axis]:
            raise ValueError(f"{self.node.describe()}: k = {k} is out of range for axis of size {x.shape[axis]}")
        shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
        values, indices = ctx.new(x.dtype, shape), ctx.new(np.int64, shape)
        if values.size:
            ctx.record(ctx.backend.record_topk(ctx.contiguous(x), values.view, indices.view, axis, k,
                                               bool(self.a["largest"])))
        return [values, indices]


# ---- ConvTranspose ------------------------------------------------------------------------------------------------
def _half_floor(v: int) -> int:
    return v // 2  # floor: a negative total padding (output_shape larger than the full result) pads the end


@register("ConvTranspose", 1)
class ConvTranspose(Op):
    """A convolution of the stride-dilated, padded input with the flipped, channel-swapped kernel:
    one index kernel spreads x over the zero grid (skipped for stride 1), then the backend's conv runs."""

    attrs = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None, "output_padding": None,
             "output_shape": None, "pads": None, "strides": None}

    def run(self, ctx: Context, x: T, w: T, b: T | None = None) -> list[T]:
        r = x.rank - 2
        if r not in (1, 2):
            raise self.fail(f"{r}-D ConvTranspose is not supported (1-D and 2-D are)")
        if x.dtype.kind != "f" or w.dtype != x.dtype:
            raise self.fail(f"ConvTranspose on {x.dtype} is not supported")
        g = self.a["group"]
        n, c = x.shape[:2]
        if w.shape[0] != c or c % g:
            raise ValueError(f"{self.node.describe()}: input {x.shape}, weight {w.shape} and group {g} disagree")
        cg, mg = c // g, w.shape[1]
        ksize, size = w.shape[2:], x.shape[2:]
        strides = list(self.a["strides"] or [1] * r)
        dil = list(self.a["dilations"] or [1] * r)
        opad = list(self.a["output_padding"] or [0] * r)
        keff = [(k - 1) * d + 1 for k, d in zip(ksize, dil, strict=True)]
        full = [s * (m - 1) + op + ke for s, m, op, ke in zip(strides, size, opad, keff, strict=True)]
        mode = self.a["auto_pad"]
        if self.a["output_shape"] is not None or mode in ("SAME_UPPER", "SAME_LOWER"):
            out_sp = list(self.a["output_shape"] or [m * s for m, s in zip(size, strides, strict=True)])[-r:]
            total = [f - o for f, o in zip(full, out_sp, strict=True)]
            if mode == "SAME_UPPER":
                head = [_half_floor(t) for t in total]
            else:
                head = [t - _half_floor(t) for t in total]
            tail = [t - h for t, h in zip(total, head, strict=True)]
        else:
            pads = list(self.a["pads"] or [0] * (2 * r))
            head, tail = pads[:r], pads[r:]
            out_sp = [f - h - t for f, h, t in zip(full, head, tail, strict=True)]
        lo = [ke - 1 - h for ke, h in zip(keff, head, strict=True)]
        hi = [ke - 1 - t + op for ke, t, op in zip(keff, tail, opad, strict=True)]
        if min(out_sp) <= 0:
            raise ValueError(f"{self.node.describe()}: output size {out_sp} is empty")
        # Weights (C, M/g, k...) -> (M, C/g, k...) flipped: on the host for a constant (folded once).
        if w.is_const:
            wv = w.value.reshape(g, cg, mg, *ksize).swapaxes(1, 2).reshape(g * mg, cg, *ksize)
            wt = ctx.const(np.ascontiguousarray(np.flip(wv, axis=tuple(range(2, 2 + r)))))
        else:
            o, ci = coord(0), coord(1)
            src = [call("add", call("mul", call("div", o, ic(mg)), ic(cg)), ci), call("mod", o, ic(mg))]
            src += [call("sub", ic(k - 1), coord(2 + i)) for i, k in enumerate(ksize)]
            wt = kernel(ctx, load(0, *src, kind=FLOAT), [w], w.dtype, (g * mg, cg, *ksize))
        if all(s == 1 for s in strides) and min(lo + hi) >= 0:
            z, conv_pads = x, lo + hi  # stride 1: the conv pads the input itself
        else:
            spread = [(m - 1) * s + 1 for m, s in zip(size, strides, strict=True)]
            z_sp = [sp + a + e for sp, a, e in zip(spread, lo, hi, strict=True)]
            idx, ok = [coord(0), coord(1)], []
            for i in range(r):
                pos = call("sub", coord(2 + i), ic(lo[i])) if lo[i] else coord(2 + i)
                idx.append(call("div", pos, ic(strides[i])) if strides[i] > 1 else pos)
                ok += [call("ge", pos, ic(0)), call("lt", pos, ic(spread[i]))]
                if strides[i] > 1:
                    ok.append(call("eq", call("mod", pos, ic(strides[i])), ic(0)))
            valid = ok[0]
            for e in ok[1:]:
                valid = call("and", valid, e)
            z = kernel(ctx, call("where", valid, load(0, *idx, kind=FLOAT), fc(0.0)), [x], x.dtype,
                          (n, c, *z_sp))
            conv_pads = [0] * (2 * r)
        out = ctx.new(x.dtype, (n, g * mg, *out_sp))
        one = [1] * r
        if r == 1:
            conv_pads, dil, one = [0, conv_pads[0], 0, conv_pads[1]], [1, *dil], [1, 1]
        bias = ctx.contiguous(b) if b is not None else None
        ctx.record(ctx.backend.record_conv(ctx.contiguous(to_2d(ctx, z)), ctx.contiguous(to_2d(ctx, wt)), bias,
                                           to_2d(ctx, out).view, tuple(one), tuple(conv_pads), tuple(dil), g))
        return [out]


@register("CausalConvWithState", 27)
class CausalConvWithState(Op):
    """Depthwise causal conv1d over [past_state, input] (zeros without a state), one index kernel with the k
    taps unrolled; present_state is the last k - 1 positions of that concatenation."""

    attrs = {"activation": "none"}

    def run(self, ctx: Context, x: T, w: T, b: T | None = None, state: T | None = None) -> list[T]:
        if x.rank != 3 or w.rank != 3 or w.shape[0] != x.shape[1] or w.shape[1] != 1:
            raise ValueError(f"{self.node.describe()}: input {x.shape} and weight {w.shape} do not match")
        if x.dtype.kind != "f":
            raise self.fail(f"CausalConvWithState on {x.dtype} is not supported")
        act = self.a["activation"]
        if act not in ("none", "silu", "swish"):
            raise self.fail(f"activation {act!r} is not supported")
        nb, c, length = x.shape
        k = w.shape[2]
        dtype, f32 = x.dtype, np.dtype(np.float32)
        if dtype != f32:  # computed in float32 (as onnx.reference), then cast back
            x, w, b, state = (t if t is None else emit(ctx, self, inp(0), [t], f32) for t in (x, w, b, state))
        ins: list[T] = [x, w] + ([state] if state is not None else [])

        def padded(pos: Expr) -> Expr:  # [state, x] at position pos of the time axis
            from_x = load(0, coord(0), coord(1), call("sub", pos, ic(k - 1)), kind=FLOAT)
            if k == 1:
                return from_x
            early = load(2, coord(0), coord(1), pos, kind=FLOAT) if state is not None else fc(0.0)
            return call("where", call("lt", pos, ic(k - 1)), early, from_x)

        terms = [call("mul", load(1, coord(1), ic(0), ic(j), kind=FLOAT),
                      padded(call("add", coord(2), ic(j)) if j else coord(2))) for j in range(k)]
        y = sum_exprs(terms)
        if b is not None:
            ins.append(b)
            y = call("add", y, load(len(ins) - 1, coord(1), kind=FLOAT))
        if act != "none":
            y = call("mul", y, call("sigmoid", y))
        out = kernel(ctx, y, ins, dtype, x.shape)
        present = kernel(ctx, padded(call("add", coord(2), ic(length))), ins[:3], dtype, (nb, c, k - 1))
        return [out, present]


# ---- integer and quantized linear algebra (float32 products: exact while sums stay below 2^24) -------------------
def call_op(ctx: Context, parent: Op, op_type: str, *inputs: T | None, **attrs: object) -> list[T]:
    """Run another registered op inside this one (same context), e.g. MatMul inside QLinearMatMul."""
    node = Node(op_type, "", [f"_{i}" if t is not None else "" for i, t in enumerate(inputs)], ["_y"], attrs,
                f"{parent.node.name}/{op_type}", parent.node.opset)
    cls = lookup(node)
    assert cls is not None, op_type
    return cls(node).run(ctx, *inputs)


def centered(ctx: Context, op: Op, x: T, zp: T | None, axis: int | None = None) -> T:
    """float32(x - zero_point); a 1-D zero point runs along `axis` of x."""
    if zp is not None and zp.size > 1 and axis is not None:
        zp = reshape_view(ctx, zp, tuple(zp.size if i == axis % x.rank else 1 for i in range(x.rank)))
    e = call("to_float", inp(0, INT))
    ins = [x]
    if zp is not None:
        ins.append(zp)
        e = call("sub", e, call("to_float", inp(1, INT)))
    return emit(ctx, op, e, ins, np.dtype(np.float32))


def exact_chunk(a: T, b: T) -> int:
    """The most terms an integer dot product can have and stay exact in float32 (|x - zp| < 2^bits)."""
    return max(2 ** 24 // ((2 ** (8 * a.dtype.itemsize) - 1) * (2 ** (8 * b.dtype.itemsize) - 1)), 1)


def requantize(ctx: Context, op: Op, acc: T, mult: list[T], zp: T | None, dtype: np.dtype) -> T:
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
    e = call("max", fc(lo), call("min", fc(hi), call("round", e)))
    return emit(ctx, op, call("to_int", e), ins, dtype)


@register("MatMulInteger", 10)
class MatMulInteger(Op):
    """int32 (A - a_zp) @ (B - b_zp): float32 products over K chunks short enough to be exact, each turned
    into int32 and summed in int32."""

    def run(self, ctx: Context, a: T, b: T, azp: T | None = None, bzp: T | None = None) -> list[T]:
        af = centered(ctx, self, a, azp, -2 if a.rank > 1 else None)
        bf = centered(ctx, self, b, bzp, -1)
        k, step = a.shape[-1], exact_chunk(a, b)
        total: T | None = None
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
    def run(self, ctx: Context, a: T, a_s: T, azp: T | None, b: T, b_s: T, bzp: T | None, y_s: T,
            yzp: T | None = None) -> list[T]:
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

    def run(self, ctx: Context, x: T, w: T, xzp: T | None = None, wzp: T | None = None) -> list[T]:
        if math.prod(w.shape[1:]) > exact_chunk(x, w):
            raise self.fail(f"a {w.shape} integer filter could leave float32's exact range")
        acc = call_op(ctx, self, "Conv", centered(ctx, self, x, xzp), centered(ctx, self, w, wzp, 0), **self.a)[0]
        return [emit(ctx, self, call("to_int", inp(0)), [acc], np.dtype(np.int32))]


@register("QLinearConv", 10)
class QLinearConv(Op):
    attrs = ConvInteger.attrs

    def run(self, ctx: Context, x: T, x_s: T, xzp: T, w: T, w_s: T, wzp: T, y_s: T, yzp: T | None = None,
            b: T | None = None) -> list[T]:
        dt = yzp.dtype if yzp is not None else x.dtype
        if dt.name not in _QRANGE:
            raise self.fail(f"QLinearConv to {dt} is not supported")
        acc = call_op(ctx, self, "Conv", centered(ctx, self, x, xzp), centered(ctx, self, w, wzp, 0), **self.a)[0]
        if b is not None:  # int32 bias in units of x_scale * w_scale
            bias = reshape_view(ctx, b, (b.size,) + (1,) * (acc.rank - 2))
            acc = emit(ctx, self, call("add", inp(0), call("to_float", inp(1, INT))), [acc, bias], acc.dtype)
        scales = [x_s, per_axis(ctx, self, w_s, acc, 1), y_s]
        return [requantize(ctx, self, acc, scales, yzp, dt)]


# ---- RNN / GRU / LSTM: unrolled over the (static) sequence length -----------------------------------------------
_ALPHA = {"Affine": (1.0, 0.0), "LeakyRelu": (0.01, None), "ThresholdedRelu": (1.0, None), "ScaledTanh": (1.0, 1.0),
          "HardSigmoid": (0.2, 0.5), "Elu": (1.0, None)}


def activation(name: str, alpha: float | None, beta: float | None) -> Callable[[Expr], Expr]:
    a, b = _ALPHA.get(name, (None, None))
    a = a if alpha is None else alpha
    b = b if beta is None else beta
    simple = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid", "Softsign": "softsign", "Softplus": "softplus"}
    if name in simple:
        return lambda x: call(simple[name], x)
    if name == "Affine":
        return lambda x: call("add", call("mul", fc(a), x), fc(b))
    if name == "LeakyRelu":
        return lambda x: call("where", call("lt", x, fc(0.0)), call("mul", fc(a), x), x)
    if name == "ThresholdedRelu":
        return lambda x: call("where", call("gt", x, fc(a)), x, fc(0.0))
    if name == "ScaledTanh":
        return lambda x: call("mul", fc(a), call("tanh", call("mul", fc(b), x)))
    if name == "HardSigmoid":
        return lambda x: call("max", fc(0.0), call("min", fc(1.0), call("add", call("mul", fc(a), x), fc(b))))
    if name == "Elu":
        return lambda x: call("where", call("lt", x, fc(0.0)), call("mul", fc(a), call("sub", call("exp", x),
                                                                                         fc(1.0))), x)
    raise ValueError(f"unknown recurrent activation {name!r}")


class Recurrent(Op):
    """One MatMul for the input projection of every step, then per step: H @ R^T and one or two elementwise
    kernels for the gates. sequence_lens freezes a batch row's state past its length (its Y rows are 0)."""

    attrs = {"activation_alpha": None, "activation_beta": None, "activations": None, "clip": None,
             "direction": "forward", "hidden_size": None, "layout": 0}
    n_gates: int
    default_acts: tuple[str, ...]

    def run(self, ctx: Context, x: T, w: T, r: T, b: T | None = None, lens: T | None = None,
            h0: T | None = None, c0: T | None = None, p: T | None = None) -> list[T]:
        if x.dtype.kind != "f":
            raise self.fail(f"{self.node.op_type} on {x.dtype} is not supported")
        dirs = 2 if self.a["direction"] == "bidirectional" else 1
        if self.a["layout"]:  # batch first: x (batch, seq, in), states (batch, dirs, hidden)
            x, h0, c0 = (None if t is None else T(t.dtype, (t.shape[1], t.shape[0], t.shape[2]),
                                                  view=ctx.view(t).permute((1, 0, 2))) for t in (x, h0, c0))
        seq, batch, _ = x.shape
        hid = w.shape[1] // self.n_gates
        names = list(self.a["activations"] or self.default_acts * dirs)
        alphas, betas = list(self.a["activation_alpha"] or []), list(self.a["activation_beta"] or [])
        acts = []
        for name in names:  # alpha/beta lists are consumed in order by the activations that take them
            a_def, b_def = _ALPHA.get(name, (None, None))
            al = alphas.pop(0) if a_def is not None and alphas else None
            be = betas.pop(0) if b_def is not None and betas else None
            acts.append(activation(name, al, be))
        lens_col = reshape_view(ctx, lens, (batch, 1)) if lens is not None else None
        y = ctx.new(x.dtype, (seq, dirs, batch, hid))
        finals: list[list[T]] = []
        for d in range(dirs):
            reverse = self.a["direction"] == "reverse" or d == 1
            wd = slice_view(ctx, w, 0, d, d + 1)
            wt = T(w.dtype, (w.shape[2], w.shape[1]), view=ctx.view(reshape_view(ctx, wd, w.shape[1:])).permute((1, 0)))
            rd = reshape_view(ctx, slice_view(ctx, r, 0, d, d + 1), r.shape[1:])
            rt = T(r.dtype, (hid, r.shape[1]), view=ctx.view(rd).permute((1, 0)))
            xw = call_op(ctx, self, "MatMul", x, wt)[0]  # (seq, batch, G*hid)
            bias = None
            if b is not None:
                bd = reshape_view(ctx, slice_view(ctx, b, 0, d, d + 1), (2 * self.n_gates * hid,))
                bias = [slice_view(ctx, bd, 0, k * hid, (k + 1) * hid) for k in range(2 * self.n_gates)]
            h, c = (reshape_view(ctx, slice_view(ctx, s0, 0, d, d + 1), (batch, hid)) if s0 is not None
                    else ctx.const(np.zeros((batch, hid), x.dtype)) for s0 in (h0, c0))
            pd = None
            if p is not None:
                pv = reshape_view(ctx, slice_view(ctx, p, 0, d, d + 1), (3 * hid,))
                pd = [slice_view(ctx, pv, 0, k * hid, (k + 1) * hid) for k in range(3)]
            fns = acts[d * len(self.default_acts):(d + 1) * len(self.default_acts)]
            for step in range(seq):
                t = seq - 1 - step if reverse else step
                xw_t = reshape_view(ctx, slice_view(ctx, xw, 0, t, t + 1), (batch, self.n_gates * hid))
                gx = [slice_view(ctx, xw_t, 1, k * hid, (k + 1) * hid) for k in range(self.n_gates)]
                hr = call_op(ctx, self, "MatMul", h, rt)[0]
                gh = [slice_view(ctx, hr, 1, k * hid, (k + 1) * hid) for k in range(self.n_gates)]
                h_new, c_new = self.cell(ctx, fns, gx, gh, bias, pd, h, c, rd, hid)
                out_t, h, c = self.mask(ctx, t, lens_col, h_new, h, c_new, c)
                dst = View(y.view.handle, y.dtype, (batch, hid), y.view.strides[2:],
                           t * y.view.strides[0] + d * y.view.strides[1])
                copy_into(ctx, ctx.view(out_t), dst)
            finals.append([h, c])
        outs = [y]
        for k in range(2 if self.n_gates == 4 else 1):
            st = ctx.new(x.dtype, (dirs, batch, hid))
            for d in range(dirs):
                copy_into(ctx, ctx.view(finals[d][k]), View(st.view.handle, x.dtype, (batch, hid), (hid, 1),
                                                            d * batch * hid))
            outs.append(st)
        if self.a["layout"]:
            outs = [T(o.dtype, tuple(o.shape[i] for i in perm), view=ctx.view(o).permute(perm))
                    for o, perm in zip(outs, [(2, 0, 1, 3), (1, 0, 2), (1, 0, 2)], strict=False)]
        return outs

    def pre(self, parts: list[Expr]) -> Expr:
        """A gate's pre-activation: the sum of its parts, clipped when `clip` is set."""
        e = parts[0]
        for q in parts[1:]:
            e = call("add", e, q)
        clip = self.a["clip"]
        return call("max", fc(-clip), call("min", fc(clip), e)) if clip is not None else e

    def mask(self, ctx: Context, t: int, lens: T | None, h_new: T, h: T, c_new: T, c: T) -> tuple[T, T, T]:
        if lens is None:
            return h_new, h_new, c_new
        keep = call("lt", ic(t), inp(0, INT))
        y_t = emit(ctx, self, call("where", keep, inp(1), fc(0.0)), [lens, h_new], h_new.dtype)
        h2 = emit(ctx, self, call("where", keep, inp(1), inp(2)), [lens, h_new, h], h.dtype)
        c2 = emit(ctx, self, call("where", keep, inp(1), inp(2)), [lens, c_new, c], c.dtype) if c_new is not c else c
        return y_t, h2, c2

    def cell(self, ctx: Context, fns: list, gx: list[T], gh: list[T], bias: list[T] | None, p: list[T] | None,
             h: T, c: T, rd: T, hid: int) -> tuple[T, T]:
        raise NotImplementedError


def _parts(gx: T, gh: T | None, bias: list[T] | None, k: int, n: int) -> tuple[list[Expr], list[T]]:
    ins = [gx] + ([gh] if gh is not None else [])
    if bias is not None:
        ins += [bias[k], bias[n + k]]
    return [inp(i) for i in range(len(ins))], ins


@register("RNN", 7)
class RNN(Recurrent):
    n_gates, default_acts = 1, ("Tanh",)

    def cell(self, ctx: Context, fns: list, gx: list[T], gh: list[T], bias: list[T] | None, p: list[T] | None,
             h: T, c: T, rd: T, hid: int) -> tuple[T, T]:
        parts, ins = _parts(gx[0], gh[0], bias, 0, 1)
        h_new = emit(ctx, self, fns[0](self.pre(parts)), ins, h.dtype)
        return h_new, c


@register("GRU", 7)
class GRU(Recurrent):
    attrs = {**Recurrent.attrs, "linear_before_reset": 0}
    n_gates, default_acts = 3, ("Sigmoid", "Tanh")

    def cell(self, ctx: Context, fns: list, gx: list[T], gh: list[T], bias: list[T] | None, p: list[T] | None,
             h: T, c: T, rd: T, hid: int) -> tuple[T, T]:
        f, g = fns
        gates = []
        for k in (0, 1):  # z, r
            parts, ins = _parts(gx[k], gh[k], bias, k, 3)
            gates.append(emit(ctx, self, f(self.pre(parts)), ins, h.dtype))
        z, rg = gates
        if self.a["linear_before_reset"]:
            ins = [gx[2], rg, gh[2]] + ([bias[5], bias[2]] if bias is not None else [])
            inner = call("add", inp(2), inp(3)) if bias is not None else inp(2)
            parts = [inp(0), call("mul", inp(1), inner)] + ([inp(4)] if bias is not None else [])
        else:
            rh = emit(ctx, self, call("mul", inp(0), inp(1)), [rg, h], h.dtype)
            rh_t = T(rd.dtype, (hid, hid), view=ctx.view(slice_view(ctx, rd, 0, 2 * hid, 3 * hid)).permute((1, 0)))
            ghh = call_op(ctx, self, "MatMul", rh, rh_t)[0]
            ins = [gx[2], ghh] + ([bias[2], bias[5]] if bias is not None else [])
            parts = [inp(i) for i in range(len(ins))]
        hh = emit(ctx, self, g(self.pre(parts)), ins, h.dtype)
        blend = call("add", call("mul", call("sub", fc(1.0), inp(0)), inp(1)), call("mul", inp(0), inp(2)))
        h_new = emit(ctx, self, blend, [z, hh, h], h.dtype)  # (1 - z) * h~ + z * h
        return h_new, c


@register("LSTM", 7)
class LSTM(Recurrent):
    attrs = {**Recurrent.attrs, "input_forget": 0}
    n_gates, default_acts = 4, ("Sigmoid", "Tanh", "Tanh")

    def cell(self, ctx: Context, fns: list, gx: list[T], gh: list[T], bias: list[T] | None, p: list[T] | None,
             h: T, c: T, rd: T, hid: int) -> tuple[T, T]:
        f, g, hf = fns
        gate = {}
        for name, k, peep in (("i", 0, 0), ("f", 2, 2), ("c", 3, None)):  # gate order i, o, f, c; P is i, o, f
            parts, ins = _parts(gx[k], gh[k], bias, k, 4)
            if p is not None and peep is not None:
                ins += [p[peep], c]
                parts.append(call("mul", inp(len(ins) - 2), inp(len(ins) - 1)))
            gate[name] = emit(ctx, self, (g if name == "c" else f)(self.pre(parts)), ins, h.dtype)
        if self.a["input_forget"]:
            gate["f"] = emit(ctx, self, call("sub", fc(1.0), inp(0)), [gate["i"]], h.dtype)
        c_new = emit(ctx, self, call("add", call("mul", inp(0), inp(1)), call("mul", inp(2), inp(3))),
                     [gate["f"], c, gate["i"], gate["c"]], c.dtype)
        parts, ins = _parts(gx[1], gh[1], bias, 1, 4)
        if p is not None:
            ins += [p[1], c_new]
            parts.append(call("mul", inp(len(ins) - 2), inp(len(ins) - 1)))
        o = emit(ctx, self, f(self.pre(parts)), ins, h.dtype)
        h_new = emit(ctx, self, call("mul", inp(0), hf(inp(1))), [o, c_new], h.dtype)
        return h_new, c_new


@register("DeformConv", 19)
class DeformConv(Op):
    """Deformable conv: one index kernel samples every (channel, tap, output position) bilinearly at its
    offset position (zeros outside, times the mask), then a grouped MatMul with the weights."""

    attrs = {"dilations": None, "group": 1, "kernel_shape": None, "offset_group": 1, "pads": None, "strides": None}

    def run(self, ctx: Context, x: T, w: T, offset: T, b: T | None = None, mask: T | None = None) -> list[T]:
        if x.rank != 4 or x.dtype.kind != "f":
            raise self.fail("only 2-D float DeformConv is supported")
        n, c, h, wd = x.shape
        oc, icpg, kh, kw = w.shape
        g, og_n = self.a["group"], self.a["offset_group"]
        if c != icpg * g or oc % g or c % og_n:
            raise ValueError(f"{self.node.describe()}: input {x.shape}, weight {w.shape}, group {g} disagree")
        sh, sw = self.a["strides"] or [1, 1]
        dh, dw = self.a["dilations"] or [1, 1]
        pt, pl = (self.a["pads"] or [0, 0, 0, 0])[:2]
        oh, ow = offset.shape[2:]
        ch, i, j, yo, xo = coord(1), coord(2), coord(3), coord(4), coord(5)
        og = call("div", ch, ic(c // og_n))
        tap = call("add", call("mul", call("add", call("mul", og, ic(kh)), i), ic(kw)), j)

        def off(axis: int) -> Expr:
            return load(2, coord(0), call("add", call("mul", tap, ic(2)), ic(axis)), yo, xo, kind=FLOAT)

        py = call("add", call("to_float", call("add", call("mul", yo, ic(sh)), call("mul", i, ic(dh)))),
                  call("add", fc(-pt), off(0)))
        px = call("add", call("to_float", call("add", call("mul", xo, ic(sw)), call("mul", j, ic(dw)))),
                  call("add", fc(-pl), off(1)))
        y0, x0 = call("floor", py), call("floor", px)
        fy, fx = call("sub", py, y0), call("sub", px, x0)
        iy, ix = call("to_int", y0), call("to_int", x0)
        terms = []
        for dy, wy in ((0, call("sub", fc(1.0), fy)), (1, fy)):
            for dx, wx in ((0, call("sub", fc(1.0), fx)), (1, fx)):
                ty = call("add", iy, ic(dy)) if dy else iy
                tx = call("add", ix, ic(dx)) if dx else ix
                ok = call("and", call("and", call("ge", ty, ic(0)), call("lt", ty, ic(h))),
                          call("and", call("ge", tx, ic(0)), call("lt", tx, ic(wd))))
                v = call("where", ok, load(0, coord(0), ch, ty, tx, kind=FLOAT), fc(0.0))
                terms.append(call("mul", v, call("mul", wy, wx)))
        val = call("add", call("add", terms[0], terms[1]), call("add", terms[2], terms[3]))
        ins = [x, w, offset]
        if mask is not None:
            ins.append(mask)
            val = call("mul", val, load(3, coord(0), tap, yo, xo, kind=FLOAT))
        cols = kernel(ctx, val, ins, x.dtype, (n, c, kh, kw, oh, ow))
        k = icpg * kh * kw
        cols4 = reshape_view(ctx, cols, (n, g, k, oh * ow))
        w4 = reshape_view(ctx, w, (1, g, oc // g, k))
        y = reshape_view(ctx, call_op(ctx, self, "MatMul", w4, cols4)[0], (n, oc, oh, ow))
        if b is not None:
            y = emit(ctx, self, call("add", inp(0), inp(1)), [y, reshape_view(ctx, b, (oc, 1, 1))], x.dtype)
        return [y]


@register("Det", 11)
class Det(Op):
    """Determinants of small matrices (n <= 5) by the Leibniz sum over permutations, one kernel over the
    batch; larger ones would need an LU primitive."""

    def run(self, ctx: Context, x: T) -> list[T]:
        m = x.shape[-1]
        if x.rank < 2 or x.shape[-2] != m or x.dtype.kind != "f":
            raise ValueError(f"{self.node.describe()}: Det needs float square matrices, got {x.shape}")
        if m > 5:
            raise self.fail(f"Det of {m} x {m} matrices is not supported (up to 5 x 5)")
        lead = [coord(d) for d in range(x.rank - 2)]
        cell = [[load(0, *lead, ic(r), ic(c), kind=FLOAT) for c in range(m)] for r in range(m)]
        terms = []
        for perm in itertools.permutations(range(m)):
            inversions = sum(1 for a in range(m) for b in range(a + 1, m) if perm[a] > perm[b])
            t = cell[0][perm[0]]
            for r in range(1, m):
                t = call("mul", t, cell[r][perm[r]])
            terms.append(call("neg", t) if inversions % 2 else t)
        return [kernel(ctx, sum_exprs(terms), [x], x.dtype, x.shape[:-2])]


@register("LinearAttention", 27)
class LinearAttention(Op):
    """The recurrence unrolled over the (static) sequence: per step, the state (B, H_kv, d_k, d_v) decays
    (gated), takes the delta-corrected outer product k v^T, and is read by q (grouped query heads share
    their KV head's state). Each step is two small MatMuls and fused elementwise kernels."""

    attrs = {"chunk_size": None, "kv_num_heads": None, "q_num_heads": None, "scale": None,
             "update_rule": "gated_delta"}

    def run(self, ctx: Context, q: T, k: T, v: T, past: T | None = None, decay: T | None = None,
            beta: T | None = None) -> list[T]:
        rule = self.a["update_rule"]
        hq, hkv = self.a["q_num_heads"], self.a["kv_num_heads"]
        if rule not in ("linear", "gated", "delta", "gated_delta") or not hq or not hkv or hq % hkv:
            raise self.fail(f"update_rule {rule!r} with {hq} query / {hkv} KV heads is not supported")
        gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
        if (decay is None) == gating or (beta is None) == delta:
            raise ValueError(f"{self.node.describe()}: decay/beta inputs do not match update_rule {rule!r}")
        b, t = q.shape[:2]
        dk, dv, grp = q.shape[2] // hq, v.shape[2] // hkv, hq // hkv
        scale = self.a["scale"] or 1.0 / math.sqrt(dk)
        f32, q_dtype = np.dtype(np.float32), q.dtype
        # The recurrence runs in float32 whatever the activations' type (as onnx.reference).
        q, k, v, decay, beta = (x if x is None or x.dtype == f32 else emit(ctx, self, inp(0), [x], f32)
                                for x in (q, k, v, decay, beta))
        qc, kc, vc = (ctx.contiguous(x) for x in (q, k, v))

        def at(base: View, step: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype) -> T:
            """A per-step window (batch stride: the whole sequence) of a (B, T, ...) tensor."""
            row = base.size // b
            off = base.offset + step * (row // t)
            return T(dtype, shape, view=View(base.handle, dtype, shape, (row, *strides), off))

        state = past if past is not None else ctx.const(np.zeros((b, hkv, dk, dv), f32))
        out = ctx.new(f32, (b, t, hq * dv))
        dc = ctx.contiguous(decay) if decay is not None else None
        bc = ctx.contiguous(beta) if beta is not None else None
        for i in range(t):
            k_t = at(kc, i, (b, hkv, dk, 1), (dk, 1, 0), k.dtype)
            v_t = at(vc, i, (b, hkv, 1, dv), (dv, 0, 1), v.dtype)
            if gating:
                assert dc is not None and decay is not None
                per = decay.shape[2] // hkv  # 1 (per head) or d_k (per key dim)
                g = at(dc, i, (b, hkv, dk, 1), (per, 1 if per > 1 else 0, 0), decay.dtype)
                state = emit(ctx, self, call("mul", inp(0), call("exp", inp(1))), [state, g], f32)
            if delta:
                assert bc is not None and beta is not None
                nb = beta.shape[2]
                bt = at(bc, i, (b, hkv, 1, 1), (1 if nb > 1 else 0, 0, 0), beta.dtype)
                k_row = at(kc, i, (b, hkv, 1, dk), (dk, 0, 1), k.dtype)
                got = call_op(ctx, self, "MatMul", k_row, state)[0]  # S^T k: (B, H_kv, 1, d_v)
                v_t = emit(ctx, self, call("mul", inp(0), call("sub", inp(1), inp(2))), [bt, v_t, got], f32)
            state = emit(ctx, self, call("add", inp(0), call("mul", inp(1), inp(2))), [state, k_t, v_t], f32)
            q_t = at(qc, i, (b, hkv, grp, dk), (grp * dk, dk, 1), q.dtype)
            o = call_op(ctx, self, "MatMul", q_t, state)[0]  # (B, H_kv, group, d_v)
            dst = View(out.view.handle, f32, (b, hkv, grp, dv), (t * hq * dv, grp * dv, dv, 1), i * hq * dv)
            copy_into(ctx, ctx.view(emit(ctx, self, call("mul", inp(0), fc(scale)), [o], f32)), dst)
        present_dtype = past.dtype if past is not None else q_dtype
        if state.dtype != present_dtype or state.is_const:
            state = emit(ctx, self, inp(0), [state], present_dtype)
        return [out if q_dtype == f32 else emit(ctx, self, inp(0), [out], q_dtype), state]
