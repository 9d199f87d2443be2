${ENABLES}
// f16 matrix products on subgroup matrices, A and B staged through workgroup memory (template, filled by
// matmul_sgmat_staged.py): out[z, m, n] = epi(sum_k A[z, m, k] * B[z, k, n]), A and B f16, f32 accumulation.
// A workgroup is SGM x SGN subgroups owning a BM x BN block; each subgroup holds TM x TN accumulator tiles of
// CM x CN (the subgroup-matrix config). Per K block of BK the workgroup copies the A block (BM x BK) and the B
// block (BK x BN, or BN x BK where B^T is the contiguous one) from global memory into workgroup arrays, each
// invocation moving 16-byte chunks (vec4<u32>, 8 f16) through registers, rows padded against bank conflicts; the
// subgroups then load their left / right tiles from those arrays, CK columns of K at a time. Double-buffered:
// the next block's chunks are loaded into registers before the current block's multiply-accumulates and stored
// into the other half of the arrays after them, one barrier per K block. Single-buffered: load, barrier, store,
// barrier, compute. Rows of A past M and columns of B past N load clamped (in-range) rows / columns; their tiles
// are masked at the store, so the control flow stays workgroup-uniform around every barrier. The epilogue is
// matmul_sgmat.wgsl's: each accumulator through one f32 tile of workgroup memory per subgroup, then epi().
// Two variants from one generator: native (chromium_experimental_subgroup_matrix) and emulated (the same arrays,
// barriers and offsets in plain WGSL over virtual subgroups of consecutive local_invocation_index lanes).
// Placeholders: ENABLES, HEADER (variant, bindings, grid), PRELUDE, BINDINGS (A and B as array<vec4<u32>>),
// MATRIX (type aliases / emulated primitives), SH_A / SH_B (elements of the staging arrays, both halves when
// double-buffered), SCRATCH, PUT (fns storing one chunk into sh_a / sh_b), EPILOGUE (fn epi(acc, z, m, n)), WG_X,
// LANE_ARGS / LANES (define sg, lane and lid), GROUPS, TILES, TILES_N, BM, BN, SETUP (chunk addresses, tile
// offsets in the arrays, origins, accumulators), MAIN (the K loop), FINISH (stores and epilogue).
// Bindings (group 0): A, B, bias, residual read-only (one binding per distinct buffer), then out (read_write)
// last; the instance's list is in the header below.
// Grid: grid_1d(GROUPS) workgroups of WG_X invocations, GROUPS = Z * TILES; group g = wid.y * nwg.x + wid.x:
// z = g / TILES, block row (g % TILES) / TILES_N (BM rows), block column (g % TILES) % TILES_N (BN columns).
${HEADER}
${PRELUDE}
${BINDINGS}
${MATRIX}
var<workgroup> sh_a: array<f16, ${SH_A}>;  // [buffer][BM][BK + pad]
var<workgroup> sh_b: array<f16, ${SH_B}>;  // [buffer][BK][BN + pad], or [buffer][BN][BK + pad] for B^T
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
    let brow = (t / ${TILES_N}) * ${BM};  // the block's first row / column
    let bcol = (t % ${TILES_N}) * ${BN};
${SETUP}
${MAIN}
${FINISH}
}
