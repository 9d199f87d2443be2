"""What every cpu kernel builds on: a step (a closure run at replay), sequences of them, and the scratch buffer
the im2col and Winograd convs of one backend share."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from . import parallel

Step = Callable[[], None]
# Makes a step's parts over the scratch buffer (None for a step that uses none).
Build = Callable[[np.ndarray | None], list[Step]]


class Scratch:
    """One buffer shared by every im2col step of a backend, so that it stays in cache between convs. A step
    holds the lock while it uses the buffer: plans on one backend may run in several threads."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # re-entered by a plan run inside a step (execute holds it throughout)
        self.buf = np.empty(0, np.uint8)

    def reserve(self, nbytes: int) -> None:
        with self.lock:
            if self.buf.nbytes < nbytes:
                self.buf = np.empty(nbytes, np.uint8)  # steps bound to the old one rebind on their next run


def seq(*steps: Step) -> Step:
    """One step running `steps` in order."""
    def run() -> None:
        for st in steps:
            st()

    return run


_NO_LOCK = contextlib.nullcontext()


def scratch_step(scratch: Scratch | None, build: Build, before: Step | None = None,
                 after: Step | None = None) -> Step:
    """A step running the parts build(buffer) makes on the scratch buffer (None without scratch), holding its
    lock; the parts are built on the first run and again whenever the scratch has grown since."""
    bound: list[Any] = [None, None]  # the scratch buffer the parts were built on, the parts

    def parts() -> list[Step]:
        buf = scratch.buf if scratch is not None else None
        if bound[1] is None or bound[0] is not buf:  # first run, or the scratch grew since
            bound[:] = [buf, build(buf)]
        return bound[1]

    def step() -> None:
        if before is not None:
            before()
        with scratch.lock if scratch is not None else _NO_LOCK:
            for part in parts():
                part()
        if after is not None:
            after()

    def program() -> list[Any]:
        """The step as Pool.run_program items (the caller holds the scratch lock)."""
        out: list[Any] = [before] if before is not None else []
        for part in parts():
            out += part.regions() if isinstance(part, parallel.Phases) else [part]
        return out + ([after] if after is not None else [])

    step.program = program  # type: ignore[attr-defined]
    return step
