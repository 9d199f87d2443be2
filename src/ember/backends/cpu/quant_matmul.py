"""MatMulNBits on the cpu backend: the block-quantised weight dequantised with numpy into a float32 (N, K) matrix,
then numpy's matmul (OpenBLAS, through matmul.py) against it.

The cpu backend's memory is the host's, so nothing is saved by keeping the weight packed: with `const_weight` (the
model's initializers) the weight is dequantised once, while recording, into a float32 copy that every plan of the
model shares (4 bytes a weight, next to the packed bytes in the backend's memory); otherwise every run dequantises
it again first. The
dequantisation is ONNX Runtime's arithmetic: (code - zero) * scale in float32, then a float32 product.
"""

from __future__ import annotations

from collections.abc import Hashable, MutableMapping

import numpy as np

from . import matmul
from .steps import Step


def dequantize(words: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None, g_idx: np.ndarray | None, k: int,
               bits: int, block_size: int, dst: np.ndarray | None = None) -> np.ndarray:
    """W (N, K) float32 from the int32 words of the packed codes (N, words), scales / zeros (N, n_blocks) and the
    optional act-order g_idx (K,): W[n, k] = (code(n, k) - zero[n, b]) * scale[n, b], b = k // block_size or g_idx."""
    n = words.shape[0]
    raw = np.ascontiguousarray(words).view(np.uint8).reshape(n, -1)
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    codes = ((raw[..., None] >> shifts) & np.uint8((1 << bits) - 1)).reshape(n, -1)[:, :k]
    n_blocks = scales.shape[1]
    if g_idx is None:
        block = np.arange(k) // block_size
    else:
        block = np.clip(g_idx.astype(np.int64), 0, n_blocks - 1)  # as the wgpu kernel clamps a bad index
    s = scales.astype(np.float32)[:, block]
    z = zeros.astype(np.float32)[:, block] if zeros is not None else np.float32(1 << (bits - 1))
    w = np.subtract(codes, z, dtype=np.float32, out=dst)
    return np.multiply(w, s, out=w)


def record_matmul_nbits(a: np.ndarray, words: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None,
                        out: np.ndarray, k: int, bits: int, block_size: int, bias: np.ndarray | None,
                        g_idx: np.ndarray | None, cache: MutableMapping[Hashable, np.ndarray],
                        key: Hashable | None) -> list[Step]:
    """out (M, N) = a (M, K) @ Wᵀ + bias, W as dequantize() gives it. `key`: where the weight is a model constant
    (const_weight), what names it in `cache` (weak values: the weight lives while some plan's steps hold it), so
    every plan of the model shares one float32 copy; None: dequantised on every run."""
    n = out.shape[1]
    if key is not None:
        w = cache.get(key)
        if w is None:
            w = cache[key] = dequantize(words, scales, zeros, g_idx, k, bits, block_size)
        steps: list[Step] = []
    else:
        w = np.empty((n, k), np.float32)

        def refill() -> None:
            dequantize(words, scales, zeros, g_idx, k, bits, block_size, dst=w)

        steps = [refill]
    if a.dtype == np.float32 and out.dtype == np.float32:
        cv = np.broadcast_to(bias, out.shape)[None] if bias is not None else None
        return steps + matmul.record_matmul(a[None], w.T[None], cv, out[None], 1.0, 1.0, None)
    # float16: the product in float32, rounded once into the output
    def step() -> None:
        r = np.matmul(a.astype(np.float32), w.T)
        if bias is not None:
            r += bias.astype(np.float32)
        out[...] = r

    return [*steps, step]
