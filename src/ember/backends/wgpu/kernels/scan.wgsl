// Running sum or product along one axis (CumSum, CumProd): one thread per line, serial along the line.
// Bindings: 0 x: array<${T}> (OUTER, N, INNER), read; 1 out: array<${T}> (same shape), read_write.
// Grid: ceil(OUTER*INNER / 256) workgroups of 256, spread over x and y (65,535 per dimension).
// EXCLUSIVE writes the running value before adding the element; REVERSE walks the line from its end.
// float64 (T = vec2<f32>, double-float) combines through df64.wgsl, which LIBRARY brings and INIT sets up
// (both empty otherwise).
${LIBRARY}
@group(0) @binding(0) var<storage, read> x: array<${T}>;
@group(0) @binding(1) var<storage, read_write> out: array<${T}>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
${INIT}
    let line = (wid.y * nwg.x + wid.x) * 256u + lid.x;
    if (line >= ${LINES}u) { return; }
    let base = (line / ${INNER}u) * ${N}u * ${INNER}u + line % ${INNER}u;
    var acc: ${T} = ${IDENT};
    for (var j = 0u; j < ${N}u; j++) {
        let at = base + select(j, ${N}u - 1u - j, ${REVERSE}) * ${INNER}u;
        let v = x[${X_OFF}u + at];
        if (${EXCLUSIVE}) {
            out[${O_OFF}u + at] = acc;
            acc = ${COMBINE};
        } else {
            acc = ${COMBINE};
            out[${O_OFF}u + at] = acc;
        }
    }
}
