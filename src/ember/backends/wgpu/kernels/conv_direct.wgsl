// Direct 2-D convolution (template, filled by conv_direct.py's record_direct) for convs with few input channels and
// a large window, such as the stem of image models (3 -> 64 channels, 7x7, stride 2): there implicit GEMM's
// K = C*R*S is short and its gather of the input dominates.
//
// A workgroup of WARPS warps computes a TP x 16 tile of output pixels of one image for KT = 8 * WARPS output
// channels. Per input channel it stages in workgroup memory the input patch the tile reads (zero outside the
// image; each row's columns split into SW phases, so that lanes with neighbouring output columns read
// neighbouring words) and the KT x R x S filter slice, tap-major with KT + 4 floats a tap (the padding spreads
// a warp's stores over 8 banks). Warp `cg` owns channels cg*8 .. +8, so its filter loads are vec4 broadcasts;
// its lanes own 16 consecutive output columns (stores coalesce) in two groups of RT = TP/2 rows. A thread loads
// a filter column's input values once ((RT-1)*SH + (R-1)*DH + 1 of them) and reuses each for up to R taps:
// RT x 8 accumulators in named vec4s. The filter columns are a loop and the taps of one column unrolled (fully
// unrolled, the kernel ran slower in whole models: cold instruction caches). The next channel's patch and
// filter words are loaded into registers before the current channel's products, so those loads are in flight
// while the products run.
// Bindings (group 0): x, w, bias, residual read-only (those present, one binding per distinct buffer), then
// out (read_write) last; the instance's list is in the header below.
// Grid: (ceil(P/TP) * ceil(Q/16), K/KT, N) workgroups of THREADS = 32 * WARPS threads.
// Placeholders: HEADER (bindings + grid comment), PRELUDE, BINDINGS, EPILOGUE (fn epi(acc, z = image,
// m = channel, n = p*Q + q)), THREADS, KT, TILES_Q, TP, TQ, SH, SW, PT, PL, C, XS_SIZE, WS_VEC4, ROW0 (the
// thread's first patch word), DECLS, LOAD_FIRST / LOAD_NEXT (channel 0 / c + 1 into the thread's registers),
// STORE_FIRST / STORE (those registers into xs and ws), COMPUTE (channel c's products), EPILOGUE_STORE.
${HEADER}
${PRELUDE}
${BINDINGS}

${EPILOGUE}

var<workgroup> xs: array<f32, ${XS_SIZE}>;
var<workgroup> ws: array<vec4<f32>, ${WS_VEC4}>;

@compute @workgroup_size(${THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let tile_q = wid.x % ${TILES_Q};
    let tile_p = wid.x / ${TILES_Q};
    let k0 = wid.y * ${KT};
    let img = wid.z;
    let cg = lid >> 5u;
    let ql = lid & 15u;
    let rg = (lid >> 4u) & 1u;
    let h0 = i32(tile_p * ${TP} * ${SH}) - ${PT};
    let w0 = i32(tile_q * ${TQ} * ${SW}) - ${PL};
    let row0 = ${ROW0};
    let w0i = cg * 2u;
${DECLS}
${LOAD_FIRST}
${STORE_FIRST}
    workgroupBarrier();
    for (var c = 0u; c < ${C}; c++) {
        if (c + 1u < ${C}) {
${LOAD_NEXT}
        }
${COMPUTE}
        workgroupBarrier();
        if (c + 1u < ${C}) {
${STORE}
        }
        workgroupBarrier();
    }
${EPILOGUE_STORE}
}
