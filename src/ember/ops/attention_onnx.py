"""ONNX Attention (opsets 23-25): 4-D (B, H, S, D) or 3-D (B, S, H*D) inputs, boolean or additive mask, causal,
grouped-query heads, past key/value concatenated in front; softcap, the qk_matmul_output output, an external
cache's nonpad_kv_seqlen and sliding windows (left/right_window_size) by the reference's rules (onnx.reference's
op_attention: softcap before the mask, a row that no key may attend gives zeros, decided on the mask).

The common case runs transformer.attention (the fused kernel where the backend has it); what only the explicit
chain can give (a softcap, the scores as an output, per-batch frontiers) runs as scores GEMM -> elementwise ->
softmax -> GEMM.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.expr import call, const, inp
from ..core.view import View
from .base import Context, Op, Tensor, register
from .elementwise import emit
from .reduce import reduce_axes
from .shape import copy_into, reshape_view
from .transformer import attention, expand_kv_heads, softmax

NEG_INF = -math.inf
INT = "int"


@register("Attention", 23)
class Attention(Op):
    f16 = True

    attrs = {"is_causal": 0, "kv_num_heads": None, "q_num_heads": None, "qk_matmul_output_mode": 0, "scale": None,
             "softcap": 0.0, "softmax_precision": None, "left_window_size": -1, "right_window_size": -1}

    def run(self, ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
            past_k: Tensor | None = None, past_v: Tensor | None = None,
            nonpad: Tensor | None = None) -> list[Tensor]:
        outs = list(self.node.outputs)
        want_qk = len(outs) > 3 and bool(outs[3])
        mode = int(self.attr["qk_matmul_output_mode"])
        if mode not in (0, 1, 2, 3):
            raise self.fail(f"qk_matmul_output_mode {mode} is not one of 0, 1, 2, 3")
        softcap = float(self.attr["softcap"] or 0.0)
        left, right = int(self.attr["left_window_size"]), int(self.attr["right_window_size"])
        if (past_k is None) != (past_v is None):
            raise ValueError(f"{self.node.describe()}: past_key and past_value must be given together")
        if nonpad is not None and past_k is not None:
            raise ValueError(f"{self.node.describe()}: nonpad_kv_seqlen cannot be combined with past key/value")
        three_d = q.rank == 3
        if three_d:
            hq, hkv = self.attr["q_num_heads"], self.attr["kv_num_heads"]
            if not hq or not hkv:
                raise ValueError(f"{self.node.describe()}: 3-D inputs need q_num_heads and kv_num_heads")
            q = split_heads(ctx, q, hq)
            k, v = split_heads(ctx, k, hkv), split_heads(ctx, v, hkv)
        elif q.rank != 4 or k.rank != 4 or v.rank != 4:
            raise ValueError(f"{self.node.describe()}: Q, K and V must all be 3-D or all 4-D, got ranks "
                             f"{q.rank}, {k.rank}, {v.rank}")
        past = past_k.shape[2] if past_k is not None else 0
        if past_k is not None:
            k = concat_seq(ctx, past_k, k)
            v = concat_seq(ctx, past_v, v)
        scale = self.attr["scale"] if self.attr["scale"] is not None else 1.0 / math.sqrt(q.shape[3])
        if mask is not None and mask.shape[-1] < k.shape[2]:  # a mask shorter than the keys pads with -inf
            raise self.fail("an attention mask shorter than the key sequence is not supported")
        causal = bool(self.attr["is_causal"])
        sq, skv = q.shape[2], k.shape[2]
        if want_qk or softcap or nonpad is not None or left >= 0 or right >= 0:
            y, qk = self._explicit(ctx, q, k, v, mask, past, nonpad, causal, scale, softcap, left, right, mode)
        else:
            if causal and past != skv - sq:
                # ONNX aligns the causal frontier at the past length (top-left without a cache); the kernel's flag
                # is bottom-right aligned, so other alignments become an additive mask.
                mask = self._add(ctx, self._as_bias(ctx, mask, q.dtype), self._frontier(ctx, sq, skv, past, q.dtype))
                causal = False
            y, qk = attention(ctx, self, q, k, v, mask, scale, causal), None
        if three_d:
            b, h, s, dv = y.shape
            moved = Tensor(y.dtype, (b, s, h, dv), view=ctx.view(y).permute((0, 2, 1, 3)))
            y = reshape_view(ctx, moved, (b, s, h * dv))
        result: list[Tensor | None] = [y]
        if len(outs) > 1:
            result += [k, v]
        if want_qk:
            result.append(qk)
        return result  # type: ignore[return-value]

    # ---- the explicit chain --------------------------------------------------------------------------------
    def _explicit(self, ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, past: int,
                  nonpad: Tensor | None, causal: bool, scale: float, softcap: float, left: int, right: int,
                  mode: int) -> tuple[Tensor, Tensor]:
        b, hq, sq, d = q.shape
        skv, dv, dt = k.shape[2], v.shape[3], q.dtype
        ctx.count("attention.gemm")
        bias = self._as_bias(ctx, mask, dt)
        # Where each query's frontier sits: the past length (internal cache), else the valid keys before the
        # block per batch (an external cache's nonpad_kv_seqlen - S), else 0.
        offset = self._offsets(ctx, nonpad, sq, b) if nonpad is not None else None
        if causal:
            bias = self._add(ctx, bias, self._frontier(ctx, sq, skv, past, dt) if offset is None else
                             self._window_mask(ctx, sq, skv, offset, dt, -1, 0))
        if left >= 0 or right >= 0:
            bias = self._add(ctx, bias, self._window_mask(ctx, sq, skv, offset if offset is not None else past, dt,
                                                          left, right))
        if nonpad is not None:
            j = ctx.const(np.arange(skv, dtype=np.int64).reshape(1, 1, 1, skv))
            pad = emit(ctx, self, call("where", call("lt", inp(0, INT), inp(1, INT)), const(0.0), const(NEG_INF)),
                       [j, self._per_batch(ctx, nonpad, b)], dt)
            bias = self._add(ctx, bias, pad)
        kk, vv = expand_kv_heads(ctx, k, v, hq)
        scores = ctx.new(dt, (b, hq, sq, skv))
        q3 = ctx.contiguous(q).merged((b * hq, sq, d))
        ctx.record(ctx.backend.record_matmul(q3, kk.merged((b * hq, skv, d)).permute((0, 2, 1)),
                                             scores.view.merged((b * hq, sq, skv)), alpha=float(scale)))
        s: Tensor = scores
        if softcap > 0:  # before the mask, so a masked -inf stays -inf
            s = emit(ctx, self, call("mul", call("tanh", call("div", inp(0), const(softcap))), const(softcap)), [s],
                     dt)
        qk = s
        if bias is not None:
            s = emit(ctx, self, call("add", inp(0), inp(1)), [s, bias], dt)
            if mode == 2:
                qk = s
        p = softmax(ctx, self, s, 3, False)
        if bias is not None:
            # A row no key may attend (its mask all -inf) gives zeros, decided on the mask, not on the scores.
            rows = reduce_axes(ctx, "max", self._full(ctx, bias, (b, hq, sq, skv)), [3])
            rows = reshape_view(ctx, rows, (b, hq, sq, 1))
            p = emit(ctx, self, call("where", call("isneginf", inp(1)), const(0.0), inp(0)), [p, rows], dt)
        if mode == 3:
            qk = p
        out = ctx.new(dt, (b, hq, sq, dv))
        p3 = ctx.contiguous(p).merged((b * hq, sq, skv))
        ctx.record(ctx.backend.record_matmul(p3, vv.merged((b * hq, skv, dv)), out.view.merged((b * hq, sq, dv))))
        return out, qk

    def _offsets(self, ctx: Context, nonpad: Tensor, sq: int, b: int) -> Tensor:
        if nonpad.rank != 1 or nonpad.shape[0] != b:
            raise ValueError(f"{self.node.describe()}: nonpad_kv_seqlen must be [batch] = [{b}], got "
                             f"{list(nonpad.shape)}")
        return emit(ctx, self, call("sub", inp(0, INT), const(sq, INT)), [self._per_batch(ctx, nonpad, b)],
                    nonpad.dtype)

    def _per_batch(self, ctx: Context, t: Tensor, b: int) -> Tensor:
        return reshape_view(ctx, t, (b, 1, 1, 1))

    def _window_mask(self, ctx: Context, sq: int, skv: int, offset: int | Tensor, dt: np.dtype, left: int,
                     right: int) -> Tensor:
        """0 where query i (at position offset + i) may see key j, -inf elsewhere: j <= p + right (right -1:
        unbounded) and j >= p - left (left -1: unbounded). Causal is left -1, right 0."""
        i = np.arange(sq, dtype=np.int64).reshape(sq, 1)
        j = np.arange(skv, dtype=np.int64).reshape(1, skv)
        if isinstance(offset, int):
            diff = i + offset - j
            allowed = np.ones(diff.shape, bool)
            if left >= 0:
                allowed &= diff <= left
            if right >= 0:
                allowed &= -diff <= right
            return ctx.const(np.where(allowed, 0.0, NEG_INF).astype(dt))
        diff_t = ctx.const((i - j).reshape(1, 1, sq, skv))  # i - j, plus each batch's offset below
        cond = None
        if left >= 0:
            cond = call("le", call("add", inp(0, INT), inp(1, INT)), const(left, INT))
        if right >= 0:
            c = call("le", call("neg", call("add", inp(0, INT), inp(1, INT))), const(right, INT))
            cond = c if cond is None else call("and", cond, c)
        assert cond is not None
        return emit(ctx, self, call("where", cond, const(0.0), const(NEG_INF)), [diff_t, offset], dt)

    def _frontier(self, ctx: Context, sq: int, skv: int, past: int, dt: np.dtype) -> Tensor:
        i, j = np.arange(sq)[:, None], np.arange(skv)[None, :]
        return ctx.const(np.where(j <= i + past, 0.0, NEG_INF).astype(dt))

    def _as_bias(self, ctx: Context, mask: Tensor | None, dt: np.dtype) -> Tensor | None:
        if mask is not None and mask.dtype == np.bool_:  # True = attend
            return emit(ctx, self, call("where", inp(0, "bool"), const(0.0), const(NEG_INF)), [mask], dt)
        return mask

    def _add(self, ctx: Context, a: Tensor | None, b: Tensor | None) -> Tensor | None:
        if a is None or b is None:
            return a if b is None else b
        return emit(ctx, self, call("add", inp(0), inp(1)), [a, b], a.dtype)

    def _full(self, ctx: Context, t: Tensor, shape: tuple[int, ...]) -> Tensor:
        return Tensor(t.dtype, shape, view=ctx.view(t).broadcast_to(shape))


def split_heads(ctx: Context, t: Tensor, heads: int) -> Tensor:
    """(batch, sequence, heads * head) -> (batch, heads, sequence, head), a view."""
    b, s, hd = t.shape
    split = reshape_view(ctx, t, (b, s, heads, hd // heads))
    return Tensor(t.dtype, (b, heads, s, hd // heads), view=ctx.view(split).permute((0, 2, 1, 3)))


def concat_seq(ctx: Context, past: Tensor, new: Tensor) -> Tensor:
    """past ++ new along the sequence axis of (batch, heads, sequence, head) tensors (the present key/value)."""
    shape = past.shape[:2] + (past.shape[2] + new.shape[2],) + past.shape[3:]
    out = ctx.new(new.dtype, shape)
    st = out.view.strides
    if past.size:
        copy_into(ctx, ctx.view(past), View(out.view.handle, out.dtype, past.shape, st, 0))
    copy_into(ctx, ctx.view(new), View(out.view.handle, out.dtype, new.shape, st, past.shape[2] * st[2]))
    return out
