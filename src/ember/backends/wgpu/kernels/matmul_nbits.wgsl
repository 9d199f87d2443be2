// MatMulNBits: out (M, N) = a (M, K) @ Wᵀ + bias, W[n, k] = (code(n, k) - zero(n, b)) * scale(n, b) dequantised
// here from the packed codes (BITS bits each, low-first in u32 words, a column's WPC words, each block's codes in
// whole words); b = k / BS, or g_idx[k] (clamped into the column's NB blocks). Computes in f32.
// Bindings: 0 a: array<${T}>, 1 w: array<u32> (the packed codes), 2 scales: array<${T}> (N, NB), 3 zeros:
// array<${T}> (N, NB; only with zero points), 4 g_idx: array<i32> (K; only with g_idx), 5 bias: array<${T}> (N;
// only with a bias), 6 out: array<${T}> (read_write).
// Grid: grid_1d(GROUPS) workgroups of 256, group g = wid.y * nwg.x + wid.x:
//   gemv (small M): GROUPS = M * ceil(N / COLS); m = g / ceil(N / COLS); COLS columns a workgroup, LANES = 256 /
//     COLS invocations a column striding over its words, their sums combined by a tree in workgroup memory.
//   tiled: GROUPS = ceil(M / 64) * ceil(N / 64); a 64 x 64 tile of out, 4 x 4 outputs an invocation, K in
//     steps of 16: a's 64 x 16 slice and the dequantised 16 x 64 slice of W staged in workgroup memory.
// Every index is in range by construction: rows and columns past the end are clamped and store nothing, codes
// past K are never multiplied (the last block's padding).
${BINDINGS}

const M: u32 = ${M}u;
const N: u32 = ${N}u;
const K: u32 = ${K}u;
const NB: u32 = ${NB}u;  // blocks a column
const BS: u32 = ${BS}u;  // block size
const WPC: u32 = ${WPC}u;  // words a column
const BITS: u32 = ${BITS}u;
const VPW: u32 = 32u / BITS;  // codes a word
const MASK: u32 = (1u << BITS) - 1u;
const KW: u32 = (K + VPW - 1u) / VPW;  // the words holding codes of k < K
const GROUPS: u32 = ${GROUPS}u;
const COLS: u32 = ${COLS}u;
const LANES: u32 = 256u / COLS;
const COL_GROUPS: u32 = (N + COLS - 1u) / COLS;
const TILES_N: u32 = (N + 63u) / 64u;

fn block_of(k: u32) -> u32 {
    ${BLOCK_OF}
}

fn zero_of(i: u32) -> f32 {
    ${ZERO_OF}
}

fn bias_of(n: u32) -> f32 {
    ${BIAS_OF}
}

fn load_a(i: u32) -> f32 {
    return f32(a[${A_OFF}u + i]);
}

fn scale_of(i: u32) -> f32 {
    return f32(scales[${S_OFF}u + i]);
}

// W[n, k] for n < N, k < K.
fn weight(n: u32, k: u32) -> f32 {
    let word = w[${W_OFF}u + n * WPC + k / VPW];
    let q = f32((word >> ((k % VPW) * BITS)) & MASK);
    let b = n * NB + block_of(k);
    return (q - zero_of(b)) * scale_of(b);
}

var<workgroup> partial: array<f32, 256>;

fn gemv(g: u32, lid: u32) {
    let m = g / COL_GROUPS;
    let n_raw = (g % COL_GROUPS) * COLS + lid / LANES;
    let valid = n_raw < N;
    let n = select(0u, n_raw, valid);
    let lane = lid % LANES;
    let abase = m * K;
    let wbase = ${W_OFF}u + n * WPC;
    var acc = 0.0;
    for (var j = lane; j < KW; j += LANES) {
        let word = w[wbase + j];
        let k0 = j * VPW;
        for (var i = 0u; i < VPW; i++) {
            let k = k0 + i;
            if (k < K) {
                let b = n * NB + block_of(k);
                let q = f32((word >> (i * BITS)) & MASK);
                acc += load_a(abase + k) * ((q - zero_of(b)) * scale_of(b));
            }
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && valid) {
        out[${OUT_OFF}u + m * N + n] = ${T}(partial[lid] + bias_of(n));
    }
}

var<workgroup> a_tile: array<f32, 1024>;  // [64 rows][16 k]
var<workgroup> w_tile: array<f32, 1024>;  // [16 k][64 columns]

fn tiled(g: u32, lid: u32) {
    let m0 = (g / TILES_N) * 64u;
    let n0 = (g % TILES_N) * 64u;
    let tx = lid % 16u;
    let ty = lid / 16u;
    var acc: array<array<f32, 4>, 4>;
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            acc[i][j] = 0.0;
        }
    }
    for (var k0 = 0u; k0 < K; k0 += 16u) {
        for (var r = 0u; r < 4u; r++) {
            let e = lid + r * 256u;
            let row = e / 16u;  // a's row in the tile, or W's column
            let kk = e % 16u;
            let k = k0 + kk;
            let m = m0 + row;
            let n = n0 + row;
            let a_ok = m < M && k < K;
            a_tile[e] = select(0.0, load_a(select(0u, m * K + k, a_ok)), a_ok);
            let w_ok = n < N && k < K;
            w_tile[kk * 64u + row] = select(0.0, weight(select(0u, n, w_ok), select(0u, k, w_ok)), w_ok);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk++) {
            var av: array<f32, 4>;
            var wv: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                av[i] = a_tile[(ty + 16u * i) * 16u + kk];
                wv[i] = w_tile[kk * 64u + tx + 16u * i];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i][j] += av[i] * wv[j];
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let m = m0 + ty + 16u * i;
        for (var j = 0u; j < 4u; j++) {
            let n = n0 + tx + 16u * j;
            if (m < M && n < N) {
                out[${OUT_OFF}u + m * N + n] = ${T}(acc[i][j] + bias_of(n));
            }
        }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.y * nwg.x + wid.x;
    if (g >= GROUPS) { return; }
    ${KERNEL}(g, lid);
}
