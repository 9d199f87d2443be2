// Row kernels (filled in by norm.py and softmax.py): one fused op over contiguous rows of N elements.
// Bindings (group 0): the op's read-only inputs, then out (read_write); HEADER lists them per op (an input in
// out's buffer is read through out).
${HEADER}
//
// Grid: grid_1d(ceil(ROWS / TX)) workgroups of TX * TY invocations: TX rows per workgroup, TY lanes per row,
// adjacent lanes on adjacent elements; row = (wid.y * nwg.x + wid.x) * TX + lid / TY.
// Each lane folds its elements with a compensated (Neumaier) sum where it sums; the lanes of a row then combine
// in a fixed order (subgroup butterfly + workgroup memory, or a tree in workgroup memory), so runs are bitwise
// reproducible. With CPL <= the cache limit the lane keeps its elements in registers (`c`) between passes.
// Every index is in range by construction: rows past the end clamp to row 0 and store nothing.
${PRELUDE}
${FUNCS}

${BINDINGS}

const N: u32 = ${N}u;  // row length
const TX: u32 = ${TX}u;  // rows per workgroup
const TY: u32 = ${TY}u;  // lanes per row
${ROWS_DECL}
const CPL: u32 = ${CPL}u;  // elements per lane, ceil(N / TY)
${CONSTS}

var<workgroup> sh: array<f32, ${WG}>;

${REDUCTIONS}

${COMPENSATED_SUM}

@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32${SG_ARGS}) {
    let tx = lid / TY;
    let ty = lid % TY;
    let row_raw = (wid.y * nwg.x + wid.x) * TX + tx;
    let valid = row_raw < ${ROWS};
    let row = select(0u, row_raw, valid);
    let xb = ${X_OFF} + row * N;
    let ob = ${OUT_OFF} + row * N;
${BODY}
}
