"""LinearAttention: the linear / gated / delta attention recurrence, unrolled over the
sequence."""

from __future__ import annotations

import math

import numpy as np

from ..core.expr import call, inp
from ..core.view import View
from .base import Context, Op, Tensor, call_op, register
from .elementwise import emit
from .exprs import float_const
from .shape import copy_into


@register("LinearAttention", 27)
class LinearAttention(Op):
    """The recurrence unrolled over the (static) sequence: per step, the state (B, H_kv, d_k, d_v) decays
    (gated), takes the delta-corrected outer product k v^T, and is read by q (grouped query heads share
    their KV head's state). Each step is two small MatMuls and fused elementwise kernels."""

    attrs = {"chunk_size": None, "kv_num_heads": None, "q_num_heads": None, "scale": None,
             "update_rule": "gated_delta"}

    def run(self, ctx: Context, q: Tensor, k: Tensor, v: Tensor, past: Tensor | None = None,
            decay: Tensor | None = None, beta: Tensor | None = None) -> list[Tensor]:
        rule = self.attr["update_rule"]
        hq, hkv = self.attr["q_num_heads"], self.attr["kv_num_heads"]
        if rule not in ("linear", "gated", "delta", "gated_delta") or not hq or not hkv or hq % hkv:
            raise self.fail(f"update_rule {rule!r} with {hq} query / {hkv} KV heads is not supported")
        gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
        if (decay is None) == gating or (beta is None) == delta:
            raise ValueError(f"{self.node.describe()}: decay/beta inputs do not match update_rule {rule!r}")
        b, t = q.shape[:2]
        dk, dv, grp = q.shape[2] // hq, v.shape[2] // hkv, hq // hkv
        scale = self.attr["scale"] or 1.0 / math.sqrt(dk)
        f32, q_dtype = np.dtype(np.float32), q.dtype
        # The recurrence runs in float32 whatever the activations' type (as onnx.reference).
        q, k, v, decay, beta = (x if x is None or x.dtype == f32 else emit(ctx, self, inp(0), [x], f32)
                                for x in (q, k, v, decay, beta))
        qc, kc, vc = (ctx.contiguous(x) for x in (q, k, v))

        def at(base: View, step: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype) -> Tensor:
            """A per-step window (batch stride: the whole sequence) of a (B, T, ...) tensor."""
            row = base.size // b
            off = base.offset + step * (row // t)
            return Tensor(dtype, shape, view=View(base.handle, dtype, shape, (row, *strides), off))

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
            copy_into(ctx, ctx.view(emit(ctx, self, call("mul", inp(0), float_const(scale)), [o], f32)), dst)
        present_dtype = past.dtype if past is not None else q_dtype
        if state.dtype != present_dtype or state.is_const:
            state = emit(ctx, self, inp(0), [state], present_dtype)
        return [out if q_dtype == f32 else emit(ctx, self, inp(0), [out], q_dtype), state]
