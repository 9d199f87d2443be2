"""WGSL text the subgroup-matrix kernels share (matmul_sgmat.py, matmul_sgmat_staged.py, conv_sgmat.py): the enables
and subgroup/lane bindings of either variant, and the epilogue that takes each accumulator through a scratch tile."""

from __future__ import annotations

from .runtime import MatrixConfig
from .shader.wgsl import u32

NATIVE_ENABLES = ("enable f16;\nenable subgroups;\nenable chromium_experimental_subgroup_matrix;\n"
                  # The offsets derive from subgroup_id: subgroup-uniform, which the analysis cannot prove.
                  "diagnostic(off, chromium_experimental.subgroup_matrix_uniformity);")


def lane_preamble(native: bool, subgroup: int, subgroups: int, lid: bool) -> tuple[str, str, str]:
    """(enables, main's extra builtin arguments, lines defining `sg` and `lane`) for `subgroups` subgroups of
    `subgroup` lanes; `lid`: the native kernel also reads local_invocation_index (the emulated one always does)."""
    if native:
        args = ", @builtin(local_invocation_index) lid: u32" if lid else ""
        args += ", @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32"
        lanes = f"    // sg: this subgroup (0..{subgroups - 1}), lane: its invocation" + (
            ", lid: the workgroup's" if lid else " within it")
        return NATIVE_ENABLES, args, lanes
    lanes = (f"    let sg = lid / {u32(subgroup)};  // the virtual subgroup (0..{subgroups - 1})\n"
             f"    let lane = lid % {u32(subgroup)};")
    return "enable f16;", ", @builtin(local_invocation_index) lid: u32", lanes


def finish_lines(native: bool, cfg: MatrixConfig, subgroup: int, pairs: list[tuple[int, int]], m: int,
                 n: int) -> list[str]:
    """Each accumulator acc_i_j through this subgroup's scratch tile to epi(), masked where the tile (origin row_i,
    col_j) is past M or N."""
    cmn = cfg.m * cfg.n
    lines = [f"    let base = sg * {u32(cmn)};"]
    for t, (i, j) in enumerate(pairs):
        if t:
            lines.append("    workgroupBarrier();  // the previous tile's reads of scratch are done")
        if native:
            lines.append(f"    subgroupMatrixStore(&scratch, base, acc_{i}_{j}, false, {u32(cfg.n)});")
        else:
            lines.append(f"    store_acc(lane, base, &acc_{i}_{j});")
        lines += ["    workgroupBarrier();",
                  f"    if (row_{i} < {u32(m)} && col_{j} < {u32(n)}) {{",
                  f"        for (var e = lane; e < {u32(cmn)}; e += {u32(subgroup)}) {{",
                  f"            epi(scratch[base + e], z, row_{i} + e / {u32(cfg.n)}, col_{j} + e % {u32(cfg.n)});",
                  "        }", "    }"]
    return lines
