"""com.microsoft GroupQueryAttention, what ONNX Runtime GenAI's model builder emits for every decoder layer: causal
grouped-query attention over (batch, sequence, heads * head_size) inputs (or one packed QKV input), a past
key/value in (batch, kv_heads, past, head_size) concatenated in front of the new one (present = past ++ new),
per-batch valid lengths (`seqlens_k` = total length - 1), rotary embedding inside (`do_rotary` with cos/sin
caches), a sliding window (`local_window_size`) and softcap. Composed from ember's own pieces: RotaryEmbedding,
the additive mask built from seqlens_k, and ONNX Attention's kernels (the fused one where the backend has it).
As ONNX Runtime lays it out, each batch entry's present holds its valid past (seqlens_k + 1 - S positions), the
new tokens right after, and zeros to the end.

Not supported (UnsupportedError naming the node): past and present sharing one max-length buffer, quantised KV
caches, head_sink / smooth_softmax, the output_qk output, position_ids and attention_bias inputs.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from ..core.expr import call, const, coord, load
from ..ir import Node
from .attention_onnx import Attention, split_heads
from .base import Context, Op, Tensor, host_ints, register
from .contrib import MS, RotaryEmbedding
from .exprs import kernel
from .shape import reshape_view, slice_view

INT = "int"


@register("GroupQueryAttention", 1, MS)
class GroupQueryAttention(Op):
    f16 = True
    # total_sequence_length is shape arithmetic (past + new), known while planning; a plan is keyed by it as by
    # the shapes it follows.
    host_inputs = (6,)
    attrs: ClassVar[dict[str, Any]] = {
        "num_heads": None, "kv_num_heads": None, "scale": None, "softcap": 0.0, "local_window_size": -1,
        "do_rotary": 0, "rotary_interleaved": 0, "smooth_softmax": -1, "qk_output": 0, "k_quant_type": "NONE",
        "v_quant_type": "NONE", "kv_cache_bit_width": None}

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        a = self.attr
        if not a["num_heads"] or not a["kv_num_heads"] or a["num_heads"] % a["kv_num_heads"]:
            raise ValueError(f"{node.describe()}: num_heads ({a['num_heads']}) must be a positive multiple of "
                             f"kv_num_heads ({a['kv_num_heads']})")
        if a["smooth_softmax"] not in (-1, 0) or a["qk_output"]:
            raise self.fail("smooth_softmax and the output_qk output are not supported")
        if a["k_quant_type"] != "NONE" or a["v_quant_type"] != "NONE" or a["kv_cache_bit_width"]:
            raise self.fail("quantised KV caches are not supported")
        if len(node.inputs) < 7 or not node.inputs[5] or not node.inputs[6]:
            raise ValueError(f"{node.describe()}: seqlens_k (input 5) and total_sequence_length (input 6) are "
                             "required")
        extra = [i for i in (9, 10, 11, 12, 13) if len(node.inputs) > i and node.inputs[i]]
        if extra:
            raise self.fail(f"inputs {extra} (position_ids, attention_bias, head_sink, KV scales) are not supported")
        if a["do_rotary"] and (len(node.inputs) < 9 or not node.inputs[7] or not node.inputs[8]):
            raise ValueError(f"{node.describe()}: do_rotary=1 needs cos_cache (input 7) and sin_cache (input 8)")

    def run(self, ctx: Context, q: Tensor, k: Tensor | None, v: Tensor | None, past_k: Tensor | None,
            past_v: Tensor | None, seqlens: Tensor, total: Tensor, cos: Tensor | None = None,
            sin: Tensor | None = None, *rest: Tensor | None) -> list[Tensor]:
        d = self.node.describe()
        hq, hkv = int(self.attr["num_heads"]), int(self.attr["kv_num_heads"])
        if q.rank != 3:
            raise ValueError(f"{d}: query must be (batch, sequence, hidden), got {list(q.shape)}")
        b, s = q.shape[0], q.shape[1]
        if k is None:  # packed QKV: (batch, sequence, (hq + 2 hkv) * head)
            head = q.shape[2] // (hq + 2 * hkv)
            if head * (hq + 2 * hkv) != q.shape[2]:
                raise ValueError(f"{d}: a packed QKV width of {q.shape[2]} does not split into {hq} + 2 x {hkv} heads")
            q, k, v = (slice_view(ctx, q, 2, lo * head, hi * head) for lo, hi in
                       ((0, hq), (hq, hq + hkv), (hq + hkv, hq + 2 * hkv)))
        assert v is not None
        head = q.shape[2] // hq
        if q.shape[2] != hq * head or k.shape[2] != hkv * head or v.shape[2] % hkv:
            raise ValueError(f"{d}: query {list(q.shape)}, key {list(k.shape)} and value {list(v.shape)} do not "
                             f"split into {hq} and {hkv} heads of one size")
        if seqlens.rank != 1 or seqlens.shape[0] != b or seqlens.dtype.kind not in "iu":
            raise ValueError(f"{d}: seqlens_k must be an integer (batch,) = ({b},) tensor, got {seqlens.dtype} "
                             f"{list(seqlens.shape)}")
        past = past_k.shape[2] if past_k is not None else 0
        if (past_k is None) != (past_v is None):
            raise ValueError(f"{d}: past_key and past_value must be given together")
        t = int(host_ints(self, total, "total_sequence_length")[0])
        if past and t <= past:
            raise self.fail(f"past ({past}) and present share one max-length buffer (total_sequence_length {t}): "
                            "not supported; export with a growing cache")
        if t != past + s:
            raise ValueError(f"{d}: total_sequence_length is {t}, but past ({past}) + new ({s}) = {past + s}")
        if self.attr["do_rotary"]:
            assert cos is not None and sin is not None
            pos = self._positions(ctx, seqlens, b, s, past)
            q = self._rotate(ctx, q, pos, cos, sin, hq)
            k = self._rotate(ctx, k, pos, cos, sin, hkv)
        dv = v.shape[2] // hkv
        q4 = split_heads(ctx, q, hq)
        k_new = reshape_view(ctx, k, (b, s, hkv, head))
        v_new = reshape_view(ctx, v, (b, s, hkv, dv))
        if past == 0:  # no past, or an empty one: the present is the new key/value
            present_k, present_v = self._moved(ctx, k_new), self._moved(ctx, v_new)
        else:
            present_k = self._present(ctx, past_k, k_new, seqlens, s)
            present_v = self._present(ctx, past_v, v_new, seqlens, s)
        mask = self._mask(ctx, seqlens, b, s, past + s, past, q.dtype)
        att = Attention(Node("Attention", "", ["q", "k", "v", "mask"], ["y"],
                             {"scale": self.attr["scale"], "softcap": float(self.attr["softcap"] or 0.0)},
                             self.node.name + "/attention", 23))
        y = att.run(ctx, q4, present_k, present_v, mask)[0]
        moved = Tensor(y.dtype, (b, s, hq, dv), view=ctx.view(y).permute((0, 2, 1, 3)))
        return [reshape_view(ctx, moved, (b, s, hq * dv)), present_k, present_v]

    def _moved(self, ctx: Context, t: Tensor) -> Tensor:
        """(batch, sequence, heads, head) -> (batch, heads, sequence, head), a view."""
        b, s, h, d = t.shape
        return Tensor(t.dtype, (b, h, s, d), view=ctx.view(t).permute((0, 2, 1, 3)))

    def _present(self, ctx: Context, past: Tensor, new: Tensor, seqlens: Tensor, s: int) -> Tensor:
        """ONNX Runtime's layout of the present key/value: each batch entry's valid past (its first
        seqlens_k + 1 - S positions), then the new tokens, then zeros up to past + S."""
        b, h, p, d = past.shape
        if past.dtype != new.dtype:
            raise ValueError(f"{self.node.describe()}: the past cache is {past.dtype}, the new key/value {new.dtype}")
        c = [coord(i) for i in range(4)]
        valid = call("add", load(2, c[0], kind=INT), const(1 - s, INT))  # the entry's valid past length
        jn = call("sub", c[2], valid)
        in_new = call("and", call("ge", jn, const(0, INT)), call("lt", jn, const(s, INT)))
        expr = call("where", call("lt", c[2], valid), load(0, c[0], c[1], c[2], c[3]),
                    call("where", in_new, load(1, c[0], jn, c[1], c[3]), const(0.0)))
        return kernel(ctx, expr, [past, new, seqlens], past.dtype, (b, h, p + s, d))

    def _positions(self, ctx: Context, seqlens: Tensor, b: int, s: int, past: int) -> Tensor:
        """Each new token's position: 0.. on the first prompt (no past), else after the batch entry's valid past
        (seqlens_k + 1 - S + i). From coordinates, not constants, so a template's plans share the kernel."""
        i = coord(1)
        expr = i if past == 0 else call("add", call("add", load(0, coord(0), kind=INT), const(1 - s, INT)), i)
        return kernel(ctx, expr, [seqlens], np.dtype(np.int64), (b, s))

    def _rotate(self, ctx: Context, x: Tensor, pos: Tensor, cos: Tensor, sin: Tensor, heads: int) -> Tensor:
        node = Node("RotaryEmbedding", MS, ["x", "pos", "cos", "sin"], ["y"],
                    {"interleaved": int(self.attr["rotary_interleaved"]), "num_heads": heads},
                    self.node.name + "/rotary", 1)
        return RotaryEmbedding(node).run(ctx, x, pos, cos, sin)[0]

    def _mask(self, ctx: Context, seqlens: Tensor, b: int, s: int, total: int, past: int, dt: np.dtype) -> Tensor:
        """0 where query i of batch entry n may see key j, -inf elsewhere: j at or before the query's position
        (causal, by the entry's own length) and within the entry's valid keys (j <= seqlens_k), and within the
        last local_window_size keys when a window is set. (b, 1, S, total), from coordinates."""
        n, i, j = coord(0), coord(2), coord(3)
        sk = load(0, n, kind=INT)
        # The query's position: i on the first prompt, seqlens_k + 1 - S + i after a past.
        qpos = i if past == 0 else call("add", call("add", sk, const(1 - s, INT)), i)
        allowed = call("and", call("le", j, qpos), call("le", j, sk))
        window = int(self.attr["local_window_size"])
        if window > 0:
            allowed = call("and", allowed, call("gt", j, call("sub", qpos, const(window, INT))))
        return kernel(ctx, call("where", allowed, const(0.0), const(-math.inf)), [seqlens], dt, (b, 1, s, total))
