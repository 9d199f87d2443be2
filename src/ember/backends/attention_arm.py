"""Which attention algorithm a backend records for a shape: the flash kernel or scores GEMM + softmax + GEMM.

Where the flash kernel stops paying (bench/bench_attention.py measures it; BENCHMARKS.md has the figures):
- prefill: past these sizes GEMM + fused softmax + GEMM is faster, the tiled GEMMs reaching a larger share of the
  GPU than the flash kernel's fp32 inner loops; below them the flash kernel wins (fewer launches, no S x S buffer);
- decoding (one query row): the flash kernel has one workgroup per (batch, head) walking the whole cache, the
  GEMMs spread a long cache over the GPU.
"""

from __future__ import annotations

from .. import settings

FLASH_MAX_SCORES = 512 * 512 - 1  # scores per (batch, head)
FLASH_MAX_KEYS = 1023
GEMM_SCORES_MAX_BYTES = 1 << 30  # the S x S scores buffer the GEMM route may allocate


def flash_pays(batch: int, heads: int, seq_q: int, seq_kv: int, itemsize: int) -> bool:
    """Whether attention over (batch, heads, seq_q queries, seq_kv keys) takes the flash kernel: short sequences,
    or a scores buffer too large for the GEMM route."""
    if seq_q * seq_kv <= FLASH_MAX_SCORES and seq_kv <= FLASH_MAX_KEYS:
        return True
    return batch * heads * seq_q * seq_kv * itemsize > GEMM_SCORES_MAX_BYTES


def choose(batch: int, heads: int, seq_q: int, seq_kv: int, itemsize: int) -> str:
    """"flash" or "gemm": settings.ATTENTION where set, else the rule above."""
    forced = settings.ATTENTION.get()
    if forced is not None:
        return forced
    return "flash" if flash_pays(batch, heads, seq_q, seq_kv, itemsize) else "gemm"
