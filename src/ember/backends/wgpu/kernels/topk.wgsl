// Top-k along one axis by ranking: one thread per input element (OUTER, N, INNER) counts the elements of its
// line ordered before it (better value, or an equal value at a lower index); a rank below K is the element's
// slot in the sorted output, so every output slot is written exactly once. O(N) per element, no sort.
// Bindings: 0 x: array<${T}> (OUTER, N, INNER), read; 1 values: array<${T}> (OUTER, K, INNER), read_write;
// 2 indices: array<i32> (OUTER, K, INNER), read_write.
// Grid: ceil(OUTER*N*INNER / 256) workgroups of 256, spread over x and y (65,535 per dimension).
@group(0) @binding(0) var<storage, read> x: array<${T}>;
@group(0) @binding(1) var<storage, read_write> values: array<${T}>;
@group(0) @binding(2) var<storage, read_write> indices: array<i32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let gid = (wid.y * nwg.x + wid.x) * 256u + lid.x;
    if (gid >= ${TOTAL}u) { return; }
    let i = gid % ${INNER}u;
    let m = (gid / ${INNER}u) % ${N}u;
    let o = gid / (${INNER}u * ${N}u);
    let base = ${X_OFF}u + o * ${N}u * ${INNER}u + i;
    let v = x[base + m * ${INNER}u];
    var rank = 0u;
    for (var j = 0u; j < ${N}u; j++) {
        let w = x[base + j * ${INNER}u];
        if ((w ${CMP} v) || (w == v && j < m)) {
            rank += 1u;
            if (rank >= ${K}u) { return; }
        }
    }
    let at = (o * ${K}u + rank) * ${INNER}u + i;
    values[${V_OFF}u + at] = v;
    indices[${I_OFF}u + at] = i32(m);
}
