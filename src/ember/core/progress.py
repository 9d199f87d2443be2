"""Progress of slow work (model load, plan build, wgpu autotune) on stderr, for people watching a terminal.

    with progress.task("autotune matmul 512x512x512", total=len(candidates)) as bar:
        for c in candidates:
            ...
            bar.advance()

Whether anything is shown is decided per task: EMBER_PROGRESS=0 (or `settings.override(progress=False)`, the CLI's
`--quiet`) shows nothing, EMBER_PROGRESS=1 shows it always, unset shows it only when the stream (stderr) is a
terminal, so tests, pipes and CI logs stay quiet. On a terminal the tasks are rows of one rich progress display
(nested tasks, from any thread, share it; each row goes when its task ends, the display when the last one does);
forced on elsewhere, or without rich, each task is one plain line when it starts and one when it ends. A task
that shows nothing costs a setting lookup and an isatty() call.

It lives in ember.core so that the backends (which may import only core and settings) can report too.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

from .. import settings


class Task:
    """A running task. `advance(n)` moves its bar (a task with a total), `update(label)` renames it. This base
    class is the silent task: both do nothing."""

    def advance(self, n: float = 1) -> None:
        pass

    def update(self, label: str) -> None:
        pass


_SILENT = Task()


def _is_tty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except (ValueError, OSError):  # a closed stream
        return False


def enabled(stream: TextIO | None = None) -> bool:
    """Whether a task would show on `stream` (default: sys.stderr) now."""
    chosen = settings.PROGRESS.get()
    if chosen is not None:
        return bool(chosen)
    return _is_tty(sys.stderr if stream is None else stream)


class _RichTask(Task):
    def __init__(self, display: Any, task_id: Any) -> None:
        self.display, self.task_id = display, task_id

    def advance(self, n: float = 1) -> None:
        self.display.advance(self.task_id, n)

    def update(self, label: str) -> None:
        self.display.update(self.task_id, description=label)


class _Shared:
    """The one rich display of the process while any task shows on it, and how many tasks use it."""

    lock = threading.Lock()
    display: Any = None
    users = 0


def _rich_display(stream: TextIO) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    # stdout is left alone (the commands print their tables there); transient: the rows vanish when done.
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(file=stream), transient=True, redirect_stdout=False,
                    redirect_stderr=False)


@contextlib.contextmanager
def _rich_task(label: str, total: int | None, stream: TextIO) -> Iterator[Task]:
    with _Shared.lock:
        if _Shared.display is None:
            display = _rich_display(stream)
            display.start()
            _Shared.display = display
        display = _Shared.display
        _Shared.users += 1
        task_id = display.add_task(label, total=total)
        display.refresh()  # shown at once, not at the next tick
    try:
        yield _RichTask(display, task_id)
    finally:
        with _Shared.lock:
            display.remove_task(task_id)
            _Shared.users -= 1
            if _Shared.users == 0:
                _Shared.display = None
                display.stop()


@contextlib.contextmanager
def _line_task(label: str, stream: TextIO) -> Iterator[Task]:
    print(f"ember: {label} ...", file=stream, flush=True)
    t0 = time.perf_counter()
    outcome = "failed"
    try:
        yield _SILENT
        outcome = "done"
    finally:
        print(f"ember: {label}: {outcome} in {time.perf_counter() - t0:.2f} s", file=stream, flush=True)


def _have_rich() -> bool:
    try:
        import rich.progress  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def task(label: str, total: int | None = None, stream: TextIO | None = None) -> Iterator[Task]:
    """A task shown while the block runs (see the module's doc for when): `label` says what is being done,
    `total` how many steps `advance()` will count (None: a spinner)."""
    out = sys.stderr if stream is None else stream
    if not enabled(out):
        yield _SILENT
    elif _is_tty(out) and _have_rich():
        with _rich_task(label, total, out) as t:
            yield t
    else:
        with _line_task(label, out) as t:
            yield t
