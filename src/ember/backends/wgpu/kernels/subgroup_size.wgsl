${ENABLES}
// The subgroup size a compute pipeline runs at (template, filled by matmul_sgmat.py): Dawn's adapter info has
// no per-pipeline subgroup size, and the subgroup-matrix kernel's workgroup is 4 subgroups wide.
// Every invocation folds its subgroup_size into out[0] (the largest) and out[1] (~ the smallest), so a
// pipeline whose subgroups differ in size shows it (out[0] != ~out[1]) and the caller can refuse to trust it.
// Placeholders: ENABLES (`enable subgroups;` where the compiler wants it, plus the matrix extension when TOUCH
// uses it), TOUCH (a statement naming a subgroup-matrix type, so the pipeline is built as the matrix kernel's
// are: full subgroups, the matrix units' size; empty for a plain measurement).
// Bindings (group 0): binding 0: out, read_write, array<atomic<u32>, 4> (16 bytes, zeroed by the caller).
// Grid: (1, 1, 1), one workgroup of 128 invocations (a multiple of any adapter's largest subgroup size).
@group(0) @binding(0) var<storage, read_write> out: array<atomic<u32>, 4>;

@compute @workgroup_size(128)
fn main(@builtin(subgroup_size) size: u32) {
    ${TOUCH}
    atomicMax(&out[0], size);
    atomicMax(&out[1], 0xffffffffu - size);
}
