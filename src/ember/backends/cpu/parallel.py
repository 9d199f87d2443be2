"""Intra-op parallelism for the cpu backend: the caller and a few worker threads share a step's tasks.

numpy releases the GIL inside copies and ufunc loops, so threads running those run in parallel. BLAS
products are left to OpenBLAS, which spreads them over the cores itself: products split into bands on
single-threaded BLAS ran ~40% slower here (measured on ResNet-18), and so did im2col copies split over
the pool (they contend with OpenBLAS's workers, which spin between products). What the pool runs is
work with no BLAS in it: depthwise convolutions, over bands of channels.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

Task = Callable[[], None]


class Pool:
    """`workers` daemon threads; `run(tasks)` hands the tasks out to them and to the caller, in order, and
    returns when all are done (re-raising the first exception a task raised)."""

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
        # [tasks, next index, lock, all-done event, errors, tasks finished]
        job = [tasks, itertools.count(), threading.Lock(), threading.Event(), [], 0]
        for _ in range(min(self.size - 1, len(tasks) - 1)):
            self._jobs.put(job)
        self._drain(job)
        job[3].wait()
        if job[4]:
            raise job[4][0]


_lock = threading.Lock()
_pool: list[Pool | None] = []


def pool() -> Pool | None:
    """The process's pool (made on first use), or None on one core or with EMBER_CPU_THREADS=1."""
    with _lock:
        if not _pool:
            try:
                cores = len(os.sched_getaffinity(0))
            except AttributeError:  # not on Linux
                cores = os.cpu_count() or 1
            raw = os.environ.get("EMBER_CPU_THREADS", "").strip() or str(cores)
            if not raw.isdigit() or int(raw) < 1:
                raise ValueError(f"EMBER_CPU_THREADS: expected a whole number >= 1, got {raw!r}")
            threads = int(raw)
            _pool.append(Pool(threads - 1) if threads > 1 else None)
        return _pool[0]
