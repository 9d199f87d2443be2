// Split-KV decode attention, second pass (filled in by attention_decode.py): merges the SPLITS partials
// (m_s, l_s, acc_s) kernels/attention_split.wgsl wrote for each (batch, head) into its output row:
// M = max m_s, L = sum l_s exp(m_s - M), out = sum acc_s exp(m_s - M) / L. A split with m_s = -inf (empty, or
// every score -inf) weighs nothing; a row with L = 0 (all of its scores -inf) gives zeros.
// One thread per output vec4 chunk: gid = (b * HQ + h) * D4 + c. The output is a strided view (row-0 element ob
// per (batch, head), head_dim elements from its stride) stored as f32 or f16.
// Part layout: per (b, h, s), at ((b * HQ + h) * SPLITS + s) * (D4 + 1): D4 vec4s of acc, then (m, l, 0, 0).
// Bindings (group 0): 0 part: array<vec4<f32>> (read), 1 o: the output (read_write), 2 sz (uniform; runtime
// sizes only).
// Grid: grid_1d(ceil(B * HQ * D4 / WG)) workgroups of WG threads, spread over x and y.
${HEADER}

// From a private variable: Tint rejects a non-finite constant.
var<private> NEG_INF_BITS: u32 = 0xff800000u;
fn neg_inf() -> f32 { return bitcast<f32>(NEG_INF_BITS); }

${BINDINGS}

const HQ: u32 = ${HQ}u;  // query heads
const D: u32 = ${D}u;  // head_dim
const D4: u32 = ${D4}u;  // head_dim in vec4s, rounded up
const SPLITS: u32 = ${SPLITS}u;
const TOTAL: u32 = ${TOTAL}u;  // B * HQ * D4
const WG: u32 = ${WG}u;

fn store_o(base: u32, c: u32, x: vec4<f32>) {
${STORE_O}
}

@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
${PROLOGUE}
    let gid = (wid.y * nwg.x + wid.x) * WG + lid;
    if (gid >= TOTAL) { return; }
    let c = gid % D4;
    let bh = gid / D4;
    let b = bh / HQ;
    let h = bh % HQ;
    let p0 = bh * SPLITS * (D4 + 1u);
    var mx = neg_inf();
    for (var s = 0u; s < SPLITS; s++) {
        mx = max(mx, part[p0 + s * (D4 + 1u) + D4].x);
    }
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    for (var s = 0u; s < SPLITS; s++) {
        let ps = p0 + s * (D4 + 1u);
        let ml = part[ps + D4];
        let w = select(exp(ml.x - mx), 0.0, ml.x == neg_inf());
        l += ml.y * w;
        acc += part[ps + c] * w;
    }
    let inv = select(0.0, 1.0 / l, l > 0.0);
    store_o(${OB}, c, acc * inv);
}
