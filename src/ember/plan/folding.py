"""Constant folding: an op whose inputs are all host values runs right away on a cpu backend, and its outputs
become host values too. The planner folds while it plans (Shape -> Gather -> Concat chains over static shapes
vanish); the graph optimizer folds nodes over initializers before any plan."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from ..backends.cpu import CpuBackend
from ..backends.cpu.elementwise import record_elementwise
from ..ops import Context, Op, Tensor
from .host_fold import host_fold

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
    quick = host_fold(op, inputs)  # small shape arithmetic straight in numpy, where it plainly equals the op's
    if quick is not None:
        return quick
    be = fold_backend()
    ctx = Context(be)
    try:
        outs = [_on_host(t) for t in op.run(ctx, *inputs)]
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


def _on_host(t: Tensor | None) -> Tensor | None:
    """A lazy elementwise value over constants computed right here, by the cpu backend's elementwise kernel on
    numpy arrays: what recording it on the fold backend would do, without buffers and steps (the host program
    of a template runs such folds on every move)."""
    lz = t.lazy if t is not None else None
    if t is None or lz is None or lz.anchor is not None or any(i.value is None for i in lz.inputs):
        return t
    dst = np.empty(t.shape, t.dtype)
    if dst.size:
        ins = [np.broadcast_to(np.asarray(i.value, i.dtype), t.shape) for i in lz.inputs]
        for step in record_elementwise(lz.expr, ins, dst):
            step()
    return Tensor(t.dtype, t.shape, value=dst)


class FoldCache:
    """A model's folds, remembered across its plans: the shape arithmetic that every plan folds (Shape ->
    Gather -> Concat over the dims a new shape leaves alone) runs once, not once per plan. Keyed by the node and
    its inputs' dtypes, shapes and bytes; only nodes whose inputs are small are kept (`max_input_bytes`), and at
    most `max_entries` of them (the oldest go first). The values are shared read-only arrays, so a plan's
    constant they feed is found in the weight pool by identity, not hashed again."""

    def __init__(self, max_entries: int = 4096, max_input_bytes: int = 4096) -> None:
        self.max_entries = max_entries
        self.max_input_bytes = max_input_bytes
        self._entries: OrderedDict[tuple, list[tuple[Any, tuple[int, ...], np.ndarray] | None]] = OrderedDict()
        self._lock = threading.Lock()

    def fold(self, node: Any, op: Op, inputs: list[Tensor | None]) -> list[Tensor | None]:
        key = self._key(node, inputs)
        if key is None:
            return fold(op, inputs)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is None:
            entry = [None if t is None else (t.dtype, t.shape, _frozen(t.value)) for t in fold(op, inputs)]
            with self._lock:
                self._entries[key] = entry
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        return [None if e is None else Tensor(e[0], e[1], value=e[2]) for e in entry]

    def _key(self, node: Any, inputs: list[Tensor | None]) -> tuple | None:
        parts: list[Any] = [id(node)]
        total = 0
        for t in inputs:
            if t is None:
                parts.append(None)
                continue
            value = np.asarray(t.value)
            total += value.nbytes
            if total > self.max_input_bytes or value.dtype.hasobject:
                return None
            parts.append((value.dtype.str, value.shape, value.tobytes()))
        return tuple(parts)


def _frozen(value: Any) -> np.ndarray:
    """A fold's value as the cache keeps it: shared by every plan, so read-only."""
    value = np.asarray(value)
    value.flags.writeable = False
    return value
