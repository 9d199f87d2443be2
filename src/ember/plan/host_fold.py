"""Folds of small shape arithmetic straight in numpy: what Cast, Add, Unsqueeze, Gather, ... over host values give
when run as ops on the fold backend (folding.py), without a Context, buffers or steps. A template's host program
(fit.py) runs such nodes on every move of a live plan, and the planner folds them in every trace.

Each case is one whose result plainly equals the op's (same dtype, same values, same shape); anything else (mixed
dtypes, an index out of range, a float cast to an integer, an attribute outside the case) returns None and the op
runs as usual, so its errors and its semantics stay the only ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from onnx import helper

from ..ops import Op, Tensor

_ARITH = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}
_COMPARE = {"Equal": np.equal, "Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater,
            "GreaterOrEqual": np.greater_equal}
_LOGIC = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}


def host_fold(op: Op, inputs: list[Tensor | None]) -> list[Tensor | None] | None:
    """The op's outputs over constant `inputs`, or None where this module does not take the case."""
    if any(t is None or t.value is None for t in inputs):
        return None
    fn = _CASES.get(op.node.op_type)
    if fn is None:
        return None
    out = fold_arrays(fn, op, [np.asarray(t.value) for t in inputs if t is not None])
    if out is None:
        return None
    return [Tensor(out.dtype, out.shape, value=out)]


Case = Callable[[Op, list[np.ndarray]], np.ndarray | None]


def fold_case(op_type: str) -> Case | None:
    """The case taking nodes of `op_type`, if any: for fold_arrays, looked up once per node."""
    return _CASES.get(op_type)


def fold_arrays(case: Case, op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    """host_fold on the inputs' arrays (none omitted) with the node's case: its output's array, or None."""
    for v in values:
        if v.dtype.kind not in "biuf":
            return None
    return case(op, values)


def _same(values: list[np.ndarray]) -> bool:
    return all(v.dtype == values[0].dtype for v in values)


def _arith(op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    if len(values) != 2:
        return None
    dt = values[0].dtype
    if values[1].dtype != dt or dt.kind == "b" or dt.itemsize < 4:
        return None  # bool, and half-precision or 8/16-bit arithmetic: the op's kernels
    if dt.kind != "f":  # integer ufuncs wrap around silently
        return np.asarray(_ARITH[op.node.op_type](values[0], values[1]), dtype=dt)
    with np.errstate(all="ignore"):  # float overflow, as the cpu kernels give
        out = _ARITH[op.node.op_type](values[0], values[1])
    return np.asarray(out, dtype=values[0].dtype)


def _compare(op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    if len(values) != 2 or not _same(values):
        return None
    return np.asarray(_COMPARE[op.node.op_type](values[0], values[1]), dtype=np.bool_)


def _logic(op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    if len(values) != 2 or any(v.dtype != np.bool_ for v in values):
        return None
    return np.asarray(_LOGIC[op.node.op_type](values[0], values[1]))


def _not(op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    return np.logical_not(values[0]) if len(values) == 1 and values[0].dtype == np.bool_ else None


def _cast(op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    try:
        to = np.dtype(helper.tensor_dtype_to_np_dtype(op.attr["to"]))
    except Exception:
        return None
    x = values[0]
    if to.kind not in "biuf" or (x.dtype.kind == "f" and to.kind != "f"):  # float -> int/bool: the op's rules
        return None
    if x.dtype == to:
        return x
    if to.kind == "b":
        return x != 0
    if to.kind in "iu" and x.dtype.kind in "iu" and not np.can_cast(x.dtype, to):
        return None  # a narrowing integer cast: the op's rules
    with np.errstate(all="ignore"):
        return x.astype(to)


def _where(op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    if len(values) != 3 or values[0].dtype != np.bool_ or values[1].dtype != values[2].dtype:
        return None
    return np.asarray(np.where(values[0], values[1], values[2]), dtype=values[1].dtype)


_UNSQUEEZED: dict[tuple[int, tuple[int, ...]], list[int] | None] = {}  # (rank, axes) -> where the 1s go, or None


def _unsqueeze(op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    x = values[0]
    if len(values) > 1:
        if values[1].dtype.kind not in "iu":
            return None
        axes = tuple(values[1].reshape(-1).tolist())
    else:
        axes = tuple(op.attr.get("axes") or ())
    if not axes:
        return None
    key = (x.ndim, axes)
    norm = _UNSQUEEZED.get(key, [])
    if norm == []:  # not seen yet: checked once per rank and axes (a template's program runs it on every move)
        rank = x.ndim + len(axes)
        norm = sorted(a % rank for a in axes) if all(-rank <= a < rank for a in axes) else None
        if norm is not None and len(set(norm)) != len(norm):
            norm = None
        if len(_UNSQUEEZED) > 4096:
            _UNSQUEEZED.clear()
        _UNSQUEEZED[key] = norm
    if norm is None:
        return None
    shape = list(x.shape)
    for a in norm:
        shape.insert(a, 1)
    return x.reshape(shape)


def _gather(op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    if len(values) != 2:
        return None
    data, idx = values
    axis = op.attr["axis"]
    if idx.dtype.kind not in "iu" or not -data.ndim <= axis < data.ndim:
        return None
    n = data.shape[axis]
    if idx.size:
        few = idx.reshape(-1).tolist() if idx.size <= 16 else None  # shape arithmetic: a few indices, in Python
        lo, hi = (min(few), max(few)) if few is not None else (idx.min(), idx.max())
        if lo < -n or hi >= n:
            return None
    return data.take(idx if idx.dtype == np.int64 else idx.astype(np.int64), axis=axis % data.ndim)


def _concat(op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    if not _same(values) or len({v.ndim for v in values}) != 1 or values[0].ndim == 0:
        return None
    axis = op.attr["axis"]
    if not -values[0].ndim <= axis < values[0].ndim:
        return None
    try:
        return np.concatenate(values, axis=axis)
    except ValueError:
        return None


def _range(op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    if len(values) != 3 or any(v.size != 1 for v in values) or not _same(values):
        return None
    s, lim, d = (v.item() for v in values)
    if d == 0:
        return None  # the op's error
    n = max(int(math.ceil((lim - s) / d)), 0)
    dt = values[0].dtype
    if dt.kind in "iu" and d == 1 and -2**62 < s < 2**62 and n < 2**62:  # positions: one arange, the same numbers
        return np.arange(s, s + n, dtype=np.int64).astype(dt, copy=False)
    return (s + np.arange(n) * d).astype(dt)  # ops/constant.py's Range, number for number


_CASES: dict[str, Case] = {
    **dict.fromkeys(_ARITH, _arith), **dict.fromkeys(_COMPARE, _compare), **dict.fromkeys(_LOGIC, _logic),
    "Not": _not, "Cast": _cast, "Where": _where, "Unsqueeze": _unsqueeze, "Gather": _gather, "Concat": _concat,
    "Range": _range,
}
