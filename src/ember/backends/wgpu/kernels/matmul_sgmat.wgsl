${ENABLES}
// f16 matrix products on subgroup matrices (template, filled by matmul_sgmat.py):
// out[z, m, n] = epi(sum_k A[z, m, k] * B[z, k, n]), A and B f16, f32 accumulation.
// A workgroup is 2 x 2 subgroups; each subgroup owns TM x TN accumulator tiles of CM x CN (the adapter's
// subgroup-matrix config) and, per K step of CK, loads TM left tiles and TN right tiles straight from the
// storage buffers (A row-major; B row-major, or column-major where B^T is the contiguous one), then TM * TN
// multiply-accumulates. Tiles past M or N load a clamped (in-range) origin and are masked at the store, so the
// control flow stays workgroup-uniform. The epilogue stages each accumulator through one f32 tile of workgroup
// memory per subgroup, from which the lanes apply epi() (bias, residual, activation, output dtype).
// Two variants from one generator: native (chromium_experimental_subgroup_matrix: subgroupMatrixLoad /
// MultiplyAccumulate / Store, subgroup_id) and emulated (the same loops and offsets in plain WGSL over virtual
// subgroups of consecutive local_invocation_index lanes; MATRIX defines its primitives), so the tiling is tested
// on adapters without matrix units.
// Placeholders: ENABLES (first, so the text starts with `enable f16;`), HEADER (bindings + grid comment),
// PRELUDE, BINDINGS, MATRIX (type aliases / emulated primitives), SCRATCH (elements of the staging array),
// EPILOGUE (fn epi(acc, z, m, n)), WG_X (4 subgroups), LANE_ARGS / LANES (defines sg and lane), GROUPS, TILES
// (per batch), TILES_N, BM, BN, SG_ROWS, SG_COLS, K, CK, SETUP (tile origins, base offsets, accumulators), STEP
// (one K step: loads and multiply-accumulates at offset kb), FINISH (stores and epilogue).
// Bindings (group 0): A, B, bias, residual read-only (one binding per distinct buffer; those in out's buffer are
// read through out), then out (read_write) last; the instance's list is in the header below.
// Grid: grid_1d(GROUPS) workgroups of WG_X invocations, GROUPS = Z * TILES; group g = wid.y * nwg.x + wid.x:
// z = g / TILES, block row (g % TILES) / TILES_N (BM rows), block column (g % TILES) % TILES_N (BN columns).
${HEADER}
${PRELUDE}
${BINDINGS}
${MATRIX}
var<workgroup> scratch: array<f32, ${SCRATCH}>;  // [subgroup][CM][CN]: one accumulator tile each, reused

${EPILOGUE}

@compute @workgroup_size(${WG_X})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>${LANE_ARGS}) {
    let g = wid.y * nwg.x + wid.x;
    if (g >= ${GROUPS}) { return; }  // a whole workgroup or none: the barriers below stay uniform
${LANES}
    let z = g / ${TILES};
    let t = g % ${TILES};
    let row0 = (t / ${TILES_N}) * ${BM} + (sg / 2u) * ${SG_ROWS};
    let col0 = (t % ${TILES_N}) * ${BN} + (sg % 2u) * ${SG_COLS};
${SETUP}
    for (var kb = 0u; kb < ${K}; kb += ${CK}) {
${STEP}
    }
${FINISH}
}
