"""ONNX Runtime's contrib ops (domain com.microsoft) that transformer exports use: what ONNX Runtime GenAI's model
builder and onnxruntime.transformers' optimizer emit. Each is composed from ember's own ops and helpers, with the
meaning of ONNX Runtime's CPU kernels (the reference):

- SkipLayerNormalization / SkipSimplifiedLayerNormalization: sum = input + skip (+ bias), then LayerNorm / RMSNorm
  of the sum over the last axis, through the fused row kernels of transformer.py; outputs output, mean (LayerNorm
  only), inv_std_var, input_skip_bias_sum.
- SimplifiedLayerNormalization (RMSNorm; ONNX Runtime registers it in the default domain, so it is here too).
- Gelu (erf), BiasGelu (erf GELU of x + bias), FastGelu (tanh form, optional bias), QuickGelu (x * sigmoid(alpha x)):
  one elementwise expression each, which fuses with its neighbours (and into a producing MatMul's epilogue).
- FusedMatMul: alpha * op(A) @ op(B), the transposes as views (transBatchA/B are refused).
- RotaryEmbedding: one kernel that reads the cos/sin caches at the position ids (the Gather) and rotates.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..core.dtypes import kind_of
from ..core.expr import INT, Expr, call, const, coord, inp, load
from ..ir import Node
from .base import Context, Op, Tensor, call_op, norm_axis, register
from .elementwise import broadcast_shape, emit
from .exprs import float_const, int_const, kernel
from .normalization import normalize
from .reduce import reduce_axes
from .shape import reshape_view
from .transformer import EMBER, affine, decomposed_rms, fell_back, try_fused_norm

MS = "com.microsoft"


def _same_dtype(op: Op, x: Tensor, **others: Tensor | None) -> None:
    for name, t in others.items():
        if t is not None and t.dtype != x.dtype:
            raise ValueError(f"{op.node.describe()}: input {name!r} is {t.dtype}, the input is {x.dtype}")


def _hidden_vector(op: Op, name: str, t: Tensor | None, hidden: int) -> None:
    """gamma / beta / bias: 1-D tensors of the hidden size."""
    if t is not None and t.shape != (hidden,):
        raise ValueError(f"{op.node.describe()}: input {name!r} has shape {t.shape}, expected ({hidden},) "
                         "(1-D, the hidden size)")


def _wanted(op: Op, index: int) -> bool:
    outs = op.node.outputs
    return len(outs) > index and bool(outs[index])


class _Contrib(Op):
    """A contrib op: ONNX's load-time checks know no schema for it, so it checks its own input and output counts
    (`arity`: (required, most) inputs; `max_outputs`), at load."""
    arity: ClassVar[tuple[int, int]] = (1, 1)
    max_outputs: ClassVar[int] = 1

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        low, high = self.arity
        given = len(node.inputs)
        if not low <= given <= high:
            raise ValueError(f"{node.describe()}: {given} input(s); the op takes "
                             f"{low if low == high else f'{low} to {high}'}")
        empty = [i for i in range(low) if not node.inputs[i]]
        if empty:
            raise ValueError(f"{node.describe()}: required input(s) {empty} are empty")
        if not 1 <= len(node.outputs) <= self.max_outputs or not node.outputs[0]:
            raise ValueError(f"{node.describe()}: {len(node.outputs)} output(s); the op has 1 to {self.max_outputs}, "
                             "the first named")


# ---- normalisations --------------------------------------------------------------------------------------------
def rms_stats(ctx: Context, op: Op, x: Tensor, axis: int, eps: float) -> tuple[Tensor, Tensor]:
    """x / sqrt(mean(x^2) + eps) over the dims from `axis`, and 1 / sqrt(mean(x^2) + eps) (kept dims of 1)."""
    axes = list(range(axis, x.rank))
    keep = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    n = max(int(np.prod([x.shape[a] for a in axes])), 1)
    ss = reshape_view(ctx, reduce_axes(ctx, "sumsq", x, axes), keep)
    inv = emit(ctx, op, call("div", const(1.0), call("sqrt", call("add", call("div", inp(0), const(float(n))),
                                                                    const(eps)))), [ss], x.dtype)
    y = emit(ctx, op, call("mul", inp(0), inp(1)), [x, inv], x.dtype)
    return y, inv


class _SkipNorm(_Contrib):
    """input + skip (+ bias), normalised over the last axis and scaled by gamma (+ beta)."""
    f16 = True
    attrs = {"epsilon": 1e-12}
    max_outputs = 4
    simplified = False

    def norm(self, ctx: Context, x: Tensor, skip: Tensor, gamma: Tensor, beta: Tensor | None,
             bias: Tensor | None) -> list[Tensor | None]:
        if x.rank not in (2, 3):
            raise ValueError(f"{self.node.describe()}: the input has shape {x.shape}; expected 3-D (batch, sequence, "
                             "hidden) or 2-D (tokens, hidden)")
        _same_dtype(self, x, skip=skip, gamma=gamma, beta=beta, bias=bias)
        hidden = x.shape[-1]
        if skip.rank not in (2, 3) or skip.shape[-1] != hidden or broadcast_shape(self, [x.shape, skip.shape]) != \
                x.shape:
            raise ValueError(f"{self.node.describe()}: the skip input has shape {skip.shape}; expected {x.shape}, "
                             f"(1, {', '.join(map(str, x.shape[1:]))}) or {x.shape[-2:]}")
        for name, t in (("gamma", gamma), ("beta", beta), ("bias", bias)):
            _hidden_vector(self, name, t, hidden)
        ins = [x, skip] + ([bias] if bias is not None else [])
        e = call("add", inp(0), inp(1))
        if bias is not None:
            e = call("add", e, inp(2))
        total = emit(ctx, self, e, ins, x.dtype)
        eps = float(self.attr["epsilon"])
        axis = x.rank - 1
        kind = "rmsnorm" if self.simplified else "layernorm"
        mean = inv = None
        if _wanted(self, 1) or _wanted(self, 2):
            y: Tensor | str = "the mean / inverse deviation outputs are read (the fused kernel keeps no statistics)"
        else:
            y = try_fused_norm(ctx, self, kind, total, axis, gamma, beta, eps)
        if isinstance(y, Tensor):
            ctx.count(f"{kind}.fused")
        else:
            fell_back(ctx, self, kind, y)
            if self.simplified:
                normed, inv = rms_stats(ctx, self, total, axis, eps)
            else:
                normed, mean, inv = normalize(ctx, self, total, [axis], eps, stats=True)
            y = affine(ctx, self, normed, gamma, beta)
        return [y, mean, inv, total if _wanted(self, 3) else None]


@register("SkipLayerNormalization", 1, MS)
class SkipLayerNormalization(_SkipNorm):
    arity = (3, 5)

    def run(self, ctx: Context, x: Tensor, skip: Tensor, gamma: Tensor, beta: Tensor | None = None,
            bias: Tensor | None = None) -> list[Tensor | None]:
        return self.norm(ctx, x, skip, gamma, beta, bias)


@register("SkipSimplifiedLayerNormalization", 1, MS)
class SkipSimplifiedLayerNormalization(_SkipNorm):
    arity = (3, 4)
    simplified = True

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        if _wanted(self, 1):
            raise self.fail("the mean output is not supported (ONNX Runtime does not compute it for the RMS form)")

    def run(self, ctx: Context, x: Tensor, skip: Tensor, gamma: Tensor,
            bias: Tensor | None = None) -> list[Tensor | None]:
        return self.norm(ctx, x, skip, gamma, None, bias)


class _SimplifiedLayerNormalization(_Contrib):
    """RMSNorm over the dims from `axis`; the optional second output is 1 / sqrt(mean(x^2) + eps)."""
    f16 = True
    arity = (2, 2)
    max_outputs = 2
    attrs = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}

    def run(self, ctx: Context, x: Tensor, scale: Tensor) -> list[Tensor]:
        axis = norm_axis(self, self.attr["axis"], x.rank)
        if scale.dtype != x.dtype:  # legal (the scale's type is the output's), but not composed here
            raise self.fail(f"a {scale.dtype} scale for {x.dtype} input is not supported (one dtype for both is)")
        eps = float(self.attr["epsilon"])
        try:
            broadcast_shape(self, [x.shape, scale.shape])
        except ValueError:
            raise ValueError(f"{self.node.describe()}: the scale's shape {scale.shape} does not broadcast to the "
                             f"normalised dims {x.shape[axis:]}") from None
        if scale.rank > x.rank - axis:
            raise ValueError(f"{self.node.describe()}: the scale has rank {scale.rank}, more than the "
                             f"{x.rank - axis} normalised dim(s)")
        if not _wanted(self, 1):
            y = try_fused_norm(ctx, self, "rmsnorm", x, axis, scale, None, eps)
            if isinstance(y, Tensor):
                ctx.count("rmsnorm.fused")
                return [y]
            fell_back(ctx, self, "rmsnorm", y)
            return [decomposed_rms(ctx, self, x, list(range(axis, x.rank)), eps, scale)]
        fell_back(ctx, self, "rmsnorm", "the inverse deviation output is read (the fused kernel keeps no statistics)")
        normed, inv = rms_stats(ctx, self, x, axis, eps)
        return [affine(ctx, self, normed, scale, None), inv]


# ONNX Runtime registers it in the ONNX domain (its contrib schema), some exporters write it as com.microsoft.
register("SimplifiedLayerNormalization", 1)(type("SimplifiedLayerNormalization",
                                                 (_SimplifiedLayerNormalization,), {}))
register("SimplifiedLayerNormalization", 1, MS)(type("SimplifiedLayerNormalizationMS",
                                                     (_SimplifiedLayerNormalization,), {}))


# ---- GELU family -----------------------------------------------------------------------------------------------
class _Activation(_Contrib):
    """fn(x (+ bias)) as one elementwise expression; `bias_required`: the second input must be given."""
    f16 = True
    arity = (1, 2)
    bias_required = False
    pattern = "gelu"  # the fused arm it counts

    def build(self, x: Expr) -> Expr:
        raise NotImplementedError

    def run(self, ctx: Context, x: Tensor, bias: Tensor | None = None) -> list[Tensor]:
        if x.dtype.kind != "f":
            raise ValueError(f"{self.node.describe()}: the input is {x.dtype}; a float tensor is expected")
        if bias is None and self.bias_required:
            raise ValueError(f"{self.node.describe()}: the bias input is required")
        if bias is not None:
            _same_dtype(self, x, bias=bias)
            if bias.rank != 1 or x.rank == 0 or bias.shape[0] != x.shape[-1]:
                raise ValueError(f"{self.node.describe()}: the bias has shape {bias.shape}; expected "
                                 f"({x.shape[-1] if x.rank else '?'},) (1-D, the input's last dim)")
            # Two steps, as an Add node and a Gelu node would be: after a MatMul the bias joins its epilogue and
            # the activation follows it there; otherwise the two fuse into one elementwise kernel.
            x = emit(ctx, self, call("add", inp(0), inp(1)), [x, bias], x.dtype)
            x.uses = 1  # read once, by the activation below
        ctx.count(f"{self.pattern}.fused")
        return [emit(ctx, self, self.build(inp(0)), [x], x.dtype)]


@register("Gelu", 1, MS)
class GeluMS(_Activation):
    arity = (1, 1)

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:  # type: ignore[override]
        return super().run(ctx, x)

    def build(self, x: Expr) -> Expr:
        return call("gelu", x)


@register("BiasGelu", 1, MS)
class BiasGelu(_Activation):
    arity = (2, 2)
    bias_required = True

    def build(self, x: Expr) -> Expr:
        return call("gelu", x)


@register("FastGelu", 1, MS)
class FastGelu(_Activation):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): the tanh form of GELU."""

    def build(self, x: Expr) -> Expr:
        return call("gelu_tanh", x)


@register("QuickGelu", 1, MS)
class QuickGelu(_Activation):
    """x * sigmoid(alpha x): com.microsoft's, and ai.ember's from CLIP's quick_gelu chain (onnx/patterns.py)."""
    arity = (1, 1)
    attrs = {"alpha": 1.702}
    pattern = "quickgelu"

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:  # type: ignore[override]
        return super().run(ctx, x)

    def build(self, x: Expr) -> Expr:
        return call("mul", x, call("sigmoid", call("mul", float_const(self.attr["alpha"]), x)))


register("QuickGelu", 1, EMBER)(type("QuickGeluEmber", (QuickGelu,), {}))


# ---- FusedMatMul -----------------------------------------------------------------------------------------------
def _swap_last(ctx: Context, t: Tensor) -> Tensor:
    """t with its last two dims swapped: a view (no copy)."""
    perm = list(range(t.rank - 2)) + [t.rank - 1, t.rank - 2]
    shape = tuple(t.shape[p] for p in perm)
    if t.is_const:
        return ctx.const(np.ascontiguousarray(np.swapaxes(t.value, -1, -2)))
    return Tensor(t.dtype, shape, view=ctx.view(t).permute(perm))


@register("FusedMatMul", 1, MS)
class FusedMatMul(_Contrib):
    """alpha * op(A) @ op(B), op a transpose of the last two dims (transA / transB), numpy.matmul broadcasting."""
    f16 = True
    arity = (2, 2)
    attrs = {"alpha": 1.0, "transA": 0, "transB": 0, "transBatchA": 0, "transBatchB": 0}

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        for key in ("transBatchA", "transBatchB"):
            if self.attr[key]:
                raise self.fail(f"{key}={self.attr[key]} is not supported (only transA, transB and alpha are)")

    def run(self, ctx: Context, a: Tensor, b: Tensor) -> list[Tensor]:
        if self.attr["transA"] and a.rank >= 2:
            a = _swap_last(ctx, a)
        if self.attr["transB"] and b.rank >= 2:
            b = _swap_last(ctx, b)
        y = call_op(ctx, self, "MatMul", a, b)[0]
        alpha = float(self.attr["alpha"])
        if alpha == 1.0:
            return [y]
        y.uses = 1  # read once, here: the scaling becomes the matmul's epilogue
        return [emit(ctx, self, call("mul", inp(0), float_const(alpha)), [y], y.dtype)]


# ---- RotaryEmbedding -------------------------------------------------------------------------------------------
@register("RotaryEmbedding", 1, MS)
class RotaryEmbedding(_Contrib):
    """RoPE over (batch, sequence, hidden) or (batch, heads, sequence, head_size) input. Position ids are one id
    (the first position; the rest follow it) or (batch, sequence); they index the (positions, rotary_dim / 2)
    cos/sin caches. The first rotary_embedding_dim (default: head_size) dims of each head rotate, as halves
    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), or interleaved as pairs; the rest pass through."""
    f16 = True
    arity = (4, 4)
    attrs: dict[str, Any] = {"interleaved": 0, "num_heads": 0, "rotary_embedding_dim": 0, "scale": 1.0,
                             "is_packed_batching": 0}

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        a = self.attr
        if a["interleaved"] not in (0, 1):
            raise self.fail(f"interleaved={a['interleaved']} is not supported (0 or 1)")
        if a["is_packed_batching"]:
            raise self.fail("is_packed_batching=1 (ragged batches) is not supported")
        if a["rotary_embedding_dim"] and not a["num_heads"]:
            raise ValueError(f"{node.describe()}: rotary_embedding_dim needs num_heads")
        # `scale` only matters to ONNX Runtime when it rebuilds the caches for sequences longer than them, which it
        # does not do on CPU (an error); with the caches given it has no effect.

    def run(self, ctx: Context, x: Tensor, pos: Tensor, cos: Tensor, sin: Tensor) -> list[Tensor]:
        d = self.node.describe()
        if x.rank not in (3, 4):
            raise ValueError(f"{d}: the input has shape {x.shape}; expected 3-D (batch, sequence, hidden) or 4-D "
                             "(batch, heads, sequence, head_size)")
        if cos.rank != 2 or sin.shape != cos.shape:
            raise ValueError(f"{d}: cos_cache {cos.shape} and sin_cache {sin.shape} must be 2-D of one shape")
        _same_dtype(self, x, cos_cache=cos, sin_cache=sin)
        if pos.dtype.kind not in "iu":
            raise ValueError(f"{d}: position_ids are {pos.dtype}; an integer tensor is expected")
        rd, heads = int(self.attr["rotary_embedding_dim"]), int(self.attr["num_heads"])
        batch, seq = x.shape[0], x.shape[2 if x.rank == 4 else 1]
        hidden = x.shape[1] * x.shape[3] if x.rank == 4 else x.shape[2]
        head = cos.shape[1] * 2 if rd == 0 else (hidden // heads if heads else 0)
        if x.rank == 3:
            n = heads or (hidden // head if head else 0)
            if not head or n * head != hidden:
                raise ValueError(f"{d}: a hidden size of {hidden} does not split into heads of {head} "
                                 f"(num_heads={heads}, cos_cache {cos.shape})")
        elif head != x.shape[3]:
            raise ValueError(f"{d}: the head size is {x.shape[3]}, but the caches {cos.shape} and attributes give "
                             f"{head}")
        rot = rd or head
        if rot > head or rot % 2:
            raise ValueError(f"{d}: rotary_embedding_dim {rot} must be even and at most the head size {head}")
        half = rot // 2
        if cos.shape[1] != half:
            raise self.fail(f"caches of {cos.shape[1]} columns for a rotary dim of {rot} (expected {half}) are not "
                            "supported")
        one = pos.size == 1 and pos.rank <= 1
        if not one and pos.shape != (batch, seq):
            raise ValueError(f"{d}: position_ids have shape {pos.shape}; expected (1,) or ({batch}, {seq})")
        if pos.is_const and pos.size and seq:
            ids = np.asarray(pos.value).reshape(-1)
            lo, hi = (int(ids[0]), int(ids[0]) + seq - 1) if one else (int(ids.min()), int(ids.max()))
            if lo < 0 or hi >= cos.shape[0]:
                raise ValueError(f"{d}: positions {lo}..{hi} are outside the caches' {cos.shape[0]} rows")
        # The 4-D layout the kernel works in: (batch, sequence, heads, head) for 3-D input, the input's own for 4-D.
        x4 = reshape_view(ctx, x, (batch, seq, hidden // head, head)) if x.rank == 3 else x
        seq_axis = 1 if x.rank == 3 else 2
        if one:
            pos = reshape_view(ctx, pos, (1,))
        y = kernel(ctx, self._expr(x4, pos, one, seq_axis, rot), [x4, pos, cos, sin], x.dtype, x4.shape)
        return [reshape_view(ctx, y, x.shape)]

    def _expr(self, x4: Tensor, pos: Tensor, one: bool, seq_axis: int, rot: int) -> Expr:
        xk, pk = kind_of(x4.dtype), kind_of(pos.dtype)
        c = [coord(i) for i in range(4)]
        i = c[3]
        half = rot // 2
        p = call("add", load(1, int_const(0), kind=pk), c[seq_axis]) if one else load(1, c[0], c[seq_axis], kind=pk)
        if pk != INT:
            p = call("to_int", p)
        if self.attr["interleaved"]:
            col = call("shr", i, int_const(1))
            partner = call("bitxor", i, int_const(1))
            first = call("eq", call("bitand", i, int_const(1)), int_const(0))
        else:
            first = call("lt", i, int_const(half))
            col = call("where", first, i, call("sub", i, int_const(half)))
            partner = call("where", first, call("add", i, int_const(half)), call("sub", i, int_const(half)))
        xi = load(0, *c, kind=xk)
        xj = load(0, c[0], c[1], c[2], partner, kind=xk)
        cos_v, sin_v = load(2, p, col, kind=xk), load(3, p, col, kind=xk)
        signed = call("where", first, call("neg", xj), xj)
        rotated = call("add", call("mul", xi, cos_v), call("mul", signed, sin_v))
        if rot == x4.shape[3]:
            return rotated
        return call("where", call("lt", i, int_const(rot)), rotated, xi)


@register("RotaryEmbedding", 23)
class OnnxRotaryEmbedding(RotaryEmbedding):
    """ONNX's RotaryEmbedding-23: inputs (X, cos_cache, sin_cache, position_ids?). With position ids the caches
    are (positions, rotary_dim / 2), as com.microsoft's; without, (batch, sequence, rotary_dim / 2) — read as one
    (batch * sequence)-row cache at position b * sequence + s. 4-D input is (batch, heads, sequence, head)."""

    arity = (3, 4)
    attrs: dict[str, Any] = {"interleaved": 0, "num_heads": 0, "rotary_embedding_dim": 0}

    def __init__(self, node: Node) -> None:
        _Contrib.__init__(self, node)
        if self.attr["interleaved"] not in (0, 1):
            raise self.fail(f"interleaved={self.attr['interleaved']} is not supported (0 or 1)")
        self.attr.update(scale=1.0, is_packed_batching=0)

    def run(self, ctx: Context, x: Tensor, cos: Tensor, sin: Tensor,  # type: ignore[override]
            pos: Tensor | None = None) -> list[Tensor]:
        if x.rank == 4:
            self.attr["num_heads"] = x.shape[1]
        elif x.rank == 3 and not self.attr["num_heads"]:
            raise ValueError(f"{self.node.describe()}: 3-D input needs the num_heads attribute")
        if pos is None:
            if cos.rank != 3 or sin.shape != cos.shape:
                raise ValueError(f"{self.node.describe()}: without position_ids the caches must be (batch, "
                                 f"sequence, rotary_dim / 2), got {cos.shape} and {sin.shape}")
            b, s, half = cos.shape
            cos, sin = reshape_view(ctx, cos, (b * s, half)), reshape_view(ctx, sin, (b * s, half))
            pos = ctx.const(np.arange(b * s, dtype=np.int64).reshape(b, s))
            if b == 1 and x.shape[0] > 1:  # one batch row's caches (torch.onnx's export of HF rotary) serve all
                pos = ctx.const(np.broadcast_to(np.arange(s, dtype=np.int64), (x.shape[0], s)).copy())
        return RotaryEmbedding.run(self, ctx, x, pos, cos, sin)
