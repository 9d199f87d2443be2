// Row reduction (filled in by reduce.py). A workgroup reduces TX rows with TY lanes each: TY == 1 is one
// thread per output, TX == 1 one workgroup per output. Each lane folds a strided slice of its row into a
// state S, then the TY lanes of a row combine their states (subgroup butterfly, or a tree in workgroup
// memory). A row is an output (FINAL mode) or a chunk of one (PARTIAL mode: the states go to a scratch
// buffer, reduced by a second dispatch of this kernel that reads them back).
// Every index is in range by construction: rows past the end clamp to row 0 and fold nothing.
// Bindings (group 0): 0 src (read), 1 src_b (read: a second pass's second state component, when the op has
// one), 2 dst (read_write), 3 dst_b (read_write: a first pass's second state component, when the op has one).
// Grid: grid_1d(ceil(ROWS / TX)) workgroups of TX * TY invocations.
// float64 (double-float) reductions bring df64.wgsl in PRELUDE and call its df_init in INIT (empty otherwise).
${PRELUDE}
fn is_finite(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u; }

struct S { a: ${AT}, b: ${BT} }

${BINDINGS}

const TX: u32 = ${TX}u;  // rows per workgroup
const TY: u32 = ${TY}u;  // lanes per row
const ROWS: u32 = ${ROWS}u;

var<workgroup> sh: array<S, ${WG}>;

fn identity() -> S { return S(${ID_A}, ${ID_B}); }

fn combine(p: S, q: S) -> S {
${COMBINE}
}

// Offset of element r (0 <= r < the row's length) from the row's base.
fn elem(base: u32, r: u32) -> u32 {
${ELEM}
}

fn load(base: u32, r: u32) -> S {
${LOAD}
}

fn store(row: u32, s: S) {
${STORE}
}

@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32${SG_ARGS}) {
${INIT}
    let tx = ${TX_OF_LID};
    let ty = ${TY_OF_LID};
    let row_raw = (wid.y * nwg.x + wid.x) * TX + tx;
    let valid = row_raw < ROWS;
    let row = select(0u, row_raw, valid);
${RANGE}
    var s = identity();
    var r = start + ty;
    // Four independent loads in flight per step, then the tail.
    for (; r + 3u * TY < end; r += 4u * TY) {
        let s01 = combine(load(base, r), load(base, r + TY));
        let s23 = combine(load(base, r + 2u * TY), load(base, r + 3u * TY));
        s = combine(s, combine(s01, s23));
    }
    for (; r < end; r += TY) {
        s = combine(s, load(base, r));
    }
${CROSS}
}
