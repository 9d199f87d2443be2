"""The public ComputeBackend calls: gemm, conv2d_forward, attention, reduce, unary, binary.

Each validates its arguments (a ValueError naming the argument), then records its steps through the record
methods every backend provides, prepared once per call signature and replayed after (api_cache.py). ComputeBackend
(base.py) takes these from `PublicOps`; the methods they use (`_require_init`, `_need`, `_api_cache`, the record
methods) are ComputeBackend's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.expr import call, inp
from ..core.view import View
from .api_types import BinaryOp, ReduceOp, UnaryOp, as_enum, check_dim, check_pair, check_shape

f32 = np.dtype(np.float32)  # the public ops' element type


class PublicOps:
    """The public calls over float32 buffers, as a mixin of ComputeBackend."""

    # ---- compute ----------------------------------------------------------------------------------
    def gemm(self, trans_a: bool, trans_b: bool, m: int, n: int, k: int, alpha: float, a: int, lda: int,
             b: int, ldb: int, beta: float, c: int, ldc: int) -> None:
        """C = alpha op(A) op(B) + beta C on float32 row-major matrices (BLAS-style leading dimensions); op
        transposes where `trans_a` / `trans_b`."""
        self._require_init()
        m, n, k = check_dim(m, "m"), check_dim(n, "n"), check_dim(k, "k")
        a_rows, a_cols = (k, m) if trans_a else (m, k)
        b_rows, b_cols = (n, k) if trans_b else (k, n)
        lda = check_dim(lda, "lda", minimum=a_cols)
        ldb = check_dim(ldb, "ldb", minimum=b_cols)
        ldc = check_dim(ldc, "ldc", minimum=n)
        self._need(a, "a", (a_rows - 1) * lda + a_cols)
        self._need(b, "b", (b_rows - 1) * ldb + b_cols)
        self._need(c, "c", (m - 1) * ldc + n)
        alpha, beta = float(alpha), float(beta)
        if not (math.isfinite(alpha) and math.isfinite(beta)):
            raise ValueError(f"alpha and beta must be finite, got alpha={alpha}, beta={beta}")
        ta, tb = bool(trans_a), bool(trans_b)
        key = ("gemm", ta, tb, m, n, k, alpha, math.copysign(1.0, alpha), a, lda, b, ldb, beta,
               math.copysign(1.0, beta), c, ldc, self._api_context(True))
        self._api_cache.run(self, key, (a, b, c),
                            lambda: self.record_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))

    def conv2d_forward(self, input: int, input_shape: Sequence[int], filter: int, filter_shape: Sequence[int],
                       output: int, output_shape: Sequence[int], stride: Any = (1, 1),
                       padding: Any = (0, 0)) -> None:
        """2-D convolution of float32 NCHW `input` with a KCRS `filter` into NKPQ `output` (shapes checked
        against stride and padding)."""
        self._require_init()
        n, c, h, w = check_shape(input_shape, "input_shape", 4)
        kk, fc, r, s = check_shape(filter_shape, "filter_shape", 4)
        sh, sw = check_pair(stride, "stride", minimum=1)
        ph, pw = check_pair(padding, "padding", minimum=0)
        if fc != c:
            raise ValueError(f"filter_shape: {fc} input channels, but input_shape has C={c}")
        p, q = (h + 2 * ph - r) // sh + 1, (w + 2 * pw - s) // sw + 1
        if h + 2 * ph < r or w + 2 * pw < s:
            raise ValueError(f"filter {r}x{s} is larger than the padded input {h + 2 * ph}x{w + 2 * pw}")
        out = check_shape(output_shape, "output_shape", 4)
        if out != (n, kk, p, q):
            raise ValueError(f"output_shape: expected {(n, kk, p, q)} for this input, filter, stride and "
                             f"padding, got {out}")
        self._need(input, "input", n * c * h * w)
        self._need(filter, "filter", kk * c * r * s)
        self._need(output, "output", n * kk * p * q)
        key = ("conv2d", input, (n, c, h, w), filter, (kk, r, s), output, sh, sw, ph, pw, self._api_context(True))
        self._api_cache.run(self, key, (input, filter, output), lambda: self.record_conv2d(
            input, (n, c, h, w), filter, (kk, c, r, s), output, (n, kk, p, q), (sh, sw), (ph, pw)))

    def attention(self, q: int, k: int, v: int, o: int, batch: int, heads: int, seq_q: int, seq_kv: int,
                  head_dim: int, scale: float, causal: bool = False) -> None:
        """o = softmax(scale q kᵀ) v per batch and head over float32 (batch, heads, seq, head_dim) buffers; `causal`
        masks keys j > i + seq_kv - seq_q (bottom-right aligned)."""
        self._require_init()
        batch, heads = check_dim(batch, "batch"), check_dim(heads, "heads")
        seq_q, seq_kv = check_dim(seq_q, "seq_q"), check_dim(seq_kv, "seq_kv")
        head_dim = check_dim(head_dim, "head_dim")
        scale = float(scale)
        if not math.isfinite(scale):
            raise ValueError(f"scale must be finite, got {scale}")
        self._need(q, "q", batch * heads * seq_q * head_dim)
        self._need(k, "k", batch * heads * seq_kv * head_dim)
        self._need(v, "v", batch * heads * seq_kv * head_dim)
        self._need(o, "o", batch * heads * seq_q * head_dim)
        causal = bool(causal)
        key = ("attention", q, k, v, o, batch, heads, seq_q, seq_kv, head_dim, scale, math.copysign(1.0, scale),
               causal, self._api_context(True))
        self._api_cache.run(self, key, (q, k, v, o), lambda: self.record_attention(
            q, k, v, o, batch, heads, seq_q, seq_kv, head_dim, scale, causal))

    def reduce(self, op: Any, input: int, output: int, shape: Sequence[int], axis: int) -> None:
        """Reduce a float32 tensor of `shape` along `axis` with a ReduceOp (or its name: "sum", "max", ...)."""
        self._require_init()
        op = as_enum(ReduceOp, op, "op")
        shape = check_shape(shape, "shape")
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -len(shape) <= axis < len(shape):
            raise ValueError(f"axis: {axis!r} is out of range for a {len(shape)}-D shape")
        axis = int(axis) % len(shape)
        total = math.prod(shape)
        self._need(input, "input", total)
        self._need(output, "output", total // shape[axis])
        outer, r, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
        self._api_cache.run(self, ("reduce", op.value, input, output, outer, r, inner, self._api_context(False)),
                            (input, output), lambda: self.record_reduce(op, input, output, outer, r, inner))

    def unary(self, op: Any, input: int, output: int, n: int) -> None:
        """Apply a UnaryOp (or its name) to `n` float32 elements."""
        self._require_init()
        op = as_enum(UnaryOp, op, "op")
        n = check_dim(n, "n")
        self._need(input, "input", n)
        self._need(output, "output", n)
        self._api_cache.run(self, ("unary", op.value, input, output, n, self._api_context(False)), (input, output),
                            lambda: self.record_unary(op, input, output, n))

    def binary(self, op: Any, a: int, b: int, output: int, n: int) -> None:
        """Apply a BinaryOp (or its name) elementwise to `n` float32 elements of `a` and `b`."""
        self._require_init()
        op = as_enum(BinaryOp, op, "op")
        n = check_dim(n, "n")
        self._need(a, "a", n)
        self._need(b, "b", n)
        self._need(output, "output", n)
        self._api_cache.run(self, ("binary", op.value, a, b, output, n, self._api_context(False)), (a, b, output),
                            lambda: self.record_binary(op, a, b, output, n))

    # Record methods take validated arguments and return a list of steps; nothing runs until execute().
    # The public ops are special cases of the runtime's general primitives below.
    def record_gemm(self, trans_a: bool, trans_b: bool, m: int, n: int, k: int, alpha: float, a: int,
                    lda: int, b: int, ldb: int, beta: float, c: int, ldc: int) -> list:
        """gemm()'s steps (arguments already checked), as a matmul over strided Views."""
        av = View(a, f32, (1, m, k), (0, 1, lda) if trans_a else (0, lda, 1))
        bv = View(b, f32, (1, k, n), (0, 1, ldb) if trans_b else (0, ldb, 1))
        cv = View(c, f32, (1, m, n), (0, ldc, 1))
        return self.record_matmul(av, bv, cv, alpha=alpha, bias=cv if beta != 0.0 else None, beta=beta)

    def record_conv2d(self, input: int, input_shape: tuple, filter: int, filter_shape: tuple, output: int,
                      output_shape: tuple, stride: tuple, padding: tuple) -> list:
        """conv2d_forward()'s steps (arguments already checked), through record_conv."""
        return self.record_conv(View.contiguous(input, f32, input_shape), View.contiguous(filter, f32, filter_shape),
                                None, View.contiguous(output, f32, output_shape), stride,
                                (padding[0], padding[1], padding[0], padding[1]), (1, 1), 1)

    def record_attention(self, q: int, k: int, v: int, o: int, batch: int, heads: int, seq_q: int,
                         seq_kv: int, head_dim: int, scale: float, causal: bool) -> list:
        """attention()'s steps (arguments already checked), through record_attention_views."""
        qs, kvs = (batch, heads, seq_q, head_dim), (batch, heads, seq_kv, head_dim)
        return self.record_attention_views(View.contiguous(q, f32, qs), View.contiguous(k, f32, kvs),
                                           View.contiguous(v, f32, kvs), None, View.contiguous(o, f32, qs),
                                           scale, causal)

    def record_reduce(self, op: ReduceOp, input: int, output: int, outer: int, r: int, inner: int) -> list:
        """reduce()'s steps: the middle axis of (outer, r, inner), through record_reduce_axes."""
        x = View(input, f32, (outer, inner, r), (r * inner, 1, inner))
        return self.record_reduce_axes(op.value, x, View.contiguous(output, f32, (outer, inner)), 1)

    def record_unary(self, op: UnaryOp, input: int, output: int, n: int) -> list:
        """unary()'s steps, as a one-call elementwise expression."""
        return self.record_elementwise(call(op.value, inp(0)), [View.contiguous(input, f32, (n,))],
                                       View.contiguous(output, f32, (n,)))

    def record_binary(self, op: BinaryOp, a: int, b: int, output: int, n: int) -> list:
        """binary()'s steps, as a one-call elementwise expression."""
        return self.record_elementwise(call(op.value, inp(0), inp(1)),
                                       [View.contiguous(a, f32, (n,)), View.contiguous(b, f32, (n,))],
                                       View.contiguous(output, f32, (n,)))
