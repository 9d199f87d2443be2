// Fused (log)softmax over contiguous rows of N elements (filled in by softmax.py).
//
// Bindings (group 0): 0 x (read; absent when x is out's own window, read through `out`), 1 out (read_write).
// Grid: grid_1d(ceil(ROWS / TX)) workgroups of TX * TY invocations: TX rows per workgroup, TY lanes per row,
// adjacent lanes on adjacent elements; row = (wid.y * nwg.x + wid.x) * TX + lid / TY.
//
// Two passes over the row (from registers `c` when CPL <= the cache limit, else from global memory):
// m = max(x) (NaN-propagating, exact in any order), s = sum(exp(x - m)) (Neumaier-compensated lane sums),
// then out = exp(x - m) / s, or (x - m) - log(s). A row whose max is not finite (all -inf, or holding NaN or
// +inf) is all NaN: ONNX's formula exp(x - max) gives NaN there (-inf - -inf, inf - inf), and so do
// onnx.reference and ONNX Runtime (checked: Softmax and LogSoftmax, opsets 11 and 13, all -inf row -> NaN).
// The lanes of a row combine in a fixed order (subgroup butterfly + workgroup memory, or a tree in workgroup
// memory), so runs are bitwise reproducible.
// Every index is in range by construction: rows past the end clamp to row 0 and store nothing.
${PRELUDE}
fn is_finite(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u; }
// exp of x - m <= 0; exactly 0 below f32's smallest subnormal (and for -inf, without inf arithmetic in exp).
fn exp_le0(d: f32) -> f32 { return select(exp(d), 0.0, d < -104.0); }

${BINDINGS}

const N: u32 = ${N}u;  // row length
const TX: u32 = ${TX}u;  // rows per workgroup
const TY: u32 = ${TY}u;  // lanes per row
const ROWS: u32 = ${ROWS}u;
const CPL: u32 = ${CPL}u;  // elements per lane, ceil(N / TY)

var<workgroup> sh: array<f32, ${WG}>;

${ROW_MAX}

${ROW_SUM}

${COMPENSATED_SUM}

@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32${SG_ARGS}) {
    let tx = lid / TY;
    let ty = lid % TY;
    let row_raw = (wid.y * nwg.x + wid.x) * TX + tx;
    let valid = row_raw < ROWS;
    let row = select(0u, row_raw, valid);
    let xb = ${X_OFF}u + row * N;
    let ob = ${OUT_OFF}u + row * N;
${BODY}
}
