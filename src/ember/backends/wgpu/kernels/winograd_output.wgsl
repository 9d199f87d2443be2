// Winograd F(m x m, 3 x 3) output transform (template, filled by winograd.py): M (alpha^2, K, Tp) -> out
// (N, K, P, Q). One thread per (output channel k, tile t) of a chunk of TC tiles starting at tile T0, linear id
// gid = k * TC + tl (the alpha^2 loads, each at stride K * Tp, are coalesced). It computes A^T M A (unrolled by
// the generator) and hands each of the m x m outputs inside P x Q to epi() (bias, activation, the store in
// out's storage type); edge tiles skip the outputs past the last row / column.
// Placeholders: HEADER, PRELUDE, BINDINGS, EPILOGUE (fn epi(acc, z = image, m = channel, n = p*Q + q)),
// WORKGROUP, TOTAL (= K * TC), TC, T0, TW, TH, M, Q, TP, BODY.
// Bindings (group 0): the M scratch buffer, residual and bias read-only (those present), then out
// (read_write) last; the instance's list is in the header below.
// Grid: grid_1d(ceil(K*TC / WORKGROUP)) workgroups of WORKGROUP threads, spread over x and y.
${HEADER}
${PRELUDE}
${BINDINGS}

${EPILOGUE}

@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let gid = (wid.y * nwg.x + wid.x) * ${WORKGROUP}u + lid;
    if (gid >= ${TOTAL}) { return; }
    let k = gid / ${TC};
    let tl = gid - k * ${TC};
    let t = tl + ${T0};
    let nth = t / ${TW};
    let tw = t - nth * ${TW};
    let img = nth / ${TH};
    let th = nth - img * ${TH};
    let oh = th * ${M};
    let ow = tw * ${M};
    let pix = oh * ${Q} + ow;
    let mb = k * ${TP} + tl;
${BODY}
}
