"""The com.microsoft ops ONNX Runtime's transformer optimizer fuses BERT-style encoders into: EmbedLayerNormalization
(word + position + segment embeddings, LayerNorm, and the mask's per-row lengths) and Attention (one QKV
projection, multi-head attention with a mask in one of ONNX Runtime's formats, optional causal and past). Composed
from ember's Gather, fused LayerNorm and attention kernels; semantics and defaults as in ONNX Runtime's
ContribOperators (a masked key gets mask_filter_value, -10000, added to its score, as ONNX Runtime does).

Not supported (UnsupportedError naming the node): Attention's left-padding (2 * batch) and 3 * batch + 2 mask
index formats and 4-D masks, past and present sharing a buffer, do_rotary; EmbedLayerNormalization's
mask_index_type 0 ... other than the default.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..core.expr import call, const, inp
from ..core.view import View
from ..ir import Node
from .attention_onnx import concat_seq, split_heads
from .base import Context, Op, Tensor, call_op, register
from .contrib import MS, _Contrib, _hidden_vector, _wanted
from .elementwise import emit
from .normalization import normalize
from .reduce import reduce_axes
from .shape import copy_into, reshape_view, slice_view
from .transformer import affine, attention, fused_norm

INT = "int"


@register("EmbedLayerNormalization", 1, MS)
class EmbedLayerNormalization(_Contrib):
    f16 = True
    arity = (7, 9)
    max_outputs = 3
    attrs: ClassVar[dict[str, Any]] = {"epsilon": 1e-12, "mask_index_type": 1}

    def run(self, ctx: Context, ids: Tensor, segments: Tensor | None, word: Tensor, position: Tensor,
            segment: Tensor | None, gamma: Tensor, beta: Tensor, mask: Tensor | None = None,
            position_ids: Tensor | None = None) -> list[Tensor | None]:
        d = self.node.describe()
        if ids.rank != 2:
            raise ValueError(f"{d}: input_ids must be (batch, sequence), got {list(ids.shape)}")
        if self.attr["mask_index_type"] != 1:
            raise self.fail(f"mask_index_type {self.attr['mask_index_type']} is not supported (1: lengths)")
        b, s = ids.shape
        hidden = word.shape[1]
        for name, t in (("gamma", gamma), ("beta", beta)):
            _hidden_vector(self, name, t, hidden)
        total = call_op(ctx, self, "Gather", word, ids, axis=0, opset=17)[0]
        if segment is not None and segments is not None:
            seg = call_op(ctx, self, "Gather", segment, segments, axis=0, opset=17)[0]
            total = emit(ctx, self, call("add", inp(0), inp(1)), [total, seg], word.dtype)
        if position_ids is None:
            pos = slice_view(ctx, position, 0, 0, s)  # positions 0 .. S-1, one row per position
            pos = reshape_view(ctx, pos, (1, s, hidden))
        else:
            pos = call_op(ctx, self, "Gather", position, position_ids, axis=0, opset=17)[0]
            if pos.rank == 2:
                pos = reshape_view(ctx, pos, (1, *pos.shape))
        total = emit(ctx, self, call("add", inp(0), inp(1)), [total, pos], word.dtype)
        eps = float(self.attr["epsilon"])
        y = fused_norm(ctx, self, "layernorm", total, 2, gamma, beta, eps)
        if y is None:
            y = affine(ctx, self, normalize(ctx, self, total, [2], eps), gamma, beta)
        lengths = None
        if _wanted(self, 1):
            if mask is None:
                lengths = ctx.const(np.full(b, s, np.int32))
            else:  # the number of tokens each row attends to (right padding)
                lengths = reduce_axes(ctx, "sum", emit(ctx, self, call("ne", inp(0, INT), const(0, INT)), [mask],
                                                       np.dtype(np.int32)), [1])
        return [y, lengths, total if _wanted(self, 2) else None]


@register("Attention", 1, MS)
class MsAttention(_Contrib):
    f16 = True
    arity = (2, 7)
    max_outputs = 2
    attrs: ClassVar[dict[str, Any]] = {"num_heads": None, "unidirectional": 0, "qkv_hidden_sizes": None,
                                       "mask_filter_value": -10000.0, "scale": None, "do_rotary": 0,
                                       "past_present_share_buffer": 0, "rotary_embedding_dim": 0}

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        if not self.attr["num_heads"]:
            raise ValueError(f"{node.describe()}: the num_heads attribute is required")
        if self.attr["do_rotary"] or self.attr["past_present_share_buffer"]:
            raise self.fail("do_rotary and past_present_share_buffer are not supported")
        if len(node.inputs) > 6 and node.inputs[6]:
            raise self.fail("past_sequence_length (a shared past/present buffer) is not supported")

    def run(self, ctx: Context, x: Tensor, w: Tensor, bias: Tensor | None = None, mask: Tensor | None = None,
            past: Tensor | None = None, attn_bias: Tensor | None = None, *rest: Tensor | None) -> list[Tensor]:
        d = self.node.describe()
        heads = int(self.attr["num_heads"])
        if x.rank != 3 or w.rank != 2 or w.shape[0] != x.shape[2]:
            raise ValueError(f"{d}: input (batch, sequence, hidden) {list(x.shape)} and weights (hidden, q + k + v) "
                             f"{list(w.shape)} do not fit")
        b, s = x.shape[:2]
        sizes = self.attr["qkv_hidden_sizes"] or [w.shape[1] // 3] * 3
        if len(sizes) != 3 or sum(sizes) != w.shape[1] or any(n % heads for n in sizes) or sizes[0] != sizes[1]:
            raise ValueError(f"{d}: qkv_hidden_sizes {list(sizes)} must be three sizes (q = k) divisible by "
                             f"{heads} heads that add up to the weights' {w.shape[1]} columns")
        qkv = call_op(ctx, self, "MatMul", x, w, opset=17)[0]
        if bias is not None:
            qkv = emit(ctx, self, call("add", inp(0), inp(1)), [qkv, bias], x.dtype)
        q, k, v = (split_heads(ctx, slice_view(ctx, qkv, 2, lo, lo + n), heads) for lo, n in
                   ((0, sizes[0]), (sizes[0], sizes[1]), (sizes[0] + sizes[1], sizes[2])))
        p = 0
        if past is not None:
            if past.rank != 5 or past.shape[0] != 2 or past.shape[1] != b or past.shape[2] != heads:
                raise ValueError(f"{d}: past must be (2, batch, heads, past, head), got {list(past.shape)}")
            p = past.shape[3]
            k = concat_seq(ctx, reshape_view(ctx, slice_view(ctx, past, 0, 0, 1), past.shape[1:]), k)
            v = concat_seq(ctx, reshape_view(ctx, slice_view(ctx, past, 0, 1, 2), past.shape[1:]), v)
        t = p + s
        additive = additive_mask(ctx, self, mask, b, s, t, x.dtype)
        if attn_bias is not None:
            additive = attn_bias if additive is None else emit(ctx, self, call("add", inp(0), inp(1)),
                                                               [additive, attn_bias], x.dtype)
        scale = self.attr["scale"] if self.attr["scale"] is not None else 1.0 / float(np.sqrt(sizes[0] // heads))
        y = attention(ctx, self, q, k, v, additive, scale, bool(self.attr["unidirectional"]))
        dv = sizes[2] // heads
        moved = Tensor(y.dtype, (b, s, heads, dv), view=ctx.view(y).permute((0, 2, 1, 3)))
        out = [reshape_view(ctx, moved, (b, s, heads * dv))]
        if _wanted(self, 1):
            if k.shape[3] != v.shape[3]:
                raise self.fail("the present output with value heads of another size than the key's")
            present = ctx.new(x.dtype, (2, b, heads, t, k.shape[3]))
            st = present.view.strides
            for i, part in enumerate((k, v)):
                copy_into(ctx, ctx.view(part), View(present.view.handle, x.dtype, part.shape, st[1:], i * st[0]))
            out.append(present)
        return out


@register("MultiHeadAttention", 1, MS)
class MultiHeadAttention(_Contrib):
    """Multi-head attention over projected Q, K, V: (batch, sequence, heads * head) each, or K and V already in
    (batch, heads, kv_sequence, head) (a cross-attention cache); bias added to the three before the heads split;
    key_padding_mask as lengths (batch,) or raw (batch, kv); attention_bias; a past key/value concatenated in front
    (present = past ++ new). Packed QKV/KV inputs and cache_indirection are not supported."""

    f16 = True
    arity = (1, 10)
    max_outputs = 3
    attrs: ClassVar[dict[str, Any]] = {"num_heads": None, "mask_filter_value": -10000.0, "scale": None,
                                       "unidirectional": 0}

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        if not self.attr["num_heads"]:
            raise ValueError(f"{node.describe()}: the num_heads attribute is required")
        if len(node.inputs) < 3 or not node.inputs[1] or not node.inputs[2]:
            raise self.fail("packed QKV or KV (no separate key and value inputs) is not supported")
        if any(len(node.inputs) > i and node.inputs[i] for i in (8, 9)):
            raise self.fail("past_sequence_length / cache_indirection (shared buffers, beam search) are not supported")

    def run(self, ctx: Context, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None,
            mask: Tensor | None = None, attn_bias: Tensor | None = None, past_k: Tensor | None = None,
            past_v: Tensor | None = None, *rest: Tensor | None) -> list[Tensor | None]:
        d = self.node.describe()
        heads = int(self.attr["num_heads"])
        if q.rank != 3:
            raise ValueError(f"{d}: query must be (batch, sequence, hidden), got {list(q.shape)}")
        b, s, hq = q.shape
        head = hq // heads
        if bias is not None:
            if bias.rank != 1 or (k.rank == 3 and bias.shape[0] != hq + k.shape[2] + v.shape[2]):
                raise ValueError(f"{d}: bias must be 1-D (q + k + v hidden), got {list(bias.shape)}")
            q = emit(ctx, self, call("add", inp(0), inp(1)), [q, slice_view(ctx, bias, 0, 0, hq)], q.dtype)
        if k.rank == 3:
            if bias is not None:
                nk, nv = k.shape[2], v.shape[2]
                k = emit(ctx, self, call("add", inp(0), inp(1)), [k, slice_view(ctx, bias, 0, hq, hq + nk)], k.dtype)
                v = emit(ctx, self, call("add", inp(0), inp(1)), [v, slice_view(ctx, bias, 0, hq + nk, hq + nk + nv)],
                         v.dtype)
            k, v = split_heads(ctx, k, heads), split_heads(ctx, v, heads)
        elif k.rank != 4 or v.rank != 4 or k.shape[1] != heads:
            raise ValueError(f"{d}: key and value must be (batch, kv, hidden) or (batch, {heads}, kv, head), got "
                             f"{list(k.shape)} and {list(v.shape)}")
        q4 = split_heads(ctx, q, heads)
        if (past_k is None) != (past_v is None):
            raise ValueError(f"{d}: past_key and past_value must be given together")
        if past_k is not None and past_k.shape[2]:
            k, v = concat_seq(ctx, past_k, k), concat_seq(ctx, past_v, v)
        t = k.shape[2]
        additive = additive_mask(ctx, self, mask, b, s, t, q.dtype)
        if attn_bias is not None:
            additive = attn_bias if additive is None else emit(ctx, self, call("add", inp(0), inp(1)),
                                                               [additive, attn_bias], q.dtype)
        scale = self.attr["scale"] if self.attr["scale"] is not None else 1.0 / float(np.sqrt(head))
        y = attention(ctx, self, q4, k, v, additive, scale, bool(self.attr["unidirectional"]))
        dv = v.shape[3]
        moved = Tensor(y.dtype, (b, s, heads, dv), view=ctx.view(y).permute((0, 2, 1, 3)))
        return [reshape_view(ctx, moved, (b, s, heads * dv)), k if _wanted(self, 1) else None,
                v if _wanted(self, 2) else None]


def additive_mask(ctx: Context, op: Op, mask: Tensor | None, b: int, s: int, t: int, dt: np.dtype) -> Tensor | None:
    """The mask as an additive (batch, 1, S or 1, T) bias: lengths (batch,) -> keys at or past the length get
    mask_filter_value; a raw (batch, T) or (batch, S, T) mask of 1 = attend, 0 = masked likewise."""
    if mask is None:
        return None
    fill = float(op.attr["mask_filter_value"])
    if mask.rank == 1 and mask.shape[0] == b:
        j = ctx.const(np.arange(t, dtype=np.int64).reshape(1, 1, 1, t))
        ends = reshape_view(ctx, mask, (b, 1, 1, 1))
        return emit(ctx, op, call("where", call("lt", inp(0, INT), inp(1, INT)), const(0.0), const(fill)),
                    [j, ends], dt)
    if mask.rank in (2, 3) and mask.shape[0] == b and mask.shape[-1] == t:
        raw = reshape_view(ctx, mask, (b, 1, 1, t) if mask.rank == 2 else (b, 1, *mask.shape[1:]))
        kind = "bool" if mask.dtype == np.bool_ else INT if mask.dtype.kind in "iu" else "float"
        zero = const(False, "bool") if kind == "bool" else const(0, INT) if kind == INT else const(0.0)
        return emit(ctx, op, call("where", call("eq", inp(0, kind), zero), const(fill), const(0.0)), [raw], dt)
    raise op.fail(f"a mask_index of shape {list(mask.shape)} (left padding or 4-D masks) is not supported")
