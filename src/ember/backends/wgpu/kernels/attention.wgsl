// Flash-style attention (filled in by attention.py): o = softmax(scale * q k^T [+ causal mask]) v, per
// (batch, head), with an online softmax over key tiles, so no seq_q x seq_kv matrix exists anywhere.
//
// A workgroup owns BQ = GY * RQ query rows of one (batch, head) and walks the keys in tiles of BK = GX * RK.
// Thread (ty, tx) holds a register tile of scores: rows ty * RQ + i (i < RQ) against keys tx + GX * k
// (k < RK), so each q and k vec4 read from workgroup memory feeds RK or RQ dot products. For the output it
// owns the same rows and the head_dim vec4 chunks tx + GX * n. Row maxima go through workgroup memory
// (`red`), the probabilities through `ps` ([key][row]); each lane keeps a partial row sum, added up at the
// end. Rows of q, k and v are padded to D4 vec4s in workgroup memory (zeros past head_dim); K and V share
// one tile buffer (V is loaded once the scores are done).
// Causal masks are bottom-right aligned: query i sees key j iff j <= i + SKV - SQ; a query that sees no
// key gets zeros. Every index is in range by construction (rows and keys past the end are clamped and
// masked), so the module can run trusted.

fn neg_inf() -> f32 { return bitcast<f32>(0xff800000u); }

@group(0) @binding(0) var<storage, read> q: array<${VT}>;
@group(0) @binding(1) var<storage, read> k: array<${VT}>;
@group(0) @binding(2) var<storage, read> v: array<${VT}>;
@group(0) @binding(3) var<storage, read_write> o: array<${VT}>;

const SQ: u32 = ${SQ}u;
const SKV: u32 = ${SKV}u;
const D: u32 = ${D}u;  // head_dim
const D4: u32 = ${D4}u;  // head_dim in vec4s, rounded up
const RS: u32 = ${RS}u;  // row stride of the q and k/v tiles, in vec4s (odd: no bank conflicts)
const GX: u32 = ${GX}u;  // lanes per row group
const BQ: u32 = ${BQ}u;  // query rows per workgroup
const BQP: u32 = ${BQP}u;  // row stride of ps (odd)
const BK: u32 = ${BK}u;  // keys per tile
const WG: u32 = ${WG}u;
const QBLOCKS: u32 = ${QBLOCKS}u;
const GROUPS: u32 = ${GROUPS}u;
const SCALE: f32 = ${SCALE};

var<workgroup> qs: array<vec4<f32>, ${QS_SIZE}>;
var<workgroup> kvs: array<vec4<f32>, ${KV_SIZE}>;
var<workgroup> ps: array<f32, ${PS_SIZE}>;
var<workgroup> red: array<f32, ${RED_SIZE}>;

// Chunk c (< D4) of the row starting at element `base` of a tensor; zeros past head_dim.
fn load_q(base: u32, c: u32) -> vec4<f32> {
${LOAD_Q}
}
fn load_k(base: u32, c: u32) -> vec4<f32> {
${LOAD_K}
}
fn load_v(base: u32, c: u32) -> vec4<f32> {
${LOAD_V}
}
fn store_o(base: u32, c: u32, x: vec4<f32>) {
${STORE_O}
}

@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.y * nwg.x + wid.x;
    if (g >= GROUPS) { return; }  // whole workgroups only
    let bh = g / QBLOCKS;
    let q0 = (g % QBLOCKS) * BQ;
    let tx = lid % GX;
    let ty = lid / GX;

    for (var idx = lid; idx < BQ * D4; idx += WG) {
        let rr = idx / D4;
        let c = idx % D4;
        let i = q0 + rr;
        let x = load_q((bh * SQ + min(i, SQ - 1u)) * D, c);
        qs[rr * RS + c] = select(vec4<f32>(0.0), x * SCALE, i < SQ);
    }

    // Keys this block can see at all.
    let kend = ${KEND};
${STATE_DECL}
    for (var j0 = 0u; j0 < kend; j0 += BK) {
        workgroupBarrier();  // the previous tile's V and ps reads are done
        for (var idx = lid; idx < BK * D4; idx += WG) {
            let j = idx / D4;
            let c = idx % D4;
            let x = load_k((bh * SKV + min(j0 + j, SKV - 1u)) * D, c);
            kvs[j * RS + c] = select(vec4<f32>(0.0), x, j0 + j < SKV);
        }
        workgroupBarrier();
${SCORES}
        workgroupBarrier();  // partial maxima written, K no longer read
        for (var idx = lid; idx < BK * D4; idx += WG) {
            let j = idx / D4;
            let c = idx % D4;
            let x = load_v((bh * SKV + min(j0 + j, SKV - 1u)) * D, c);
            kvs[j * RS + c] = select(vec4<f32>(0.0), x, j0 + j < SKV);
        }
${SOFTMAX}
        workgroupBarrier();  // V tile and probabilities ready
        for (var j = 0u; j < BK; j++) {
${PV}
        }
    }

    workgroupBarrier();
${FINAL}
}
