// Double-float (df64) arithmetic: how the wgpu backend computes float64 (WGSL has no f64).
// A float64 value is a vec2<f32> (hi, lo), normalised: hi = f32(hi + lo) rounded to nearest, lo the exact rest
// (the host splits uploads the same way, program.to_storage). Every result is ~2^-48 relative (about 3.6e-15)
// with f32's exponent range; a non-finite hi always comes with lo = 0, so comparisons may read lo.
// A library, no bindings and no entry point: the generated elementwise kernels, reduce.wgsl and scan.wgsl
// include it after the prelude (shader/wgsl.py: is_nan, is_inf, nan_f32, inf_f32) when a tensor is float64.
// Products split both factors by bit masks (12 + 12 significant bits), so every partial product is exact and no
// result depends on whether the driver contracts a*b + c into an FMA.
// Shader compilers may simplify float algebra ((a + b) - a -> b: Mesa's NIR does, naga marks nothing exact),
// which would erase the error terms: df_o passes a value through an integer xor with a zero the compiler cannot
// know (df_init: num_workgroups.z - 1, so kernels including this must be dispatched with a grid of z = 1, as
// program.grid_1d makes them, and call df_init(nwg) first thing in main).
var<private> df_zero: u32;
fn df_init(nwg: vec3<u32>) { df_zero = nwg.z - 1u; }
fn df_o(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) ^ df_zero); }

fn df(x: f32) -> vec2<f32> { return vec2<f32>(x, 0.0); }
// -0.0 from bits in a private variable: Tint folds a constant -0.0 to +0.0.
var<private> DF_NEG_ZERO_BITS: u32 = 0x80000000u;
fn df_neg_zero() -> f32 { return bitcast<f32>(DF_NEG_ZERO_BITS); }
fn df_finite(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u; }
fn df_fix(a: vec2<f32>) -> vec2<f32> { return select(vec2<f32>(a.x, 0.0), a, df_finite(a.x)); }

// s + e with |e| <= ulp(s) / 2 as a normalised pair (e == 0 keeps s's zero sign: -0 + -0 is -0).
fn df_quick(s: f32, e: f32) -> vec2<f32> {
    if (!df_finite(s) || e == 0.0) { return vec2<f32>(s, 0.0); }
    let h = df_o(s + e);
    if (!df_finite(h)) { return vec2<f32>(h, 0.0); }
    return vec2<f32>(h, e - df_o(h - s));
}

// Knuth's two-sum: s = fl(a + b) and the exact error, any magnitudes.
fn df_two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = df_o(a + b);
    let bb = df_o(s - a);
    return vec2<f32>(s, (a - df_o(s - bb)) + (b - bb));
}

fn df_add(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    // The accurate ("IEEE") variant: the low words are summed exactly too, so cancellation stays accurate.
    let s = df_two_sum(a.x, b.x);
    let t = df_two_sum(a.y, b.y);
    let u = df_quick(s.x, s.y + t.x);
    return df_quick(u.x, u.y + t.y);
}
fn df_neg(a: vec2<f32>) -> vec2<f32> { return -a; }
fn df_sub(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> { return df_add(a, -b); }
fn df_abs(a: vec2<f32>) -> vec2<f32> { return select(a, -a, a.x < 0.0 || (a.x == 0.0 && a.y < 0.0)); }

// a = hi + lo with hi the top 12 significant bits (a mask, not Veltkamp's multiply: no overflow, no FMA).
fn df_split(a: f32) -> vec2<f32> {
    let h = bitcast<f32>(bitcast<u32>(a) & 0xfffff000u);
    return vec2<f32>(h, a - h);
}

// Dekker's two-product: p = fl(a * b) and the exact error (finite a, b; no underflow).
fn df_two_prod(a: f32, b: f32) -> vec2<f32> {
    let p = a * b;
    if (!df_finite(p) || p == 0.0) { return vec2<f32>(p, 0.0); }
    let x = df_split(a);
    let y = df_split(b);
    return vec2<f32>(p, (((x.x * y.x - p) + x.x * y.y) + x.y * y.x) + x.y * y.y);
}

fn df_mul(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let p = a.x * b.x;
    if (!df_finite(p) || p == 0.0) { return vec2<f32>(p, 0.0); }
    let ah = df_split(a.x);
    let bh = df_split(b.x);
    let al = df_split(a.y);
    let bl = df_split(b.y);
    let e = (((ah.x * bh.x - p) + ah.x * bh.y) + ah.y * bh.x) + ah.y * bh.y;
    // hi * lo cross terms from exact 12 x 12-bit products too (lo * lo is below the format's precision). No two
    // products added directly share a factor: a compiler may factor a*b + a*c into a*(b + c), which rounds.
    let c = ((ah.x * bl.x + ah.y * bl.y) + (ah.x * bl.y + ah.y * bl.x))
        + ((al.x * bh.x + al.y * bh.y) + (al.x * bh.y + al.y * bh.x));
    return df_quick(p, e + c);
}
fn df_scale(a: vec2<f32>, k: i32) -> vec2<f32> {
    // a * 2^k in two steps: WGSL's ldexp is undefined for exponents past the f32 bias.
    let k1 = k / 2;
    return df_fix(vec2<f32>(ldexp(ldexp(a.x, k1), k - k1), ldexp(ldexp(a.y, k1), k - k1)));
}

fn df_div(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    // The f32 quotient, then two Newton corrections on the df64 remainder (WGSL's f32 division is 2.5 ulp).
    let q1 = a.x / b.x;
    if (!df_finite(q1) || q1 == 0.0 || !df_finite(b.x)) { return vec2<f32>(q1, 0.0); }
    var r = df_sub(a, df_mul(b, df(q1)));
    let q2 = r.x / b.x;
    r = df_sub(r, df_mul(b, df(q2)));
    let q3 = r.x / b.x;
    return df_add(df_quick(q1, q2), df(q3));
}

// Comparisons: lexicographic on normalised pairs; a NaN hi makes every one but `ne` false.
fn df_eq(a: vec2<f32>, b: vec2<f32>) -> bool { return a.x == b.x && a.y == b.y; }
fn df_ne(a: vec2<f32>, b: vec2<f32>) -> bool { return !df_eq(a, b); }
fn df_lt(a: vec2<f32>, b: vec2<f32>) -> bool { return a.x < b.x || (a.x == b.x && a.y < b.y); }
fn df_le(a: vec2<f32>, b: vec2<f32>) -> bool { return a.x < b.x || (a.x == b.x && a.y <= b.y); }
fn df_gt(a: vec2<f32>, b: vec2<f32>) -> bool { return df_lt(b, a); }
fn df_ge(a: vec2<f32>, b: vec2<f32>) -> bool { return df_le(b, a); }
// numpy's maximum/minimum: a NaN operand gives NaN.
fn df_max(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    if (is_nan(a.x) || is_nan(b.x)) { return df(nan_f32()); }
    return select(b, a, df_gt(a, b));
}
fn df_min(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    if (is_nan(a.x) || is_nan(b.x)) { return df(nan_f32()); }
    return select(b, a, df_lt(a, b));
}

fn df_floor(a: vec2<f32>) -> vec2<f32> {
    // A non-integer hi has |lo| < the distance to the next integer: floor(hi) is the answer.
    let h = floor(a.x);
    if (h != a.x) { return vec2<f32>(h, 0.0); }
    return df_quick(h, floor(a.y));
}
fn df_ceil(a: vec2<f32>) -> vec2<f32> { return -df_floor(-a); }
fn df_trunc(a: vec2<f32>) -> vec2<f32> { return select(df_floor(a), df_ceil(a), a.x < 0.0); }
fn df_odd(v: f32) -> bool { return v * 0.5 != floor(v * 0.5); }  // for integer-valued v
fn df_round(a: vec2<f32>) -> vec2<f32> {
    // Half to even, as ONNX Round and numpy: the fraction a - floor(a) is exact.
    let f = df_floor(a);
    let frac = df_sub(a, f);
    let odd = df_odd(f.x) != df_odd(f.y);
    let up = frac.x > 0.5 || (frac.x == 0.5 && (frac.y > 0.0 || (frac.y == 0.0 && odd)));
    return select(f, df_add(f, df(1.0)), up && df_finite(a.x));
}
fn df_sign(a: vec2<f32>) -> vec2<f32> { return select(df(sign(a.x)), a, is_nan(a.x)); }
fn df_relu(a: vec2<f32>) -> vec2<f32> { return select(a, df(0.0), a.x < 0.0); }

fn df_sqrt(a: vec2<f32>) -> vec2<f32> {
    if (is_nan(a.x) || a.x < 0.0) { return df(nan_f32()); }
    if (a.x == 0.0 || is_inf(a.x)) { return df(a.x); }
    var y = df(sqrt(a.x));
    for (var i = 0; i < 2; i++) {  // Newton: y += (a - y^2) / 2y
        y = df_add(y, df_div(df_sub(a, df_mul(y, y)), 2.0 * y));
    }
    return y;
}

fn df_exp(a: vec2<f32>) -> vec2<f32> {
    if (is_nan(a.x)) { return df(a.x); }
    if (a.x > 88.8) { return df(inf_f32()); }
    if (a.x < -104.0) { return df(0.0); }
    // x = k ln2 + r, ln2 = L1 + L2 + L3 (L1 of 16 bits, so k * L1 is exact for |k| < 2^8): r is accurate to
    // 2^-48 of itself, |r| <= 0.35.
    let k = round(a.x * 1.4426950408889634);
    var r = df_sub(a, df(k * 0.693145751953125));
    r = df_sub(r, df_two_prod(k, 1.428606765330187e-06));
    r = df_sub(r, df(k * 5.497923148104107e-14));
    // expm1(t), t = r / 512, by Taylor to t^7/7! (the next term is below 2^-60 of the sum), then nine
    // squarings expm1(2t) = 2 expm1(t) + expm1(t)^2, which keep the small result's relative precision.
    let t = r * 0.001953125;
    var p = vec2<f32>(0.00019841270113829523, -2.725596874933456e-12);
    p = df_add(vec2<f32>(0.0013888889225199819, -3.3631094437103215e-11), df_mul(t, p));
    p = df_add(vec2<f32>(0.008333333767950535, -4.34617203337595e-10), df_mul(t, p));
    p = df_add(vec2<f32>(0.0416666679084301, -1.2417634698280722e-09), df_mul(t, p));
    p = df_add(vec2<f32>(0.1666666716337204, -4.967053879312289e-09), df_mul(t, p));
    p = df_add(df(0.5), df_mul(t, p));
    p = df_add(df(1.0), df_mul(t, p));
    var s = df_mul(t, p);
    for (var i = 0; i < 9; i++) {
        s = df_add(df_mul(s, s), 2.0 * s);
    }
    return df_scale(df_add(s, df(1.0)), i32(k));
}

fn df_log(a: vec2<f32>) -> vec2<f32> {
    if (is_nan(a.x) || a.x < 0.0) { return df(nan_f32()); }
    if (a.x == 0.0) { return df(-inf_f32()); }
    if (is_inf(a.x)) { return df(a.x); }
    // x = 2^e m with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716: the odd
    // series to s^23 (the next term is below 2^-60 of the sum), accurate to 2^-48 relative even near x = 1.
    let fe = frexp(a.x);
    let e = select(fe.exp, fe.exp - 1, fe.fract < 0.70710678);
    let m = df_scale(a, -e);
    let s = df_div(df_sub(m, df(1.0)), df_add(m, df(1.0)));
    let s2 = df_mul(s, s);
    var p = vec2<f32>(0.043478261679410934, -8.098456905081264e-10);
    p = df_add(vec2<f32>(0.0476190485060215, -8.869738832295582e-10), df_mul(s2, p));
    p = df_add(vec2<f32>(0.05263157933950424, -3.9213582381236733e-10), df_mul(s2, p));
    p = df_add(vec2<f32>(0.05882352963089943, -2.1913472425527658e-10), df_mul(s2, p));
    p = df_add(vec2<f32>(0.06666667014360428, -3.47693762670076e-09), df_mul(s2, p));
    p = df_add(vec2<f32>(0.07692307978868484, -2.8656079731348427e-09), df_mul(s2, p));
    p = df_add(vec2<f32>(0.09090909361839294, -2.709302115988521e-09), df_mul(s2, p));
    p = df_add(vec2<f32>(0.1111111119389534, -8.278422947149977e-10), df_mul(s2, p));
    p = df_add(vec2<f32>(0.1428571492433548, -6.38621200366174e-09), df_mul(s2, p));
    p = df_add(vec2<f32>(0.20000000298023224, -2.9802322831784522e-09), df_mul(s2, p));
    p = df_add(vec2<f32>(0.3333333432674408, -9.934107758624577e-09), df_mul(s2, p));
    p = df_add(df(1.0), df_mul(s2, p));
    let ln_m = 2.0 * df_mul(s, p);
    return df_add(df_mul(df(f32(e)), vec2<f32>(0.6931471824645996, -1.9046542121259336e-09)), ln_m);
}

// C fmod (the sign of a) by binary long division: r -= b 2^k for k from the exponent gap down to 0. Each step
// subtracts a value within a factor 2 of r, so any quotient gives a remainder in [0, |b|) accurate to ~2^-48 |a|
// modulo b (past a quotient of ~2^40 a remainder near 0 can come out near |b| or the other way round)
// (a single a - b trunc(a / b) is off by whole multiples of b once a / b passes 2^24; an exact remainder would
// need a third word, as the intermediate remainders can span 50 bits).
fn df_fmod(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    if (!df_finite(a.x) || is_nan(b.x) || b.x == 0.0) { return df(nan_f32()); }
    if (is_inf(b.x)) { return a; }
    var r = df_abs(a);
    let d = df_abs(b);
    if (df_lt(r, d)) { return a; }
    for (var k = frexp(r.x).exp - frexp(d.x).exp; k >= 0; k--) {
        let step = df_scale(d, k);
        if (df_ge(r, step)) { r = df_sub(r, step); }
    }
    // A step taken on a rounded tie (r within rounding of b 2^k) leaves r just below 0 instead of just below b:
    // the same value modulo b, moved back into [0, |b|).
    if (r.x < 0.0) { r = df_add(r, d); }
    if (df_ge(r, d)) { r = df_sub(r, d); }
    if (r.x == 0.0) { return vec2<f32>(select(0.0, df_neg_zero(), a.x < 0.0), 0.0); }
    return select(r, -r, a.x < 0.0);
}
// numpy's floored mod: the sign of b (zeros too); a finite a mod +-inf is a or b (as mod_f32).
fn df_mod(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    if (is_inf(b.x) && df_finite(a.x)) {
        if (a.x == 0.0) { return df(select(0.0, df_neg_zero(), b.x < 0.0)); }
        return select(b, a, (a.x < 0.0) == (b.x < 0.0));
    }
    var r = df_fmod(a, b);
    if (r.x != 0.0 && (r.x < 0.0) != (b.x < 0.0)) { r = df_add(r, b); }
    return select(r, df(select(0.0, df_neg_zero(), b.x < 0.0)), r.x == 0.0);
}

// Conversions. df -> f32 is hi (normalised pairs: hi is hi + lo rounded to nearest).
fn df_from_i32(i: i32) -> vec2<f32> {
    // Two exact halves (16 significant bits each): f32(i) alone rounds past 2^24.
    let t = df_two_sum(f32(i & bitcast<i32>(0xffff0000u)), f32(i & 0xffff));
    return vec2<f32>(t.x, t.y);
}
fn df_to_i32(a: vec2<f32>) -> i32 {
    // Truncation toward zero (ONNX Cast); NaN -> 0. hi and lo of an integer are integers: add them in i32 (a hi
    // of 2^31 is halved first so its conversion does not saturate; the sum wraps back into range).
    if (is_nan(a.x)) { return 0; }
    let t = df_trunc(a);
    let h = select(i32(t.x), i32(t.x * 0.5) * 2, abs(t.x) >= 1073741824.0);
    return h + i32(t.y);
}
// float64 -> float16 as numpy rounds it (once, to nearest even): hi's dropped bits decide, and at an exact f16
// midpoint the sign of lo says on which side the float64 value lies. Returns the f16 bits.
fn df_to_f16_bits(a: vec2<f32>) -> u32 {
    let b = bitcast<u32>(a.x);
    let sgn = (b >> 16u) & 0x8000u;
    let mag = b & 0x7fffffffu;
    if (mag > 0x7f800000u) { return sgn | 0x7e00u; }
    if (mag >= 0x47800000u) { return sgn | 0x7c00u; }  // >= 65536: past f16's largest finite value
    let e = i32(mag >> 23u) - 127;
    if (e < -26) { return sgn; }  // below half the smallest f16 subnormal (2^-25): zero
    let m = (mag & 0x7fffffu) | 0x800000u;
    let shift = u32(select(13, -1 - e, e < -14));  // normal: drop 13 bits; subnormal: more
    let kept = m >> shift;
    let rest = m & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    let above = a.y != 0.0 && ((a.y > 0.0) == (a.x > 0.0));
    let up = rest > half || (rest == half && (above || (a.y == 0.0 && (kept & 1u) == 1u)));
    let r = kept + select(0u, 1u, up);
    let bits = select(r, u32(e + 15) * 1024u + r - 1024u, e >= -14);
    return sgn | min(bits, 0x7c00u);
}
