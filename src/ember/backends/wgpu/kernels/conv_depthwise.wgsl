// Depthwise 2-D convolution (template, filled by conv_depthwise.py): NCHW input, filter (K, 1, R, S), K = C * MULT;
// output channel k reads input channel k / MULT. One output element per thread (linear id over N*K*P*Q),
// the R x S taps unrolled by the compiler, zero padding by bounds checks.
// Placeholders: HEADER (bindings + grid comment), PRELUDE, BINDINGS, EPILOGUE (fn epi(acc, z = image,
// m = channel, n = p*Q + q)), WORKGROUP, TOTAL, P, Q, K, C, MULT, H, W, R, S, SH, SW, PT, PL, DH, DW,
// LOAD_X (of xc = n*C + c, hu, wu), LOAD_W (of wk = k*R*S, r, s).
// Bindings (group 0): x, w, bias, residual read-only (those present, one binding per distinct buffer), then
// out (read_write) last; the instance's list is in the header below.
// Grid: grid_1d(ceil(N*K*P*Q / WORKGROUP)) workgroups of WORKGROUP threads, spread over x and y.
${HEADER}
${PRELUDE}
${BINDINGS}

${EPILOGUE}

@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let gid = (wid.y * nwg.x + wid.x) * ${WORKGROUP}u + lid;
    if (gid >= ${TOTAL}) { return; }
    let q = gid % ${Q};
    let p = (gid / ${Q}) % ${P};
    let k = (gid / (${P} * ${Q})) % ${K};
    let img = gid / (${P} * ${Q} * ${K});
    let xc = img * ${C} + k / ${MULT};
    let wk = k * (${R} * ${S});
    let h0 = i32(p * ${SH}) - ${PT};
    let w0 = i32(q * ${SW}) - ${PL};
    var acc = 0.0;
    for (var r = 0u; r < ${R}; r++) {
        let h = h0 + i32(r * ${DH});
        if (u32(h) >= ${H}) { continue; }
        let hu = u32(h);
        for (var s = 0u; s < ${S}; s++) {
            let w = w0 + i32(s * ${DW});
            if (u32(w) < ${W}) {
                let wu = u32(w);
                acc += ${LOAD_X} * ${LOAD_W};
            }
        }
    }
    epi(acc, img, k, p * ${Q} + q);
}
