// Winograd F(m x m, 3 x 3) input transform (template, filled by winograd.py): x (N, C, H, W) -> V (alpha^2, C, Tp).
// One thread per (channel c, tile t) of a chunk of TC tiles starting at tile T0, linear id gid = c * TC + tl
// (consecutive threads take consecutive tiles, so the alpha^2 stores, each at stride C * Tp, are coalesced).
// Tile t = (n * TH + th) * TW + tw reads the alpha x alpha window at row th*M - PT, column tw*M - PL (zeros
// outside the input; only the rows / columns that can fall outside are guarded) and stores B^T d B, the constant
// matrix products unrolled by the generator (BODY).
// Placeholders: HEADER, BINDINGS, WORKGROUP, TOTAL (= C * TC), TC, T0, TW, TH, M, PT, PL, TP, XBASE (of img, c),
// BODY (loads of d, the transform, the stores into `out` at vb + p * C * Tp).
// Bindings (group 0): x read-only, then out = the V scratch buffer (read_write); the instance's list is in
// the header below.
// Grid: grid_1d(ceil(C*TC / WORKGROUP)) workgroups of WORKGROUP threads, spread over x and y.
${HEADER}
${BINDINGS}

@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let gid = (wid.y * nwg.x + wid.x) * ${WORKGROUP}u + lid;
    if (gid >= ${TOTAL}) { return; }
    let c = gid / ${TC};
    let tl = gid - c * ${TC};
    let t = tl + ${T0};
    let nth = t / ${TW};
    let tw = t - nth * ${TW};
    let img = nth / ${TH};
    let th = nth - img * ${TH};
    let h0 = i32(th * ${M}) - ${PT};
    let w0 = i32(tw * ${M}) - ${PL};
    let xb = ${XBASE};
    let vb = c * ${TP} + tl;
${BODY}
}
