${ENABLES}
// Implicit-GEMM convolution on subgroup matrices (template, filled by conv_sgmat.py), NCHW, f16 x and w, f32
// accumulation: out[n, z*Kg + m, p, q] = epi(sum_kk W[z*Kg + m, kk] * X(kk; n, p, q)), kk = (c, r, s),
// column j = (n, p, q), X the input element under tap (r, s) of pixel (p, q) or 0 in the padding.
// A workgroup is SGM x SGN subgroups owning a BM x BN output block (BM output channels, BN pixels); each subgroup
// holds TM x TN accumulator tiles of CM x CN. Per K block of BK, single-buffered as matmul_sgmat_staged.wgsl:
// every invocation loads its share of the A block (W rows, 16-byte chunks or scalars) and of the B block (COLS
// consecutive pixels x some rows, gathered: (n, p, q) decoded before the loop, (c, r, s) once per row) into
// registers, barrier (the previous block's reads are done), stores them into the workgroup arrays as f16,
// barrier, then the subgroups load their left / right tiles from the arrays CK columns of K at a time. Rows of A
// and B past K are stored as zeros (K need not be a multiple of BK); rows of A past M load a clamped row, columns
// of B past N zeros, and their tiles / elements are masked at the store, so the control flow stays
// workgroup-uniform around every barrier. The epilogue is matmul_sgmat.wgsl's: each accumulator through one f32
// tile of workgroup memory per subgroup, then epi() (bias per channel, residual, activation, output dtype).
// Two variants from one generator: native (chromium_experimental_subgroup_matrix) and emulated (the same arrays,
// barriers and offsets in plain WGSL over virtual subgroups of consecutive local_invocation_index lanes).
// Placeholders: ENABLES, HEADER (shape, variant, bindings, grid), PRELUDE, BINDINGS (W as array<vec4<u32>> where
// A moves in chunks), MATRIX (type aliases / emulated primitives), SH_A / SH_B, SCRATCH, PUT (put_a / put_b: one
// chunk into the arrays), EPILOGUE (fn epi(acc, z, m, n)), WG_X, LANE_ARGS / LANES (define sg, lane and lid),
// GROUPS, TILES (per group), TILES_N, BM, BN, SETUP (chunk / pixel decodes, tile offsets, accumulators), KBLOCKS,
// BK, LOAD (global -> registers for block s at k0), STORE (registers -> arrays), COMPUTE, FINISH.
// Bindings (group 0): W, x, bias, residual read-only (one binding per distinct buffer; one in out's buffer is read
// through out), then out (read_write) last; the instance's list is in the header below.
// Grid: grid_1d(GROUPS) workgroups of WG_X invocations, GROUPS = groups * TILES; group g = wid.y * nwg.x + wid.x:
// z = g / TILES (the conv group), block row (g % TILES) / TILES_N (BM channels), block column (g % TILES) % TILES_N
// (BN pixels).
${HEADER}
${PRELUDE}
${BINDINGS}
${MATRIX}
var<workgroup> sh_a: array<f16, ${SH_A}>;  // [BM][BK + pad]: W rows x the K block
var<workgroup> sh_b: array<f16, ${SH_B}>;  // [BK][BN + pad]: the K block x the block's pixels, gathered
var<workgroup> scratch: array<f32, ${SCRATCH}>;  // [subgroup][CM][CN]: one accumulator tile each, reused
${PUT}

${EPILOGUE}

@compute @workgroup_size(${WG_X})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>${LANE_ARGS}) {
    let g = wid.y * nwg.x + wid.x;
    if (g >= ${GROUPS}) { return; }  // a whole workgroup or none: the barriers below stay uniform
${LANES}
    let z = g / ${TILES};
    let t = g % ${TILES};
    let brow = (t / ${TILES_N}) * ${BM};  // the block's first output channel (within the group) / pixel
    let bcol = (t % ${TILES_N}) * ${BN};
${SETUP}
    for (var s = 0u; s < ${KBLOCKS}; s++) {
        let k0 = s * ${BK};
${LOAD}
        workgroupBarrier();  // every subgroup is done reading the previous block
${STORE}
        workgroupBarrier();
        let abuf = 0u;
        let bbuf = 0u;
${COMPUTE}
    }
${FINISH}
}
