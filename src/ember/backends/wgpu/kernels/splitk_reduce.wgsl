${HEADER}
// Split-K reduce (template, filled by matmul.py): the tiled kernel wrote SPLITS partial sums
// part[s, z, m, n] (s-major, each a contiguous Z x M x N block); one thread per output element adds them in
// order and applies the matmul/conv epilogue (alpha, bias, activation, output layout) through epi().
// Placeholders: HEADER (bindings + grid comment), PRELUDE, BINDINGS, EPILOGUE (fn epi(acc, z, m, n)),
// WORKGROUP, TOTAL (= Z*M*N), M, N, SPLITS, PART (the binding holding the partial sums).
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
