"""Intra-op parallelism for the cpu backend: the caller and a few worker threads share a step's tasks.

numpy releases the GIL inside copies, ufunc loops and BLAS calls, so threads running those run in parallel.
While a backend's steps run, OpenBLAS is held to one thread (`one_blas_thread`) and the products are split
over the pool instead, each part with its im2col or Winograd transforms: OpenBLAS's own workers spin between
products and take a core from the pool's numpy work (a Winograd conv split over the pool runs much slower next
to OpenBLAS-threaded convs than next to convs split the same way), and its per-product thread hand-offs cost
more than they save on the small products of Winograd (alpha^2 of them per conv). The pool also runs depthwise
convolutions and max pooling, over bands of channels.

Handing a region to a worker is costly (a wake-up through the hypervisor, then the GIL), so a plan's
regions run as one program (`Pool.run_program`: a barrier between regions, not a hand-off and a wait each), and
the caller's part of every split is a little larger (`spans`).
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from ... import settings

Task = Callable[[], None]


class Pool:
    """`workers` daemon threads; `run(tasks)` hands the tasks out to them and to the caller, in order, and
    returns when all are done (re-raising the first exception a task raised)."""

    def __init__(self, workers: int) -> None:
        self.size = workers + 1
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(workers):
            threading.Thread(target=self._serve, name=f"ember-cpu-{i}", daemon=True).start()

    @staticmethod
    def _drain(job: list[Any]) -> None:
        tasks, counter, lock, done, errors, _ = job
        while (i := next(counter)) < len(tasks):  # next() on a count is atomic under the GIL
            try:
                tasks[i]()
            except BaseException as e:  # re-raised in the caller
                errors.append(e)
            with lock:
                job[5] += 1
                if job[5] == len(tasks):
                    done.set()

    def run_program(self, items: list[Task | Region | OnCaller]) -> None:
        """Run `items` in order, each stretch of them from one Region to the last before an OnCaller as one
        parallel region: a Region's tasks are shared out among the threads, the plain callables after a region
        run on one thread (the last to finish that region), and a barrier separates each region from what
        follows. Against a `run` per region this saves a hand-off at each boundary: the thread that finishes
        last goes straight on, only the other waits. OnCaller items (and anything before the first region)
        run here, between stretches."""
        i = 0
        while i < len(items):
            item = items[i]
            if not isinstance(item, Region):
                item()
                i += 1
                continue
            j = i
            while j < len(items) and not isinstance(items[j], OnCaller):
                j += 1
            stretch, i = items[i:j], j
            if sum(isinstance(x, Region) for x in stretch) < 2:
                for x in stretch:
                    x()
                continue
            program: list[tuple[Region, list[Task]]] = []
            for x in stretch:
                if isinstance(x, Region):
                    program.append((x, []))
                else:
                    program[-1][1].append(x)
            gang = _Gang(program)
            for _ in range(min(self.size, max(len(r.tasks) for r, _ in program)) - 1):
                self._jobs.put(gang)
            gang.play()
            if gang.errors:
                raise gang.errors[0]

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if isinstance(job, _Gang):
                job.play()
            else:
                self._drain(job)

    def run(self, tasks: list[Task]) -> None:
        if len(tasks) <= 1:
            for task in tasks:
                task()
            return
        # [tasks, next index, lock, all-done event, errors, tasks finished]
        job = [tasks, itertools.count(), threading.Lock(), threading.Event(), [], 0]
        for _ in range(min(self.size - 1, len(tasks) - 1)):
            self._jobs.put(job)
        self._drain(job)
        job[3].wait()
        if job[4]:
            raise job[4][0]


# The calling thread's head start. `Pool.run` wakes a worker that starts later (through the hypervisor, then
# handed the GIL), and when that worker finishes last the caller waits more to be woken: the caller finishing
# first is the common case, and both waits are lost. So the first part of a split, the caller's, is larger: by
# LEAD of the whole at least, and where the caller says how long the split's work takes one thread, by enough
# that the two parts end together with the worker HEAD_START_S late.
LEAD = 0.02
HEAD_START_S = 50e-6
# One thread's rough speed, for those estimates: multiply-adds a second in OpenBLAS sgemm, and seconds per
# element of a Winograd input transform's output (both measured: BENCHMARKS.md).
MACS_PER_S = 40e9
TRANSFORM_S = 1.5e-9
# Products smaller than this (multiply-adds) run whole on the calling thread: a hand-off to the pool costs more.
SPLIT_MACS = 1 << 20


def spans(total: int, parts: int, seconds: float | None = None) -> list[tuple[int, int]]:
    """`parts` (or fewer) [start, stop) ranges covering range(total) for a pool's threads: near-equal, but the
    first (the calling thread's) larger, as LEAD says; `seconds`: the whole split's work on one thread."""
    parts = max(1, min(parts, total))
    if parts == 1:
        return [(0, total)]
    lead = LEAD
    if seconds:
        # The first part's end = the others' (starting HEAD_START_S late): lead = HEAD_START_S / seconds
        # * (parts - 1) / parts, capped where the estimate is less than a few head starts.
        lead = min(0.25, max(lead, HEAD_START_S * (parts - 1) / (parts * seconds)))
    first = min(total - parts + 1, max(-(-total // parts), round(total * (1 / parts + lead))))
    rest = total - first
    return [(0, first)] + [(first + rest * i // (parts - 1), first + rest * (i + 1) // (parts - 1))
                           for i in range(parts - 1)]


class Access:
    """What a step reads and writes (each array's byte range) and whether it uses the backend's shared scratch:
    two steps whose accesses do not conflict may run in one parallel region (`merge_regions`)."""

    def __init__(self, reads: list[Any], writes: list[Any], scratch: bool) -> None:
        from numpy.lib.array_utils import byte_bounds

        self.reads = [byte_bounds(a) for a in reads if a is not None and a.size]
        self.writes = [byte_bounds(a) for a in writes if a is not None and a.size]
        self.scratch = scratch

    def conflicts(self, other: Access) -> bool:
        def overlap(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> bool:
            return any(a0 < b1 and b0 < a1 for a0, a1 in xs for b0, b1 in ys)

        return ((self.scratch and other.scratch) or overlap(self.writes, other.reads + other.writes)
                or overlap(other.writes, self.reads))


def merge_regions(first: list[Any], second: list[Any]) -> list[Any] | None:
    """Two independent steps' run_program items as one: the second's region's tasks join the first's (one
    barrier instead of two, and either thread takes the other's share when it finishes early), its serial
    followers run after the first's. Only for steps of one region each, the second with nothing before it
    (ResNet's strided conv and its 1x1 shortcut, both reading the block's input); None otherwise."""
    regions = [i for i, x in enumerate(first) if isinstance(x, Region)]
    if len(regions) != 1 or not second or not isinstance(second[0], Region):
        return None
    if any(isinstance(x, (Region, OnCaller)) for x in second[1:] + first[regions[0] + 1:]):
        return None
    i, region = regions[0], first[regions[0]]
    return [*first[:i], Region(region.pool, region.tasks + second[0].tasks), *first[i + 1:], *second[1:]]


class OnCaller:
    """A step that `Pool.run_program` runs on the calling thread, outside its regions (it may take locks the
    caller holds, or run a plan of its own)."""

    def __init__(self, fn: Task) -> None:
        self.fn = fn

    def __call__(self) -> None:
        self.fn()


class Region:
    """`pool.run(tasks)` as a step part that `Pool.run_program` can see into."""

    def __init__(self, pool: Pool, tasks: list[Task]) -> None:
        self.pool, self.tasks = pool, tasks

    def __call__(self) -> None:
        self.pool.run(self.tasks)


class Phases:
    """Two lists of tasks as one parallel region: task i runs firsts[i], waits until every task has run its first
    part, then runs seconds[i]. Against two `Pool.run`s this saves a hand-off: the worker does not go back to
    the queue to be woken again, and where it finishes the first phase last the caller is not woken
    from its wait for it either; only the thread that reaches the barrier first waits.

    Every task must run on a thread of its own, all at once (or the first would wait for ever): no more tasks
    than the pool has threads, which `Pool.run` hands the job to together."""

    def __init__(self, pool: Pool, firsts: list[Task], seconds: list[Task]) -> None:
        assert len(firsts) == len(seconds) <= pool.size
        self._pool = pool
        self._barrier = threading.Barrier(len(firsts))
        self._firsts, self._seconds = firsts, seconds
        self._tasks = [self._task(f, s) for f, s in zip(firsts, seconds, strict=True)]

    def _task(self, first: Task, second: Task) -> Task:
        def run() -> None:
            try:
                first()
            except BaseException:
                self._barrier.abort()  # the others stop waiting; Pool.run raises this exception
                raise
            try:
                self._barrier.wait()
            except threading.BrokenBarrierError:
                return  # another task's first part failed
            second()

        return run

    def __call__(self) -> None:
        if self._barrier.broken:  # a failed run before this one
            self._barrier.reset()
        self._pool.run(self._tasks)

    def regions(self) -> list[Region]:
        """The two phases as regions, for Pool.run_program (which puts a barrier between any two)."""
        return [Region(self._pool, self._firsts), Region(self._pool, self._seconds)]


class _Gang:
    """One run of Pool.run_program: the caller and the workers that pick the job up step through the regions
    together. Per region: claim its tasks one by one (the first claimed is the largest: see spans), then meet
    at a barrier, whose last arriver runs the region's serial followers before releasing the others.

    A barrier waits for the threads that have joined only: a worker joins at the region the gang is at when it
    picks the job up (or not at all, busy elsewhere or lost), so the caller never waits for one that is not
    coming."""

    def __init__(self, program: list[tuple[Region, list[Task]]]) -> None:
        self.program = program
        self.counters = [itertools.count() for _ in program]
        self.errors: list[BaseException] = []
        self._cond = threading.Condition()
        self._joined = 0
        self._arrived = 0
        self._at = 0  # the region the gang is at (barriers passed)

    def play(self) -> None:
        with self._cond:
            self._joined += 1
            start = self._at
        for r in range(start, len(self.program)):
            tasks, after = self.program[r][0].tasks, self.program[r][1]
            counter = self.counters[r]
            while not self.errors and (i := next(counter)) < len(tasks):
                try:
                    tasks[i]()
                except BaseException as e:  # re-raised in the caller
                    self.errors.append(e)
            self._meet(after)

    def _meet(self, after: list[Task]) -> None:
        with self._cond:
            self._arrived += 1
            if self._arrived == self._joined:
                for fn in after:
                    if self.errors:
                        break
                    try:
                        fn()
                    except BaseException as e:
                        self.errors.append(e)
                self._arrived = 0
                self._at += 1
                self._cond.notify_all()
            else:
                at = self._at
                while at == self._at:
                    self._cond.wait()


_lock = threading.Lock()
_pool: list[Pool | None] = []
_cores: list[int] = []
# The pool's default size: the core count, at most DEFAULT_MAX_THREADS. More threads run slower on a many-core
# host: their Python parts contend for the GIL (and OpenBLAS's own threads instead of the pool's spin, slowing
# whatever runs next to them).
DEFAULT_MAX_THREADS = 4


def cores() -> int:
    if not _cores:
        try:
            _cores.append(len(os.sched_getaffinity(0)))
        except AttributeError:  # not on Linux
            _cores.append(os.cpu_count() or 1)
    return _cores[0]


def pool() -> Pool | None:
    """The process's pool (made on first use), or None on one core or with EMBER_CPU_THREADS=1."""
    with _lock:
        if not _pool:
            threads = settings.CPU_THREADS.get() or min(cores(), DEFAULT_MAX_THREADS)
            _pool.append(Pool(threads - 1) if threads > 1 else None)
        return _pool[0]


class _OneBlasThread:
    """A context in which OpenBLAS runs every product on the calling thread, so that the pool's threads can each
    run their own products side by side: the alpha^2 small products of a Winograd conv run faster as
    single-threaded parts than as OpenBLAS's own multi-threaded products, whose per-product thread hand-offs
    dominate at those sizes.

    OpenBLAS's thread count is process-wide (its `_local` setter too, in pthreads builds), so entries nest by a
    count: the first saves and sets 1, the last restores. Code outside ember running BLAS meanwhile only runs
    slower, never wrong."""

    def __init__(self, get: Callable[[], int], put: Callable[[int], None]) -> None:
        self._get, self._set = get, put
        self._lock = threading.Lock()
        self._depth = 0
        self._saved = 1

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._saved = self._get()
                self._set(1)
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self._set(self._saved)


_blas: list[_OneBlasThread | None] = []


def blas_pool() -> Pool | None:
    """The pool to split BLAS products over: there is one and OpenBLAS can be held to one thread."""
    p = pool()
    return p if p is not None and one_blas_thread() is not None else None


def one_blas_thread() -> _OneBlasThread | None:
    """The context that holds numpy's OpenBLAS to one thread, or None where numpy's BLAS is not an OpenBLAS
    found loaded in this process (then products stay on OpenBLAS's own threads)."""
    with _lock:
        if not _blas:
            _blas.append(_find_openblas())
        return _blas[0]


def _find_openblas() -> _OneBlasThread | None:
    import ctypes

    import numpy as np

    try:
        with open("/proc/self/maps") as f:
            paths = {p for p in (line.split()[-1] for line in f) if p.startswith("/")
                     and "openblas" in os.path.basename(p).lower() and ".so" in os.path.basename(p)}
    except OSError:  # not Linux
        return None
    here = os.path.dirname(os.path.dirname(np.__file__))
    # numpy's own copy first (a wheel's numpy.libs/), where other packages load OpenBLASes of their own.
    for path in sorted(paths, key=lambda p: not p.startswith(here)):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name in (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                                   ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
                                   ("openblas_get_num_threads", "openblas_set_num_threads")):
            get, put = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is not None and put is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                put.restype, put.argtypes = None, [ctypes.c_int]
                return _OneBlasThread(get, put)
    return None
