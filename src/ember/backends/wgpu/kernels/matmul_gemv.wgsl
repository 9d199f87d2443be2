// Matrix-vector products (template, filled by matmul_gemv.py): out[z, m, n] = epi(sum_k A[z, m, k] * B[z, k, n])
// for M <= 4 rows, the decode step's products. Memory-bound: every weight element is read once, by one invocation,
// for all M rows, and consecutive invocations read consecutive addresses of B: along n where B's rows are
// contiguous (`rows`: LANES invocations of a column split its K, COLS columns side by side), along k where its
// columns are (`cols`: a column's LANES invocations read consecutive k). The LANES partial sums of a column meet
// in a tree in workgroup memory; the first lane applies the epilogue (bias, residual, activation). Few columns
// (N = 768 gives 48 workgroups) would leave most of the GPU idle: SPLITS > 1 splits K into chunks of KC, one
// workgroup per chunk, and the epilogue stores partial sums part[s, z, m, n] (EPI_Z = s * Z + z) that
// kernels/splitk_reduce.wgsl adds. W = 4 (row-major B whose rows and N are whole quads): an invocation reads a
// vec4 of 4 consecutive columns per k (VEC = vec4<f32> accumulators), a warp's load 16 quads wide. A transposed B
// whose columns and K are whole quads: K, KC and k count quads of k, LOAD_A is a vec4 of A's 4 k, VEC = vec4<f32>
// with W = 1, and EPI_CALLS adds the 4 components.
// Placeholders: HEADER (bindings + grid comment), PRELUDE, BINDINGS, EPILOGUE (fn epi(acc, z, m, n)), M, N, K, Z,
// COLS, LANES, COL_GROUPS, SPLITS, KC, GROUPS, COL (column within the workgroup, of lid), LANE (of lid), LOAD_A
// (of z, m, k), LOAD_B (of z, k, n or quad nq: a VEC), EPI_Z (z, or zs when K is split), W (columns an invocation
// reads: 1 or 4), VEC (f32 or vec4<f32>), EPI_CALLS (epi of the partial sum v's W components).
// Bindings (group 0): A, B, bias, residual read-only (one binding per distinct buffer), then out (read_write) last.
// Grid: grid_1d(GROUPS) workgroups of 256 invocations, GROUPS = SPLITS * Z * COL_GROUPS; group g = wid.y * nwg.x +
// wid.x: zs = g / COL_GROUPS = s * Z + z, columns (g % COL_GROUPS) * COLS * W ... + COLS * W - 1, k in
// [s * KC, s * KC + KC).
${HEADER}
${PRELUDE}
${BINDINGS}
var<workgroup> partial: array<${VEC}, ${PARTIALS}>;  // [m][col][lane]

${EPILOGUE}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.y * nwg.x + wid.x;
    let live = g < ${GROUPS};  // no return before the barriers: every invocation reaches them
    let zs = select(0u, g / ${COL_GROUPS}, live);
    let z = zs % ${Z};
    let k_end = min(${K}, (zs / ${Z}) * ${KC} + ${KC});
    let col = ${COL};
    let lane = ${LANE};
    let n_raw = ((g % ${COL_GROUPS}) * ${COLS} + col) * ${W};
    let n = min(n_raw, ${N} - ${W});
    let nq = n / ${W};
    var acc: array<${VEC}, ${M}>;
    var k = (zs / ${Z}) * ${KC} + lane;
    // Four independent loads in flight per invocation, then the tail.
    for (; k + 3u * ${LANES} < k_end; k += 4u * ${LANES}) {
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
    for (; k < k_end; k += ${LANES}) {
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
            let v = partial[(m * ${COLS} + col) * ${LANES}];
            ${EPI_CALLS}
        }
    }
}
