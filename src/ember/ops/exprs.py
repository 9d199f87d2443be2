"""Building blocks of the generated kernels: Expr constants and folds, flat offsets, ONNX's index rules, and
`kernel`, a tensor computed by one elementwise kernel whose Expr reads its inputs at computed positions
(`coord`/`load`), so index-driven ops run the same way on every backend."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..core.expr import FLOAT, INT, Expr, call, const, coord
from ..core.view import View
from .base import Context, Op, Tensor


def kernel(ctx: Context, expr: Expr, inputs: Sequence[Tensor | View], dtype: np.dtype, shape: Sequence[int]) -> Tensor:
    """A new tensor computed by one elementwise kernel. Inputs read through `inp` must already have `shape`
    (pass broadcast Views); inputs read through `load` keep their own shapes."""
    out = ctx.new(dtype, shape)
    if out.size:
        views = [t if isinstance(t, View) else ctx.view(t) for t in inputs]
        ctx.record(ctx.backend.record_elementwise(expr, views, out.view))
    return out


def int_const(v: int) -> Expr:
    return const(int(v), INT)


def float_const(v: float) -> Expr:
    return const(float(v), FLOAT)


def zero(kind: str) -> Expr:
    return const(0, kind)


def coords(rank: int) -> list[Expr]:
    return [coord(d) for d in range(rank)]


def sum_exprs(terms: list[Expr]) -> Expr:
    acc = terms[0]
    for t in terms[1:]:
        acc = call("add", acc, t)
    return acc


def all_exprs(terms: list[Expr]) -> Expr | None:
    acc = None
    for t in terms:
        acc = t if acc is None else call("and", acc, t)
    return acc


def any_exprs(terms: list[Expr]) -> Expr:
    acc = terms[0]
    for t in terms[1:]:
        acc = call("or", acc, t)
    return acc


def wrap_index(e: Expr, dim: int) -> Expr:
    """ONNX negative indices count from the end."""
    return call("where", call("lt", e, zero(e.kind)), call("add", e, const(dim, e.kind)), e)


def check_indices(op: Op, t: Tensor, dim: int) -> None:
    """Constant indices are checked at plan time (ONNX makes out-of-range ones an error); device-resident ones
    cannot be, and the kernels clamp them, so a read or write never leaves its tensor."""
    if t.is_const and t.size:
        v = np.asarray(t.value)
        bad = (v < -dim) | (v >= dim)
        if bad.any():
            raise ValueError(f"{op.node.describe()}: index {v[bad].reshape(-1)[0]} is out of range for a dim of {dim}")


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    """Row-major element strides of `shape`."""
    return list(View.contiguous(0, np.float32, tuple(shape)).strides)


def flat_offset(idx: Sequence[Expr], shape: Sequence[int]) -> Expr:
    """The row-major element offset of the position `idx` (one int Expr per dim) in a dense tensor of `shape`."""
    terms = [call("mul", e, int_const(s)) if s != 1 else e
             for e, s, d in zip(idx, contiguous_strides(shape), shape, strict=True) if d != 1]
    return sum_exprs(terms) if terms else int_const(0)
