"""Elementwise expressions on the cpu backend, and the epilogues (activation, residual) the products and convs
run in place on their accumulators."""

from __future__ import annotations

import functools
import math

import numpy as np

from ...core.expr import Expr, call, eval_numpy, inp
from .inplace import compile_inplace
from .steps import Step


def record_elementwise(expr: Expr, ins: list[np.ndarray], dst: np.ndarray) -> list[Step]:
    """dst = expr(ins): compiled to in-place ufunc calls where it is plain float arithmetic, else eval_numpy."""
    # The widest float of the inputs and the output: float16 data cast up into float32 work (a fused Cast) is
    # computed in float32, as the graph says, not in the input's float16.
    floats = [a.dtype for a in (*ins, dst) if a.dtype.kind == "f"]
    float_dtype = max(floats, key=lambda d: d.itemsize) if floats else np.dtype(np.float32)
    # (Not a gather's table: its loads pick a few elements of a whole input.)
    narrow = [] if expr.indexed() else [i for i, a in enumerate(ins) if a.dtype.kind == "f" and a.dtype != float_dtype]
    int_dtype = next((a.dtype for a in ins if a.dtype.kind in "iu"), np.dtype(np.int64))
    if expr.indexed():
        int_dtype = np.dtype(np.int64)  # index arithmetic must not wrap in a narrow data dtype
    shape = dst.shape
    fast = compile_inplace(expr, ins, dst)
    if fast is not None:
        return [fast]

    def step() -> None:
        args = [a.astype(float_dtype) if i in narrow else a for i, a in enumerate(ins)] if narrow else ins
        dst[...] = eval_numpy(expr, args, float_dtype, int_dtype, shape)

    return [step]


def _substitute(e: Expr, by: Expr) -> Expr:
    """e with its input 0 replaced by `by`."""
    if e.op == "in":
        return by
    if not e.args:
        return e
    return Expr(e.op, tuple(_substitute(a, by) for a in e.args), e.value, e.kind)


def epilogue(act: Expr | None, dst: np.ndarray, res: np.ndarray | None = None) -> Step | None:
    """`act` over the accumulator dst (plus `res`), in place: compiled to ufunc calls where it is plain float
    arithmetic."""
    if res is not None:
        add = call("add", inp(0), inp(1))
        act = add if act is None else _substitute(act, add)
    if act is None:
        return None
    ins = [dst] if res is None else [dst, res]
    fast = compile_inplace(act, ins, dst, clobber=0)
    if fast is not None:
        return fast

    def step() -> None:
        dst[...] = eval_numpy(act, ins, dst.dtype)

    return step


def clamp_bounds(act: Expr | None) -> tuple[float, float] | None:
    """(lo, hi) where `act` is a clamp of its input: none, Relu, Clip's min(max(x, lo), hi) or one side of it;
    else None. The compiled kernels fuse those."""
    if act is None:
        return -math.inf, math.inf
    if act.op == "relu" and act.args[0].op == "in":
        return 0.0, math.inf
    lo, hi, e = -math.inf, math.inf, act
    if e.op == "min" and e.args[1].op == "const":
        hi, e = float(e.args[1].value), e.args[0]
    if e.op == "max" and e.args[1].op == "const":
        lo, e = float(e.args[1].value), e.args[0]
    return (lo, hi) if e.op == "in" and e is not act else None


def own_residual(dst: np.ndarray, res: np.ndarray) -> tuple[Step | None, np.ndarray]:
    """(before, residual to read): where res shares memory with dst, `before` copies it into an array of its own
    first (the conv would overwrite it), else it is None and res is read as it is."""
    if np.may_share_memory(dst, res):
        own = np.empty(res.shape, res.dtype)
        return functools.partial(np.copyto, own, res), own
    return None, res


def residual_pass(act: Expr | None, dst: np.ndarray, res: np.ndarray) -> tuple[Step | None, Step]:
    """(before, after): `after` makes dst = act(dst + res) in place once the conv wrote dst; `before` as
    own_residual says."""
    before, res = own_residual(dst, res)
    after = epilogue(act, dst, res)
    assert after is not None
    return before, after
