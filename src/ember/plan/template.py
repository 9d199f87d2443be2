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
from collections.abc import Container
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


class Storage:
    """The backend's storage bytes per element of a dtype, asked once per dtype."""

    def __init__(self, backend: ComputeBackend) -> None:
        self.backend = backend
        self.sizes: dict[str, int] = {}

    def __call__(self, dtype: np.dtype) -> int:
        hit = self.sizes.get(dtype.str)
        if hit is None:
            hit = self.sizes[dtype.str] = self.backend.storage_itemsize(dtype)
        return hit


def entry_needs(tape: Tape, i: int, leaves: list[Any], storage: Storage) -> list[tuple[Ref, int]]:
    """(buffer, bytes it must hold) for each buffer entry i's call touches at these leaves."""
    e = tape.entries[i]
    if e.kind in ("const", "query", "object"):
        return []
    a = decode_call(e.skeleton, list(leaves), _as_is, _as_is)
    if e.kind == "alloc":
        return [(Ref("tape", i), _whole(a[0][0], "an allocation's size"))]
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
    return [(ref, nbytes) for ref, nbytes in refs if ref.kind == "tape"]


def io_needs(tape: Tape, io_leaves: list[Any], storage: Storage) -> list[tuple[Ref, int]]:
    """(buffer, bytes) of the plan's inputs and outputs at these io leaves."""
    io = decode(tape.io[0], list(io_leaves), _as_is, _as_is)
    views: list[View] = []
    _views(io, views)
    return [(v.handle, v.extent() * storage(v.dtype)) for v in views if v.handle.kind == "tape"]


def needs(tape: Tape, point: Point, storage: Storage) -> tuple[dict[Ref, int], dict[Ref, list[int]]]:
    """The bytes each buffer must hold at `point`, and the step positions that touch it (inputs and outputs
    live for the whole run)."""
    need: dict[Ref, int] = {}
    touch: dict[Ref, list[int]] = {}
    position = {st.entry: i for i, st in reversed(list(enumerate(tape.steps)))}
    for i in range(len(tape.entries)):
        at = position.get(i)
        for ref, nbytes in entry_needs(tape, i, point.leaves[i], storage):
            need[ref] = max(need.get(ref, 0), nbytes)
            if at is not None:
                touch.setdefault(ref, []).append(at)
    last = len(tape.steps)
    for ref, nbytes in io_needs(tape, point.io, storage):
        need[ref] = max(need.get(ref, 0), nbytes)
        touch.setdefault(ref, []).extend((0, last))
    return need, touch


def lay_out(tape: Tape, need: dict[Ref, int], touch: dict[Ref, list[int]], backend: ComputeBackend,
            owned: list[int]) -> tuple[dict[Ref, int], int]:
    """Buffers for `need`: pinned ones (inputs, outputs, uploads) of their own; intermediates share memory where
    their step ranges do not overlap (best fit). Returns (handles, intermediate bytes); what it allocates is
    appended to `owned`."""
    handles: dict[Ref, int] = {}
    intermediate = 0
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
    return handles, intermediate


class Calls:
    """The real calls of a tape's entries, on one backend, with the buffers and objects realized so far."""

    def __init__(self, tape: Tape, backend: ComputeBackend, handles: dict[Ref, int]) -> None:
        self.tape, self.backend, self.handles = tape, backend, handles
        self.objects: dict[int, Any] = {}
        # A question's answers at the current point by (method, skeleton, numbers): every layer of a decoder
        # asks the same select_attention at a move; the backend answers once.
        self._answers: tuple[Point | None, dict] = (None, {})
        self._io: tuple | None = None  # _plain_io's answer for the tape, once asked ((): not plain)

    def real(self, ref: Ref) -> int:
        return self.handles[ref]

    def fn(self, ref: Ref) -> Any:
        index, field = ref.key
        return getattr(self.objects[index], field)

    def make(self, i: int, point: Point) -> Any:
        """Entry i's call at `point` (an upload, a record call, a question or a kernel selection): a record
        call's steps, else None. A question answered otherwise than `point` says is a Mismatch."""
        e = self.tape.entries[i]
        key = None
        if e.kind not in ("upload", "steps", "object") and e.receiver is None:
            if self._answers[0] is not point:  # the point itself, not its id: a new point may reuse an id
                self._answers = (point, {})
            try:
                key = (e.method, e.skeleton, tuple(point.leaves[i]))
                hit = self._answers[1].get(key)
            except TypeError:  # unhashable numbers or skeleton: asked as it is
                key, hit = None, None
            if hit is not None:
                _same_answer(e, hit[0], point.results[i], self.tape)
                return None
        a, kw = decode_call(e.skeleton, list(point.leaves[i]), self.real, self.fn)
        if e.kind == "upload":
            self.backend.upload(a[0], a[1])
            return None
        target = getattr(self.backend, e.method) if e.receiver is None else self.fn(e.receiver)
        if i in point.moving and e.receiver is None and e.method in self.backend.RUNTIME_SIZES:
            kw = {**kw, "runtime_sizes": True}  # one kernel for every point of the template
        result = target(*a, **kw)
        if e.kind == "steps":
            return result
        if e.kind == "object":
            plain = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)
                     if not callable(getattr(result, f.name)) or isinstance(getattr(result, f.name), type)}
            _same_answer(e, plain, point.results[i], self.tape)
            self.objects[i] = result
        else:
            _same_answer(e, result, point.results[i], self.tape)
            if key is not None:
                self._answers[1][key] = (result,)
        return None

    def io(self, point: Point) -> tuple[list[tuple[str, Tensor]], list[tuple[str, Tensor]]]:
        """The plan's (name, Tensor) inputs and outputs at `point`."""
        if self._io is None:
            self._io = _plain_io(self.tape.io[0]) or ()
        if self._io:  # every input and output a plain strided tensor: built straight from the leaves
            leaves, k, sides = point.io, 0, []
            for side in self._io:
                built = []
                for name, dt, rank, ref, vdt in side:
                    shape = tuple(leaves[k:k + rank])
                    view = View(self.handles[ref], vdt, tuple(leaves[k + rank:k + 2 * rank]),
                                tuple(leaves[k + 2 * rank:k + 3 * rank]), leaves[k + 3 * rank])
                    built.append((name, Tensor(dt, shape, view=view)))
                    k += 3 * rank + 1
                sides.append(built)
            return sides[0], sides[1]

        def tensor(dtype: str, shape: tuple, view: View | None, value: Any = None) -> Tensor:
            return Tensor(np.dtype(dtype), tuple(shape), value=value, view=view)

        ins, outs = decode(self.tape.io[0], list(point.io), self.real, self.fn)
        return ([(n, tensor(d, s, v)) for n, d, s, v in ins],
                [(n, tensor(d, s, v, val)) for n, d, s, v, val in outs])


_LEAF = ("$", "i")


def _plain_io(skeleton: Any) -> tuple | None:
    """Per side (inputs, outputs), per tensor (name, dtype, rank, buffer Ref, view dtype), where every one is a
    plain strided tensor in a taped buffer (the io skeleton of a traced build: a constant output, say, is not);
    else None."""
    if skeleton[0] != "tuple" or len(skeleton[1]) != 2:
        return None
    sides = []
    for side, width in zip(skeleton[1], (4, 5), strict=True):
        if side[0] != "list":
            return None
        items = []
        for item in side[1]:
            parts = item[1] if item[0] == "tuple" else ()
            if (len(parts) != width or parts[0][0] != "c" or parts[1][0] != "c"
                    or (width == 5 and parts[4] != ("c", None))):
                return None
            shape, view = parts[2], parts[3]
            if shape[0] != "tuple" or view[0] != "view" or not isinstance(view[1], Ref) or view[1].kind != "tape":
                return None
            rank = len(shape[1])
            if any(x != _LEAF for x in shape[1]) or view[3] != shape or view[4] != shape or view[5] != _LEAF:
                return None
            items.append((parts[0][1], np.dtype(parts[1][1]), rank, view[1], np.dtype(view[2])))
        sides.append(tuple(items))
    return tuple(sides)


def ordered_steps(tape: Tape, results: dict[int, list]) -> tuple[list, list[str]]:
    """The plan's steps and labels: each record call's steps where its fake step stood."""
    steps, labels = [], []
    for st, label in zip(tape.steps, tape.labels, strict=True):
        got = results[st.entry]
        steps += got
        labels += [label] * len(got)
    return steps, labels


def make_calls(tape: Tape, point: Point, calls: Calls, pool: WeightPool, storage: Storage, shared: list[Any],
               own: Container[int] = ()) -> dict[int, list]:
    """Every entry's call at `point` in the tape's order, its buffers allocated already: weight-pool constants
    acquired (their keys appended to `shared`) but those in `own` (the caller's to fill), the questions in
    point.ask asked again, the uploads and record calls made. Returns the record calls' steps by entry."""
    results: dict[int, list] = {}
    for i, e in enumerate(tape.entries):
        if e.kind == "alloc" or (e.kind == "query" and i not in point.ask) or i in own:
            continue
        if e.kind == "const":
            key, value = point.consts[i]
            dtype = np.dtype(e.skeleton[0])
            nbytes = max(_whole(point.leaves[i][0], "a constant's size"), 1) * storage(dtype)
            calls.handles.setdefault(Ref("const", i), pool.acquire(
                key, nbytes, lambda v=value, d=dtype: np.ascontiguousarray(v, d)))
            shared.append(key)
            continue
        got = calls.make(i, point)
        if e.kind == "steps":
            results[i] = got
    return results


def realize(tape: Tape, point: Point, backend: ComputeBackend, pool: WeightPool) -> Plan:
    """The plan `tape` stands for at `point` (see the module docstring)."""
    storage = Storage(backend)
    need, touch = needs(tape, point, storage)
    owned: list[int] = []
    shared: list[Any] = []
    try:
        handles, intermediate = lay_out(tape, need, touch, backend, owned)
        calls = Calls(tape, backend, handles)
        results = make_calls(tape, point, calls, pool, storage, shared)
        steps, labels = ordered_steps(tape, results)
        inputs, outputs = calls.io(point)
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
    if type(result) is str:  # a kernel's name (select_attention's): Encoder's ("c", name), no leaves
        if e.result_skeleton != ("c", result) or expected:
            raise Mismatch(f"{e.method}: answered {result!r}, the template expected otherwise")
        return
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

