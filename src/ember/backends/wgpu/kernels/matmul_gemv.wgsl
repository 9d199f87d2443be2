// Matrix-vector products (template, filled by matmul_gemv.py): out[z, m, n] = epi(sum_k A[z, m, k] * B[z, k, n])
// for M <= 4 rows, the decode step's products. Memory-bound: every weight element is read once, by one invocation,
// for all M rows, and consecutive invocations read consecutive addresses of B: along n where B's rows are
// contiguous (`rows`: LANES invocations of a column split its K, COLS columns side by side), along k where its
// columns are (`cols`: a column's LANES invocations read consecutive k). The LANES partial sums of a column meet
// in a tree in workgroup memory; the first lane applies the epilogue (bias, residual, activation).
// Placeholders: HEADER (bindings + grid comment), PRELUDE, BINDINGS, EPILOGUE (fn epi(acc, z, m, n)), M, N, K,
// COLS, LANES, COL_GROUPS, GROUPS, COL (column within the workgroup, of lid), LANE (of lid), LOAD_A (of z, m, k),
// LOAD_B (of z, k, n).
// Bindings (group 0): A, B, bias, residual read-only (one binding per distinct buffer), then out (read_write) last.
// Grid: grid_1d(GROUPS) workgroups of 256 invocations, GROUPS = Z * COL_GROUPS; group g = wid.y * nwg.x + wid.x:
// z = g / COL_GROUPS, columns (g % COL_GROUPS) * COLS ... + COLS - 1.
${HEADER}
${PRELUDE}
${BINDINGS}
var<workgroup> partial: array<f32, ${PARTIALS}>;  // [m][col][lane]

${EPILOGUE}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.y * nwg.x + wid.x;
    let live = g < ${GROUPS};  // no return before the barriers: every invocation reaches them
    let z = select(0u, g / ${COL_GROUPS}, live);
    let col = ${COL};
    let lane = ${LANE};
    let n_raw = (g % ${COL_GROUPS}) * ${COLS} + col;
    let n = min(n_raw, ${N} - 1u);
    var acc: array<f32, ${M}>;
    var k = lane;
    // Four independent loads in flight per invocation, then the tail.
    for (; k + 3u * ${LANES} < ${K}; k += 4u * ${LANES}) {
        let k1 = k + ${LANES};
        let k2 = k1 + ${LANES};
        let k3 = k2 + ${LANES};
        let b0 = ${LOAD_B_K0};
        let b1 = ${LOAD_B_K1};
        let b2 = ${LOAD_B_K2};
        let b3 = ${LOAD_B_K3};
        for (var m = 0u; m < ${M}; m++) {
            acc[m] += ${LOAD_A_K0} * b0 + ${LOAD_A_K1} * b1 + ${LOAD_A_K2} * b2 + ${LOAD_A_K3} * b3;
        }
    }
    for (; k < ${K}; k += ${LANES}) {
        let b0 = ${LOAD_B_K0};
        for (var m = 0u; m < ${M}; m++) {
            acc[m] += ${LOAD_A_K0} * b0;
        }
    }
    for (var m = 0u; m < ${M}; m++) {
        partial[(m * ${COLS} + col) * ${LANES} + lane] = acc[m];
    }
    workgroupBarrier();
    for (var s = ${LANES} / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            for (var m = 0u; m < ${M}; m++) {
                let i = (m * ${COLS} + col) * ${LANES} + lane;
                partial[i] += partial[i + s];
            }
        }
        workgroupBarrier();
    }
    if (live && lane == 0u && n_raw < ${N}) {
        for (var m = 0u; m < ${M}; m++) {
            epi(partial[(m * ${COLS} + col) * ${LANES}], z, m, n);
        }
    }
}
