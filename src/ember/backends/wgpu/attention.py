"""Fused attention: kernels/attention.wgsl with shapes, tile sizes and head_dim baked in.

Tiles: BQ query rows x BK keys per workgroup (BQ * BK threads). BQ follows seq_q (decoding, seq_q = 1,
gets one row and wide key tiles); both shrink until the q tile and the shared K/V tile fit the adapter's
workgroup storage (32 KiB on lavapipe, 48 KiB on NVIDIA).
"""

from __future__ import annotations

from typing import Any

from .backend import WgpuBackend, grid_1d
from .elementwise import float_literal

MAX_HEAD_DIM = 256


def _pow2ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _tiles(seq_q: int, d4: int, rs: int, limit: int) -> tuple[int, int]:
    bq = min(16, _pow2ceil(seq_q))
    bk = min(64, 256 // bq)

    def smem(bq: int, bk: int) -> int:
        return 16 * (bq + bk) * rs + 8 * bq * bk

    while smem(bq, bk) > limit:
        if bk > 8 and (bk >= bq or bq == 1):
            bk //= 2
        elif bq > 1:
            bq //= 2
        else:
            raise NotImplementedError(f"wgpu attention: head_dim {d4 * 4} does not fit in {limit} bytes "
                                      "of workgroup storage")
    return bq, bk


def _row_io(name: str, d: int, vec: bool) -> str:
    if vec:
        return f"    return {name}[base / 4u + c];"
    return "\n".join([
        "    var x = vec4<f32>(0.0);",
        "    for (var i = 0u; i < 4u; i++) {",
        "        let d = c * 4u + i;",
        f"        if (d < D) {{ x[i] = {name}[base + d]; }}",
        "    }",
        "    return x;",
    ])


def _store(vec: bool) -> str:
    if vec:
        return "    o[base / 4u + c] = x;"
    return "\n".join([
        "    for (var i = 0u; i < 4u; i++) {",
        "        let d = c * 4u + i;",
        "        if (d < D) { o[base + d] = x[i]; }",
        "    }",
    ])


def record_attention(be: WgpuBackend, q: int, k: int, v: int, o: int, batch: int, heads: int, seq_q: int,
                     seq_kv: int, head_dim: int, scale: float, causal: bool) -> list[Any]:
    if head_dim > MAX_HEAD_DIM:
        raise NotImplementedError(f"wgpu attention: head_dim {head_dim} > {MAX_HEAD_DIM}")
    d = head_dim
    d4 = -(-d // 4)
    rs = d4 | 1
    limit = int(be.limits.get("max-compute-workgroup-storage-size", 16384))
    bq, bk = _tiles(seq_q, d4, rs, limit)
    wg = bq * bk
    nc = -(-d4 // bk)
    qblocks = -(-seq_q // bq)
    groups = batch * heads * qblocks
    vec = d % 4 == 0

    off = seq_kv - seq_q
    if causal:
        kend = f"u32(clamp(i32(q0 + BQ) + ({off}), 0, i32(SKV)))"
        visible = f" && (i32(jg) <= i32(qi) + ({off}))"
    else:
        kend, visible = "SKV", ""

    def guard(i: int, stmt: str) -> str:
        c = f"t + {i * bk}u"
        stmt = stmt.replace("CHUNK", c)
        return stmt if (i + 1) * bk <= d4 else f"if ({c} < D4) {{ {stmt} }}"

    acc_decl = "\n".join(f"    var acc{i} = vec4<f32>(0.0);" for i in range(nc))
    acc_scale = "\n".join(f"        acc{i} = acc{i} * alpha;" for i in range(nc))
    acc_update = "\n".join("            " + guard(i, f"acc{i} += p * kvs[j * RS + CHUNK];") for i in range(nc))
    acc_store = "\n".join("        " + guard(i, f"store_o(obase, CHUNK, acc{i} * inv);") for i in range(nc))
    src = be.kernel_source(
        "attention", VT="vec4<f32>" if vec else "f32", SQ=seq_q, SKV=seq_kv, D=d, D4=d4, RS=rs, BQ=bq, BK=bk,
        WG=wg, QBLOCKS=qblocks, GROUPS=groups, SCALE=float_literal(scale), QS_SIZE=bq * rs, KV_SIZE=bk * rs,
        LOAD_Q=_row_io("q", d, vec), LOAD_K=_row_io("k", d, vec), LOAD_V=_row_io("v", d, vec), STORE_O=_store(vec),
        KEND=kend, VISIBLE=visible, ACC_DECL=acc_decl, ACC_SCALE=acc_scale, ACC_UPDATE=acc_update,
        ACC_STORE=acc_store,
    )
    label = "attention"
    pipe = be.pipeline(label, src)
    return [be.dispatch(pipe, [q, k, v, o], grid_1d(groups), label)]
