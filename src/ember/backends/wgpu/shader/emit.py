"""The expression emitter: an Expr tree (ember.core.expr) -> WGSL `let` statements, one per distinct node."""

from __future__ import annotations

from typing import Any

from ....core.expr import BOOL, FLOAT, INT, Expr
from .wgsl import WGSL_TYPE, float_literal, int_literal

_F_UNARY = {
    "neg": "(-{0})", "abs": "abs({0})", "sign": "select(sign({0}), {0}, is_nan({0}))",
    # relu keeps NaN by a bit test: NVIDIA's driver turns select(x, 0, x < 0) into max(x, 0), which drops it
    "relu": "select(select({0}, 0.0, {0} < 0.0), {0}, is_nan({0}))",
    "floor": "floor({0})", "ceil": "ceil({0})", "round": "round({0})",
    "exp": "exp({0})", "log": "safe_log({0})", "sqrt": "safe_sqrt({0})", "reciprocal": "(1.0 / {0})",
    "sigmoid": "(1.0 / (1.0 + exp(-{0})))", "tanh": "tanh_f32({0})",
    "erf": "erf_f32({0})", "gelu": "(0.5 * {0} * erfc_f32(-0.70710678118654752 * {0}))",
    "gelu_tanh": "gelu_tanh_f32({0})",
    "sin": "sin({0})", "cos": "cos({0})", "tan": "tan({0})",
    "asin": "select(asin({0}), nan_f32(), abs({0}) > 1.0)", "acos": "select(acos({0}), nan_f32(), abs({0}) > 1.0)",
    "atan": "atan({0})", "sinh": "sinh({0})", "cosh": "cosh({0})", "asinh": "asinh({0})",
    "acosh": "select(acosh({0}), nan_f32(), {0} < 1.0)",
    "atanh": "select(atanh({0}), nan_f32(), abs({0}) > 1.0)",
    "softplus": "softplus_f32({0})", "softsign": "({0} / (1.0 + abs({0})))",
    "isnan": "is_nan({0})", "isinf": "is_inf({0})", "isposinf": "({0} == inf_f32())",
    "isneginf": "({0} == -inf_f32())",
}
_F_BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "max": "fmax_nan({0}, {1})", "min": "fmin_nan({0}, {1})", "pow": "pow_f32({0}, {1})",
    "mod": "mod_f32({0}, {1})", "fmod": "({0} - {1} * trunc({0} / {1}))",
}
_I_UNARY = {"neg": "(-{0})", "abs": "abs({0})", "sign": "sign({0})", "relu": "max({0}, 0)",
            "floor": "{0}", "ceil": "{0}", "round": "{0}"}
_I_BINARY = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "idiv({0}, {1})",
             "max": "max({0}, {1})", "min": "min({0}, {1})", "mod": "imod({0}, {1})",
             "fmod": "ifmod({0}, {1})",
             "pow": "i32(round(pow_f32(f32({0}), f32({1}))))", "bitand": "({0} & {1})", "bitor": "({0} | {1})",
             "bitxor": "({0} ^ {1})", "bitnot": "(~{0})", "shl": "({0} << u32({1}))", "shr": "({0} >> u32({1}))"}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_LOGIC = {"and": "({0} && {1})", "or": "({0} || {1})", "xor": "({0} != {1})", "not": "(!{0})"}


class ExprEmitter:
    def __init__(self, loads: list[str], gather: Any = None) -> None:
        self.lines: list[str] = []
        self.loads = loads  # WGSL expression that loads input i, already of its kind's type
        self.gather = gather  # (input, [index exprs]) -> WGSL expression, for "load" nodes
        self.count = 0
        self.memo: dict[int, str] = {}  # a subtree shared by identity is computed once

    def leaf(self, e: Expr) -> str:
        if e.op == "in":
            return self.loads[e.value]
        if e.op == "coord":
            return f"c{e.value}"
        if e.kind == FLOAT:
            return float_literal(e.value)
        if e.kind == INT:
            return int_literal(e.value)
        return "true" if e.value else "false"

    def emit(self, root: Expr) -> str:
        """One `let` per distinct node, children first (iterative: index kernels nest deeply)."""
        for e in root.walk():
            if id(e) in self.memo:
                continue
            if not e.args and e.op in ("in", "const", "coord"):
                self.memo[id(e)] = self.leaf(e)
                continue
            args = [self.memo[id(a)] for a in e.args]
            text = self.gather(e.value, args) if e.op == "load" else self.translate(e, args)
            name = f"t{self.count}"
            self.count += 1
            self.lines.append(f"    let {name}: {WGSL_TYPE[e.kind]} = {text};")
            self.memo[id(e)] = name
        return self.memo[id(root)]

    @staticmethod
    def translate(e: Expr, a: list[str]) -> str:
        op, k0 = e.op, e.args[0].kind
        if op == "to_float":
            return {FLOAT: a[0], INT: f"f32({a[0]})", BOOL: f"select(0.0, 1.0, {a[0]})"}[k0]
        if op == "to_int":
            # WGSL f32 -> i32 saturates; NaN maps to 0, as ONNX leaves it undefined.
            return {FLOAT: f"i32(select(trunc({a[0]}), 0.0, is_nan({a[0]})))", INT: a[0],
                    BOOL: f"select(0i, 1i, {a[0]})"}[k0]
        if op == "to_bool":
            return {FLOAT: f"({a[0]} != 0.0)", INT: f"({a[0]} != 0i)", BOOL: a[0]}[k0]
        if op == "where":
            return f"select({a[2]}, {a[1]}, {a[0]})"
        if op == "bitcast":
            if BOOL in (k0, e.kind):
                raise NotImplementedError("wgpu backend: bitcast to or from bool")
            return a[0] if k0 == e.kind else f"bitcast<{WGSL_TYPE[e.kind]}>({a[0]})"
        if op in _CMP:
            if k0 == BOOL:
                return f"(select(0i, 1i, {a[0]}) {_CMP[op]} select(0i, 1i, {a[1]}))"
            return f"({a[0]} {_CMP[op]} {a[1]})"
        if op in _LOGIC:
            return _LOGIC[op].format(*a)
        table = (_F_UNARY | _F_BINARY) if k0 == FLOAT else (_I_UNARY | _I_BINARY)
        if op not in table:
            raise NotImplementedError(f"wgpu backend: elementwise op {op!r} on {k0} operands")
        return table[op].format(*a)


def act_lines(act: Expr | None, value: str) -> tuple[list[str], str]:
    """WGSL lines applying `act` (an Expr over input 0) to `value`, through the expression emitter."""
    if act is None:
        return [], value
    if act.inputs() - {0}:
        raise ValueError(f"act: an activation reads input 0 only, got inputs {sorted(act.inputs())}")
    if act.kind != FLOAT:
        raise NotImplementedError(f"act: the activation must produce float, got {act.kind}")
    em = ExprEmitter([value])
    result = em.emit(act)
    return em.lines, result

