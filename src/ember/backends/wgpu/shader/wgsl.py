"""WGSL building blocks: the prelude of helpers, literals, u32 address expressions."""

from __future__ import annotations

import numpy as np

from ....core.expr import BOOL, FLOAT, INT

# Helpers every generated kernel may call. NaN and infinity come from bit patterns, not literals
# (WGSL has no inf/nan literals), and are tested by bits, since the compiler may assume x == x. The bits sit in
# private variables: Tint (Dawn) evaluates a bitcast of a constant at compile time and rejects a non-finite
# result, and folds a constant -0.0 to +0.0.
PRELUDE = """
var<private> NAN_BITS: u32 = 0x7fc00000u;
var<private> INF_BITS: u32 = 0x7f800000u;
var<private> NEG_ZERO_BITS: u32 = 0x80000000u;
fn nan_f32() -> f32 { return bitcast<f32>(NAN_BITS); }
fn inf_f32() -> f32 { return bitcast<f32>(INF_BITS); }
fn neg_zero_f32() -> f32 { return bitcast<f32>(NEG_ZERO_BITS); }
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
            // Integer powers by repeated squaring: NVIDIA's log2 is too coarse for exp2(y log2 x);
            // squaring is exact for powers of two and within a few ulp otherwise.
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
        if (a == 0.0) { return select(0.0, neg_zero_f32(), b < 0.0); }
        return select(b, a, (a < 0.0) == (b < 0.0));
    }
    let r = a - b * floor(a / b);
    return select(r, select(0.0, neg_zero_f32(), b < 0.0), r == 0.0);
}
fn idiv(a: i32, b: i32) -> i32 { return select(a / b, 0, b == 0); }
fn ifmod(a: i32, b: i32) -> i32 {
    if (b == 0) { return 0; }
    return a - b * (a / b);
}
"""
WGSL_TYPE = {FLOAT: "f32", INT: "i32", BOOL: "bool"}


def float_literal(v: float) -> str:
    f = np.float32(v)
    if np.isnan(f):
        return "nan_f32()"
    if np.isinf(f):
        return "inf_f32()" if f > 0 else "(-inf_f32())"
    if f == 0 and np.signbit(f):
        return f"bitcast<f32>({int(f.view(np.uint32))}u)"  # -0.0: Tint folds the literal to +0.0
    if f == 0 or abs(f) >= np.finfo(np.float32).tiny:
        return f"{float(f)!r}f"
    return f"bitcast<f32>({int(f.view(np.uint32))}u)"  # subnormal: spell the bits


def int_literal(v: int) -> str:
    v = max(min(v, 2**31 - 1), -(2**31))
    return f"i32({v})" if v == -(2**31) else f"{v}i"


def u32(v: int) -> str:
    """The WGSL u32 literal of v."""
    return f"{int(v)}u"


def log2(v: int) -> int:
    assert v > 0 and v & (v - 1) == 0, v
    return v.bit_length() - 1


def addr(off: int, terms: list[tuple[str, int]]) -> str:
    """A u32 WGSL expression for off + sum(var * stride), in i32 arithmetic if anything is negative."""
    terms = [(var, s) for var, s in terms if s != 0]
    if off >= 0 and all(s > 0 for _, s in terms):
        parts = [var if s == 1 else f"{var} * {u32(s)}" for var, s in terms]
        if off or not parts:
            parts.append(u32(off))
        return " + ".join(parts)
    parts = [f"i32({var})" if s == 1 else f"i32({var}) * {s}i" for var, s in terms]
    parts.append(f"{off}i")
    return f"u32({' + '.join(parts)})"

