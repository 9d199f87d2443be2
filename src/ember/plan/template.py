"""A plan built in two halves, for models whose inputs have symbolic dims: a traced build, then its tape realized.

`trace` plans the graph on a TapeBackend (tape.py): every allocation, record call, question to the backend and
constant taken from the weight pool is written down, nothing is recorded on the device, and buffers are not
reused. `realize` turns a tape's numbers at one `Point` (its own, or a template's at a new input dim: fit.py) into
a Plan: it sizes every buffer from the views that read it, gives intermediates whose step ranges do not overlap
the same memory, makes the record calls on the real backend (with runtime sizes where the numbers move and the
backend offers them) and asks again the questions whose numbers move (an answer that differs from the point's is
a `Mismatch`, as is a size that is not whole: the caller traces a build instead).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..backends.base import ComputeBackend
from ..core.view import View
from ..ir import Graph
from ..ops import Tensor
from .folding import FoldCache
from .planner import Plan, plan_graph
from .tape import Encoder, Entry, FakeStep, Ref, Refused, Tape, TracingContext, decode, decode_call
from .weights import WeightPool


class Mismatch(Exception):
    """A tape's numbers at a new point do not make a plan (a question answered differently, a size that is not
    a whole number): the caller traces a build instead."""


def trace(graph: Graph, backend: ComputeBackend, shapes: dict[str, tuple[int, ...]], host_values: dict | None,
          *, fuse: bool, precision: str, pool: WeightPool, folds: FoldCache | None, casts: dict | None) -> Tape:
    """The tape of planning `graph` for these shapes. The pool entries it took stay held (`tape.shared`) until
    the caller releases them, after realizing the tape, so weights are uploaded once."""
    pool.register(graph.initializers.values())
    tape = Tape()
    ctx = TracingContext(backend, pool, tape)
    ctx.fuse = fuse
    ctx.reuse = False  # realize() shares memory by step ranges, at each point's own sizes
    try:
        inputs, outputs = plan_graph(ctx, graph, shapes, host_values, precision, casts, folds, trace=tape)
        bad = [s for s in ctx.steps if not isinstance(s, FakeStep)]
        if bad:
            raise Refused(f"a step made outside the backend's record calls ({type(bad[0]).__name__})")
        enc = Encoder(tape.handle_ref, tape.fn_ref)
        io = ([(n, t.dtype.str, t.shape, t.view) for n, t in inputs],
              [(n, t.dtype.str, t.shape, t.view, t.value) for n, t in outputs])
        tape.io = (enc.encode(io), enc.leaves)
    except BaseException:
        pool.release(ctx.shared)
        raise
    tape.shared = list(ctx.shared)
    tape.steps, tape.labels = list(ctx.steps), list(ctx.labels)
    tape.pinned = {tape.handles[h] for h in ctx.pinned}
    tape.counters, tape.requested_bytes = dict(ctx.counters), ctx.requested_bytes
    return tape


@dataclasses.dataclass
class Point:
    """A tape's numbers at one point: per entry its argument and answer leaves, the io leaves, and the constants
    (pool key, array) of the const entries."""

    leaves: list[list[Any]]
    results: list[list[Any]]
    io: list[Any]
    consts: dict[int, tuple[Any, Any]]
    ask: set[int]  # the questions ("query" entries) to ask again: their answers may differ here
    moving: set[int] = dataclasses.field(default_factory=set)  # record calls whose numbers move with the dim


def own_point(tape: Tape) -> Point:
    """The tape's own numbers: every question was answered for them while tracing."""
    return Point([e.leaves for e in tape.entries], [e.result_leaves for e in tape.entries], tape.io[1],
                 {i: e.const[:2] for i, e in enumerate(tape.entries) if e.kind == "const"}, set())


def _views(value: Any, out: list[View]) -> None:
    if isinstance(value, View):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _views(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _views(v, out)


def _as_is(ref: Ref) -> Ref:
    """A Ref standing in for its handle (or callable) while sizes are worked out."""
    return ref


def realize(tape: Tape, point: Point, backend: ComputeBackend, pool: WeightPool) -> Plan:
    """The plan `tape` stands for at `point` (see the module docstring)."""
    entries = tape.entries
    itemsize: dict[str, int] = {}

    def storage(dtype: np.dtype) -> int:
        hit = itemsize.get(dtype.str)
        if hit is None:
            hit = itemsize[dtype.str] = backend.storage_itemsize(dtype)
        return hit

    # Pass 1: the arguments with Refs for handles, the bytes each buffer must hold and where steps touch it.
    need: dict[Ref, int] = {}
    touch: dict[Ref, list[int]] = {}
    position = {st.entry: i for i, st in reversed(list(enumerate(tape.steps)))}
    for i, e in enumerate(entries):
        if e.kind in ("const", "query", "object"):
            continue
        a = decode_call(e.skeleton, list(point.leaves[i]), _as_is, _as_is)
        if e.kind == "alloc":
            need[Ref("tape", i)] = max(need.get(Ref("tape", i), 0), _whole(a[0][0], "an allocation's size"))
            continue
        views: list[View] = []
        _views(a, views)
        refs = [(v.handle, v.extent() * storage(v.dtype)) for v in views]
        for part, raw in zip(e.skeleton[0], a[0], strict=True):
            if part[0] == "h":
                refs.append((raw, 0))
        if e.method == "record_copy":
            refs += [(a[0][0], a[0][2]), (a[0][1], a[0][2])]
        elif e.method == "upload":
            refs.append((a[0][0], a[0][1].size * storage(a[0][1].dtype)))
        at = position.get(i)
        for ref, nbytes in refs:
            if ref.kind == "tape":
                need[ref] = max(need.get(ref, 0), nbytes)
                if at is not None:
                    touch.setdefault(ref, []).append(at)
    io = decode(tape.io[0], list(point.io), _as_is, _as_is)
    io_views: list[View] = []
    _views(io, io_views)
    last = len(tape.steps)
    for v in io_views:  # inputs and outputs live for the whole run
        if v.handle.kind == "tape":
            need[v.handle] = max(need.get(v.handle, 0), v.extent() * storage(v.dtype))
            touch.setdefault(v.handle, []).extend((0, last))

    handles: dict[Ref, int] = {}
    owned: list[int] = []
    shared: list[Any] = []
    objects: dict[int, Any] = {}
    results: dict[int, list] = {}
    intermediate = 0
    try:
        # Memory: pinned buffers (inputs, outputs, uploads) of their own; intermediates share by step ranges.
        spans = []
        for ref, nbytes in need.items():
            if ref in tape.pinned or ref not in touch:
                handles[ref] = backend.alloc(max(nbytes, 1))
                owned.append(handles[ref])
            else:
                spans.append((min(touch[ref]), max(touch[ref]), max(nbytes, 1), ref))
        spans.sort(key=lambda s: (s[0], s[1]))
        active: list[tuple[int, int, int]] = []  # (last step, nbytes, handle)
        free: list[tuple[int, int]] = []
        for first, end, nbytes, ref in spans:
            still = []
            for span in active:
                (free.append((span[1], span[2])) if span[0] < first else still.append(span))
            active = still
            fits = [f for f in free if nbytes <= f[0] <= 2 * nbytes + 4096]
            if fits:
                best = min(fits)
                free.remove(best)
                handle, size = best[1], best[0]
            else:
                handle, size = backend.alloc(nbytes), nbytes
                owned.append(handle)
                intermediate += nbytes
            handles[ref] = handle
            active.append((end, size, handle))

        def real(ref: Ref) -> int:
            return handles[ref]

        def fn(ref: Ref) -> Any:
            index, field = ref.key
            return getattr(objects[index], field)

        # Pass 2: the calls, in the tape's order.
        for i, e in enumerate(entries):
            if e.kind == "alloc" or (e.kind == "query" and i not in point.ask):
                continue
            if e.kind == "const":
                key, value = point.consts[i]
                dtype = np.dtype(e.skeleton[0])
                size = _whole(point.leaves[i][0], "a constant's size")
                nbytes = max(size, 1) * storage(dtype)
                handles.setdefault(Ref("const", i), pool.acquire(key, nbytes,
                                                                 lambda v=value, d=dtype: np.ascontiguousarray(v, d)))
                shared.append(key)
                continue
            a, kw = decode_call(e.skeleton, list(point.leaves[i]), real, fn)
            if e.kind == "upload":
                backend.upload(a[0], a[1])
                continue
            target = getattr(backend, e.method) if e.receiver is None else fn(e.receiver)
            if i in point.moving and e.receiver is None and e.method in backend.RUNTIME_SIZES:
                kw = {**kw, "runtime_sizes": True}  # one kernel for every point of the template
            result = target(*a, **kw)
            if e.kind == "steps":
                results[i] = result
            elif e.kind == "object":
                plain = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)
                         if not callable(getattr(result, f.name)) or isinstance(getattr(result, f.name), type)}
                _same_answer(e, plain, point.results[i], tape)
                objects[i] = result
            else:
                _same_answer(e, result, point.results[i], tape)
        steps, labels = [], []
        for st, label in zip(tape.steps, tape.labels, strict=True):
            got = results[st.entry]
            steps += got
            labels += [label] * len(got)

        def tensor(dtype: str, shape: tuple, view: View | None, value: Any = None) -> Tensor:
            return Tensor(np.dtype(dtype), tuple(shape), value=value, view=view)

        ins, outs = decode(tape.io[0], list(point.io), real, fn)
        inputs = [(n, tensor(d, s, v)) for n, d, s, v in ins]
        outputs = [(n, tensor(d, s, v, val)) for n, d, s, v, val in outs]
    except BaseException:
        for h in owned:
            backend.free(h)
        pool.release(shared)
        raise
    built = _Built(steps, labels, owned, pool, shared, dict(tape.counters), intermediate, tape.requested_bytes)
    return Plan(backend, built, inputs, outputs)  # type: ignore[arg-type]


@dataclasses.dataclass
class _Built:
    """What Plan takes from a planning Context, for a realized tape."""

    steps: list
    labels: list[str]
    handles: list[int]
    pool: WeightPool
    shared: list[Any]
    counters: dict[str, int]
    intermediate_bytes: int
    requested_bytes: int


def _whole(value: Any, what: str) -> int:
    if isinstance(value, (int, np.integer)):
        return int(value)
    raise Mismatch(f"{what} is not a whole number ({value})")


def _same_answer(e: Entry, result: Any, expected: list[Any], tape: Tape) -> None:
    enc = Encoder(lambda h: tape.handles.get(h, Ref("ext", h)), lambda f: None)
    try:
        skeleton = enc.encode(result)
    except Refused as err:
        raise Mismatch(str(err)) from None
    if skeleton != e.result_skeleton or not equal_leaves(enc.leaves, expected):
        raise Mismatch(f"{e.method}: answered {result!r}, the template expected otherwise")


def equal_leaves(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.dtype == y.dtype
                    and x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f")):
                return False
        elif isinstance(x, float) or isinstance(y, float):
            if not (x == y or (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 1e-9 * max(abs(x), abs(y))):
                return False
        elif x != y:
            return False
    return True

