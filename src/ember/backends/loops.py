"""Loop primitives: the few ops an elementwise kernel cannot express, because an output element depends on a
whole line of the input (scan, top-k) or on where other elements go (scatter).

Each backend implements them as methods in its own `loops` module (cpu/loops.py with numpy, wgpu/loops.py with
kernels/*.wgsl), attached to the backend class when that module is imported; `ensure` imports it. The ONNX ops
(CumSum, CumProd, TopK, ScatterElements, ScatterND, ...) are written once against these methods:

- record_scan(op, x, out, axis, exclusive, reverse): inclusive/exclusive running "sum" or "prod" along `axis`,
  optionally from the end. x and out: contiguous Views of one shape.
- record_topk(x, values, indices, axis, k, largest): the k largest (or smallest) elements along `axis`, sorted,
  equal values in index order; indices are int64. All Views contiguous; values/indices have k along `axis`.
- record_scatter(out, offsets, updates, reduction): for each update in order, out.flat[offset] =
  reduce(out.flat[offset], update), reduction "none", "add", "mul", "max" or "min". `out` (contiguous) already
  holds the data; offsets (int) and updates are contiguous Views of one shape. Offsets are clamped into out.
"""

from __future__ import annotations

import importlib

from .base import ComputeBackend

METHODS = ("record_scan", "record_topk", "record_scatter")


def ensure(backend: ComputeBackend) -> ComputeBackend:
    """The backend, with its loop primitives attached (imports ember.backends.<name>.loops once)."""
    if not hasattr(backend, "record_scatter"):
        importlib.import_module(f"{__package__}.{backend.name}.loops")
    return backend
