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
    values = [np.asarray(t.value) for t in inputs if t is not None]
    if any(v.dtype.kind not in "biuf" for v in values):
        return None
    out = fn(op, values)
    if out is None:
        return None
    return [Tensor(out.dtype, out.shape, value=out)]


def _same(values: list[np.ndarray]) -> bool:
    return all(v.dtype == values[0].dtype for v in values)


def _arith(op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    if len(values) != 2 or not _same(values) or values[0].dtype.kind == "b" or values[0].dtype.itemsize < 4:
        return None  # bool, and half-precision or 8/16-bit arithmetic: the op's kernels
    with np.errstate(all="ignore"):  # integer wrap-around and float overflow, as the cpu kernels give
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


def _unsqueeze(op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    x = values[0]
    axes = [int(a) for a in values[1].reshape(-1)] if len(values) > 1 else op.attr.get("axes")
    if not axes:
        return None
    rank = x.ndim + len(axes)
    if any(not -rank <= a < rank for a in axes):
        return None
    norm = sorted(a % rank for a in axes)
    if len(set(norm)) != len(norm):
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
    if idx.size and (idx.min() < -n or idx.max() >= n):
        return None
    return np.take(data, idx.astype(np.int64), axis=axis % data.ndim)


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
    return (s + np.arange(n) * d).astype(values[0].dtype)  # ops/constant.py's Range, number for number


_CASES: dict[str, Callable[[Op, list[np.ndarray]], np.ndarray | None]] = {
    **dict.fromkeys(_ARITH, _arith), **dict.fromkeys(_COMPARE, _compare), **dict.fromkeys(_LOGIC, _logic),
    "Not": _not, "Cast": _cast, "Where": _where, "Unsqueeze": _unsqueeze, "Gather": _gather, "Concat": _concat,
    "Range": _range,
}
