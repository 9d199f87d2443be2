// Discrete Fourier transform along one axis, one output element per invocation (direct sum, O(N) each):
//   out[o, k, i] = SCALE * sum_{n < TERMS} x~[o, n, i] * exp(SIGN * 2*pi*j * k*n / N)      for k < LOUT
// x: (OUTER, LIN, INNER, C), C = 1 (real) or 2 (complex, re/im); out: (OUTER, LOUT, INNER, OUT_C).
// x~ is x zero-padded (or cut) to N terms; with HALF = 1 (a real inverse of a one-sided spectrum) x~ is the
// Hermitian extension of x: x~[n] = conj(x[N - n]) for n >= LIN, and only the real part is written (OUT_C = 1).
// Bindings: 0 x: array<f32>, 1 out: array<f32> (read_write).
// Grid: ceil(OUTER*LOUT*INNER / 256) workgroups of 256 over x and y (grid_1d).
// The phase k*n is reduced mod N in integers, then to a quadrant and a fraction of it: the angle fed to cos/sin
// stays below pi/2, and the quarter turns (DC, Nyquist, N/4) get exact 0 and +-1 twiddles, as an FFT's do.
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

const HALF_PI: f32 = 1.5707963267948966;

// (cos, sin) of 2*pi * m / N for m < N.
fn twiddle(m: u32) -> vec2<f32> {
    let quarters = 4u * m;
    let quadrant = quarters / ${N}u;
    let a = HALF_PI * f32(quarters % ${N}u) / f32(${N}u);
    let c = cos(a);
    let s = sin(a);
    switch quadrant {
        case 0u: { return vec2<f32>(c, s); }
        case 1u: { return vec2<f32>(-s, c); }
        case 2u: { return vec2<f32>(-c, -s); }
        default: { return vec2<f32>(s, -c); }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let gid = (wid.y * nwg.x + wid.x) * 256u + lid.x;
    if (gid >= ${TOTAL}u) { return; }
    let i = gid % ${INNER}u;
    let k = (gid / ${INNER}u) % ${LOUT}u;
    let o = gid / (${INNER}u * ${LOUT}u);
    var re = 0.0;
    var im = 0.0;
    for (var n = 0u; n < ${TERMS}u; n++) {
        var src = n;
        var conj = 1.0;
        if (${HALF}u == 1u && n >= ${LIN}u) {
            src = ${N}u - n;
            conj = -1.0;
        }
        if (src < ${LIN}u) {
            let w = twiddle((k * n) % ${N}u);
            let c = w.x;
            let s = ${SIGN} * w.y;
            let base = ${X_OFFSET}u + ((o * ${LIN}u + src) * ${INNER}u + i) * ${C}u;
            let xr = x[base];
            let xi = select(0.0, conj * x[base + ${C}u - 1u], ${C}u == 2u);
            re += xr * c - xi * s;
            im += xr * s + xi * c;
        }
    }
    let dst = ((o * ${LOUT}u + k) * ${INNER}u + i) * ${OUT_C}u;
    out[dst] = re * ${SCALE};
    if (${OUT_C}u == 2u) {
        out[dst + 1u] = im * ${SCALE};
    }
}
