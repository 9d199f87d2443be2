// Scatter updates into out (which already holds the data): out[offsets[u]] = COMBINE(out[offsets[u]], updates[u]).
// Bindings: 0 offsets: array<i32> (M), read; 1 updates: array<${T}> (M), read; 2 out: array<${T}>, read_write.
// Grid: SERIAL (reductions): one workgroup, whose first thread applies the M updates in order, so duplicate
// offsets combine deterministically, as onnx.reference; otherwise ceil(M / 256) workgroups of 256 over x and y,
// one thread per update. Offsets are clamped into [0, SIZE): a trusted module must never write out of bounds.
@group(0) @binding(0) var<storage, read> offsets: array<i32>;
@group(0) @binding(1) var<storage, read> updates: array<${T}>;
@group(0) @binding(2) var<storage, read_write> out: array<${T}>;

fn apply(u: u32) {
    let o = ${OUT_OFF}u + u32(clamp(offsets[${OFF_OFF}u + u], 0, ${SIZE} - 1));
    let v = updates[${UPD_OFF}u + u];
    let cur = out[o];
    out[o] = ${COMBINE};
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let gid = (wid.y * nwg.x + wid.x) * 256u + lid.x;
    if (${SERIAL}) {
        if (gid != 0u) { return; }
        for (var u = 0u; u < ${M}u; u++) { apply(u); }
    } else {
        if (gid >= ${M}u) { return; }
        apply(gid);
    }
}
