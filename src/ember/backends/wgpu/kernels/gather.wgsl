// Gather along one axis: out[o, j, i] = data[o, wrap(indices[j]), i] over (outer, n_idx, inner).
// Bindings: 0 data: array<${T}>, 1 indices: array<i32>, 2 out: array<${T}> (read_write); with runtime sizes,
// 3 sz: the sizes below as a uniform array<vec4<i32>, 2> (program.sizes_decl).
// Grid: ceil(OUTER*NIDX*INNER / 256) workgroups of 256 over x and y.
// An index outside [-DIM, DIM) is clamped: the host cannot check device-resident indices, and a trusted
// module must never read out of bounds.
@group(0) @binding(0) var<storage, read> data: array<${T}>;
@group(0) @binding(1) var<storage, read> indices: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<${T}>;
${SIZES}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
${SIZE_LETS}
    let gid = (wid.y * nwg.x + wid.x) * 256u + lid.x;
    if (gid >= TOTAL) { return; }
    let i = gid % INNER;
    let j = (gid / INNER) % NIDX;
    let o = gid / (INNER * NIDX);
    var k = indices[j + IDX_OFFSET];
    k = select(k, k + i32(DIM), k < 0);
    k = clamp(k, 0, i32(DIM) - 1);
    out[gid] = data[DATA_OFFSET + (o * DIM + u32(k)) * INNER + i];
}
