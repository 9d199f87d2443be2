"""Runtime sizes on the cpu backend: the record calls a live plan (plan/live.py) moves with the template's dim,
re-made from a few integers instead of from the tape.

A call recorded with `runtime_sizes=True` runs its steps through one `Resizable` step that keeps the call's
kernel maker (numpy arrays in, steps out) and its Views' buffers and dtypes. `probe` describes a call as
(structure, numbers): the structure is every argument with each View replaced by (dtype, rank), the
numbers every View's shape, strides and offset, after one leading 0 (what the live plan reads as the invocation
count: there is no grid to outgrow on the host). A move hands `Resizable.resize` the numbers at the new point
(fitted polynomials in the dim): it makes the numpy arrays straight from them and the kernel's steps again on the
same buffers, and swaps them in; the plan's step list and prepared replay stay as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ...core.view import View
from .steps import Step

# The record methods a move re-makes from numbers, with their parameters in order: a call's Views are listed in
# this order however the call passed them.
PARAMS = {"record_elementwise": ("expr", "inputs", "out"), "record_gather": ("data", "indices", "axis", "out"),
          "record_attention_views": ("q", "k", "v", "mask", "out", "scale", "causal")}
METHODS = frozenset(PARAMS)
_GRID = (1, 1, 1)

Strided = Callable[[int, np.dtype, tuple, tuple, int], np.ndarray]  # CpuBackend.strided
Maker = Callable[[list[np.ndarray]], list[Step]]


def _structure(value: Any, views: list[View], memo: dict[int, int]) -> Any:
    """value with every View (appended to `views`, in order) standing as (dtype, rank): equal for two calls that
    differ only in their Views' numbers, or buffers (a regrown live plan's, whose steps keep their own)."""
    if isinstance(value, View):
        views.append(value)
        return ("V", value.dtype.str, len(value.shape))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_structure(x, views, memo) for x in value))
    if isinstance(value, dict):
        return ("d", tuple((k, _structure(x, views, memo)) for k, x in value.items()))
    if isinstance(value, np.ndarray):
        return ("a", value.dtype.str, value.shape, value.tobytes())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        hit = memo.get(id(value))
        if hit is not None:  # an expression DAG's shared subtree: once
            return ("m", hit)
        memo[id(value)] = len(memo)
        return ("dc", type(value), tuple(_structure(getattr(value, f.name), views, memo)
                                         for f in dataclasses.fields(value)))
    if isinstance(value, np.generic):
        return ("g", value.dtype.str, value.item())
    return (type(value), value)


def probe(method: str, args: tuple, kwargs: dict) -> tuple | None:
    """([structure], [numbers], [grid]) of a call of one of METHODS (ComputeBackend.probe_sizes), else None."""
    params = PARAMS.get(method)
    if params is None or len(args) > len(params) or not set(kwargs) <= set(params[len(args):]):
        return None
    bound = {**dict(zip(params, args, strict=False)), **kwargs}
    views: list[View] = []
    structure = (method, _structure(tuple(bound.get(p) for p in params), views, {}))
    if not views:
        return None
    numbers = [0]
    for v in views:
        numbers += [*v.shape, *v.strides, v.offset]
    return [structure], [np.array(numbers, np.int64)], [_GRID]  # one "dispatch": the call's steps


Direct = Callable[[Any], list[Step] | None]  # the numbers (probe's order) -> steps, or None: `make` then


class Resizable:
    """One record call's steps, made again for new View numbers by `resize` (see the module docstring): by
    `direct` from the numbers themselves where it takes them (a compiled kernel reading its sizes from a block it
    rewrites), else by `make` from the numpy arrays."""

    __slots__ = ("make", "layout", "strided", "direct", "steps", "_arrays")

    def __init__(self, strided: Strided, views: list[View], make: Maker, direct: Direct | None = None,
                 mem: dict[int, np.ndarray] | None = None) -> None:
        self.strided, self.make, self.direct = strided, make, direct
        self.layout = [(v.handle, v.dtype, len(v.shape)) for v in views]
        # Per View its buffer (the backend's, fixed while the handle lives), dtype, rank and element bytes: the
        # arrays made straight from them, `strided` only where numpy refuses (its error).
        self._arrays = [(mem[v.handle], v.dtype, len(v.shape), v.dtype.itemsize) for v in views] \
            if mem is not None else None
        numbers = [0]
        for v in views:
            numbers += [*v.shape, *v.strides, v.offset]
        self.steps: list[Step] = []
        self.resize(numbers)

    def __call__(self) -> None:
        for step in self.steps:
            step()

    def resize(self, numbers: np.ndarray | list[int]) -> None:
        if self.direct is not None:
            steps = self.direct(numbers)
            if steps is not None:
                self.steps = steps
                return
        values = numbers.tolist() if isinstance(numbers, np.ndarray) else numbers
        arrays, k = [], 1
        if self._arrays is not None:
            try:
                for buf, dtype, rank, item in self._arrays:
                    end = k + 2 * rank
                    arrays.append(np.ndarray(tuple(values[k:k + rank]), dtype, buf, values[end] * item,
                                             tuple([st * item for st in values[k + rank:end]])))
                    k = end + 1
            except (ValueError, TypeError):  # outside its buffer, or empty: strided says which
                arrays, k = [], 1
            else:
                self.steps = self.make(arrays)
                return
        for handle, dtype, rank in self.layout:
            end = k + 2 * rank
            arrays.append(self.strided(handle, dtype, tuple(values[k:k + rank]), tuple(values[k + rank:end]),
                                       values[end]))
            k = end + 1
        self.steps = self.make(arrays)


def record(strided: Strided, views: list[View | None], make: Maker, direct: Direct | None = None,
           mem: dict[int, np.ndarray] | None = None) -> list[Step]:
    """A call over `views` (in PARAMS order; None for an absent optional one) as one Resizable step: make(arrays)
    gives its steps from the numpy arrays of the Views that are there (direct, where given, from their numbers);
    `mem`: the backend's buffers by handle, which `strided` makes its arrays over."""
    return [Resizable(strided, [v for v in views if v is not None], make, direct, mem)]


def sizes_writer(steps: list, grids: list[tuple[int, int, int]]) -> tuple[list, Callable[[list], None]]:
    """ComputeBackend.sizes_writer for a call recorded by `record`: its step, and a writer taking its numbers."""
    if len(steps) != 1 or not isinstance(steps[0], Resizable):
        raise NotImplementedError("cpu backend: runtime sizes for a call not recorded with runtime_sizes=True")
    step = steps[0]

    def write(values: list) -> None:
        step.resize(values[0])

    return steps, write
