// Gather along one axis: out[o, j, i] = data[o, wrap(indices[j]), i] over (outer, n_idx, inner).
// Bindings: 0 data: array<${T}>, 1 indices: array<i32>, 2 out: array<${T}> (read_write).
// Grid: ceil(OUTER*NIDX*INNER / 256) workgroups of 256 over x and y.
// An index outside [-DIM, DIM) is clamped: the host cannot check device-resident indices, and a trusted
// module must never read out of bounds.
@group(0) @binding(0) var<storage, read> data: array<${T}>;
@group(0) @binding(1) var<storage, read> indices: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<${T}>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let gid = (wid.y * nwg.x + wid.x) * 256u + lid.x;
    if (gid >= ${TOTAL}u) { return; }
    let i = gid % ${INNER}u;
    let j = (gid / ${INNER}u) % ${NIDX}u;
    let o = gid / (${INNER}u * ${NIDX}u);
    var k = indices[j + ${IDX_OFFSET}u];
    k = select(k, k + ${DIM}, k < 0);
    k = clamp(k, 0, ${DIM} - 1);
    out[gid] = data[${DATA_OFFSET}u + (o * ${DIM}u + u32(k)) * ${INNER}u + i];
}
