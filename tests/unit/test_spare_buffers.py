"""wgpu's kept output buffers (encode.SpareBuffers): a decode loop's growing KV outputs find buffers freed a few
steps before, the memory kept stays bounded, oldest out first."""

from __future__ import annotations

from ember.backends.wgpu.encode import SpareBuffers


class Buf:
    def __init__(self, size: int) -> None:
        self.size = size
        self.destroyed = False

    def destroy(self) -> None:
        self.destroyed = True


def _decode(spare: SpareBuffers, per_position: int, start: int, steps: int, lag: int, tensors: int) -> float:
    """Buffers created per tensor per step by a loop whose outputs grow a position a step and are freed `lag`
    steps later (the caller holds the last few steps' caches)."""
    live: list[list[Buf]] = []
    created = 0
    for t in range(steps):
        n = per_position * (start + t)
        got = []
        for _ in range(tensors):
            buf = spare.take(n)
            if buf is None:
                buf, created = Buf(spare.size(n)), created + 1
            assert n <= buf.size <= n + n // 4 or buf.size == spare.size(n)
            got.append(buf)
        live.append(got)
        if len(live) > lag:
            for buf in live.pop(0):
                spare.keep(buf)
    return created / steps / tensors


def test_growing_outputs_reuse_buffers_freed_steps_before() -> None:
    # GPT-2 124M's KV tensors (3072 bytes a position), 24 of them, past 32 -> 232, freed three steps later.
    assert _decode(SpareBuffers(), 3072, 32, 200, 3, 24) < 0.25
    assert _decode(SpareBuffers(), 3072, 200, 200, 1, 24) < 0.1


def test_kept_bytes_stay_bounded_oldest_destroyed_first() -> None:
    spare = SpareBuffers(limit=8000)
    bufs = [Buf(1000) for _ in range(10)]
    for b in bufs:
        spare.keep(b)
    assert spare.bytes == 8000 and [b.destroyed for b in bufs] == [True] * 2 + [False] * 8
    big = Buf(1001)  # more than an eighth of the limit: not kept
    spare.keep(big)
    assert big.destroyed and spare.bytes == 8000
    assert spare.take(1000) is bufs[-1] and spare.take(700) is None  # 1000 is more than a quarter over 700
    assert spare.take(800) is bufs[-2] and spare.bytes == 6000
    spare.release()
    assert spare.bytes == 0 and all(b.destroyed for b in bufs[2:8]) and spare.take(1000) is None
