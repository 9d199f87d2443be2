"""Split-KV (flash-decoding) attention for one query row: kernels/attention_split.wgsl + attention_combine.wgsl.

A decode step's attention (seq_q = 1) has one row per (batch, head): the flash kernel (attention.py) gives each a
single workgroup walking every key, a dozen workgroups on a GPU with a hundred cores. Here the keys of a head are cut
into contiguous chunks, one workgroup each (grid (splits, heads, batch)), which write a partial max, sum and
unnormalised output into scratch; a second kernel merges a head's partials (the log-sum-exp rescaling) into the
output View. Masks, GQA, scale, f16 storage, strided and windowed views are those of record_attention_views.

The split count (`split_count`): as many chunks of at least EMBER_ATTENTION_SPLIT_KV keys (default 32) as the keys
fill, at most MAX_SPLITS; one chunk leaves the call to the flash kernel. Each workgroup takes
CHUNK = max(min_keys, ceil(keys / splits)) keys (`chunk_keys`), the chunks past the last key are empty. With runtime
sizes (a template's plans, moved from key count to key count without recording again) the grid cannot follow the
key count, so it is MAX_SPLITS workgroups a head at every count and the kernel computes CHUNK from the key count in
the uniform array: the chunks in use grow with the keys, the rest write an empty partial (m = -inf, l = 0), and the
recorded structure (sources, slots, grids) is the same at every key count, whatever it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import settings
from ...core.view import View
from .attention import _row_io, _Sizes, _squeeze_strides, _store, _vec4_ok, lin
from .program import WORKGROUPS_PER_DIM, grid_1d, kernel, sizes_buffer, sizes_decl
from .shader.bindings import Window, binding_windows, rebase_view
from .shader.wgsl import float_literal

if TYPE_CHECKING:
    from .backend import WgpuBackend

MAX_SPLITS = 32  # workgroups a head at most (and the runtime-sized kernel's count)
WG = 64  # threads of the split kernel: keys per tile; head_dim chunks x key groups in P.V (D4 <= 64)
COMBINE_WG = 64


def split_count(keys: int, min_keys: int, cap: int = MAX_SPLITS) -> int:
    """Chunks a decode step's `keys` are split into: floor(keys / min_keys), between 1 and `cap` (each chunk then
    has at least min_keys keys); min_keys <= 0 means never split (1)."""
    if min_keys <= 0:
        return 1
    return max(1, min(cap, keys // min_keys))


def chunk_keys(keys: int, splits: int, min_keys: int) -> int:
    """Keys a split's workgroup takes (the kernel's CHUNK): max(min_keys, ceil(keys / splits)); the last chunk in use
    may be shorter, those after it empty."""
    return max(min_keys, -(-keys // splits))


@kernel("attention_split_kv")
def record_split_kv(be: WgpuBackend, q: View, k: View, v: View, mask: View | None, out: View, scale: float,
                    causal: bool, types: dict[int, str], runtime_sizes: bool) -> list[Any] | None:
    """The two dispatches of a split-KV decode attention, or None where the flash kernel keeps the call (more than
    one query, the setting off, too few keys to split, a grid past 65,535). Views checked by the caller
    (record_attention_views); `types`: WGSL storage type per handle. Causal needs nothing: a single query sees every
    key (bottom-right alignment)."""
    batch, hq, seq_q, d = q.shape
    hkv, seq_kv = k.shape[1], k.shape[2]
    min_keys = settings.ATTENTION_SPLIT_KV.get()
    if seq_q != 1 or min_keys <= 0 or max(hq, batch) > WORKGROUPS_PER_DIM:
        return None
    wins = [binding_windows(be, [x]).get(x.handle) if x is not None else None for x in (q, k, v, mask)]
    ow = binding_windows(be, [out]).get(out.handle)
    if any(w is not None and w[1] > be.max_binding for w in (ow, *wins)):
        return None  # the flash kernel says why
    runtime_sizes = runtime_sizes and all(w is None for w in (ow, *wins))
    splits = MAX_SPLITS if runtime_sizes else split_count(seq_kv, min_keys)
    if splits < 2:
        return None

    def place(x: View, w: Window | None) -> View:
        return _squeeze_strides(x if w is None else rebase_view(x, {x.handle: w}))

    q, k, v = (place(x, w) for x, w in zip((q, k, v), wins[:3], strict=True))
    mask = place(mask, wins[3]) if mask is not None else None
    out = place(out, ow)
    d4 = -(-d // 4)
    scratch = be.scratch("attention split-KV partials", batch * hq * splits * (d4 + 1) * 16)
    rt = _Sizes(runtime_sizes)
    skv = rt(seq_kv)  # first: the value the work grows with (resize.probe_sizes)
    lq, lk, lv, lm = (rt.view(x) for x in (q, k, v, mask))
    assert lq is not None and lk is not None and lv is not None

    reads: dict[tuple[int, Window | None, bool], str] = {}

    def bind(x: View, w: Window | None, vec: bool) -> str:
        return reads.setdefault((x.handle, w, vec), f"in{len(reads)}")

    qvec, kvec, vvec = _vec4_ok(q), _vec4_ok(k), _vec4_ok(v)
    qn, kn, vn = bind(q, wins[0], qvec), bind(k, wins[1], kvec), bind(v, wins[2], vvec)
    mn = bind(mask, wins[3], False) if mask is not None else None
    decls = [f"@group(0) @binding({i}) var<storage, read> {name}: array<{f'vec4<{types[h]}>' if vec else types[h]}>;"
             for i, ((h, _, vec), name) in enumerate(reads.items())]
    nparts = len(reads)
    decls.append(f"@group(0) @binding({nparts}) var<storage, read_write> part: array<vec4<f32>>;")
    buffers: dict[int, Any] = {i: h if w is None else (h, *w) for i, (h, w, _) in enumerate(reads)}
    buffers[nparts] = scratch
    if runtime_sizes:
        decls += [sizes_decl(nparts + 1, len(rt.values)), *rt.declarations()]
        buffers[nparts + 1] = sizes_buffer(be, rt.values)
    bases = [f"    let qb = {lin(lq.offset, [('b', lq.strides[0]), ('h', lq.strides[1])])};",
             f"    let kb = {lin(lk.offset, [('b', lk.strides[0]), ('hk', lk.strides[1])])};",
             f"    let vb = {lin(lv.offset, [('b', lv.strides[0]), ('hk', lv.strides[1])])};"]
    add_mask = ""
    if lm is not None:
        bases.append(f"    let mb = {lin(lm.offset, [('b', lm.strides[0]), ('h', lm.strides[1])])};")
        add_mask = f" + f32({mn}[{lin('mb', [('j', lm.strides[3])])}])"
    header = (f"// This instance: scale {scale!r}, {splits} splits of >= {min_keys} keys, {batch} x {hq} heads "
              f"(kv heads {hkv}), head_dim {d}{', runtime sizes' if runtime_sizes else f', {seq_kv} keys'}.")
    src = be.kernel_source(
        "attention_split", HEADER=header, BINDINGS="\n".join(decls),
        SKV_DECL="// SKV: a let at the start of main (runtime sizes)" if runtime_sizes else
        f"const SKV: u32 = {seq_kv}u;  // keys",
        PROLOGUE=f"{rt.prologue()}\n    let SKV = {skv}u;" if runtime_sizes else "",
        HQ=hq, REP=hq // hkv, D=d, D4=d4, SPLITS=splits, MIN_KEYS=min_keys, WG=WG, NG=WG // d4,
        SCALE=float_literal(float(scale)),
        LOAD_Q=_row_io(qn, qvec, lq.strides[3], types[q.handle]),
        LOAD_K=_row_io(kn, kvec, lk.strides[3], types[k.handle]),
        LOAD_V=_row_io(vn, vvec, lv.strides[3], types[v.handle]),
        BASES="\n".join(bases), K_ROW=lin("kb", [("j", lk.strides[2])]),
        V_ROW=lin("vb", [("(j0 + jj)", lv.strides[2])]), ADD_MASK=add_mask)
    label = "attention.split_kv"
    steps = [be.dispatch(be.pipeline(label, src), buffers, (splits, hq, batch), label)]
    return steps + _record_combine(be, scratch, out, ow, types[out.handle], batch, hq, d, splits, seq_kv,
                                   runtime_sizes)


def _record_combine(be: WgpuBackend, scratch: Any, out: View, ow: Window | None, ot: str, batch: int, hq: int,
                    d: int, splits: int, seq_kv: int, runtime_sizes: bool) -> list[Any]:
    """The merge of each head's `splits` partials into out (already rebased to its window `ow`)."""
    d4 = -(-d // 4)
    rt = _Sizes(runtime_sizes)
    rt(seq_kv)  # unused by the kernel: the first value of every runtime-sized dispatch of the call is the key count
    lo = rt.view(out)
    assert lo is not None
    vec = _vec4_ok(out)
    decls = ["@group(0) @binding(0) var<storage, read> part: array<vec4<f32>>;",
             f"@group(0) @binding(1) var<storage, read_write> o: array<{f'vec4<{ot}>' if vec else ot}>;"]
    buffers: dict[int, Any] = {0: scratch, 1: out.handle if ow is None else (out.handle, *ow)}
    if runtime_sizes:
        decls += [sizes_decl(2, len(rt.values)), *rt.declarations()]
        buffers[2] = sizes_buffer(be, rt.values)
    total = batch * hq * d4
    grid = grid_1d(-(-total // COMBINE_WG))
    src = be.kernel_source(
        "attention_combine", HEADER=f"// This instance: {batch} x {hq} heads, head_dim {d}, {splits} splits.",
        BINDINGS="\n".join(decls), PROLOGUE=rt.prologue() if runtime_sizes else "",
        HQ=hq, D=d, D4=d4, SPLITS=splits, TOTAL=total, WG=COMBINE_WG,
        STORE_O=_store("o", vec, lo.strides[3], ot),
        OB=lin(lo.offset, [("b", lo.strides[0]), ("h", lo.strides[1])]))
    label = "attention.split_kv_combine"
    return [be.dispatch(be.pipeline(label, src), buffers, grid, label)]
