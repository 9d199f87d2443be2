"""Generated elementwise kernels: an Expr tree over strided, broadcast inputs -> one WGSL kernel.

Shapes and strides are baked into the source as constants (dims merged where every operand is
contiguous across them), so the common same-shape case indexes with the thread id alone and the
compiler turns the remaining divisions by constants into multiplies.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...core.expr import BOOL, FLOAT, INT, Expr
from ...core.view import View
from .backend import WgpuBackend, as_f32, grid_1d, storage_type

WORKGROUP = 256
MAX_EXPR_NODES = 1024  # distinct nodes; each is its own `let`, so this bounds shader size, not nesting depth

# Helpers every generated kernel may call. NaN and infinity come from bit patterns, not literals
# (WGSL has no inf/nan literals), and are tested by bits, since the compiler may assume x == x.
PRELUDE = """
fn nan_f32() -> f32 { return bitcast<f32>(0x7fc00000u); }
fn inf_f32() -> f32 { return bitcast<f32>(0x7f800000u); }
fn is_nan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn is_inf(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }
fn safe_log(x: f32) -> f32 {
    return select(select(log(x), -inf_f32(), x == 0.0), nan_f32(), x < 0.0 || is_nan(x));
}
fn safe_sqrt(x: f32) -> f32 { return select(sqrt(x), nan_f32(), x < 0.0 || is_nan(x)); }
fn erfc_f32(x: f32) -> f32 {
    // Numerical Recipes' erfcc (Chebyshev fit): relative error < 1.2e-7 everywhere, so the tail where
    // 1 - erf(x) would cancel (GELU at x < -3) stays accurate.
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
        + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    let r = t * exp(p);
    return select(r, 2.0 - r, x < 0.0);
}
fn erf_f32(x: f32) -> f32 {
    // Near 0 the Taylor series keeps the relative error small (1 - erfc would not); elsewhere 1 - erfc.
    if (is_nan(x)) { return x; }
    let a = abs(x);
    if (a < 0.5) {
        let x2 = x * x;
        return x * 1.1283791670955126 * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.1 + x2 * (-0.023809523809523808
            + x2 * (0.004629629629629629 + x2 * (-0.0007575757575757576 + x2 * 0.00010683760683760684))))));
    }
    return sign(x) * (1.0 - erfc_f32(a));
}
fn gelu_tanh_f32(x: f32) -> f32 {
    // 0.5 x (1 + tanh(u)) = x * sigmoid(2u): no cancellation for negative x. Past exp's range the
    // sigmoid is 0 (x * 0.0 keeps the sign of zero).
    let z = -2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return select(x / (1.0 + exp(min(z, 88.0))), x * 0.0, z > 88.0);
}
fn fmax_nan(a: f32, b: f32) -> f32 { return select(max(a, b), a + b, is_nan(a) || is_nan(b)); }
fn fmin_nan(a: f32, b: f32) -> f32 { return select(min(a, b), a + b, is_nan(a) || is_nan(b)); }
fn pow_f32(x: f32, y: f32) -> f32 {
    // IEEE/numpy pow: WGSL pow() is undefined for x < 0 and inexact at the edges.
    if (y == 0.0 || x == 1.0) { return 1.0; }
    if (is_nan(x) || is_nan(y)) { return nan_f32(); }
    let yi = trunc(y);
    let is_int = yi == y;
    if (x < 0.0 && !is_int && !is_inf(y) && !is_inf(x)) { return nan_f32(); }
    if (x == -1.0 && is_inf(y)) { return 1.0; }
    let odd = is_int && abs(y) < 16777216.0 && (i32(abs(yi)) & 1) == 1;
    let ax = abs(x);
    var r: f32;
    if (ax == 0.0) {
        r = select(0.0, inf_f32(), y < 0.0);
    } else if (is_inf(y)) {
        r = select(select(0.0, inf_f32(), ax > 1.0), select(0.0, inf_f32(), ax < 1.0), y < 0.0);
    } else if (is_inf(ax)) {
        r = select(inf_f32(), 0.0, y < 0.0);
    } else {
        r = exp2(y * log2(ax));
        if (is_int && abs(y) < 16777216.0) {
            // Integer powers by repeated squaring: NVIDIA's log2 is too coarse for exp2(y log2 x)
            // (0.5^-100 was off by 1e-5); squaring is exact for powers of two and within a few ulp otherwise.
            var e = u32(abs(yi));
            var base = ax;
            r = 1.0;
            loop {
                if ((e & 1u) == 1u) { r = r * base; }
                e = e >> 1u;
                if (e == 0u) { break; }
                base = base * base;
            }
            if (y < 0.0) { r = 1.0 / r; }
        }
    }
    return select(r, -r, (bitcast<u32>(x) & 0x80000000u) != 0u && odd);  // sign bit: pow(-0, -3) = -inf
}
fn imod(a: i32, b: i32) -> i32 {
    if (b == 0) { return 0; }
    let r = a - b * (a / b);  // not `%`: NVIDIA's Vulkan driver (H200) gave i32 % the unsigned result
    return select(r, r + b, r != 0 && ((r < 0) != (b < 0)));
}
fn tanh_f32(x: f32) -> f32 {
    // Drivers may evaluate tanh as (e^2x - 1) / (e^2x + 1), which cancels near 0: a series there.
    let a = abs(x);
    if (a < 0.1) {
        let x2 = x * x;
        return x * (1.0 + x2 * (-0.33333333333 + x2 * (0.13333333333 + x2 * -0.053968253968)));
    }
    if (a > 15.0 || is_nan(x)) { return select(sign(x), x, is_nan(x)); }
    return sign(x) * (1.0 - 2.0 / (exp(2.0 * a) + 1.0));
}
fn log1p_f32(y: f32) -> f32 {
    // log(1 + y) without the cancellation of forming 1 + y (Goldberg): softplus of large negatives needs it.
    let u = 1.0 + y;
    if (u == 1.0) { return y; }
    return log(u) * (y / (u - 1.0));
}
fn softplus_f32(x: f32) -> f32 { return select(x, 0.0, x < 0.0) + log1p_f32(exp(-abs(x))); }
fn mod_f32(a: f32, b: f32) -> f32 {
    // numpy's floored mod: the result takes b's sign (zeros too); a finite a mod +-inf is a or b.
    if (is_inf(b) && !is_inf(a) && !is_nan(a)) {
        if (a == 0.0) { return select(0.0, bitcast<f32>(0x80000000u), b < 0.0); }
        return select(b, a, (a < 0.0) == (b < 0.0));
    }
    let r = a - b * floor(a / b);
    return select(r, select(0.0, bitcast<f32>(0x80000000u), b < 0.0), r == 0.0);
}
fn idiv(a: i32, b: i32) -> i32 { return select(a / b, 0, b == 0); }
fn ifmod(a: i32, b: i32) -> i32 {
    if (b == 0) { return 0; }
    return a - b * (a / b);
}
"""

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
# Narrow ints live in i32 words; a store wraps them to their logical width, so the next kernel reads the
# value numpy would hold (uint8 200 + 100 = 44, not 300).
_WRAP = {"int8": "(({0} << 24u) >> 24u)", "int16": "(({0} << 16u) >> 16u)", "uint8": "({0} & 255i)",
         "uint16": "({0} & 65535i)"}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_LOGIC = {"and": "({0} && {1})", "or": "({0} || {1})", "xor": "({0} != {1})", "not": "(!{0})"}
WGSL_TYPE = {FLOAT: "f32", INT: "i32", BOOL: "bool"}


def float_literal(v: float) -> str:
    f = np.float32(v)
    if np.isnan(f):
        return "nan_f32()"
    if np.isinf(f):
        return "inf_f32()" if f > 0 else "(-inf_f32())"
    if f == 0 or abs(f) >= np.finfo(np.float32).tiny:
        return f"{float(f)!r}f"
    return f"bitcast<f32>({int(f.view(np.uint32))}u)"  # subnormal: spell the bits


def int_literal(v: int) -> str:
    v = max(min(v, 2**31 - 1), -(2**31))
    return f"i32({v})" if v == -(2**31) else f"{v}i"


class _Emitter:
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


def _merge_dims(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours that every operand walks contiguously."""
    dims: list[int] = []
    ss: list[list[int]] = [[] for _ in strides]
    for d, i in ((d, i) for i, d in enumerate(shape) if d != 1):
        if dims and all(s_list[-1] == st[i] * d for s_list, st in zip(ss, strides, strict=True)):
            dims[-1] *= d
            for s_list, st in zip(ss, strides, strict=True):
                s_list[-1] = st[i]
            continue
        dims.append(d)
        for s_list, st in zip(ss, strides, strict=True):
            s_list.append(st[i])
    return dims, ss


def _widen(raw: str, storage: str) -> str:
    """A stored element as its kind's compute type: bools live in u32 words, f16 is computed in f32."""
    if storage == "u32":
        return f"({raw} != 0u)"
    return as_f32(raw, storage)


def generate(expr: Expr, in_types: list[str], out_type: str, shape: tuple[int, ...],
             in_strides: list[tuple[int, ...]], in_offsets: list[int], out_strides: tuple[int, ...],
             out_offset: int, alias: list[bool], in_shapes: list[tuple[int, ...]] | None = None,
             out_dtype: Any = None) -> str:
    """WGSL for out[...] = expr(...) over an output window of `shape` (strided or not).

    `in_shapes` are needed for inputs read by `load` (their own shapes); `out_dtype`, the logical output
    dtype, makes narrow ints wrap on store.
    """
    total = math.prod(shape)
    indexed = expr.indexed()
    direct = expr.direct()
    if indexed:
        # Coordinates along every output dim, unmerged: coord(d) and computed loads refer to them.
        dims, out_ss = list(shape), list(out_strides)
        in_ss = [list(st) for st in in_strides]
    else:
        dims, ss = _merge_dims(shape, [out_strides, *in_strides])
        out_ss, in_ss = ss[0], ss[1:]
    linear = list(View.contiguous(0, np.float32, tuple(dims)).strides)
    out_plain = out_ss == linear
    body = [f"    let gid = (wid.y * nwg.x + wid.x) * {WORKGROUP}u + lid.x;",
            f"    if (gid >= {total}u) {{ return; }}"]
    # Coordinates only when some operand is not addressed by the output's linear index.
    plain = [st == linear or i not in direct for i, st in enumerate(in_ss)]
    if dims and (indexed or not all(plain) or not out_plain):
        body.append("    var r = i32(gid);")
        for j in range(len(dims) - 1, 0, -1):
            body.append(f"    let c{j} = r % {dims[j]}; r = r / {dims[j]};")
        body.append("    let c0 = r;")
    loads = []
    decls = []
    used = expr.inputs()
    for i, (t, st, off) in enumerate(zip(in_types, in_ss, in_offsets, strict=True)):
        if not alias[i] and i in used:  # an unused binding would not be in the pipeline's layout
            decls.append(f"@group(0) @binding({i}) var<storage, read> in{i}: array<{t}>;")
        if i not in direct:
            loads.append("")  # read by `load` only: see gather()
            continue
        if plain[i]:
            idx = "gid" if off == 0 else f"gid + {off}u"  # addressed by the output's linear index
        else:
            terms = [f"c{j} * {s}" for j, s in enumerate(st) if s != 0]
            idx = f"u32({' + '.join([str(off), *terms])})"
        raw = f"{'out' if alias[i] else f'in{i}'}[{idx}]"
        loads.append(_widen(raw, t))

    def gather(i: int, idx: list[str]) -> str:
        # Clamped indices: a trusted module must never read out of bounds, whatever the index data says.
        if alias[i]:
            raise ValueError("record_elementwise: an input read by load must not alias the output")
        assert in_shapes is not None, "load needs the input shapes"
        if math.prod(in_shapes[i]) == 0:
            return {"f32": "0.0", "f16": "0.0", "i32": "0i", "u32": "false"}[in_types[i]]  # nothing to read
        terms = [f"clamp({a}, 0i, {max(n - 1, 0)}i) * {st}" for a, n, st in
                 zip(idx, in_shapes[i], in_strides[i], strict=True) if n > 1 and st != 0]
        raw = f"in{i}[u32({' + '.join([str(in_offsets[i]), *terms])})]"
        return _widen(raw, in_types[i])

    em = _Emitter(loads, gather)
    value = em.emit(expr)
    body.extend(em.lines)
    if out_type == "u32":
        value = f"select(0u, 1u, {value})"
    elif expr.kind == BOOL:
        value = f"{out_type}(select(0, 1, {value}))"
    elif out_type == "f16" or (out_type == "f32") != (expr.kind == FLOAT):
        value = f"{out_type}({value})"  # f16 storage: computed in f32, rounded once on store
    if out_type == "i32" and out_dtype is not None and np.dtype(out_dtype).name in _WRAP:
        value = _WRAP[np.dtype(out_dtype).name].format(value)
    if out_plain:
        out_idx = "gid" if out_offset == 0 else f"gid + {out_offset}u"
    else:
        out_idx = f"u32({' + '.join([str(out_offset), *(f'c{j} * {s}' for j, s in enumerate(out_ss) if s)])})"
    body.append(f"    out[{out_idx}] = {value};")
    nbind = len(in_types)
    return "\n".join([
        PRELUDE,
        *decls,
        f"@group(0) @binding({nbind}) var<storage, read_write> out: array<{out_type}>;",
        f"@compute @workgroup_size({WORKGROUP})",
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,",
        "        @builtin(local_invocation_id) lid: vec3<u32>) {",
        *body,
        "}",
    ])


def record_elementwise(be: WgpuBackend, expr: Expr, inputs: list[View], out: View) -> list[Any]:
    if expr.nodes() > MAX_EXPR_NODES:
        raise ValueError(f"elementwise expression of {expr.nodes()} nodes exceeds the cap of {MAX_EXPR_NODES}")
    total = out.size
    if total == 0:
        return []
    if any(s < 0 for s in out.strides) or any(s == 0 and d > 1 for s, d in zip(out.strides, out.shape, strict=True)):
        raise ValueError("record_elementwise: the output view must not overlap itself")
    alias = [v.handle == out.handle for v in inputs]
    in_types = [storage_type(v.dtype) for v in inputs]
    out_type = storage_type(out.dtype)
    for i, v in enumerate(inputs):
        if alias[i] and (in_types[i] != out_type or v.strides != out.strides or v.offset != out.offset):
            raise ValueError("record_elementwise: an input aliasing the output must have the output's layout")
    src = generate(expr, in_types, out_type, out.shape, [v.strides for v in inputs], [v.offset for v in inputs],
                   out.strides, out.offset, alias, [v.shape for v in inputs], out.dtype)
    pipeline = be.pipeline(f"ew:{expr.op}", src)
    # Bindings are numbered by input position; an input aliasing the output is read through `out`.
    used = expr.inputs()
    bindings = {i: v.handle for i, v in enumerate(inputs) if not alias[i] and i in used}
    bindings[len(inputs)] = out.handle
    return [be.dispatch(pipeline, bindings, grid_1d(-(-total // WORKGROUP)), f"ew:{expr.op}")]
