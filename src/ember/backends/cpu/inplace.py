"""Float elementwise expressions compiled at record time into ufunc calls that write in place.

`eval_numpy` allocates a fresh array per node and the step then copies the result into its output: three
memory passes and an allocation for `relu(a + b)`. Here every node writes into a buffer chosen at record
time (the output itself where it does not alias an input, else scratch reused as soon as a value dies), so
a replay allocates nothing. Results are the ones `eval_numpy` gives: the same ufuncs, the same dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...core.expr import FLOAT, NUMPY_OPS, Expr
from .steps import Step

_BINARY: dict[str, np.ufunc] = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
                                "max": np.maximum, "min": np.minimum}
_UNARY: dict[str, np.ufunc] = {"neg": np.negative, "abs": np.absolute, "exp": np.exp, "log": np.log,
                               "sqrt": np.sqrt, "tanh": np.tanh, "reciprocal": np.reciprocal, "floor": np.floor,
                               "ceil": np.ceil}
_SPECIAL = ("relu", "sigmoid")


_FILLED: dict[tuple[str, bytes], np.ndarray] = {}


def filled(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only array of `shape` holding the 0-d `value` everywhere (shared, grown on demand).

    numpy's maximum/minimum run much slower against a broadcast scalar than against a full array, so
    relu and clip bounds read one of these instead.
    """
    key = (value.dtype.str, value.tobytes())
    size = int(np.prod(shape))
    buf = _FILLED.get(key)
    if buf is None or buf.size < size:
        buf = np.full(max(size, 1), value, value.dtype)
        buf.flags.writeable = False
        _FILLED[key] = buf
    return buf[:size].reshape(shape)


def _supported(expr: Expr) -> bool:
    return all(e.kind == FLOAT and (e.op in ("in", "const") or e.op in _BINARY or e.op in _UNARY
                                    or e.op in _SPECIAL) for e in expr.walk())


def _clip(expr: Expr) -> tuple[int, float, float] | None:
    """(input, lo, hi) where expr is min(max(input, lo), hi) or max(min(input, hi), lo) with constants
    lo <= hi (Clip, ReLU6): np.clip is that in one pass, faster than the two ufuncs."""
    outer, inner = {"min": "max", "max": "min"}.get(expr.op), None
    if outer is None:
        return None
    consts = [a for a in expr.args if a.op == "const"]
    inner = next((a for a in expr.args if a.op == outer), None)
    if len(consts) != 1 or inner is None:
        return None
    x = next((a for a in inner.args if a.op == "in"), None)
    c2 = next((a for a in inner.args if a.op == "const"), None)
    if x is None or c2 is None:
        return None
    lo, hi = (c2.value, consts[0].value) if expr.op == "min" else (consts[0].value, c2.value)
    return (x.value, lo, hi) if lo <= hi else None  # NaN bounds compare False: left to the ufuncs


def compile_inplace(expr: Expr, ins: list[np.ndarray], dst: np.ndarray, clobber: int | None = None) -> Step | None:
    """A step computing `expr` over `ins` (already broadcast to dst's shape) into dst, or None where the
    expression is not plain float arithmetic on one float dtype (eval_numpy handles those).

    `clobber`: an input that is dst itself and may be overwritten once read for the last time (an epilogue's
    accumulator).
    """
    dt = dst.dtype
    if dt.kind != "f" or any(a.dtype != dt or a.shape != dst.shape for a in ins) or not _supported(expr):
        return None
    clip = _clip(expr)
    if clip is not None:
        src, lo, hi = ins[clip[0]], dt.type(clip[1]), dt.type(clip[2])
        return lambda: np.clip(src, lo, hi, out=dst)
    order = expr.walk()
    if expr.op == "in":
        src = ins[expr.value]
        return None if src is dst else (lambda: np.copyto(dst, src))
    def key(e: Expr) -> Any:
        # Liveness by input index: two `in` nodes reading the clobbered input must both die before it is reused.
        return ("in", e.value) if e.op == "in" else id(e)

    uses: dict[Any, int] = {}
    for e in order:
        for a in e.args:
            uses[key(a)] = uses.get(key(a), 0) + 1
    free: list[np.ndarray] = []
    if clobber is None and not any(np.may_share_memory(dst, a) for a in ins):
        free.append(dst)  # dst can hold intermediates: no input is read from it
    scratch: list[np.ndarray] = []
    value: dict[Any, Any] = {}  # node key -> ndarray (an input or a buffer) or 0-d constant
    owned: set[Any] = set()
    consts: set[Any] = set()  # nodes whose value is a buffer that returns to `free` when they die
    prog: list[tuple[Callable, tuple, np.ndarray]] = []

    def buffer() -> np.ndarray:
        if free:
            return free.pop()
        scratch.append(np.empty(dst.shape, dt))
        return scratch[-1]

    for e in order:
        if e.op == "in":
            value[key(e)] = ins[e.value]
            if e.value == clobber:
                owned.add(key(e))
            continue
        if e.op == "const":
            value[key(e)] = np.asarray(e.value, dt)
            consts.add(key(e))
            continue
        args = [value[key(a)] for a in e.args]
        if all(key(a) in consts for a in e.args):  # constant subtree: fold it now
            with np.errstate(all="ignore"):
                value[key(e)] = np.asarray(NUMPY_OPS[e.op](*args), dt)
            consts.add(key(e))
            continue
        for a in e.args:  # args dying here free their buffers first, so a unary op can run in place
            uses[key(a)] -= 1
            if uses[key(a)] == 0 and key(a) in owned:
                owned.discard(key(a))
                free.append(value[key(a)])
        out = dst if e is expr else buffer()
        if e.op in ("max", "min"):  # a constant bound (clip, relu6) is read as a full array: see `filled`
            args = [filled(a, dst.shape) if key(b) in consts else a for a, b in zip(args, e.args, strict=True)]
        if e.op in _BINARY:
            prog.append((_BINARY[e.op], tuple(args), out))
        elif e.op in _UNARY:
            prog.append((_UNARY[e.op], tuple(args), out))
        elif e.op == "relu":
            # max(x, 0) keeps NaN (numpy's maximum propagates it); only -0.0 may come out as +0.0.
            prog.append((np.maximum, (args[0], filled(np.asarray(0, dt), dst.shape)), out))
        else:  # sigmoid as eval_numpy writes it: 1 / (1 + exp(-x))
            one = np.asarray(1, dt)
            prog += [(np.negative, (args[0],), out), (np.exp, (out,), out), (np.add, (out, one), out),
                     (np.true_divide, (one, out), out)]
        value[key(e)] = out
        if e is not expr:
            owned.add(key(e))
    if not prog:  # the whole tree folded to a constant
        c = value[key(expr)]
        return lambda: np.copyto(dst, c)

    if all(fn in (np.maximum, np.minimum) for fn, _, _ in prog):
        # relu and friends raise no floating-point errors: no np.errstate, which costs more than the work while
        # another thread runs numpy too (a conv's epilogue runs once per part).
        if len(prog) == 1:
            fn, a, o = prog[0]
            return lambda: fn(*a, out=o)

        def plain() -> None:
            for fn, a, o in prog:
                fn(*a, out=o)

        return plain

    def step() -> None:
        with np.errstate(all="ignore"):
            for fn, a, o in prog:
                fn(*a, out=o)

    return step
