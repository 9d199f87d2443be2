${HEADER}
// Explicit im2col (template, filled by conv.py): out[kk, j] (the column buffer) = x[img, c, p*SH - PT + r*DH, q*SW - PL + s*DW] for
// kk = (c, r, s) < KK, j = (img, p, q) < NCOLS, zero outside the input and for the row padding j >= NCOLS. The
// rows are NCP (NCOLS rounded up to 4) apart, so the GEMM that follows reads them with aligned vec4 loads.
// One thread per element, j fastest: consecutive threads write consecutive columns (coalesced).
// Placeholders: HEADER, BINDINGS, WORKGROUP, TOTAL (= KK * NCP), NCP, NCOLS, PQ, Q, RS, S, SH, SW, DH, DW, PT, PL,
// H, W, CHW, HW, LOAD_X (the input element at index xi, as f32).
${BINDINGS}

@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let gid = (wid.y * nwg.x + wid.x) * ${WORKGROUP}u + lid;
    if (gid >= ${TOTAL}) { return; }
    let kk = gid / ${NCP};
    let j = gid - kk * ${NCP};
    var v = 0.0;
    if (j < ${NCOLS}) {
        let c = kk / ${RS};
        let rs = kk - c * ${RS};
        let r = rs / ${S};
        let s = rs - r * ${S};
        let img = j / ${PQ};
        let pq = j - img * ${PQ};
        let p = pq / ${Q};
        let q = pq - p * ${Q};
        let h = i32(p * ${SH} + r * ${DH}) - ${PT};
        let w = i32(q * ${SW} + s * ${DW}) - ${PL};
        if (u32(h) < ${H} && u32(w) < ${W}) {
            let xi = img * ${CHW} + c * ${HW} + u32(h) * ${W} + u32(w);
            v = ${LOAD_X};
        }
    }
    out[gid] = v;
}
