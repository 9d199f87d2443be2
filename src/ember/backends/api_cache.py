"""The public API's replay cache: the steps of a ComputeBackend call (gemm, unary, ...) recorded and prepared once
per call signature, then replayed, as a plan replays a model's steps.

A key is the op's name and every argument after validation (handles, sizes, strides, scalars, the op enum) plus
the backend's recording context (settings that change what gets recorded, `ComputeBackend._api_context`): any
value baked into the recorded steps is part of it. Handles are never reused (alloc counts up), and free() drops
every entry naming the freed handle before the memory goes, so an entry never outlives a buffer it binds, and a
buffer recycled under a new handle (wgpu's alloc(overwritten=True)) only ever meets entries keyed by that new
handle. The steps read the buffers when they run, so a replay sees what copy_htod wrote since. An entry's first
run goes through `execute_prepared`, a hit's through `replay_prepared`, which may skip the checks the first run
made once for all (a failed first run's entry is released, never kept).

Threads: an entry is taken out of the cache while it runs (a second thread making the same call meanwhile records
an entry of its own, and the later of the two to come back is dropped), so a prepared form is never replayed by
two threads at once; the table changes under the backend's memory lock. Least recently used entries go first
past `bound`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_BOUND = 256  # entries kept per backend


class ApiCache:
    """Prepared steps by call signature for one backend, LRU-bounded; counts hits, misses and evictions."""

    def __init__(self, bound: int = DEFAULT_BOUND) -> None:
        self.bound = bound
        self._entries: OrderedDict[tuple, tuple[Any, tuple[int, ...]]] = OrderedDict()  # key -> (prepared, handles)
        self._by_handle: dict[int, set[tuple]] = {}  # handle -> keys of entries naming it
        self.hits = self.misses = self.evictions = 0

    def run(self, be: Any, key: tuple, handles: Sequence[int], record: Callable[[], list]) -> None:
        """Execute the call `key` names: its cached prepared steps, else `record()`'s, prepared and kept."""
        with be._memory_lock:
            entry = self._entries.pop(key, None)  # checked out while it runs
            if entry is not None:
                self.hits += 1
            else:
                self.misses += 1
        fresh = entry is None
        if fresh:
            entry = (be.prepare(record()), tuple(int(h) for h in handles))
        try:
            if fresh:
                be.execute_prepared(entry[0])
            else:  # it ran once through execute_prepared without an error (a failed run's entry is never put back)
                be.replay_prepared(entry[0])
        except BaseException:
            be.release_prepared(entry[0])
            raise
        drop = []
        with be._memory_lock:
            live = be._sizes
            stale = key in self._entries  # another thread's copy came back first
            for h in entry[1]:
                if h not in live:  # freed meanwhile (handles are never reused)
                    stale = True
            if stale:
                drop.append(entry[0])
            else:
                self._entries[key] = entry
                if fresh:  # a hit's keys stay indexed while it is out: free() finds them there
                    for h in entry[1]:
                        self._by_handle.setdefault(h, set()).add(key)
                    while len(self._entries) > self.bound:
                        old_key, old = self._entries.popitem(last=False)
                        self._unindex(old_key, old[1])
                        self.evictions += 1
                        drop.append(old[0])
        for prepared in drop:
            be.release_prepared(prepared)

    def _unindex(self, key: tuple, handles: tuple[int, ...]) -> None:
        for h in handles:
            keys = self._by_handle.get(h)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_handle[h]

    def drop_handle(self, be: Any, handle: int) -> None:
        """Release every entry naming `handle` (free() calls it under the memory lock, before the memory goes)."""
        keys = self._by_handle.pop(handle, None)
        if not keys:
            return
        for key in keys:
            entry = self._entries.pop(key, None)
            if entry is not None:  # else checked out (put back only while all its handles live) or already gone
                self._unindex(key, entry[1])
                be.release_prepared(entry[0])

    def clear(self, be: Any) -> None:
        with be._memory_lock:
            entries = list(self._entries.values())
            self._entries.clear()
            self._by_handle.clear()
        for prepared, _ in entries:
            be.release_prepared(prepared)

    def info(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions, "entries": len(self._entries),
                "bound": self.bound}
