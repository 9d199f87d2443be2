"""Resident runs (outputs kept on the device) copy their outputs into buffers the previous run's freed outputs
left, instead of creating buffers every run."""

from __future__ import annotations

import numpy as np

import ember
from ember.backends.base import View

from ..unit.test_plan_cache import Reference, mlp


def test_resident_runs_reuse_their_output_buffers() -> None:
    """Outputs kept on the device are copies into buffers the previous run's freed outputs left: a decode loop
    creates no buffer per step once running; a plain alloc still gets fresh (zeroed) memory."""
    be = ember.backend("wgpu")
    h = be.alloc(4096, overwritten=True)
    buf = be.buffer(h)
    be.free(h)
    h2 = be.alloc(4096, overwritten=True)
    assert be.buffer(h2) is buf
    h3 = be.alloc(4096)
    assert be.buffer(h3) is not buf and not be.download(View.contiguous(h3, np.float32, (1024,))).any()
    for x in (h2, h3):
        be.free(x)

    model = ember.load_onnx(mlp(), backend=be)
    ref = Reference(mlp())
    x = np.random.default_rng(2).standard_normal((2, 16)).astype(np.float32)
    out = model.run({"x": x}, keep_on_device=True)
    created = []
    real = be.device.create_buffer
    be.device.create_buffer = lambda **kw: created.append(kw) or real(**kw)
    try:
        for _ in range(5):
            del out
            out = model.run({"x": x}, keep_on_device=True)
            np.testing.assert_allclose(out["y"].numpy(), ref(x), rtol=1e-4, atol=1e-5)
    finally:
        be.device.create_buffer = real
    assert [kw for kw in created if kw.get("usage", 0) & 0x80] == []  # no new storage buffers (.numpy() maps its own)
    model.close()
