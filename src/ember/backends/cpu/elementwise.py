"""Elementwise expressions on the cpu backend, and the epilogues (activation, residual) the products and convs
run in place on their accumulators."""

from __future__ import annotations

import functools
import math

import numpy as np

from ...core.expr import FLOAT, Expr, call, eval_numpy, inp
from ...core.view import View
from . import native_rows, resizable
from .inplace import compile_inplace
from .steps import Step


def record_elementwise(expr: Expr, ins: list[np.ndarray], dst: np.ndarray) -> list[Step]:
    """dst = expr(ins): compiled to in-place ufunc calls where it is plain float arithmetic, else eval_numpy."""
    if expr.op == "in":  # a copy (Concat's parts, a KV cache's): made on every move of a decode's live plan
        src = ins[expr.value]
        if src.dtype == dst.dtype and src.shape == dst.shape:
            return [functools.partial(np.copyto, dst, src)]
    one = _gelu(expr, ins, dst) or _single(expr, ins, dst)
    if one is not None:
        return [one]
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


_LOGIC = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def _single(expr: Expr, ins: list[np.ndarray], dst: np.ndarray) -> Step | None:
    """One ufunc call into dst for a lone bool op over inputs (a decode's mask chain: Cast to bool, And, Where
    between two float constants), where it plainly gives what eval_numpy gives; else None."""
    args = expr.args
    if expr.op == "to_bool" and args[0].op == "in":
        src = ins[args[0].value]
        if dst.dtype == np.bool_ and src.dtype.kind in "biuf" and src.shape == dst.shape:
            return functools.partial(np.not_equal, src, 0, out=dst)  # astype(bool): x != 0, NaN included
    elif expr.op in _LOGIC and all(a.op == "in" for a in args):
        a, b = ins[args[0].value], ins[args[1].value]
        if dst.dtype == a.dtype == b.dtype == np.bool_ and a.shape == b.shape == dst.shape:
            return functools.partial(_LOGIC[expr.op], a, b, out=dst)
    elif (expr.op == "where" and args[0].op == "in" and args[1].op == args[2].op == "const"
          and args[1].kind == args[2].kind == FLOAT and dst.dtype.kind == "f"):
        cond = ins[args[0].value]
        if cond.dtype == np.bool_ and cond.shape == dst.shape and not np.may_share_memory(cond, dst):
            yes, no = np.asarray(args[1].value, dst.dtype), np.asarray(args[2].value, dst.dtype)

            def where() -> None:
                np.copyto(dst, no)
                np.copyto(dst, yes, where=cond)

            return where
    return None


def _gelu(expr: Expr, ins: list[np.ndarray], dst: np.ndarray) -> Step | None:
    """The compiled GELU where expr is one (of an input) and the kernel takes the arrays; else None."""
    if expr.op not in native_rows.GELU or expr.args[0].op != "in":
        return None
    return native_rows.gelu_step(expr.op, ins[expr.args[0].value], dst)


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
    fast = compile_inplace(act, ins, dst, clobber=0) or _gelu(act, ins, dst)
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


def direct_copy(expr: Expr, inputs: list[View], out: View, buffers: dict[int, np.ndarray]) -> resizable.Direct | None:
    """A Resizable's direct hook for a plain copy of 4-byte elements (expr reads input 0 of the out's dtype: a KV
    cache's Concat parts, made on every move of a decode's live plan): the compiled copy reading each move's
    numbers; None for any other call or where the library is not there. buffers: each View's handle's memory."""
    if (not native_rows.available() or expr.op != "in" or expr.value != 0 or len(inputs) != 1
            or inputs[0].dtype != out.dtype or out.dtype.itemsize != 4 or len(out.shape) > 4):
        return None
    src = inputs[0]
    mem = (buffers[src.handle], buffers[out.handle])
    launch = native_rows.CopyViews(1 + (2 * len(src.shape) + 1) + (2 * len(out.shape) + 1),
                                   [len(src.shape), len(out.shape)], [(b.ctypes.data, b.nbytes) for b in mem], mem)

    def move(numbers: np.ndarray | list[int]) -> list[Step] | None:
        return [launch.step] if launch.move(numbers) else None

    return move
