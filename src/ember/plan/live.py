"""Live plans: one plan per template, moved from point to point instead of realized anew for every shape.

A template's plans at two values of its dim differ only in the entries whose numbers move (`Template.moving`):
the allocations sized by the dim, the questions asked again, the constants the host program recomputes and the
record calls whose views or sizes move. A `LivePlan` sizes every buffer for a capacity above the value it is
made at (`capacity`), lays memory out and makes every call once; `move` to another value within that capacity
remakes only the moving entries, in the tape's order: questions first (an answer that differs is a Mismatch
and leaves the plan as it was), then the moving constants uploaded into buffers of the plan's own and the moving
record calls made again on the same buffers (with runtime sizes where the backend has them, so they take the
pipelines they took before). A value beyond the capacity raises `Full`: the caller makes a new LivePlan there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import settings
from ..backends.base import ComputeBackend
from .fit import Numbers, Template
from .planner import Plan
from .tape import Ref, Refused, decode_call
from .template import (
    Calls,
    Mismatch,
    Storage,
    _Built,
    _whole,
    entry_needs,
    io_needs,
    lay_out,
    make_calls,
    needs,
    ordered_steps,
)
from .weights import WeightPool

MIN_HEADROOM = 8  # values of the dim above the one a live plan is made at that it holds room for, at least


def capacity(v: int) -> int:
    """The value of the dim a live plan made at v sizes its buffers for: twice v (a decode regrows a handful of
    times on the way to a long context)."""
    return v + max(MIN_HEADROOM, v)


class Full(Exception):
    """The value needs more room than the live plan's buffers have."""


# A LivePlan refuses (Refused) a template whose kernel selections move: its values are realized one by one.


class LivePlan(Plan):
    """A template's plan at one value of its dim at a time (see the module docstring)."""

    def __init__(self, template: Template, v: int, backend: ComputeBackend, pool: WeightPool,
                 like: LivePlan | None = None) -> None:
        """The plan at v; `like`, the template's previous live plan (too small, freed), lends its fits."""
        tape = template.tape
        entries = tape.entries
        moving = sorted(template.moving)
        if any(entries[i].kind == "object" for i in moving):
            raise Refused("a kernel selection moves with the dim: realized per value")
        point = template.point(v, pool)
        storage = Storage(backend)
        need, touch = needs(tape, point, storage)
        # Constants the host program recomputes (their values move, if not always their sizes).
        consts = {i: _whole(point.leaves[i][0], "a constant's size") for i, c in template.consts.items()
                  if c[0] == "p"}
        try:
            room = capacity(v)
            for i in moving:
                for ref, nbytes in entry_needs(tape, i, template.leaves_at(i, room), storage):
                    need[ref] = max(need[ref], nbytes)
                if i in consts:
                    consts[i] = max(consts[i], _whole(template.leaves_at(i, room)[0], "a constant's size"))
            for ref, nbytes in io_needs(tape, template.io_at(room), storage):
                need[ref] = max(need[ref], nbytes)
        except Mismatch:
            room = v
        owned: list[int] = []
        shared: list[Any] = []
        try:
            handles, intermediate = lay_out(tape, need, touch, backend, owned)
            self._room = {ref: backend.nbytes(h) for ref, h in handles.items()}
            for i, size in consts.items():  # moving constants: buffers of the plan's own, written on each move
                ref = Ref("const", i)
                handles[ref] = backend.alloc(max(size, 1) * storage(np.dtype(entries[i].skeleton[0])))
                owned.append(handles[ref])
                self._room[ref] = backend.nbytes(handles[ref])
            calls = Calls(tape, backend, handles)
            results = make_calls(tape, point, calls, pool, storage, shared, own=set(consts))
            for i in consts:
                self._write_const(backend, handles, i, point.consts[i][1], entries[i].skeleton[0])
            fast = (self._refit(like, template, v, room, backend, calls, results) if like is not None else None) \
                or self._resizable(template, v, room, backend, calls, results, moving)
            write_sizes = self._join(backend, fast, results, v)
            steps, labels = ordered_steps(tape, results)
            inputs, outputs = calls.io(point)
            rooms = (like._needs, like._need_refs) if like is not None and like._needs is not None else \
                self._rooms(template, v, room, storage, moving)
        except BaseException:
            for h in owned:
                backend.free(h)
            pool.release(shared)
            raise
        built = _Built(steps, labels, owned, pool, shared, dict(tape.counters), intermediate, tape.requested_bytes)
        super().__init__(backend, built, inputs, outputs)  # type: ignore[arg-type]
        self.template, self.v, self.capacity, self.moves = template, v, room, 0
        self._storage, self._calls, self._results, self._consts = storage, calls, results, sorted(consts)
        self._fast, self._sizes, self._bounds, self._structures = fast
        self._write_sizes = write_sizes
        self._bound_rows = np.array([row for row, _ in self._bounds], dtype=np.int64)
        self._bound_max = np.array([bound for _, bound in self._bounds], dtype=np.int64)
        # Per moving constant: its element's bytes and its buffer's, and its dtype (move checks and writes it).
        self._const_rooms = [(i, storage(np.dtype(entries[i].skeleton[0])), self._room[Ref("const", i)])
                             for i in self._consts]
        self._const_dtypes = {i: np.dtype(entries[i].skeleton[0]) for i in self._consts}
        self._moving = moving
        self._remake = [i for i in moving if entries[i].kind in ("steps", "upload") and i not in self._fast]
        self._needs, self._need_refs = rooms
        self._room_of = np.array([self._room[r] for r in self._need_refs], dtype=np.int64)
        # What a move needs of the template's point: its questions, remade calls, moving constants and io.
        self._wanted = set(template.ask) | set(self._remake) | set(self._consts)
        self.stats["plan.source"] = "template"

    @staticmethod
    def _join(backend: ComputeBackend, fast: tuple, results: dict[int, list], v: int) -> Any:
        """The resizable calls' writers as one (join_sizes_writers: their steps may be recorded anew, into
        `results`), given the values at v: None where there are none."""
        entries, numbers = fast[0], fast[1]
        if not entries or numbers is None:
            return None
        keys = list(entries)
        steps, write = backend.join_sizes_writers([results[i] for i in keys], [entries[i][1] for i in keys],
                                                  [entries[i][0] for i in keys])
        for i, got in zip(keys, steps, strict=True):
            results[i] = got
        write(numbers.at(v))
        return write

    def _probe_points(self, template: Template, v: int, room: int) -> list[int]:
        """Values of the dim to fit runtime sizes through, consecutive from v, and one to check the fit at (the
        room where it is beyond them): sizes are polynomials of the template's degree in the leaves, products
        of a few of them (a stride times a count) in the values."""
        fitted = [v + k for k in range(2 * template.degree + 2)]
        return [*fitted, max(room, fitted[-1] + 1)]

    def _resizable(self, template: Template, v: int, room: int, backend: ComputeBackend, calls: Calls,
                   results: dict[int, list], moving: list[int]) -> tuple[dict, Numbers | None, list, dict]:
        """The moving record calls whose steps stay and only take new runtime sizes on a move (same kernels at
        every probed point, sizes polynomial in v): their steps, re-gridded for the room, in `results`;
        returns ({entry: (value ranges per dispatch, writer)}, the values as Numbers, the grid bounds, the
        probed structures)."""
        tape = template.tape
        points = self._probe_points(template, v, room)
        fast: dict[int, tuple[list[tuple[int, int]], Any]] = {}
        structures: dict[int, Any] = {}
        rows: list[np.ndarray] = []
        bounds: list[tuple[int, int]] = []  # (row, its value at the grid's point): the grid covers up to there
        for i in moving:
            e = tape.entries[i]
            if e.kind != "steps" or e.receiver is not None or e.method not in backend.RUNTIME_SIZES:
                continue
            try:
                probes = []
                for p in points:
                    a, kw = decode_call(e.skeleton, template.leaves_at(i, p), calls.real, calls.fn)
                    probes.append(backend.probe_sizes(e.method, a, kw))
            except (Mismatch, ValueError, NotImplementedError):
                continue
            if any(pr is None or pr[0] != probes[0][0] for pr in probes) or not probes[0][0]:
                continue
            grids, ranges, mark = [], [], len(rows)
            for d in range(len(probes[0][0])):
                sizes = [pr[1][d] for pr in probes]
                moved = [tuple(pr[2][d]) for pr in probes]
                grid = tuple(max(g[k] for g in moved) for k in range(3))
                # The grid at the last point covers the most work (probe_sizes' contract: a first value that
                # grows with the grid); a move beyond that point's first value is Full.
                if (any(x.size != sizes[0].size for x in sizes) or not sizes[0].size or moved[-1] != grid
                        or sizes[-1][0] != max(int(x[0]) for x in sizes)):
                    break
                ranges.append((len(rows), len(rows) + sizes[0].size))
                bounds.append((len(rows), int(sizes[-1][0])))
                rows.extend(np.stack(sizes, axis=1))
                grids.append(grid)
            else:
                steps, writer = backend.sizes_writer(results[i], grids)
                results[i] = steps
                fast[i] = (ranges, writer)
                structures[i] = probes[0][0]
                continue
            del rows[mark:]  # not moved by its sizes alone: remade on each move
            del bounds[len(bounds) - len(ranges):]
        if not fast:
            return {}, None, [], {}
        try:
            numbers = Numbers(points, np.array(rows))
        except Refused:
            return {}, None, [], {}
        return fast, numbers, bounds, structures

    def _refit(self, like: LivePlan, template: Template, v: int, room: int, backend: ComputeBackend,
               calls: Calls, results: dict[int, list]) -> tuple | None:
        """_resizable's answer from the previous live plan's fits: each of its resizable calls probed once, at this
        room (it must agree with the fit there), for the grid that covers it; None where one does not agree."""
        if like._sizes is None:
            return None
        tape, sizes = template.tape, like._sizes.at(room)
        fast, bounds = {}, []
        for i, (ranges, _) in like._fast.items():
            e = tape.entries[i]
            try:
                a, kw = decode_call(e.skeleton, template.leaves_at(i, room), calls.real, calls.fn)
                probe = backend.probe_sizes(e.method, a, kw)
            except (Mismatch, ValueError, NotImplementedError):
                return None
            if probe is None or probe[0] != like._structures[i] or any(
                    not np.array_equal(x, sizes[lo:hi]) for x, (lo, hi) in zip(probe[1], ranges, strict=True)):
                return None
            bounds += [(lo, int(sizes[lo])) for lo, _ in ranges]
            steps, writer = backend.sizes_writer(results[i], [tuple(g) for g in probe[2]])
            results[i] = steps
            fast[i] = (ranges, writer)
        return fast, like._sizes, bounds, like._structures

    def _rooms(self, template: Template, v: int, room: int, storage: Storage,
               moving: list[int]) -> tuple[Numbers | None, list[Ref]]:
        """The bytes the moving entries and the io need of buffers, as Numbers, and which buffer each row is."""
        tape = template.tape
        points = self._probe_points(template, v, room)
        rows: list[list[int]] = []
        refs: list[Ref] = []
        try:
            per_point = []
            for p in points:
                got = [x for i in moving for x in entry_needs(tape, i, template.leaves_at(i, p), storage)]
                got += io_needs(tape, template.io_at(p), storage)
                per_point.append(got)
            if any([r for r, _ in got] != [r for r, _ in per_point[0]] for got in per_point):
                return None, []
            refs = [r for r, _ in per_point[0]]
            rows = [[got[k][1] for got in per_point] for k in range(len(refs))]
            numbers = Numbers(points, np.array(rows)) if rows else None
        except (Mismatch, Refused):
            return None, []
        return numbers, refs

    @staticmethod
    def _write_const(backend: ComputeBackend, handles: dict[Ref, int], i: int, value: Any, dtype: Any) -> None:
        array = np.ascontiguousarray(value, np.dtype(dtype))
        if array.size:
            backend.upload(handles[Ref("const", i)], array)

    def move(self, v: int) -> None:
        """Make this the plan at v: Mismatch or Full (the plan unchanged) where it cannot be."""
        if v == self.v:
            return
        template, tape, be = self.template, self.template.tape, self.backend
        point = template.point(v, self.pool, only=self._wanted, keys=False)  # type: ignore[arg-type]
        room, storage = self._room, self._storage
        if self._needs is not None:
            short = np.flatnonzero(self._needs.at(v) > self._room_of)
            if short.size:
                raise Full(f"{short.size} buffers are too small at {v}")
        else:  # the needs did not fit a polynomial: every moving entry's, at v
            for i in self._moving:
                for ref, nbytes in entry_needs(tape, i, template.leaves_at(i, v), storage):
                    if nbytes > room[ref]:
                        raise Full(f"entry {i} needs {nbytes} bytes of a {room[ref]}-byte buffer at {v}")
            for ref, nbytes in io_needs(tape, point.io, storage):
                if nbytes > room[ref]:
                    raise Full(f"an input or output needs {nbytes} bytes of a {room[ref]}-byte buffer at {v}")
        sizes = self._sizes.at(v) if self._sizes is not None else None
        if sizes is not None and self._bounds:
            over = np.flatnonzero(sizes[self._bound_rows] > self._bound_max)
            if over.size:
                row, bound = self._bounds[over[0]]
                raise Full(f"a kernel's grid covers {bound} invocations, {sizes[row]} needed at {v}")
        for i, item, size in self._const_rooms:
            if point.consts[i][1].size * item > size:
                raise Full(f"constant {i} does not fit at {v}")
        calls = self._calls
        for i in sorted(point.ask):  # questions first: a different answer leaves the plan as it was
            calls.make(i, point)
        if settings.TEMPLATE_CHECK.get() and sizes is not None:
            self._check_sizes(v, sizes)
        try:
            for i in self._consts:
                self._write_const(be, calls.handles, i, point.consts[i][1], self._const_dtypes[i])
            if sizes is not None and self._write_sizes is not None:
                self._write_sizes(sizes)
            for i in self._remake:
                got = calls.make(i, point)
                if tape.entries[i].kind == "steps":
                    self._results[i] = got
        except BaseException:
            self.free()  # half moved: of no use any more
            raise
        self.inputs, self.outputs = calls.io(point)
        if self._readback is not None:  # the outputs' readbacks are sized for the old point
            be.release_prepared(self._readback[0])
            self._readback = None
        if any(tape.entries[i].kind == "steps" for i in self._remake):
            self.steps, self.labels = ordered_steps(tape, self._results)
            if self._resident is not None:
                be.release_prepared(self._resident)
                self._resident = None
        self.v = v
        self.moves += 1

    def _check_sizes(self, v: int, sizes: np.ndarray) -> None:
        """EMBER_TEMPLATE_CHECK: the fitted runtime sizes at v are what the record calls would take there."""
        tape, template = self.template.tape, self.template
        for i, (ranges, _) in self._fast.items():
            e = tape.entries[i]
            a, kw = decode_call(e.skeleton, template.leaves_at(i, v), self._calls.real, self._calls.fn)
            probe = self.backend.probe_sizes(e.method, a, kw)
            got = [sizes[lo:hi] for lo, hi in ranges]
            if probe is None or any(not np.array_equal(x, y) for x, y in zip(probe[1], got, strict=True)):
                raise RuntimeError(f"EMBER_TEMPLATE_CHECK: the runtime sizes of {e.method} (entry {i}) at {v} "
                                   f"are {[x.tolist() for x in probe[1]] if probe else None}, the fit says "
                                   f"{[x.tolist() for x in got]}")

    @property
    def alive(self) -> bool:
        return bool(self.handles)

