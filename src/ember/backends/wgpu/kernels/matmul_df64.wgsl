// float64 matmul in double-float: out[z, i, j] = act(alpha * sum_p a[z, i, p] b[z, p, j] + beta * bias + residual).
// For correctness, not speed: one thread per output element sums K in order (df64.wgsl's df_mul / df_add).
// Bindings (group 0): one array<vec2<f32>> per distinct buffer among a, b, bias, residual, out, numbered in that
// order; out's buffer is read_write and any operand in it is read through it (WebGPU forbids binding a buffer
// read-only and writable in one dispatch).
// Grid: ceil(Z*M*N / 256) workgroups of 256 over x and y (program.grid_1d).
${PRELUDE}
${BINDINGS}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    df_init(nwg);
    let gid = (wid.y * nwg.x + wid.x) * 256u + lid.x;
    if (gid >= ${TOTAL}u) { return; }
    let j = i32(gid % ${N}u);
    let i = i32((gid / ${N}u) % ${M}u);
    let z = i32(gid / (${N}u * ${M}u));
    var acc = df(0.0);
    for (var p = 0; p < ${K}; p++) {
        acc = df_add(acc, df_mul(${A}[u32(${A_AT})], ${B}[u32(${B_AT})]));
    }
${EPILOGUE}
    ${OUT}[u32(${OUT_AT})] = v;
}
