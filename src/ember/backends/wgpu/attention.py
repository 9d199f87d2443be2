"""Fused attention: kernels/attention.wgsl with shapes, tile sizes and head_dim baked in.

Tiles: a workgroup of GY x GX threads owns BQ = GY * RQ query rows and walks the keys BK = GX * RK at a time;
each thread holds an RQ x RK register tile of scores and RQ rows of its head_dim chunks. The largest tile
that fits the adapter's workgroup storage is taken (32 KiB on lavapipe, 48 KiB on NVIDIA); short queries
(decoding, seq_q = 1) get few rows and wide key tiles.
"""

from __future__ import annotations

from typing import Any

from .backend import WgpuBackend, grid_1d
from .elementwise import float_literal

MAX_HEAD_DIM = 256
# (GY, GX, RQ, RK), best first: more rows and keys per thread reuse each workgroup-memory read more.
TILES = [
    (16, 16, 4, 4), (16, 16, 4, 2), (16, 16, 2, 4), (16, 16, 2, 2), (16, 16, 2, 1), (16, 16, 1, 2),
    (16, 16, 1, 1), (8, 32, 1, 2), (8, 32, 1, 1), (8, 16, 1, 1), (4, 64, 1, 1), (4, 32, 1, 1), (4, 16, 1, 1),
    (2, 64, 1, 1), (2, 32, 1, 1), (1, 64, 1, 1), (1, 32, 1, 1), (1, 16, 1, 1),
]


def _pow2ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def smem_bytes(gy: int, gx: int, rq: int, rk: int, rs: int) -> int:
    bq, bk = gy * rq, gx * rk
    return 16 * rs * (bq + bk) + 4 * bk * (bq | 1) + 4 * bq * gx


def pick_tile(seq_q: int, rs: int, limit: int) -> tuple[int, int, int, int]:
    """The first tile of TILES that fits `limit` bytes and has no more rows than seq_q needs."""
    cap = _pow2ceil(seq_q)
    for gy, gx, rq, rk in TILES:
        if gy * rq <= cap and smem_bytes(gy, gx, rq, rk, rs) <= limit:
            return gy, gx, rq, rk
    for tile in reversed(TILES):
        if smem_bytes(*tile, rs) <= limit:
            return tile
    raise NotImplementedError(f"wgpu attention: head_dim rows of {rs} vec4s do not fit in {limit} bytes "
                              "of workgroup storage")


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


def _body(gx: int, rq: int, rk: int, nc: int, d4: int, causal: bool, off: int) -> dict[str, str]:
    """The unrolled parts of the kernel: register tiles of RQ rows x RK keys and RQ rows x NC chunks."""
    rows, keys, chunks = range(rq), range(rk), range(nc)

    def chunk_guarded(n: int, stmt: str) -> str:
        return stmt if (n + 1) * gx <= d4 else f"if (tx + {n * gx}u < D4) {{ {stmt} }}"

    decl = []
    for i in rows:
        decl += [f"    let r{i} = ty * {rq}u + {i}u;", f"    let qi{i} = q0 + r{i};",
                 f"    var m{i} = neg_inf();  // running max of the row's scores",
                 f"    var l{i} = 0.0;  // this lane's part of the running sum of exp(score - m)"]
        decl += [f"    var acc{i}_{n} = vec4<f32>(0.0);" for n in chunks]

    sc = [f"        var s{i}_{k} = 0.0;" for i in rows for k in keys]
    sc.append("        for (var c = 0u; c < D4; c++) {")
    sc += [f"            let qv{i} = qs[r{i} * RS + c];" for i in rows]
    sc += [f"            let kv{k} = kvs[(tx + {k * gx}u) * RS + c];" for k in keys]
    sc += [f"            s{i}_{k} += dot(qv{i}, kv{k});" for i in rows for k in keys]
    sc.append("        }")
    for k in keys:
        sc.append(f"        let jg{k} = j0 + tx + {k * gx}u;")
    for i in rows:
        for k in keys:
            vis = f"jg{k} < SKV" + (f" && (i32(jg{k}) <= i32(qi{i}) + ({off}))" if causal else "")
            sc.append(f"        s{i}_{k} = select(neg_inf(), s{i}_{k}, {vis});")
        pm = f"s{i}_0"
        for k in keys[1:]:
            pm = f"max({pm}, s{i}_{k})"
        sc.append(f"        red[r{i} * GX + tx] = {pm};")

    sm = []
    for i in rows:
        sm += [f"        var mt{i} = m{i};",
               f"        for (var l = 0u; l < GX; l++) {{ mt{i} = max(mt{i}, red[r{i} * GX + l]); }}",
               f"        let none{i} = mt{i} == neg_inf();  // nothing visible to this row yet",
               f"        let alpha{i} = select(exp(m{i} - mt{i}), 1.0, none{i});",
               f"        m{i} = mt{i};"]
        for k in keys:
            sm += [f"        let p{i}_{k} = select(exp(s{i}_{k} - mt{i}), 0.0, none{i});",
                   f"        ps[(tx + {k * gx}u) * BQP + r{i}] = p{i}_{k};"]
        sm.append(f"        l{i} = l{i} * alpha{i} + " + " + ".join(f"p{i}_{k}" for k in keys) + ";")
        sm += [f"        acc{i}_{n} = acc{i}_{n} * alpha{i};" for n in chunks]

    pv = [f"            let p{i} = ps[j * BQP + r{i}];" for i in rows]
    for n in chunks:
        upd = f"let vv{n} = kvs[j * RS + tx + {n * gx}u]; " + " ".join(f"acc{i}_{n} += p{i} * vv{n};" for i in rows)
        pv.append("            " + chunk_guarded(n, upd))

    fin = [f"    red[r{i} * GX + tx] = l{i};" for i in rows]
    fin.append("    workgroupBarrier();")
    for i in rows:
        fin += [f"    var lt{i} = 0.0;",
                f"    for (var l = 0u; l < GX; l++) {{ lt{i} += red[r{i} * GX + l]; }}",
                f"    if (qi{i} < SQ) {{",
                f"        let inv = select(0.0, 1.0 / lt{i}, lt{i} > 0.0);",
                f"        let obase = (bh * SQ + qi{i}) * D;"]
        fin += ["        " + chunk_guarded(n, f"store_o(obase, tx + {n * gx}u, acc{i}_{n} * inv);") for n in chunks]
        fin.append("    }")
    return {"STATE_DECL": "\n".join(decl), "SCORES": "\n".join(sc), "SOFTMAX": "\n".join(sm), "PV": "\n".join(pv),
            "FINAL": "\n".join(fin)}


def record_attention(be: WgpuBackend, q: int, k: int, v: int, o: int, batch: int, heads: int, seq_q: int,
                     seq_kv: int, head_dim: int, scale: float, causal: bool) -> list[Any]:
    if head_dim > MAX_HEAD_DIM:
        raise NotImplementedError(f"wgpu attention: head_dim {head_dim} > {MAX_HEAD_DIM}")
    d = head_dim
    d4 = -(-d // 4)
    rs = d4 | 1
    limit = int(be.limits.get("max-compute-workgroup-storage-size", 16384))
    gy, gx, rq, rk = pick_tile(seq_q, rs, limit)
    bq, bk = gy * rq, gx * rk
    nc = -(-d4 // gx)
    qblocks = -(-seq_q // bq)
    groups = batch * heads * qblocks
    vec = d % 4 == 0
    off = seq_kv - seq_q
    kend = f"u32(clamp(i32(q0 + BQ) + ({off}), 0, i32(SKV)))" if causal else "SKV"
    src = be.kernel_source(
        "attention", VT="vec4<f32>" if vec else "f32", SQ=seq_q, SKV=seq_kv, D=d, D4=d4, RS=rs, GX=gx, BQ=bq,
        BQP=bq | 1, BK=bk, WG=gy * gx, QBLOCKS=qblocks, GROUPS=groups, SCALE=float_literal(scale),
        QS_SIZE=bq * rs, KV_SIZE=bk * rs, PS_SIZE=bk * (bq | 1), RED_SIZE=bq * gx,
        LOAD_Q=_row_io("q", d, vec), LOAD_K=_row_io("k", d, vec), LOAD_V=_row_io("v", d, vec), STORE_O=_store(vec),
        KEND=kend, **_body(gx, rq, rk, nc, d4, causal, off),
    )
    label = "attention"
    pipe = be.pipeline(label, src)
    return [be.dispatch(pipe, [q, k, v, o], grid_1d(groups), label)]
