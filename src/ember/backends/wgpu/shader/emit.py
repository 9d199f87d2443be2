"""The expression emitter: an Expr tree (ember.core.expr) -> WGSL `let` statements, one per distinct node.

float64 operands (double-float, vec2<f32>: kernels/df64.wgsl) make the nodes reading them compute in df64: a
float node is df64 when any float operand is (an f32 operand is widened exactly: (x, 0), a literal or an int
conversion split into hi and lo), so every value derived from a float64 input keeps float64's precision. A node
with no df64 lowering is a NotImplementedError naming the op, never f32 math in disguise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ....core.expr import BOOL, FLOAT, INT, Expr
from .wgsl import WGSL_TYPE, float_literal, int_literal

DF64 = "vec2<f32>"  # program.DF64 (not imported: the shader library stands below the program layer)

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
_DF_OPS = {
    "neg": "(-{0})", "abs": "df_abs({0})", "sign": "df_sign({0})", "relu": "df_relu({0})", "floor": "df_floor({0})",
    "ceil": "df_ceil({0})", "round": "df_round({0})", "exp": "df_exp({0})", "log": "df_log({0})",
    "sqrt": "df_sqrt({0})", "reciprocal": "df_div(df(1.0), {0})",
    "add": "df_add({0}, {1})", "sub": "df_sub({0}, {1})", "mul": "df_mul({0}, {1})", "div": "df_div({0}, {1})",
    "max": "df_max({0}, {1})", "min": "df_min({0}, {1})", "mod": "df_mod({0}, {1})", "fmod": "df_fmod({0}, {1})",
    "eq": "df_eq({0}, {1})", "ne": "df_ne({0}, {1})", "lt": "df_lt({0}, {1})", "le": "df_le({0}, {1})",
    "gt": "df_gt({0}, {1})", "ge": "df_ge({0}, {1})",
    "isnan": "is_nan({0}.x)", "isinf": "is_inf({0}.x)", "isposinf": "({0}.x == inf_f32())",
    "isneginf": "({0}.x == -inf_f32())", "to_float": "{0}", "to_int": "df_to_i32({0})", "to_bool": "({0}.x != 0.0)",
}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_LOGIC = {"and": "({0} && {1})", "or": "({0} || {1})", "xor": "({0} != {1})", "not": "(!{0})"}


def df_literal(v: float) -> str:
    """A float64 constant as a df64 pair (hi, lo)."""
    hi = np.float32(v)
    with np.errstate(invalid="ignore"):
        lo = np.float32(float(v) - float(hi)) if np.isfinite(hi) else np.float32(0.0)
    return f"vec2<f32>({float_literal(float(hi))}, {float_literal(float(lo))})"


class ExprEmitter:
    def __init__(self, loads: list[str], gather: Any = None, df_inputs: frozenset[int] = frozenset()) -> None:
        self.lines: list[str] = []
        self.loads = loads  # WGSL expression that loads input i, already of its kind's type
        self.gather = gather  # (input, [index exprs]) -> WGSL expression, for "load" nodes
        self.count = 0
        self.memo: dict[int, str] = {}  # a subtree shared by identity is computed once
        self.df_inputs = df_inputs  # inputs stored as float64 (vec2<f32>): what they touch computes in df64
        self.df: set[int] = set()  # ids of the nodes whose value is a df64 pair

    def is_df(self, e: Expr) -> bool:
        return id(e) in self.df

    def as_df(self, e: Expr) -> str:
        """Node e's value as a df64 pair: itself, or an f32 / literal / int conversion widened exactly."""
        if id(e) in self.df:
            return self.memo[id(e)]
        if e.op == "const" and e.kind == FLOAT:
            return df_literal(e.value)
        if e.op == "to_float" and e.args[0].kind == INT:
            return f"df_from_i32({self.memo[id(e.args[0])]})"
        if e.kind == BOOL:
            return f"df(select(0.0, 1.0, {self.memo[id(e)]}))"
        if e.kind == INT:
            return f"df_from_i32({self.memo[id(e)]})"
        return f"df({self.memo[id(e)]})"

    def translate_df(self, e: Expr) -> str:
        """A node with a df64 operand: the df64 lowering, its float operands widened to df64."""
        if e.op == "where":
            return f"select({self.as_df(e.args[2])}, {self.as_df(e.args[1])}, {self.memo[id(e.args[0])]})"
        if e.op not in _DF_OPS:
            raise NotImplementedError(f"wgpu backend: elementwise op {e.op!r} on float64 operands has no "
                                      "double-float (df64) lowering")
        return _DF_OPS[e.op].format(*(self.as_df(a) if a.kind == FLOAT else self.memo[id(a)] for a in e.args))

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
                if e.op == "in" and e.value in self.df_inputs:
                    self.df.add(id(e))
                continue
            args = [self.memo[id(a)] for a in e.args]
            df = (e.value in self.df_inputs) if e.op == "load" else any(id(a) in self.df for a in e.args)
            if e.op == "load":
                text = self.gather(e.value, args)
            else:
                text = self.translate_df(e) if df else self.translate(e, args)
            if df and e.kind == FLOAT:
                self.df.add(id(e))
            name = f"t{self.count}"
            self.count += 1
            self.lines.append(f"    let {name}: {DF64 if id(e) in self.df else WGSL_TYPE[e.kind]} = {text};")
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

