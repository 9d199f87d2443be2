"""Fused attention: kernels/attention.wgsl with shapes, strides, tile sizes and head_dim baked in.

record_attention_views takes q, k, v, out as strided 4-D Views (B, H, S, D) (transposes, slices of a packed
QKV buffer, negative strides), k/v with fewer heads than q (grouped-query attention), and an optional additive
mask View broadcast to (B, Hq, Sq, Skv) (any strides, 0 included) bound as its own buffer; record_attention is
the contiguous special case. Rows are read and written as vec4s where head_dim is unit-stride and every row
starts 16-byte aligned, else element by element. A row whose scores are all -inf (mask or causal) gives zeros.

Tiles: a workgroup of GY x GX threads owns BQ = GY * RQ query rows and walks the keys BK = GX * RK at a time;
each thread holds an RQ x RK register tile of scores and RQ rows of its head_dim chunks. The largest tile
that fits the adapter's workgroup storage is taken (32 KiB on lavapipe, 48 KiB on NVIDIA); short queries
(decoding, seq_q = 1) get few rows and wide key tiles.

Runtime sizes (`runtime_sizes`, what a template's plans record): the key count, the views' strides and offsets and,
where there is more than one query, the query count and the batch come from a uniform array, the query tile then
picked for RUNTIME_QUERIES rows whatever the count (one kernel for every sequence length of an encoder).

A single query row (a decode step) against enough keys takes the split-KV kernels of attention_decode.py instead
(EMBER_ATTENTION_SPLIT_KV).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.view import View
from .program import KERNELS, as_f32, from_f32, grid_1d, kernel, sizes_buffer, sizes_decl
from .shader.bindings import Window, binding_windows, check_no_overlap, check_view, rebase_view, require_float
from .shader.wgsl import float_literal

if TYPE_CHECKING:
    from .backend import WgpuBackend

MAX_HEAD_DIM = 256
RUNTIME_QUERIES = 64  # the query count a runtime-sized kernel's tile is picked for: the largest tile's rows
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
    ps = 16 * bk * (gy + 1) if rq == 4 else 4 * bk * (bq | 1)  # see _body: vec4 rows of ps when RQ = 4
    return 16 * rs * (bq + bk) + ps + 4 * bq * gx


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


def lin(base: int | str, terms: list[tuple[str, int]]) -> str:
    """A u32 WGSL expression for base + sum(var * stride). Negative strides are subtracted after the positive
    terms are added, so for an element inside a view (never below 0) no intermediate wraps."""
    pos = [f"{base}u" if isinstance(base, int) else base] if base != 0 else []
    neg = []
    for var, s in terms:
        if s:
            (pos if s > 0 else neg).append(var if abs(s) == 1 else f"{var} * {abs(s)}u")
    expr = " + ".join(pos) or "0u"
    if neg:
        expr = (f"({expr})" if len(pos) > 1 else expr) + "".join(f" - {t}" if " " not in t else f" - ({t})"
                                                                for t in neg)
    return expr


def _row_io(name: str, vec: bool, sd: int, st: str) -> str:
    """Body of a row-chunk loader: vec4<f32> from f32 or f16 storage (f16 is computed in f32)."""
    if vec:
        return f"    return {as_f32(f'{name}[base / 4u + c]', st, vec4=True)};"
    elem = as_f32(f"{name}[{lin('base', [('d', sd)])}]", st)
    return "\n".join([
        "    var x = vec4<f32>(0.0);",
        "    for (var i = 0u; i < 4u; i++) {",
        "        let d = c * 4u + i;",
        f"        if (d < D) {{ x[i] = {elem}; }}",
        "    }",
        "    return x;",
    ])


def _store(name: str, vec: bool, sd: int, st: str) -> str:
    if vec:
        return f"    {name}[base / 4u + c] = {from_f32('x', st, vec4=True)};"
    return "\n".join([
        "    for (var i = 0u; i < 4u; i++) {",
        "        let d = c * 4u + i;",
        f"        if (d < D) {{ {name}[{lin('base', [('d', sd)])}] = {from_f32('x[i]', st)}; }}",
        "    }",
    ])


def _body(gx: int, rq: int, rk: int, nc: int, d4: int, causal: bool, off: int, osi: int,
          mask: tuple[str, int, int] | None, vec_ps: bool) -> dict[str, str]:
    """The unrolled parts of the kernel: register tiles of RQ rows x RK keys and RQ rows x NC chunks.

    osi: the output's row stride; mask: (binding, row stride, key stride) of the additive mask, or None."""
    rows, keys, chunks = range(rq), range(rk), range(nc)

    def chunk_guarded(n: int, stmt: str) -> str:
        return stmt if (n + 1) * gx <= d4 else f"if (tx + {n * gx}u < D4) {{ {stmt} }}"

    decl = []
    for i in rows:
        decl += [f"    let r{i} = ty * {rq}u + {i}u;", f"    let qi{i} = q0 + r{i};",
                 f"    var m{i} = neg_inf();  // running max of the row's scores",
                 f"    var l{i} = 0.0;  // this lane's part of the running sum of exp(score - m)"]
        decl += [f"    var acc{i}_{n} = vec4<f32>(0.0);" for n in chunks]
        if mask is not None and (mask[1] or i == 0):
            decl.append(f"    let mr{i} = {lin('mb', [(f'min(qi{i}, SQL)', mask[1])])};  // the row's mask")

    sc = [f"        var s{i}_{k} = 0.0;" for i in rows for k in keys]
    sc.append("        for (var c = 0u; c < D4; c++) {")
    sc += [f"            let qv{i} = qs[r{i} * RS + c];" for i in rows]
    sc += [f"            let kv{k} = kvs[(tx + {k * gx}u) * RS + c];" for k in keys]
    sc += [f"            s{i}_{k} += dot(qv{i}, kv{k});" for i in rows for k in keys]
    sc.append("        }")
    for k in keys:
        sc.append(f"        let jg{k} = j0 + tx + {k * gx}u;")
    if mask is not None:
        sc += [f"        let mk{k} = min(jg{k}, SKL);" for k in keys]
        if mask[1]:
            sc += [f"        s{i}_{k} += f32({mask[0]}[{lin(f'mr{i}', [(f'mk{k}', mask[2])])}]);"
                   for i in rows for k in keys]
        else:  # one mask row for every query (a key padding mask): one load per key
            sc += [f"        let mv{k} = f32({mask[0]}[{lin('mr0', [(f'mk{k}', mask[2])])}]);" for k in keys]
            sc += [f"        s{i}_{k} += mv{k};" for i in rows for k in keys]
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
            sm.append(f"        let p{i}_{k} = select(exp(s{i}_{k} - mt{i}), 0.0, none{i});")
            if not vec_ps:
                sm.append(f"        ps[(tx + {k * gx}u) * BQP + r{i}] = p{i}_{k};")
        sm.append(f"        l{i} = l{i} * alpha{i} + " + " + ".join(f"p{i}_{k}" for k in keys) + ";")
        sm += [f"        acc{i}_{n} = acc{i}_{n} * alpha{i};" for n in chunks]
    if vec_ps:  # a thread's four rows of one key as one vec4: the P.V loop reads them with one load
        sm += [f"        ps[(tx + {k * gx}u) * BQP + ty] = vec4<f32>({', '.join(f'p{i}_{k}' for i in rows)});"
               for k in keys]

    if vec_ps:
        pv = ["            let pq = ps[j * BQP + ty];"] + [f"            let p{i} = pq.{'xyzw'[i]};" for i in rows]
    else:
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
                f"        let obase = {lin('ob', [(f'qi{i}', osi)])};"]
        fin += ["        " + chunk_guarded(n, f"store_o(obase, tx + {n * gx}u, acc{i}_{n} * inv);") for n in chunks]
        fin.append("    }")
    return {"STATE_DECL": "\n".join(decl), "SCORES": "\n".join(sc), "SOFTMAX": "\n".join(sm), "PV": "\n".join(pv),
            "FINAL": "\n".join(fin)}


def _vec4_ok(v: View) -> bool:
    """Rows of v can be read or written as whole vec4s: unit-stride head_dim of a multiple of 4 elements, and
    every row starts at a multiple of 4 (strides of size-1 dims are 0 by then)."""
    return v.shape[3] % 4 == 0 and v.strides[3] == 1 and all(s % 4 == 0 for s in (v.offset, *v.strides[:3]))


def _squeeze_strides(v: View) -> View:
    """The same view with the strides of size-1 dims set to 0 (they never move an index)."""
    return View(v.handle, v.dtype, v.shape, tuple(0 if d == 1 else s for d, s in zip(v.shape, v.strides, strict=True)),
                v.offset)


class _Lifted(int):
    """A size read at run time: an int while the kernel is generated (signs and zero tests decide its text), written
    into the source as the name of a let at the start of main (`r3_` as i32, `r3_u` as u32, as lin and the body
    write ints with or without their suffix)."""

    name: str

    def __new__(cls, value: int, name: str) -> _Lifted:
        obj = super().__new__(cls, value)
        obj.name = name
        return obj

    def __str__(self) -> str:
        return self.name

    __format__ = lambda self, spec: self.name  # noqa: E731

    def __abs__(self) -> _Lifted:
        return self if self >= 0 else _Lifted(-int(self), f"(-{self.name})")


class _Sizes:
    """The values a runtime-sized attention kernel reads from its uniform array."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.values: list[int] = []

    def __call__(self, x: int) -> int:
        if not self.on or x < 0:  # a negative stride keeps its literal (lin subtracts its magnitude)
            return x
        self.values.append(int(x))
        return _Lifted(int(x), f"r{len(self.values) - 1}_")

    def view(self, x: View | None) -> View | None:
        if x is None or not self.on:
            return x
        return View(x.handle, x.dtype, x.shape, tuple(self(s) for s in x.strides), self(x.offset))

    def declarations(self) -> list[str]:
        # Module-scope private copies, so the row loaders (functions of their own) read them too.
        return [f"var<private> r{i}_: i32;\nvar<private> r{i}_u: u32;" for i in range(len(self.values))]

    def prologue(self) -> str:
        # The private copies for the loaders, then lets of the same names for main itself: a private variable's
        # value is non-uniform to WGSL's uniformity analysis (Tint rejects the barriers inside loops bounded by
        # it), a uniform buffer's is uniform.
        n = range(len(self.values))
        return "\n".join([f"    r{i}_ = sz[{i // 4}][{i % 4}]; r{i}_u = u32(r{i}_);" for i in n]
                         + [f"    let r{i}_ = sz[{i // 4}][{i % 4}]; let r{i}_u = u32(r{i}_);" for i in n])


@kernel("record_attention_views")
def record_attention_views(be: WgpuBackend, q: View, k: View, v: View, mask: View | None, out: View, scale: float,
                           causal: bool, runtime_sizes: bool = False) -> list[Any]:
    """`runtime_sizes`: the key count, the views' strides and offsets, and (seq_q > 1) the query count and the
    batch in a uniform buffer, not in the source (one pipeline for every past length of a decode, every sequence
    length of an encoder)."""
    types = require_float("attention", q=q, k=k, v=v, mask=mask, out=out)
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out), ("mask", mask)):
        if x is not None and len(x.shape) != 4:
            raise ValueError(f"attention: {name} must be a 4-D view (B, H, S, D), got shape {x.shape}")
    batch, hq, seq_q, d = q.shape
    hkv, seq_kv = k.shape[1], k.shape[2]
    if v.shape[3] != d:
        raise NotImplementedError(f"wgpu attention: v head_dim {v.shape[3]} != q head_dim {d}")
    if (k.shape != (batch, hkv, seq_kv, d) or v.shape != k.shape or out.shape != q.shape or hkv < 1
            or hq % hkv):
        raise ValueError(f"attention: shapes q {q.shape}, k {k.shape}, v {v.shape} -> out {out.shape} do not "
                         "match (B, Hq, Sq, D), (B, Hkv, Skv, D) x 2 -> (B, Hq, Sq, D) with Hq a multiple of Hkv")
    if mask is not None and mask.shape != (batch, hq, seq_q, seq_kv):
        raise ValueError(f"attention: mask shape {mask.shape} is not (B, Hq, Sq, Skv) = "
                         f"{(batch, hq, seq_q, seq_kv)}")
    if d > MAX_HEAD_DIM:
        raise NotImplementedError(f"wgpu attention: head_dim {d} > {MAX_HEAD_DIM}")
    if out.size == 0:
        return []
    scale = float(scale)
    for name, x in (("q", q), ("k", k), ("v", v), ("mask", mask), ("out", out)):
        if x is not None:
            check_view(be, x, name)
    if any(s == 0 for dim, s in zip(out.shape, out.strides, strict=True) if dim > 1):
        raise ValueError(f"out: a broadcast (stride 0) output view {out.strides} would write elements twice")
    for name, x in (("q", q), ("k", k), ("v", v), ("mask", mask)):
        if x is not None:
            check_no_overlap(x, out, name)
    if seq_kv == 0:  # nothing to read: keep k, v and the mask out of the address arithmetic
        k = View(k.handle, k.dtype, k.shape, (0, 0, 0, 0), 0)
        v = View(v.handle, v.dtype, v.shape, (0, 0, 0, 0), 0)
        mask = None
    if seq_q == 1:  # a decode step: its keys split over several workgroups a head where worth it (attention_decode)
        split = KERNELS["attention_split_kv"](be, q, k, v, mask, out, scale, causal, types, runtime_sizes)
        if split is not None:
            return split
    # An allocation above the max binding size binds just the bytes a view touches (its offsets then count from
    # there): each read-only input its own range (one buffer may be bound read-only several times), the output
    # one range covering whatever reads through it.
    inputs = [x for x in (q, k, v, mask) if x is not None]
    ow = binding_windows(be, [out, *(x for x in inputs if x.handle == out.handle)]).get(out.handle)
    wins = [ow if x.handle == out.handle else binding_windows(be, [x]).get(x.handle) for x in inputs]
    if any(w is not None and w[1] > be.max_binding for w in (ow, *wins)):
        raise NotImplementedError(f"wgpu attention: an operand spans more than max-storage-buffer-binding-size "
                                  f"({be.max_binding} bytes)")

    def place(x: View, w: Window | None) -> View:
        return _squeeze_strides(x if w is None else rebase_view(x, {x.handle: w}))

    q, k, v = (place(x, w) for x, w in zip(inputs[:3], wins[:3], strict=True))
    mask = place(mask, wins[3]) if mask is not None else None
    qw, kw, vw = wins[:3]
    mw = wins[3] if mask is not None else None
    out = place(out, ow)
    # A window's byte range moves with the views, and the bind group holds it, not the uniform: literal sizes then.
    runtime_sizes = runtime_sizes and all(w is None for w in (ow, *wins))
    rt = _Sizes(runtime_sizes)
    # A decode's single query stays a literal (its kernel as it was); more queries move with the sequence: the
    # first value then counts the query rows the grid covers (resize.probe_sizes).
    lift_q = runtime_sizes and seq_q > 1
    if lift_q:
        rt(batch * hq * seq_q)
    sq, sql, nb = (rt(seq_q), rt(seq_q - 1), rt(batch)) if lift_q else (seq_q, seq_q - 1, batch)
    skv, skl = rt(seq_kv), rt(max(seq_kv - 1, 0))

    # One read-only binding per (buffer, range, element type); an input in the output's buffer reads through `o`
    # (WebGPU forbids binding one buffer read-only and writable in one dispatch), all scalar then.
    shared = any(x.handle == out.handle for x in inputs)
    out_vec = _vec4_ok(out) and not shared
    reads: dict[tuple[int, Window | None, bool], str] = {}
    ot = types[out.handle]

    def bind(x: View, w: Window | None, vec: bool) -> tuple[str, bool]:
        if x.handle == out.handle:
            return "o", False
        return reads.setdefault((x.handle, w, vec), f"in{len(reads)}"), vec

    qn, qvec = bind(q, qw, _vec4_ok(q))
    kn, kvec = bind(k, kw, _vec4_ok(k))
    vn, vvec = bind(v, vw, _vec4_ok(v))
    mn = bind(mask, mw, False)[0] if mask is not None else None
    decls = [f"@group(0) @binding({i}) var<storage, read> {name}: array<{f'vec4<{types[h]}>' if vec else types[h]}>;"
             for i, ((h, _, vec), name) in enumerate(reads.items())]
    decls.append(f"@group(0) @binding({len(reads)}) var<storage, read_write> o: "
                 f"array<{f'vec4<{ot}>' if out_vec else ot}>;")
    buffers: dict[int, Any] = {i: h if w is None else (h, *w) for i, (h, w, _) in enumerate(reads)}
    buffers[len(reads)] = out.handle if ow is None else (out.handle, *ow)

    d4 = -(-d // 4)
    rs = d4 | 1
    limit = int(be.limits.get("max-compute-workgroup-storage-size", 16384))
    gy, gx, rq, rk = pick_tile(RUNTIME_QUERIES if lift_q else seq_q, rs, limit)
    bq, bk = gy * rq, gx * rk
    vec_ps = rq == 4
    nc = -(-d4 // gx)
    qblocks = -(-seq_q // bq)
    groups = batch * hq * qblocks
    off = rt(seq_kv - seq_q)
    kend = f"u32(clamp(i32(q0 + BQ) + ({off}), 0, i32(SKV)))" if causal else "SKV"
    # The views as the kernel's index arithmetic sees them (lifted: strides and offsets read at run time).
    lq, lk, lv, lo, lm = (rt.view(x) for x in (q, k, v, out, mask))
    assert lq is not None and lk is not None and lv is not None and lo is not None
    bases = [f"    let qb = {lin(lq.offset, [('b', lq.strides[0]), ('h', lq.strides[1])])};",
             f"    let kb = {lin(lk.offset, [('b', lk.strides[0]), ('hk', lk.strides[1])])};",
             f"    let vb = {lin(lv.offset, [('b', lv.strides[0]), ('hk', lv.strides[1])])};",
             f"    let ob = {lin(lo.offset, [('b', lo.strides[0]), ('h', lo.strides[1])])};"]
    if lm is not None:
        bases.append(f"    let mb = {lin(lm.offset, [('b', lm.strides[0]), ('h', lm.strides[1])])};")

    def desc(name: str, x: View | None) -> str:
        if x is None:
            return f"// {name}: none"
        return f"// {name}: shape {x.shape}, strides {x.strides}, offset {x.offset}"

    header = "\n".join([f"// This instance: scale {scale!r}, causal {causal}, {gy}x{gx} threads of {rq}x{rk} scores.",
                        *([] if runtime_sizes else [desc("q", q), desc("k", k), desc("v", v), desc("mask", mask),
                                                    desc("out", out)])])
    src = be.kernel_source(
        "attention", HEADER=header, BINDINGS="\n".join([*decls, *(
            [sizes_decl(len(reads) + 1, len(rt.values)), *rt.declarations()] if runtime_sizes else [])]),
        SQ_DECL="" if lift_q else f"const SQ: u32 = {seq_q}u;",
        SQL_DECL="// SQ, SQL, QBLOCKS, GROUPS: lets at the start of main (runtime sizes)" if lift_q else
        f"const SQL: u32 = {seq_q - 1}u;  // the last query row (rows past it are clamped to it, then masked)",
        SKV_DECL="" if runtime_sizes else f"const SKV: u32 = {seq_kv}u;\nconst SKL: u32 = {max(seq_kv - 1, 0)}u;",
        PROLOGUE=f"{rt.prologue()}\n    let SKV = {skv}u; let SKL = {skl}u;" + (
            f"\n    let SQ = {sq}u; let SQL = {sql}u; let QBLOCKS = (SQ + BQ - 1u) / BQ;"
            f" let GROUPS = {nb}u * HQ * QBLOCKS;" if lift_q else "") if runtime_sizes else "",
        QBLOCKS_DECL="" if lift_q else f"const QBLOCKS: u32 = {qblocks}u;",
        GROUPS_DECL="" if lift_q else f"const GROUPS: u32 = {groups}u;",
        HQ=hq, REP=hq // hkv, D=d, D4=d4, RS=rs, GX=gx, BQ=bq,
        BQP=gy + 1 if vec_ps else bq | 1, BK=bk,
        WG=gy * gx, SCALE=float_literal(scale),
        QS_SIZE=bq * rs, KV_SIZE=bk * rs, RED_SIZE=bq * gx,
        PS_DECL=f"var<workgroup> ps: array<vec4<f32>, {bk * (gy + 1)}>;" if vec_ps else
        f"var<workgroup> ps: array<f32, {bk * (bq | 1)}>;",
        LOAD_Q=_row_io(qn, qvec, lq.strides[3], types[q.handle]),
        LOAD_K=_row_io(kn, kvec, lk.strides[3], types[k.handle]),
        LOAD_V=_row_io(vn, vvec, lv.strides[3], types[v.handle]), STORE_O=_store("o", out_vec, lo.strides[3], ot),
        BASES="\n".join(bases),
        Q_ROW=lin("qb", [("min(i, SQL)", lq.strides[2])]), K_ROW=lin("kb", [("min(j0 + j, SKL)", lk.strides[2])]),
        V_ROW=lin("vb", [("min(j0 + j, SKL)", lv.strides[2])]), KEND=kend,
        **_body(gx, rq, rk, nc, d4, causal, off, lo.strides[2],
                (mn, lm.strides[2], lm.strides[3]) if lm is not None else None, vec_ps),
    )
    if runtime_sizes:
        buffers[len(reads) + 1] = sizes_buffer(be, rt.values)
    label = "attention"
    pipe = be.pipeline(label, src)
    return [be.dispatch(pipe, buffers, grid_1d(groups), label)]
