"""Transformer ops with fused kernels: LayerNorm, RMSNorm, GELU, Softmax.

Each runs its fused kernel when it applies and counts "<pattern>.fused"; otherwise it falls back to the
decomposition and counts "<pattern>.fallback" and, to say why, "<pattern>.fallback[<node>]: <reason>" (plan_info's
"fusion_misses" lists them). The ONNX ops (LayerNormalization-17, RMSNormalization-23, Gelu-20) and the ai.ember
ops that onnx/patterns.py rewrites torch's decomposed patterns into share them.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.dtypes import kind_of
from ..core.expr import Expr, call, const, coord, inp, load
from ..core.view import View
from .base import Context, Op, Tensor, declare_counters, host_ints, norm_axis, register
from .elementwise import emit
from .exprs import int_const, kernel
from .normalization import normalize
from .reduce import reduce_axes
from .shape import reshape_view, slice_view

EMBER = "ai.ember"
PATTERNS = ("rmsnorm", "layernorm", "softmax", "gelu", "quickgelu", "attention", "rotary")
declare_counters(*(f"{p}.{arm}" for p in PATTERNS for arm in ("fused", "fallback")), "attention.gemm")


def fell_back(ctx: Context, op: Op, pattern: str, reason: str) -> None:
    """Count the decomposition's arm of `pattern`, and why this node took it."""
    ctx.count(f"{pattern}.fallback")
    ctx.count(f"{pattern}.fallback[{op.node.name or op.node.op_type}]: {reason}")


def parse_fallback(key: str) -> dict[str, str] | None:
    """{"pattern", "node", "reason"} from a counter fell_back made, else None."""
    head, sep, reason = key.partition("]: ")
    pattern, sep2, node = head.partition(".fallback[")
    if not (sep and sep2) or pattern not in PATTERNS:
        return None
    return {"pattern": pattern, "node": node, "reason": reason}


def fused_dtype(dtype: np.dtype) -> bool:
    """Whether a fused row/attention kernel is worth asking for: float32 or float16 data. The backend still decides:
    it declines (NotImplementedError) a dtype it leaves to the decomposition (the cpu backend computes float16 per op
    in numpy's float16, as ONNX's reference does)."""
    return dtype in (np.float32, np.float16)


def _vector(ctx: Context, t: Tensor | None, n: int) -> View | None:
    """scale/bias as a View of n elements (the kernels take strided and stride-0 views), or None."""
    if t is None or t.size not in (1, n):
        return None
    return ctx.view(reshape_view(ctx, t, (t.size,))).broadcast_to((n,))


def fused_norm(ctx: Context, op: Op, kind: str, x: Tensor, axis: int, scale: Tensor | None, bias: Tensor | None,
               eps: float) -> Tensor | None:
    """The fused row kernel when it applies (float32, normalising trailing dims, vector scale/bias), else None."""
    y = try_fused_norm(ctx, op, kind, x, axis, scale, bias, eps)
    return y if isinstance(y, Tensor) else None


def try_fused_norm(ctx: Context, op: Op, kind: str, x: Tensor, axis: int, scale: Tensor | None,
                   bias: Tensor | None, eps: float) -> Tensor | str:
    """fused_norm's kernel, or why it does not apply (for fell_back)."""
    if not fused_dtype(x.dtype):
        return f"the input is {x.dtype}, not float32 or float16"
    if x.size == 0:
        return "the input is empty"
    n = math.prod(x.shape[axis:])
    sv, bv = _vector(ctx, scale, n), _vector(ctx, bias, n)
    for name, t, v in (("scale", scale, sv), ("bias", bias, bv)):
        if t is not None and v is None:
            return f"the {name} has shape {t.shape}: not 1 or {n} elements (one per normalised element)"
    out = ctx.new(x.dtype, x.shape)
    try:
        steps = ctx.backend.record_norm(kind, ctx.contiguous(x), sv, bv, out.view, n, float(eps))
    except NotImplementedError as e:
        return f"the backend has no fused kernel for it ({e})"
    ctx.record(steps)
    return out


def affine(ctx: Context, op: Op, y: Tensor, scale: Tensor | None, bias: Tensor | None) -> Tensor:
    """y * scale + bias (either optional), one lazy elementwise expression."""
    ins = [y] + [t for t in (scale, bias) if t is not None]
    e = inp(0)
    if scale is not None:
        e = call("mul", e, inp(1))
    if bias is not None:
        e = call("add", e, inp(len(ins) - 1))
    return emit(ctx, op, e, ins, y.dtype) if len(ins) > 1 else y


def decomposed_rms(ctx: Context, op: Op, x: Tensor, axes: list[int], eps: float, scale: Tensor | None) -> Tensor:
    keep = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    n = math.prod(x.shape[a] for a in axes)
    ss = reshape_view(ctx, reduce_axes(ctx, "sumsq", x, axes), keep)
    inv = emit(ctx, op, call("div", const(1.0), call("sqrt", call("add", call("div", inp(0), const(float(n))),
                                                                    const(eps)))), [ss], x.dtype)
    y = emit(ctx, op, call("mul", inp(0), inp(1)), [x, inv], x.dtype)
    return emit(ctx, op, call("mul", inp(0), inp(1)), [y, scale], x.dtype) if scale is not None else y


@register("LayerNormalization", 17)
class LayerNormalization(Op):
    f16 = True
    attrs = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}

    def run(self, ctx: Context, x: Tensor, scale: Tensor | None = None, bias: Tensor | None = None) -> list[Tensor]:
        axis = norm_axis(self, self.attr["axis"], x.rank)
        if len([o for o in self.node.outputs if o]) > 1:
            y: Tensor | str = "the Mean / InvStdDev outputs are read (the fused kernel keeps no statistics)"
        else:
            y = try_fused_norm(ctx, self, "layernorm", x, axis, scale, bias, self.attr["epsilon"])
        if isinstance(y, Tensor):
            ctx.count("layernorm.fused")
            return [y]
        fell_back(ctx, self, "layernorm", y)
        y, mean, inv = normalize(ctx, self, x, list(range(axis, x.rank)), self.attr["epsilon"], stats=True)
        return [affine(ctx, self, y, scale, bias), mean, inv]


def _inner_axis(ctx: Context, op: Op, pattern: str, x: Tensor) -> int | None:
    """The axis a rewritten chain reduced (its ReduceMean's one axis), if it is not the last: the fused kernel
    normalises trailing dims, so that chain runs as its decomposition over that axis alone."""
    axis = norm_axis(op, op.attr["axis"], x.rank)
    if axis == x.rank - 1:
        return None
    fell_back(ctx, op, pattern, f"the chain reduces axis {axis} of a rank-{x.rank} input, not the last")
    return axis


class LayerNorm(LayerNormalization):
    """ai.ember.LayerNorm, from onnx/patterns.py's chains: normalises over `axis` alone (the chain's ReduceMean)."""

    def run(self, ctx: Context, x: Tensor, scale: Tensor | None = None, bias: Tensor | None = None) -> list[Tensor]:
        axis = _inner_axis(ctx, self, "layernorm", x)
        if axis is None:
            return super().run(ctx, x, scale, bias)
        return [affine(ctx, self, normalize(ctx, self, x, [axis], self.attr["epsilon"]), scale, bias)]


register("LayerNorm", 1, EMBER)(LayerNorm)


@register("RMSNormalization", 23)
class RMSNormalization(Op):
    f16 = True
    attrs = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}

    def run(self, ctx: Context, x: Tensor, scale: Tensor | None = None) -> list[Tensor]:
        axis = norm_axis(self, self.attr["axis"], x.rank)
        y = try_fused_norm(ctx, self, "rmsnorm", x, axis, scale, None, self.attr["epsilon"])
        if isinstance(y, Tensor):
            ctx.count("rmsnorm.fused")
            return [y]
        fell_back(ctx, self, "rmsnorm", y)
        return [decomposed_rms(ctx, self, x, list(range(axis, x.rank)), self.attr["epsilon"], scale)]


class RMSNorm(RMSNormalization):
    """ai.ember.RMSNorm, from onnx/patterns.py's chains: normalises over `axis` alone (the chain's ReduceMean)."""

    def run(self, ctx: Context, x: Tensor, scale: Tensor | None = None) -> list[Tensor]:
        axis = _inner_axis(ctx, self, "rmsnorm", x)
        if axis is None:
            return super().run(ctx, x, scale)
        return [decomposed_rms(ctx, self, x, [axis], self.attr["epsilon"], scale)]


register("RMSNorm", 1, EMBER)(RMSNorm)


@register("Gelu", 20)
class Gelu(Op):
    """One elementwise kernel (the erf or tanh form), which a producing MatMul/Conv takes as its epilogue."""
    f16 = True

    attrs = {"approximate": "none"}

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        fn = "gelu_tanh" if self.attr["approximate"] == "tanh" else "gelu"
        ctx.count("gelu.fused")
        return [emit(ctx, self, call(fn, inp(0)), [x], x.dtype)]


register("Gelu", 1, EMBER)(type("GeluEmber", (Gelu,), {}))


def softmax(ctx: Context, op: Op, x: Tensor, axis: int, log: bool, legacy: bool = False) -> Tensor:
    """(Log)Softmax over `axis` (legacy: over all dims from `axis`, as opset < 13 coerces to 2-D)."""
    if legacy:
        x2 = reshape_view(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
        return reshape_view(ctx, softmax(ctx, op, x2, 1, log), x.shape)
    why = f"the input is {x.dtype}, not float32 or float16" if not fused_dtype(x.dtype) else \
        "the input is empty" if not x.size else ""
    if not why:
        perm = [i for i in range(x.rank) if i != axis] + [axis]
        moved = Tensor(x.dtype, tuple(x.shape[p] for p in perm), view=ctx.view(x).permute(perm))
        src = ctx.contiguous(moved)
        out = ctx.new(x.dtype, moved.shape)
        try:
            steps = ctx.backend.record_softmax(src, out.view, x.shape[axis], log)
        except NotImplementedError as e:
            steps, why = None, f"the backend has no fused kernel for it ({e})"
        if steps is not None:
            ctx.record(steps)
            ctx.count("softmax.fused")
            inv = list(np.argsort(perm))
            return Tensor(x.dtype, x.shape, view=out.view.permute(inv))
    fell_back(ctx, op, "softmax", why)
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
    f16 = True
    attrs = {"axis": None}
    log = False

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        legacy = self.node.opset < 13
        axis = self.attr["axis"]
        axis = norm_axis(self, (1 if legacy else -1) if axis is None else axis, x.rank)
        return [softmax(ctx, self, x, axis, self.log, legacy)]


register("Softmax", 1)(type("Softmax", (SoftmaxBase,), {}))
register("LogSoftmax", 1)(type("LogSoftmax", (SoftmaxBase,), {"log": True}))


def attention(ctx: Context, op: Op, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
              causal: bool) -> Tensor:
    """softmax(scale * q @ kᵀ + mask) @ v over (B, H, S, D) tensors, k/v possibly with fewer heads (GQA).

    The fused flash-style kernel for short sequences (counted "attention.fused"); for long ones the scores as
    one GEMM with the scale and the mask in its epilogue, the fused softmax, and a second GEMM ("attention.gemm",
    faster there); the plain decomposition where the backend has neither ("attention.fallback").
    """
    b, hq, sq, d = q.shape
    skv, dv = k.shape[2], v.shape[3]
    shape = (b, hq, sq, dv)
    mview = None
    if mask is not None:
        if mask.dtype == np.bool_:  # boolean masks: True = attend
            mask = emit(ctx, op, call("where", inp(0, "bool"), const(0.0), const(-math.inf)), [mask],
                        np.dtype(np.float32))
        mview = ctx.view(mask).broadcast_to((b, hq, sq, skv))
    out = ctx.new(q.dtype, shape)
    fused = fused_dtype(q.dtype)
    if fused and dv == d and ctx.backend.select_attention(b, hq, sq, skv, q.dtype.itemsize) == "flash":
        try:
            steps = ctx.backend.record_attention_views(ctx.view(q), ctx.view(k), ctx.view(v), mview, out.view,
                                                       float(scale), causal)
        except NotImplementedError:
            steps = None
        if steps is not None:
            ctx.record(steps)
            ctx.count("attention.fused")
            return out
    gemm = fused
    if gemm:
        ctx.count("attention.gemm")
    else:
        fell_back(ctx, op, "attention", f"the inputs are {q.dtype}, not float32 or float16")
    kv_, vv_ = expand_kv_heads(ctx, k, v, hq)
    qv = ctx.view(q)
    scores = ctx.new(q.dtype, (b, hq, sq, skv))
    q3 = ctx.contiguous(Tensor(q.dtype, q.shape, view=qv)).merged((b * hq, sq, d))
    k3 = kv_.merged((b * hq, skv, d))
    additive = None
    if causal:
        i = np.arange(sq)[:, None]
        j = np.arange(skv)[None, :]
        additive = ctx.const(np.where(j <= i + (skv - sq), 0.0, -np.inf).astype(q.dtype))
    if mask is not None:
        mt = Tensor(mask.dtype, (b, hq, sq, skv), view=mview)
        additive = mt if additive is None else emit(ctx, op, call("add", inp(0), inp(1)), [mt, additive], q.dtype)
    bias = None
    if gemm and additive is not None:
        # The mask rides in the scores GEMM's epilogue (scale * q kᵀ + mask): no extra pass over S x S.
        bias = ctx.view(additive).broadcast_to((b, hq, sq, skv)).merged((b * hq, sq, skv))
        if bias is None:
            bias = ctx.contiguous(Tensor(q.dtype, (b, hq, sq, skv),
                                    view=ctx.view(additive).broadcast_to((b, hq, sq, skv)))).merged((b * hq, sq, skv))
    ctx.record(ctx.backend.record_matmul(q3, k3.permute((0, 2, 1)), scores.view.merged((b * hq, sq, skv)),
                                         alpha=float(scale), bias=bias))
    s = scores
    if bias is None and additive is not None:
        s = emit(ctx, op, call("add", inp(0), inp(1)), [s, additive], q.dtype)
    p = softmax(ctx, op, s, 3, False)
    if mask is not None or (causal and sq > skv):
        # A row that sees no key gives zeros (softmax of all -inf is NaN): the fused kernel's rule.
        p = emit(ctx, op, call("where", call("isnan", inp(0)), const(0.0), inp(0)), [p], q.dtype)
    v3 = vv_.merged((b * hq, skv, dv))
    p3 = ctx.contiguous(p).merged((b * hq, sq, skv))
    ctx.record(ctx.backend.record_matmul(p3, v3, out.view.merged((b * hq, sq, dv))))
    return out


def expand_kv_heads(ctx: Context, k: Tensor, v: Tensor, hq: int) -> tuple[View, View]:
    """K and V as contiguous (B, hq, S, D) views: with fewer kv heads (GQA) each serves hq / hkv query heads in
    turn ([h0, h0, h1, h1, ...]), copied from a broadcast view."""
    b, hkv, skv, d = k.shape
    dv, rep = v.shape[3], hq // hkv
    kv_, vv_ = ctx.view(k), ctx.view(v)
    if rep > 1:
        kv_ = View(kv_.handle, kv_.dtype, (b, hkv, rep, skv, d), kv_.strides[:2] + (0,) + kv_.strides[2:], kv_.offset)
        vv_ = View(vv_.handle, vv_.dtype, (b, hkv, rep, skv, dv), vv_.strides[:2] + (0,) + vv_.strides[2:], vv_.offset)
    kt = ctx.contiguous(Tensor(k.dtype, kv_.shape, view=kv_)).merged((b, hq, skv, d))
    vt = ctx.contiguous(Tensor(v.dtype, vv_.shape, view=vv_)).merged((b, hq, skv, dv))
    return kt, vt


@register("Attention", 1, EMBER)
class EmberAttention(Op):
    """softmax(scale * Q @ KT + mask) @ V, from the exported MatMul/Div/Add/Softmax/MatMul pattern (KT = Kᵀ)."""
    f16 = True
    any_float = True  # the kernels take each operand's own float type

    attrs = {"scale": 1.0}

    def run(self, ctx: Context, q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None = None) -> list[Tensor]:
        if q.rank != 4 or kt.rank != 4 or v.rank != 4:
            lead = q.shape[:-2]
            q4 = reshape_view(ctx, q, (1, math.prod(lead), *q.shape[-2:]))
            kt4 = reshape_view(ctx, kt, (1, math.prod(kt.shape[:-2]), *kt.shape[-2:]))
            v4 = reshape_view(ctx, v, (1, math.prod(v.shape[:-2]), *v.shape[-2:]))
            m4 = None
            if mask is not None:
                full = (*lead, q.shape[-2], kt.shape[-1])
                m4 = Tensor(mask.dtype, full, view=ctx.view(mask).broadcast_to(full))
                m4 = reshape_view(ctx, Tensor(mask.dtype, full, view=ctx.contiguous(m4)),
                                  (1, math.prod(lead), q.shape[-2], kt.shape[-1]))
            out = self.run(ctx, q4, kt4, v4, m4)[0]
            return [reshape_view(ctx, out, (*lead, q.shape[-2], v.shape[-1]))]
        k = Tensor(kt.dtype, (kt.shape[0], kt.shape[1], kt.shape[3], kt.shape[2]),
                   view=ctx.view(kt).permute((0, 1, 3, 2)))
        return [attention(ctx, self, q, k, v, mask, self.attr["scale"], False)]


@register("RotateHalf", 1, EMBER)
class RotateHalf(Op):
    """x * cos + Concat(-Slice(x, a2:b2), Slice(x, a1:b1)) * sin as one kernel (onnx/pattern_rotary.py; transformers'
    rotate_half slices and concatenates the last axis, a2 = b1 = head / 2). Inputs: x, cos, sin, then the two
    Slices' starts and ends (a1, b1, a2, b2) along `slice_axis`, clamped as Slice clamps them; the Concat is along
    `axis`; the four operands broadcast as Mul and Add do."""
    f16 = True
    host_inputs = (3, 4, 5, 6)
    attrs = {"slice_axis": -1, "axis": -1}

    def run(self, ctx: Context, x: Tensor, cos: Tensor, sin: Tensor, a1: Tensor, b1: Tensor, a2: Tensor,
            b2: Tensor) -> list[Tensor]:
        desc = self.node.describe()
        if x.dtype != cos.dtype or x.dtype != sin.dtype or x.dtype.kind != "f":
            raise ValueError(f"{desc}: x, cos and sin must share one float dtype, got {x.dtype}, {cos.dtype}, "
                             f"{sin.dtype}")
        cut, cat = (norm_axis(self, self.attr[a], x.rank) for a in ("slice_axis", "axis"))
        parts = []
        for start, end in ((a2, b2), (a1, b1)):  # in the Concat's order
            lo, hi = host_ints(self, start, "starts"), host_ints(self, end, "ends")
            if lo is None or hi is None or len(lo) != 1 or len(hi) != 1:
                raise ValueError(f"{desc}: each Slice needs one start and one end")
            r = range(*slice(lo[0], hi[0]).indices(x.shape[cut]))
            parts.append((r.start, tuple(len(r) if i == cut else d for i, d in enumerate(x.shape))))
        (lo2, p2), (lo1, p1) = parts
        if any(d != e for i, (d, e) in enumerate(zip(p2, p1, strict=True)) if i != cat):
            raise ValueError(f"{desc}: the Concat's parts {p2} and {p1} differ off axis {cat}")
        halves = tuple(p2[i] + p1[i] if i == cat else d for i, d in enumerate(p2))
        try:
            shape = tuple(np.broadcast_shapes(x.shape, cos.shape, halves, sin.shape))
        except ValueError:
            raise ValueError(f"{desc}: x {x.shape}, cos {cos.shape}, the rotated halves {halves} and sin "
                             f"{sin.shape} do not broadcast") from None
        ctx.count("rotary.fused")
        if not ctx.backend.select_index_kernels():
            return [self._composed(ctx, x, cos, sin, cut, cat, (lo2, p2), (lo1, p1), halves)]
        off = len(shape) - x.rank
        c = [coord(i) for i in range(len(shape))]

        def at(dims: tuple[int, ...], i: int) -> Expr:  # the coordinate along dim i of a tensor broadcast to shape
            return c[off + i] if dims[i] == shape[off + i] else int_const(0)

        q = [at(halves, i) for i in range(x.rank)]
        first = call("lt", q[cat], int_const(p2[cat]))
        src = list(q)
        src[cat] = call("where", first, q[cat], call("sub", q[cat], int_const(p2[cat])))
        src[cut] = call("add", src[cut], call("where", first, int_const(lo2), int_const(lo1)))
        k = kind_of(x.dtype)
        own, part = load(0, *(at(x.shape, i) for i in range(x.rank)), kind=k), load(0, *src, kind=k)
        rotated = call("where", first, call("neg", part), part)
        mixed = call("add", call("mul", own, inp(1, k)), call("mul", rotated, inp(2, k)))
        views = [ctx.view(x), ctx.view(cos).broadcast_to(shape), ctx.view(sin).broadcast_to(shape)]
        return [kernel(ctx, mixed, views, x.dtype, shape)]

    def _composed(self, ctx: Context, x: Tensor, cos: Tensor, sin: Tensor, cut: int, cat: int,
                  second: tuple[int, tuple[int, ...]], first: tuple[int, tuple[int, ...]],
                  halves: tuple[int, ...]) -> Tensor:
        """The same as views of the two slices, one copy each into the rotated halves (the second negated on
        the way) and one elementwise kernel for the mix."""
        k = kind_of(x.dtype)
        rotated = ctx.new(x.dtype, halves)
        at = 0
        for (lo, part), negate in ((second, True), (first, False)):
            if math.prod(part):
                src = slice_view(ctx, x, cut, lo, lo + part[cut])
                dst = rotated.view
                dst = View(dst.handle, dst.dtype, part, dst.strides, dst.offset + at * dst.strides[cat])
                expr = call("neg", inp(0, k)) if negate else inp(0, k)
                ctx.record(ctx.backend.record_elementwise(expr, [ctx.view(src)], dst))
            at += part[cat]
        mix = call("add", call("mul", inp(0, k), inp(1, k)), call("mul", inp(2, k), inp(3, k)))
        return emit(ctx, self, mix, [x, cos, rotated, sin], x.dtype)
