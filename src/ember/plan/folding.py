"""Constant folding: an op whose inputs are all host values runs right away on a cpu backend, and its outputs
become host values too. The planner folds while it plans (Shape -> Gather -> Concat chains over static shapes
vanish); the graph optimizer folds nodes over initializers before any plan."""

from __future__ import annotations

import threading

from ..backends.cpu import CpuBackend
from ..ops import Context, Op, Tensor

_LOCAL = threading.local()  # one fold backend per thread: plans may be built on several threads at once


def fold_backend() -> CpuBackend:
    """This thread's cpu backend for folding (made on first use)."""
    be = getattr(_LOCAL, "backend", None)
    if be is None:
        be = _LOCAL.backend = CpuBackend().init()
    return be


def fold(op: Op, inputs: list[Tensor | None]) -> list[Tensor | None]:
    """Run `op` on constant `inputs` (host values, or None for an omitted optional input) and return its outputs
    as constants (host values); an output the op leaves out stays None. Raises what the op raises
    (UnsupportedError, ValueError, ...) for inputs it cannot take."""
    be = fold_backend()
    ctx = Context(be)
    try:
        outs = op.run(ctx, *inputs)
        for t in outs:
            if t is not None and t.lazy is not None:
                ctx.view(t)
        be.execute(ctx.steps)
        result: list[Tensor | None] = []
        for t in outs:
            if t is None or t.view is None:
                result.append(t)
            else:
                result.append(Tensor(t.dtype, t.shape, value=be.download(t.view)))
        return result
    finally:
        for h in ctx.handles:
            be.free(h)
