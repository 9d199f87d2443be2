"""MatMulNBits (com.microsoft): a MatMul whose weight is block-quantised to 2, 4 or 8 bits, as ONNX Runtime GenAI's
model builder, onnxruntime.quantization's MatMulNBitsQuantizer and transformers.js' q4 exports write it.

    Y[..., n] = sum_k A[..., k] * (code(n, k) - zero(n, b)) * scale(n, b) + bias[n],   b = k // block_size

(b = g_idx[k] with the deprecated act-order input). B is uint8 (N, n_blocks, blob_size), blob_size = block_size *
bits / 8, codes packed low-first along K; the last block is padded past K. scales are (N * n_blocks) or
(N, n_blocks) in A's dtype; zero_points are uint8 codes packed the same way per column (N * ceil(n_blocks * bits /
8) bytes) or floats like the scales; absent, the zero point is 2^(bits - 1).

The weight stays packed on the device: B's bytes are handed to the backend as int32 words (N, n_blocks * blob_size /
4) — a block's blob is a whole number of words, since block_size >= 16 — and record_matmul_nbits dequantises it
inside its kernel. Packed uint8 zero points are unpacked here, once, to floats (N, n_blocks) in A's dtype: one
value a block, as the scales are. B and uint8 zero points must therefore be constants (initializers, as every
exporter writes them); the scales, float zero points, g_idx and bias may be computed.

One difference from ONNX Runtime's CPU kernel (1.32): with g_idx and uint8 zero points it ignores the zero points
(dequantises around 8); ember applies them, as the operator's definition says.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.view import View
from .base import Context, Tensor, UnsupportedError, register
from .contrib import MS, _Contrib

BITS = (2, 4, 8)


def unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first `count` codes of each row of uint8 `packed` (rows, bytes), low bits first: (rows, count) uint8."""
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    codes = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(packed.shape[0], -1)[:, :count]


@register("MatMulNBits", 1, MS)
class MatMulNBits(_Contrib):
    arity = (3, 6)
    f16 = True  # both backends' kernels take float16 A / scales / output (computing in float32)
    attrs = {"K": None, "N": None, "bits": 4, "block_size": None, "accuracy_level": 0}

    def __init__(self, node: Any) -> None:
        super().__init__(node)
        missing = [name for name in ("K", "N", "block_size") if self.attr[name] is None]
        if missing:
            raise ValueError(f"{node.describe()}: required attribute(s) {missing} missing")
        self.k, self.n = int(self.attr["K"]), int(self.attr["N"])
        self.bits, self.block = int(self.attr["bits"]), int(self.attr["block_size"])
        if self.bits not in BITS:
            raise UnsupportedError(f"{node.describe()}: bits={self.bits} is not supported (2, 4 and 8 are, as in "
                                   "ONNX Runtime)")
        if self.block < 16 or self.block & (self.block - 1):
            raise ValueError(f"{node.describe()}: block_size={self.block}; it must be a power of 2, at least 16")
        if self.k < 1 or self.n < 1:
            raise ValueError(f"{node.describe()}: K={self.k}, N={self.n}; both must be at least 1")
        self.n_blocks = -(-self.k // self.block)
        self.blob = self.block * self.bits // 8

    def _bad(self, what: str) -> ValueError:
        return ValueError(f"{self.node.describe()}: {what} (K={self.k}, N={self.n}, bits={self.bits}, "
                          f"block_size={self.block}: {self.n_blocks} block(s) a column of {self.blob} bytes each)")

    def _check(self, a: Tensor, b: Tensor, scales: Tensor, zp: Tensor | None, g_idx: Tensor | None,
               bias: Tensor | None) -> None:
        n, nb = self.n, self.n_blocks
        if a.dtype not in (np.float32, np.float16):
            raise self.fail(f"input A is {a.dtype}; float32 and float16 are supported")
        if a.rank < 1 or a.shape[-1] != self.k:
            raise self._bad(f"input A has shape {a.shape}; its last dim must be K")
        if b.dtype != np.uint8:
            raise self._bad(f"input B is {b.dtype}, expected uint8")
        if b.shape not in ((n, nb, self.blob), (n, nb * self.blob)):
            raise self._bad(f"input B has shape {b.shape}, expected {(n, nb, self.blob)}")
        if scales.dtype != a.dtype:
            raise self._bad(f"scales are {scales.dtype}, A is {a.dtype}")
        if scales.shape not in ((n * nb,), (n, nb)):
            raise self._bad(f"scales have shape {scales.shape}, expected ({n * nb},) or {(n, nb)}")
        if zp is not None:
            if zp.dtype == np.uint8:
                want = n * -(-nb * self.bits // 8)
                if zp.size != want:
                    raise self._bad(f"uint8 zero_points have {zp.size} element(s), expected {want} "
                                    f"(N * ceil(n_blocks * bits / 8))")
            elif zp.dtype == a.dtype:
                if zp.shape not in ((n * nb,), (n, nb)):
                    raise self._bad(f"zero_points have shape {zp.shape}, expected ({n * nb},) or {(n, nb)}")
            else:
                raise self._bad(f"zero_points are {zp.dtype}; expected uint8 or A's dtype {a.dtype}")
        if g_idx is not None and (g_idx.dtype != np.int32 or g_idx.shape != (self.k,)):
            raise self._bad(f"g_idx is {g_idx.dtype} {g_idx.shape}, expected int32 ({self.k},)")
        if bias is not None and (bias.dtype != a.dtype or bias.shape != (n,)):
            raise self._bad(f"bias is {bias.dtype} {bias.shape}, expected {a.dtype} ({n},)")

    def run(self, ctx: Context, a: Tensor, b: Tensor, scales: Tensor, zero_points: Tensor | None = None,
            g_idx: Tensor | None = None, bias: Tensor | None = None) -> list[Tensor]:
        self._check(a, b, scales, zero_points, g_idx, bias)
        n, nb, dt = self.n, self.n_blocks, a.dtype
        if not b.is_const:
            raise self.fail("input B (the packed weight) must be a constant (an initializer)")
        out = ctx.new(dt, (*a.shape[:-1], n))
        m = out.size // n
        if m == 0:
            return [out]
        words = np.ascontiguousarray(b.value, np.uint8).reshape(n, nb * self.blob).view(np.int32)
        wt = ctx.const(words)
        ctx.derived(words, b, "matmul_nbits.words")
        zeros = None
        if zero_points is not None and zero_points.dtype == np.uint8:
            if not zero_points.is_const:
                raise self.fail("uint8 zero_points must be a constant (an initializer)")
            raw = np.asarray(zero_points.value, np.uint8).reshape(n, -1)
            zf = unpack_codes(raw, self.bits, nb).astype(dt)
            zeros = ctx.const(zf)
            ctx.derived(zf, zero_points, ("matmul_nbits.zeros", self.bits, nb, dt.str))
        elif zero_points is not None:
            zeros = zero_points
        const_weight = all(t is None or t.is_const for t in (scales, zeros, g_idx))
        av = ctx.contiguous(a)

        def flat(t: Tensor, shape: tuple[int, ...]) -> View:
            v = ctx.contiguous(t)
            return View.contiguous(v.handle, v.dtype, shape, v.offset)

        def maybe(t: Tensor | None, shape: tuple[int, ...]) -> View | None:
            return flat(t, shape) if t is not None else None

        ov = out.view
        assert ov is not None
        ctx.record(ctx.backend.record_matmul_nbits(
            View.contiguous(av.handle, dt, (m, self.k), av.offset), flat(wt, words.shape), flat(scales, (n, nb)),
            maybe(zeros, (n, nb)), View.contiguous(ov.handle, dt, (m, n), ov.offset), k=self.k, n=n, bits=self.bits,
            block_size=self.block, bias=maybe(bias, (n,)), g_idx=maybe(g_idx, (self.k,)), const_weight=const_weight))
        return [out]
