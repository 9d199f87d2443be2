"""Leaks: alloc/free loops and ops leave no live allocations (handles, device buffers) behind."""

from __future__ import annotations

import gc

import numpy as np

import ember
from ember.backends.base import View

from .helpers import upload


def live(be: ember.ComputeBackend) -> tuple[int, int]:
    """(handles the contract tracks, allocations the backend holds underneath)."""
    store = be._bufs if be.name == "wgpu" else be._mem
    return len(be._sizes), len(store)


def gpu_buffers() -> int | None:
    """wgpu-py's count of live GPUBuffer objects (None where wgpu is not in use)."""
    try:
        import wgpu
    except ImportError:
        return None
    return wgpu.diagnostics.object_counts.get_dict().get("Buffer", {}).get("count")


def test_alloc_free_loop(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    before = live(be)
    for i in range(500):
        h = be.alloc(int(rng.integers(4, 1 << 16)))  # room for the 4-byte write below
        if i % 3 == 0:
            be.copy_htod(h, b"abcd")
        be.free(h)
    assert live(be) == before


def test_alloc_many_then_free(be: ember.ComputeBackend) -> None:
    before = live(be)
    gc.collect()
    buffers = gpu_buffers() if be.name == "wgpu" else None
    hs = [be.alloc(4096 + i) for i in range(200)]
    assert live(be) == (before[0] + 200, before[1] + 200)
    assert len(set(hs)) == 200  # handles are never reused while live
    for h in reversed(hs):
        be.free(h)
    assert live(be) == before
    if buffers is not None:
        gc.collect()
        assert gpu_buffers() == buffers


def test_ops_leave_nothing(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """Ops, split reductions (scratch buffers) and attention included, then free: back to where we were."""
    gc.collect()
    before = live(be)
    buffers = gpu_buffers() if be.name == "wgpu" else None
    for _ in range(5):
        x = upload(be, rng.standard_normal(200_000).astype(np.float32))
        o = be.alloc(4 * 200_000)
        be.unary("exp", x, o, 200_000)
        be.binary("add", x, o, o, 200_000)
        be.reduce("sum", x, o, (200_000,), 0)  # few long rows: two passes with scratch on wgpu
        be.execute(be.record_reduce_axes("argmax", View.contiguous(x, np.dtype(np.float32), (2, 100_000)),
                                         View.contiguous(o, np.dtype(np.int64), (2,)), 1))
        be.attention(x, x, x, o, 1, 2, 16, 16, 32, 0.2, True)
        be.synchronize()
        be.free(x)
        be.free(o)
    assert live(be) == before
    if buffers is not None:
        gc.collect()
        assert gpu_buffers() == buffers


def test_release_frees_everything(backend_name: str) -> None:
    be = ember.backend(backend_name)  # a backend of its own: release() frees every live allocation
    hs = [be.alloc(64) for _ in range(10)]
    be.free(hs[3])
    be.release()
    assert live(be) == (0, 0)
    for h in hs:
        try:
            be.free(h)
        except ValueError as e:
            assert "freed" in str(e)
        else:
            raise AssertionError(f"handle {h} still live after release()")
    h = be.alloc(16)  # still usable, and handles keep counting up
    assert h > max(hs)
    be.release()
    assert live(be) == (0, 0)
