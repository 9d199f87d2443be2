// Split-K reduce (template, filled by gemm.py): the tiled kernel wrote SPLITS partial sums
// part[s, z, m, n] (s-major, each a contiguous Z x M x N block); one thread per output element adds them in
// order and applies the matmul/conv epilogue (alpha, bias, activation, output layout) through epi().
// Placeholders: HEADER (bindings + grid comment), PRELUDE, BINDINGS, EPILOGUE (fn epi(acc, z, m, n)),
// WORKGROUP, TOTAL (= Z*M*N), M, N, SPLITS, PART (the binding holding the partial sums).
// Bindings (group 0): the partial sums (PART) and the epilogue's bias / residual read-only, then out
// (read_write) last; the instance's list is in the header below.
// Grid: grid_1d(ceil(Z*M*N / WORKGROUP)) workgroups of WORKGROUP threads, spread over x and y.
${HEADER}
${PRELUDE}
${BINDINGS}

${EPILOGUE}

@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let gid = (wid.y * nwg.x + wid.x) * ${WORKGROUP}u + lid;
    if (gid >= ${TOTAL}) { return; }
    var acc = 0.0;
    for (var s = 0u; s < ${SPLITS}; s++) {
        acc += ${PART}[s * ${TOTAL} + gid];
    }
    let n = gid % ${N};
    let m = (gid / ${N}) % ${M};
    let z = gid / (${M} * ${N});
    epi(acc, z, m, n);
}
