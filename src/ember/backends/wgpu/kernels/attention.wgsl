// Flash-style attention (filled in by attention.py): o = softmax(scale * q k^T [+ mask] [+ causal mask]) v, per
// (batch, head), with an online softmax over key tiles, so no seq_q x seq_kv matrix exists anywhere.
//
// A workgroup owns BQ = GY * RQ query rows of one (batch, head) and walks the keys in tiles of BK = GX * RK.
// Thread (ty, tx) holds a register tile of scores: rows ty * RQ + i (i < RQ) against keys tx + GX * k
// (k < RK), so each q and k vec4 read from workgroup memory feeds RK or RQ dot products. For the output it
// owns the same rows and the head_dim vec4 chunks tx + GX * n. Row maxima go through workgroup memory
// (`red`), the probabilities through `ps` ([key][row]); each lane keeps a partial row sum, added up at the
// end. Rows of q, k and v are padded to D4 vec4s in workgroup memory (zeros past head_dim); K and V share
// one tile buffer (V is loaded once the scores are done).
// Causal masks are bottom-right aligned: query i sees key j iff j <= i + SKV - SQ; an additive mask (its own
// binding, any strides) is added to the scores; a query that sees no key (or only -inf) gets zeros.
// Operands are strided views: the generated code computes each (batch, head)'s row-0 element (qb, kb, vb, ob,
// mb) once, then rows and head_dim elements from their baked strides. Query head h reads kv head h / REP
// (grouped-query attention). Every index is in range by construction (the host checks each view's extent;
// rows and keys past the end are clamped and masked), so the module can run trusted.
// Bindings (group 0): one read-only binding per distinct (buffer, byte range, vec4 or scalar) among q, k, v
// and the mask (in0, in1, ...; an input in the output's buffer is read through o), then o (read_write) last.
// Grid: grid_1d(GROUPS) workgroups of WG = GY * GX threads, GROUPS = B * HQ * QBLOCKS (a (batch, head,
// query block) each).
${HEADER}

// From a private variable: Tint rejects a non-finite constant.
var<private> NEG_INF_BITS: u32 = 0xff800000u;
fn neg_inf() -> f32 { return bitcast<f32>(NEG_INF_BITS); }

${BINDINGS}

${SQ_DECL}
${SKV_DECL}
${SQL_DECL}
// SKL: the last key (0 when there are none: no key tile is loaded then). SKV and SKL are constants here, or, with
// runtime sizes, lets at the start of main read (with the views' strides and offsets) from the uniform array sz.
const HQ: u32 = ${HQ}u;  // query heads
const REP: u32 = ${REP}u;  // query heads per kv head
const D: u32 = ${D}u;  // head_dim
const D4: u32 = ${D4}u;  // head_dim in vec4s, rounded up
const RS: u32 = ${RS}u;  // row stride of the q and k/v tiles, in vec4s (odd: no bank conflicts)
const GX: u32 = ${GX}u;  // lanes per row group
const BQ: u32 = ${BQ}u;  // query rows per workgroup
const BQP: u32 = ${BQP}u;  // row stride of ps, padded (in f32s, or in vec4s of 4 rows when RQ = 4)
const BK: u32 = ${BK}u;  // keys per tile
const WG: u32 = ${WG}u;
${QBLOCKS_DECL}
${GROUPS_DECL}
const SCALE: f32 = ${SCALE};

var<workgroup> qs: array<vec4<f32>, ${QS_SIZE}>;
var<workgroup> kvs: array<vec4<f32>, ${KV_SIZE}>;
${PS_DECL}
var<workgroup> red: array<f32, ${RED_SIZE}>;

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
fn store_o(base: u32, c: u32, x: vec4<f32>) {
${STORE_O}
}

@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
${PROLOGUE}
    let g = wid.y * nwg.x + wid.x;
    if (g >= GROUPS) { return; }  // whole workgroups only
    let bh = g / QBLOCKS;
    let q0 = (g % QBLOCKS) * BQ;
    let tx = lid % GX;
    let ty = lid / GX;
    let b = bh / HQ;
    let h = bh % HQ;
    let hk = h / REP;
${BASES}

    for (var idx = lid; idx < BQ * D4; idx += WG) {
        let rr = idx / D4;
        let c = idx % D4;
        let i = q0 + rr;
        let x = load_q(${Q_ROW}, c);
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
            let x = load_k(${K_ROW}, c);
            kvs[j * RS + c] = select(vec4<f32>(0.0), x, j0 + j < SKV);
        }
        workgroupBarrier();
${SCORES}
        workgroupBarrier();  // partial maxima written, K no longer read
        for (var idx = lid; idx < BK * D4; idx += WG) {
            let j = idx / D4;
            let c = idx % D4;
            let x = load_v(${V_ROW}, c);
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
