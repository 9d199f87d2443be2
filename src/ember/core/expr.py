"""Elementwise expressions: one small tree language that both backends compile.

The cpu backend evaluates a tree with numpy; the wgpu backend turns it into one generated WGSL kernel.
Every elementwise ONNX op, the public unary/binary ops and fused chains of them are trees here, so
broadcasting, NaN rules and dtype handling are written once per backend, not once per op.

Kinds: "float", "int", "bool". A backend picks the storage type (wgpu: f32 / i32 / u32).

Index-aware nodes make gathers and resamplers single kernels too: `coord(d)` is the output element's
coordinate along output dim d, and `load(i, idx...)` reads input i at a computed multi-index (indices are
clamped into range, so a read never leaves the tensor). An input read only through `load` keeps its own
shape; inputs read through `inp` are broadcast to the output's shape, as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

FLOAT, INT, BOOL = "float", "int", "bool"


@dataclass(frozen=True)
class Expr:
    op: str  # "in", "const", "coord", "load" or a name in SIGNATURES
    args: tuple[Expr, ...] = ()
    value: Any = None  # "in"/"load": input index; "const": the number; "coord": the dim; "bitcast": the dtype
    kind: str = FLOAT

    def size(self) -> int:
        """Nodes as a tree (a shared subtree counts at every use: the cost of inlining it)."""
        memo: dict[int, int] = {}

        def walk(e: Expr) -> int:
            hit = memo.get(id(e))
            if hit is None:
                hit = memo[id(e)] = 1 + sum(walk(a) for a in e.args)
            return hit

        return walk(self)

    def walk(self) -> list[Expr]:
        """Every distinct node once (by identity), children before parents. Index kernels share subtrees
        heavily (a running max refers to the previous one twice), so walks must not expand the tree."""
        seen: set[int] = set()
        order: list[Expr] = []
        stack: list[tuple[Expr, bool]] = [(self, False)]
        while stack:
            e, done = stack.pop()
            if done:
                order.append(e)
                continue
            if id(e) in seen:
                continue
            seen.add(id(e))
            stack.append((e, True))
            stack.extend((a, False) for a in e.args)
        return order

    def nodes(self) -> int:
        """Distinct nodes (a subtree shared by identity counts once: it is computed once)."""
        return len(self.walk())

    def inputs(self) -> set[int]:
        return {e.value for e in self.walk() if e.op in ("in", "load")}

    def loaded(self) -> set[int]:
        """Inputs read through `load` (at computed indices)."""
        return {e.value for e in self.walk() if e.op == "load"}

    def direct(self) -> set[int]:
        """Inputs read through `in` (at the output element's own position)."""
        return {e.value for e in self.walk() if e.op == "in"}

    def indexed(self) -> bool:
        """True when the tree uses output coordinates or computed loads (no dim merging then)."""
        return any(e.op in ("coord", "load") for e in self.walk())

    def key(self) -> str:
        """A stable text form, used to cache generated kernels (shared subtrees are written once, as @n)."""
        names: dict[int, str] = {}
        parts = []
        for e in self.walk():
            if e.op == "in":
                text = f"${e.value}:{e.kind}"
            elif e.op == "const":
                text = f"#{e.value!r}:{e.kind}"
            elif e.op == "coord":
                text = f"@c{e.value}"
            else:
                head = f"{e.op}{e.value}:{e.kind}" if e.op in ("load", "bitcast") else e.op
                text = f"{head}({','.join(names[id(a)] for a in e.args)})"
            names[id(e)] = f"%{len(parts)}"
            parts.append(text)
        return ";".join(parts)


def inp(index: int, kind: str = FLOAT) -> Expr:
    return Expr("in", value=index, kind=kind)


def const(value: float | int | bool, kind: str = FLOAT) -> Expr:
    if kind == FLOAT:
        value = float(value)
    elif kind == INT:
        value = int(value)
    else:
        value = bool(value)
    return Expr("const", value=value, kind=kind)


def coord(dim: int) -> Expr:
    """The coordinate of the output element being computed, along output dim `dim`."""
    return Expr("coord", value=int(dim), kind=INT)


def load(index: int, *idx: Expr, kind: str = FLOAT) -> Expr:
    """Input `index` (of kind `kind`) at the multi-index `idx` (one int Expr per dim of that input).

    Each index is clamped into [0, dim - 1]: callers that need other out-of-range behaviour (a fill value,
    say) select it with `where`, and a device read never leaves the tensor.
    """
    if any(e.kind != INT for e in idx):
        raise ValueError("load: indices must be int expressions")
    return Expr("load", tuple(idx), value=int(index), kind=kind)


def bitcast(x: Expr, dtype: Any) -> Expr:
    """The bits of x reinterpreted as `dtype` (same item size as x's dtype)."""
    dt = np.dtype(dtype)
    return Expr("bitcast", (x,), value=dt.name, kind=FLOAT if dt.kind == "f" else BOOL if dt.kind == "b" else INT)


# name -> (arity, result kind: "same" (kind of first arg), or a fixed kind)
SIGNATURES: dict[str, tuple[int, str]] = {}


def _sig(names: str, arity: int, result: str) -> None:
    for n in names.split():
        SIGNATURES[n] = (arity, result)


_sig("neg abs sign relu floor ceil round", 1, "same")
_sig("exp log sqrt reciprocal sigmoid tanh erf gelu gelu_tanh sin cos tan asin acos atan sinh cosh "
     "asinh acosh atanh softplus softsign", 1, FLOAT)
_sig("add sub mul div max min pow mod fmod", 2, "same")
_sig("eq ne lt le gt ge", 2, BOOL)
_sig("and or xor", 2, BOOL)
_sig("bitand bitor bitxor shl shr", 2, "same")  # int operands; shifts need 0 <= amount < the storage width
_sig("bitnot", 1, "same")
_sig("not", 1, BOOL)
_sig("isnan isinf isposinf isneginf", 1, BOOL)
_sig("where", 3, "second")
_sig("to_float", 1, FLOAT)
_sig("to_int", 1, INT)
_sig("to_bool", 1, BOOL)


def call(op: str, *args: Expr) -> Expr:
    if op not in SIGNATURES:
        raise ValueError(f"unknown elementwise op {op!r}")
    arity, result = SIGNATURES[op]
    if len(args) != arity:
        raise ValueError(f"{op} takes {arity} operands, got {len(args)}")
    if result == "same":
        kind = args[0].kind
    elif result == "second":
        kind = args[1].kind
    else:
        kind = result
    return Expr(op, tuple(args), kind=kind)


# ---- numpy evaluation (cpu backend, constant folding) ------------------------------------------------
def _np_round(x: np.ndarray) -> np.ndarray:
    return np.round(x)  # numpy rounds half to even, as ONNX Round does


def _np_gelu(x: np.ndarray) -> np.ndarray:
    # 0.5 x erfc(-x/sqrt2) in float64: 1 + erf(x/sqrt2) would cancel in the left tail.
    x64 = np.asarray(x, np.float64)
    erfc = np.vectorize(math.erfc, otypes=[np.float64])(-x64 / math.sqrt(2.0)) if x64.size else x64
    return (0.5 * x64 * erfc).astype(np.asarray(x).dtype)


def _np_gelu_tanh(x: np.ndarray) -> np.ndarray:
    # 0.5 x (1 + tanh(u)) = x sigmoid(2u), in float64.
    x64 = np.asarray(x, np.float64)
    u = math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)
    with np.errstate(over="ignore"):
        return (x64 / (1.0 + np.exp(-2.0 * u))).astype(np.asarray(x).dtype)


def _erf(x: np.ndarray) -> np.ndarray:
    # numpy has no erf; math.erf per element is exact and fine for host-side evaluation.
    x = np.asarray(x)
    return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy()


def _np_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(np.asarray(a).dtype, np.integer):
        return np.mod(a, np.where(b == 0, 1, b))  # integer Mod: sign of the divisor, like Python
    return np.mod(a, b)


def _np_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(np.asarray(a).dtype, np.integer):
        # ONNX integer Div truncates toward zero (C semantics), numpy floors.
        q = np.trunc(np.true_divide(a, np.where(b == 0, 1, b)))
        return q.astype(np.asarray(a).dtype)
    return np.true_divide(a, b)


def _np_relu(x: np.ndarray) -> np.ndarray:
    return np.where(x < 0, np.zeros_like(x), x)  # keeps NaN, unlike np.maximum(x, 0) on some builds


NUMPY_OPS: dict[str, Any] = {
    "neg": np.negative, "abs": np.abs, "sign": np.sign, "relu": _np_relu, "floor": np.floor,
    "ceil": np.ceil, "round": _np_round, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "reciprocal": np.reciprocal, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh, "erf": _erf,
    "gelu": _np_gelu, "gelu_tanh": _np_gelu_tanh, "sin": np.sin, "cos": np.cos, "tan": np.tan,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "softplus": lambda x: np.logaddexp(np.zeros_like(x), x), "softsign": lambda x: x / (1 + np.abs(x)),
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _np_div, "max": np.maximum,
    "min": np.minimum, "pow": np.power, "mod": _np_mod, "fmod": np.fmod,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor,
    "not": np.logical_not, "isnan": np.isnan, "isinf": np.isinf, "isposinf": np.isposinf,
    "isneginf": np.isneginf, "where": np.where, "bitand": np.bitwise_and, "bitor": np.bitwise_or,
    "bitxor": np.bitwise_xor, "bitnot": np.invert, "shl": np.left_shift, "shr": np.right_shift,
}


def eval_numpy(expr: Expr, inputs: list[np.ndarray], float_dtype: Any = np.float32,
               int_dtype: Any = np.int64, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Evaluate `expr` over numpy arrays (already broadcast-compatible); `shape` is the output's, which
    `coord` nodes need."""
    dtypes = {FLOAT: float_dtype, INT: int_dtype, BOOL: np.bool_}
    memo: dict[int, np.ndarray] = {}  # shared subtrees (by identity) are evaluated once

    def ev(e: Expr) -> np.ndarray:
        return memo[id(e)]

    def ev1(e: Expr) -> np.ndarray:
        if e.op == "in":
            return inputs[e.value]
        if e.op == "const":
            return np.asarray(e.value, dtypes[e.kind])
        if e.op == "coord":
            assert shape is not None, "coord needs the output shape"
            d = e.value
            return np.arange(shape[d], dtype=np.int64).reshape([-1 if i == d else 1 for i in range(len(shape))])
        vals = [ev(a) for a in e.args]
        if e.op == "load":
            src = inputs[e.value]
            idx = tuple(np.clip(v.astype(np.int64, copy=False), 0, max(n - 1, 0))
                        for v, n in zip(vals, src.shape, strict=True))
            return src[idx] if src.size else np.zeros(np.broadcast_shapes(*(v.shape for v in vals)), src.dtype)
        if e.op == "bitcast":
            v = np.ascontiguousarray(vals[0])
            return v.view(np.dtype(e.value)) if v.ndim else v.reshape(1).view(np.dtype(e.value)).reshape(())
        if e.op == "to_float":
            return vals[0].astype(float_dtype)
        if e.op == "to_int":
            v = vals[0]
            if v.dtype.kind == "f":
                v = np.trunc(v)  # float -> int casts truncate toward zero (C semantics)
            return v.astype(int_dtype)
        if e.op == "to_bool":
            return vals[0].astype(np.bool_)
        out = np.asarray(NUMPY_OPS[e.op](*vals))
        if e.kind == BOOL:
            return out.astype(np.bool_, copy=False)
        if e.kind == INT and out.dtype.kind not in "iu":
            return out.astype(int_dtype)
        return out

    with np.errstate(all="ignore"):
        for e in expr.walk():  # children first, each distinct node once
            memo[id(e)] = ev1(e)
        return memo[id(expr)]
