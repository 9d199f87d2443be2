// Split-KV decode attention, first pass (filled in by attention_decode.py): one query row (seq_q = 1) per
// (batch, head) against SKV keys cut into SPLITS contiguous chunks of CHUNK = max(MIN_KEYS, ceil(SKV / SPLITS))
// keys (the chunks past the last key are empty). Workgroup (s, h, b) runs an online softmax over chunk s of head
// h's keys and writes its partial max m, partial sum l = sum exp(score - m) and unnormalised partial output
// acc = sum exp(score - m) v to part (f32); kernels/attention_combine.wgsl merges the SPLITS partials of a head.
// An empty chunk, or one whose scores are all -inf, writes m = -inf, l = 0, acc = 0.
//
// Scores: thread t scores key j0 + t of each WG-key tile (q, scaled, in workgroup memory; its k row read chunk by
// chunk), the tile's max goes through `red`, the probabilities through `ps`. P.V: thread t owns head_dim chunk
// t % D4 of key group t / D4 (NG = WG / D4 groups, threads past NG * D4 idle) and adds the tile's keys
// t / D4 + NG * i; the groups' sums meet in `accs` at the end. Query head h reads kv head h / REP (grouped-query
// attention). Causal masks are bottom-right aligned, so a single query sees every key: causal changes nothing here.
// Operands are strided views: each (batch, head)'s row-0 element (qb, kb, vb, mb) is computed once, rows and
// head_dim elements from their strides (literals, or with runtime sizes lets read from the uniform array sz).
// Every index is in range by construction (the host checks each view's extent, keys past the chunk are never
// loaded), so the module can run trusted.
// Part layout: per (b, h, s), at ((b * HQ + h) * SPLITS + s) * (D4 + 1): D4 vec4s of acc, then (m, l, 0, 0).
// Bindings (group 0): one read-only binding per distinct (buffer, byte range, vec4 or scalar) among q, k, v and
// the mask (in0, in1, ...), then part (read_write), then sz (uniform; runtime sizes only).
// Grid: (SPLITS, HQ, B) workgroups of WG threads.
${HEADER}

// From a private variable: Tint rejects a non-finite constant.
var<private> NEG_INF_BITS: u32 = 0xff800000u;
fn neg_inf() -> f32 { return bitcast<f32>(NEG_INF_BITS); }

${BINDINGS}

${SKV_DECL}
const HQ: u32 = ${HQ}u;  // query heads
const REP: u32 = ${REP}u;  // query heads per kv head
const D: u32 = ${D}u;  // head_dim
const D4: u32 = ${D4}u;  // head_dim in vec4s, rounded up
const SPLITS: u32 = ${SPLITS}u;  // workgroups per head (chunks of keys)
const MIN_KEYS: u32 = ${MIN_KEYS}u;  // the shortest chunk but the last
const WG: u32 = ${WG}u;  // threads, and keys per tile
const NG: u32 = ${NG}u;  // key groups of the P.V pass
const SCALE: f32 = ${SCALE};

var<workgroup> qs: array<vec4<f32>, ${D4}>;
var<workgroup> red: array<f32, ${WG}>;
var<workgroup> ps: array<f32, ${WG}>;
var<workgroup> accs: array<vec4<f32>, ${WG}>;

// Chunk c (< D4) of the row starting at element `base` of an operand; zeros past head_dim.
fn load_q(base: u32, c: u32) -> vec4<f32> {
${LOAD_Q}
}
fn load_k(base: u32, c: u32) -> vec4<f32> {
${LOAD_K}
}
fn load_v(base: u32, c: u32) -> vec4<f32> {
${LOAD_V}
}

@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
${PROLOGUE}
    let s = wid.x;
    let h = wid.y;
    let b = wid.z;
    let hk = h / REP;
${BASES}
    // This workgroup's keys [ks, ke): uniform values (constants, the uniform array and the workgroup id), so the
    // barriers in the loop over them are in uniform control flow.
    let chunk = max(MIN_KEYS, (SKV + SPLITS - 1u) / SPLITS);
    let ks = min(s * chunk, SKV);
    let ke = min(ks + chunk, SKV);
    for (var c = lid; c < D4; c += WG) {
        qs[c] = load_q(qb, c) * SCALE;
    }
    let cg = lid % D4;  // the P.V pass: this thread's head_dim chunk
    let kg = lid / D4;  // and key group (idle when >= NG)
    var m = neg_inf();  // running max of the chunk's scores (the same in every thread)
    var l = 0.0;  // this thread's part of the running sum of exp(score - m)
    var acc = vec4<f32>(0.0);
    for (var j0 = ks; j0 < ke; j0 += WG) {
        workgroupBarrier();  // q written; the previous tile's red and ps reads done
        let j = j0 + lid;
        var sc = neg_inf();
        if (j < ke) {
            let kr = ${K_ROW};
            var dq = 0.0;
            for (var c = 0u; c < D4; c++) {
                dq += dot(qs[c], load_k(kr, c));
            }
            sc = dq${ADD_MASK};
        }
        red[lid] = sc;
        workgroupBarrier();
        var mt = m;
        for (var i = 0u; i < WG; i++) {
            mt = max(mt, red[i]);
        }
        let none = mt == neg_inf();  // nothing visible yet
        let alpha = select(exp(m - mt), 1.0, none);
        let p = select(exp(sc - mt), 0.0, none);
        m = mt;
        l = l * alpha + p;
        acc = acc * alpha;
        ps[lid] = p;
        workgroupBarrier();  // probabilities ready
        if (kg < NG) {
            let n = min(WG, ke - j0);
            for (var jj = kg; jj < n; jj += NG) {
                acc += ps[jj] * load_v(${V_ROW}, cg);
            }
        }
    }
    workgroupBarrier();
    red[lid] = l;
    accs[lid] = acc;
    workgroupBarrier();
    let pb = ((b * HQ + h) * SPLITS + s) * (D4 + 1u);
    for (var c = lid; c < D4; c += WG) {
        var a = vec4<f32>(0.0);
        for (var g = 0u; g < NG; g++) {
            a += accs[g * D4 + c];
        }
        part[pb + c] = a;
    }
    if (lid == 0u) {
        var lt = 0.0;
        for (var i = 0u; i < WG; i++) {
            lt += red[i];
        }
        part[pb + D4] = vec4<f32>(m, lt, 0.0, 0.0);
    }
}
