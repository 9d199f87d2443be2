"""Intra-op parallelism for the cpu backend: the caller and a few worker threads share a step's tasks.

numpy releases the GIL inside copies, ufunc loops and BLAS calls, so threads running those run in parallel.
Left to itself, a conv is single-threaded im2col and epilogue around an OpenBLAS product that splits
itself in fixed halves; the idle core waits through the copies, and a half whose thread is descheduled on a
busy machine stalls the product for a whole time slice. Here a conv is cut into independent tasks (im2col,
product and epilogue of a band of output rows, each product on one BLAS thread) that threads take in
turn, as ONNX Runtime's pool does: all the work is parallel, and a preempted thread leaves its tasks to the
others. OpenBLAS is held to one thread while such a step runs (a process-wide setting: restored after).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Task = Callable[[], None]


class Pool:
    """`workers` daemon threads; `run(tasks)` hands the tasks out to them and to the caller, in order."""

    def __init__(self, workers: int) -> None:
        self.size = workers + 1
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(workers):
            threading.Thread(target=self._serve, name=f"ember-cpu-{i}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._drain(self._jobs.get())

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

    def run(self, tasks: list[Task]) -> None:
        if len(tasks) <= 1:
            for task in tasks:
                task()
            return
        job = [tasks, itertools.count(), threading.Lock(), threading.Event(), [], 0]
        for _ in range(min(self.size - 1, len(tasks) - 1)):
            self._jobs.put(job)
        self._drain(job)
        job[3].wait()
        if job[4]:
            raise job[4][0]


def _openblas() -> tuple[Callable[[int], Any], Callable[[], int]] | None:
    """(set_num_threads, get_num_threads) of the OpenBLAS that numpy loaded, or None (another BLAS)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("openblas", "64_"), ("openblas", ""),
                               ("scipy_openblas", "")):
            setter = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            getter = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            if setter is not None and getter is not None:
                setter.argtypes, setter.restype, getter.restype = [ctypes.c_int], None, ctypes.c_int
                return setter, getter
    return None


_lock = threading.Lock()
_state = {"depth": 0, "saved": 1}
_blas: tuple[Callable[[int], Any], Callable[[], int]] | None = None
_pool: Pool | None = None
_made = False


def pool() -> Pool | None:
    """The process's pool, or None where it would not help: one core, EMBER_CPU_THREADS=1, or a BLAS whose
    thread count cannot be set (its own threads would then oversubscribe the cores)."""
    global _pool, _blas, _made
    with _lock:
        if not _made:
            _made = True
            try:
                cores = len(os.sched_getaffinity(0))
            except AttributeError:
                cores = os.cpu_count() or 1
            threads = int(os.environ.get("EMBER_CPU_THREADS", cores))
            if threads > 1:
                import numpy  # noqa: F401  (loads the BLAS library that _openblas looks for)

                _blas = _openblas()
                if _blas is not None:
                    _pool = Pool(threads - 1)
        return _pool


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """OpenBLAS on one thread inside (nests, and is shared by concurrent callers)."""
    assert _blas is not None
    setter, getter = _blas
    with _lock:
        if _state["depth"] == 0:
            _state["saved"] = getter()
            setter(1)
        _state["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                setter(_state["saved"])
