// Generic strided matmul (template, filled by matmul.py): out[z, m, n] = epi(sum_k A[z, m, k] * B[z, k, n]).
// A 16 x 16 output tile per workgroup of 16 x 16 threads, one output per thread; A and B are staged through
// workgroup memory 16 K at a time with guarded scalar loads at arbitrary (baked, possibly negative) strides.
// Used when an operand has no unit-stride inner dimension; the generated tiled kernel handles the rest.
// Placeholders: HEADER (bindings + grid comment), PRELUDE, BINDINGS, EPILOGUE (fn epi(acc, z, m, n)),
// COORDS (defines tile_n, tile_m, z), M, N, K, KTILES, LOAD_A (of z, gm, ak), LOAD_B (of z, bk, gn).
// Bindings (group 0): A, B, bias, residual read-only (one binding per distinct buffer; those in out's buffer
// are read through out), then out (read_write) last; the instance's list is in the header below.
// Grid: (ceil(N/16), ceil(M/16), Z) workgroups of 256 threads, or grid_1d of their product where a dimension
// exceeds 65,535 (COORDS linearises it).
${HEADER}
${PRELUDE}
${BINDINGS}
var<workgroup> As: array<f32, 256>;  // [k][m]
var<workgroup> Bs: array<f32, 256>;  // [k][n]

${EPILOGUE}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    ${COORDS}
    let lx = lid.x;
    let ly = lid.y;
    let gm = tile_m * 16u + ly;
    let gn = tile_n * 16u + lx;
    let lm = tile_m * 16u + lx;  // the A row this thread loads
    var acc = 0.0;
    for (var t = 0u; t < ${KTILES}; t++) {
        let k0 = t * 16u;
        {
            let gm = lm;
            let ak = k0 + ly;
            var v = 0.0;
            if (gm < ${M} && ak < ${K}) { v = ${LOAD_A}; }
            As[ly * 16u + lx] = v;
        }
        {
            let bk = k0 + ly;
            var v = 0.0;
            if (bk < ${K} && gn < ${N}) { v = ${LOAD_B}; }
            Bs[ly * 16u + lx] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk++) {
            acc += As[kk * 16u + ly] * Bs[kk * 16u + lx];
        }
        workgroupBarrier();
    }
    epi(acc, z, gm, gn);
}
