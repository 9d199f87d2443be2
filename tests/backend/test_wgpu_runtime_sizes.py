"""wgpu's kernels with their sizes in a uniform buffer (`runtime_sizes=True`, what plans made from a template
record): elementwise, gather, attention (key and query lengths), the GEMM (M, Z and the strides along them) and the
norms (the row count) give the same results as the kernels with sizes in the source, over strided, broadcast,
offset and index-computed (`load`) operands, and one pipeline serves every size of the same structure."""

from __future__ import annotations

import math

import numpy as np
import pytest
import wgpu

from ember.backends.base import View
from ember.backends.wgpu.shader import tiles
from ember.core.expr import call, coord, inp, load

from .helpers import download, poisoned, rel_err, upload

F32 = np.dtype(np.float32)


@pytest.fixture
def gpu(wgpu_be):
    return wgpu_be


def _run(be, expr, views, arrays, out_shape, runtime: bool) -> np.ndarray:
    handles = [upload(be, a) for a in arrays]
    ins = [View(h, v.dtype, v.shape, v.strides, v.offset) for h, v in zip(handles, views, strict=True)]
    n = int(np.prod(out_shape))
    out = poisoned(be, n)
    be.execute(be.record_elementwise(expr, ins, View.contiguous(out, np.float32, out_shape), runtime_sizes=runtime))
    got = download(be, out, out_shape)
    for h in (*handles, out):
        be.free(h)
    return got


@pytest.mark.parametrize("length", [5, 17, 130])
def test_runtime_sizes_match_literal_sizes(gpu, length: int) -> None:
    rng = np.random.default_rng(length)
    f32 = np.dtype(np.float32)
    a = rng.standard_normal((3, length, 8)).astype(np.float32)
    b = rng.standard_normal(2 + 8 * length).astype(np.float32)
    # a transposed (strided), b with an offset broadcast along dim 0, a row read at a computed index.
    va = View(0, f32, (3, 8, length), (8 * length, 1, 8), 0)
    vb = View(0, f32, (3, 8, length), (0, 1, 8), 2)
    vc = View(0, f32, (3, length, 8), (8 * length, 8, 1), 0)
    expr = call("add", call("mul", inp(0), inp(1)), load(2, coord(0), coord(2), coord(1)))
    literal = _run(gpu, expr, [va, vb, vc], [a, b, a], (3, 8, length), False)
    lifted = _run(gpu, expr, [va, vb, vc], [a, b, a], (3, 8, length), True)
    np.testing.assert_array_equal(lifted, literal)
    want = np.transpose(a, (0, 2, 1)) * b[2:].reshape(length, 8).T[None] + np.transpose(a, (0, 2, 1))
    np.testing.assert_allclose(lifted, want, rtol=1e-6, atol=1e-6)


def test_runtime_sizes_share_one_pipeline_across_sizes(gpu) -> None:
    f32 = np.dtype(np.float32)
    for length in (6, 7):  # the first compiles the kernel
        a = np.ones((4, length), np.float32)
        _run(gpu, call("relu", inp(0)), [View(0, f32, (length, 4), (1, length), 0)], [a], (length, 4), True)
    before = gpu.pipelines_created
    for length in (9, 33, 100):
        a = np.arange(4 * length, dtype=np.float32).reshape(4, length) - 50
        got = _run(gpu, call("relu", inp(0)), [View(0, f32, (length, 4), (1, length), 0)], [a], (length, 4), True)
        np.testing.assert_array_equal(got, np.maximum(a.T, 0))
    assert gpu.pipelines_created == before


@pytest.mark.parametrize("rows", [3, 40])
def test_gather_with_runtime_sizes_matches_literal_sizes(gpu, rows: int) -> None:
    rng = np.random.default_rng(rows)
    data = rng.standard_normal((2, rows, 5)).astype(np.float32)
    idx = np.array([0, rows - 1, -1, 2 % rows, -rows], np.int32)
    results = []
    for runtime in (False, True):
        hd, hi = upload(gpu, data), gpu.alloc(idx.nbytes)
        gpu.copy_htod(hi, idx)
        out = poisoned(gpu, 2 * len(idx) * 5)
        steps = gpu.record_gather(View.contiguous(hd, np.float32, data.shape), View.contiguous(hi, np.int32, idx.shape),
                                  1, View.contiguous(out, np.float32, (2, len(idx), 5)), runtime_sizes=runtime)
        gpu.execute(steps)
        results.append(download(gpu, out, (2, len(idx), 5)))
        for h in (hd, hi, out):
            gpu.free(h)
    np.testing.assert_array_equal(results[1], results[0])
    np.testing.assert_array_equal(results[1], data[:, idx % rows])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("keys", [6, 19])
def test_attention_with_runtime_sizes_matches_literal_sizes(gpu, keys: int, causal: bool) -> None:
    # A decode-shaped call: one query row, K read through a transposed layout, an additive mask broadcast over heads.
    rng = np.random.default_rng(keys)
    f32 = np.dtype(np.float32)
    b, h, sq, d = 1, 4, 2, 8
    q = rng.standard_normal((b, h, sq, d)).astype(np.float32)
    k = rng.standard_normal((b, h, d, keys)).astype(np.float32)  # stored (B, H, D, S): viewed as (B, H, S, D)
    v = rng.standard_normal((b, h, keys, d)).astype(np.float32)
    mask = np.where(rng.random((b, 1, sq, keys)) < 0.2, -1e9, 0.0).astype(np.float32)
    results = []
    for runtime in (False, True):
        hq, hk, hv, hm = (upload(gpu, a) for a in (q, k, v, mask))
        out = poisoned(gpu, q.size)
        kview = View(hk, f32, (b, h, keys, d), (h * d * keys, d * keys, 1, keys), 0)
        mview = View(hm, f32, (b, h, sq, keys), (sq * keys, 0, keys, 1), 0)
        steps = gpu.record_attention_views(View.contiguous(hq, f32, q.shape), kview, View.contiguous(hv, f32, v.shape),
                                           mview, View.contiguous(out, f32, q.shape), 0.35, causal,
                                           runtime_sizes=runtime)
        gpu.execute(steps)
        results.append(download(gpu, out, q.shape))
        for x in (hq, hk, hv, hm, out):
            gpu.free(x)
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6, atol=1e-6)
    s = np.einsum("bhqd,bhdk->bhqk", q.astype(np.float64), k) * 0.35 + mask
    if causal:
        s = np.where(np.arange(keys)[None, :] <= np.arange(sq)[:, None] + keys - sq, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)
    np.testing.assert_allclose(results[1], want, rtol=1e-4, atol=1e-5)


# ---- the GEMM: M (and Z, and the strides along them) at run time ------------------------------------------------
def _matmul(be, m: int, layout: str, runtime: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(result, float64 reference) of one matmul whose M is `m`, in one of three layouts: "linear" (a linear
    layer: a (1, M, K) activation at an offset, a weight, a bias broadcast over rows, GELU), "batched" (Z = 3,
    B read transposed, N not a multiple of 4), "a_t" (A read transposed: M is its unit-stride dim)."""
    rng = np.random.default_rng(seed)
    k, n, z = (40, 24, 1) if layout == "linear" else (12, 10, 3) if layout == "batched" else (16, 20, 1)
    a = rng.standard_normal((z, m, k)).astype(np.float32)
    b = rng.standard_normal((z, k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    if layout == "a_t":
        ha = upload(be, np.transpose(a, (0, 2, 1)))
        va = View(ha, F32, (z, m, k), (m * k, 1, m), 0)
    else:
        ha = upload(be, np.concatenate([np.zeros(8, np.float32), a.ravel()]))
        va = View(ha, F32, (z, m, k), (m * k, k, 1), 8)
    hb = upload(be, np.transpose(b, (0, 2, 1)) if layout == "batched" else b)
    vb = View(hb, F32, (z, k, n), (k * n, 1, k) if layout == "batched" else (k * n, n, 1), 0)
    hbias = upload(be, bias)
    out = poisoned(be, z * m * n)
    act = call("gelu", inp(0)) if layout == "linear" else None
    steps = be.record_matmul(va, vb, View.contiguous(out, F32, (z, m, n)), bias=View(hbias, F32, (z, m, n), (0, 0, 1)),
                             act=act, runtime_sizes=runtime)
    be.execute(steps)
    got = download(be, out, (z, m, n))
    for h in (ha, hb, hbias, out):
        be.free(h)
    want = a.astype(np.float64) @ b + bias
    if act is not None:
        want = 0.5 * want * (1 + np.vectorize(math.erf)(want / math.sqrt(2)))
    return got, want


@pytest.mark.parametrize("layout", ["linear", "batched", "a_t"])
@pytest.mark.parametrize("m", [5, 33, 130])
def test_matmul_with_runtime_sizes_matches_literal_sizes(gpu, m: int, layout: str) -> None:
    literal, want = _matmul(gpu, m, layout, False, m)
    lifted, _ = _matmul(gpu, m, layout, True, m)
    # The runtime kernel's tile is chosen without M, so it may differ from the literal one: both sum each output's
    # K products in the same order, but not the same FMA grouping, so within f32 rounding of each other.
    assert rel_err(lifted, literal) <= 1e-6
    assert rel_err(lifted, want) <= 1e-5


def test_matmul_with_runtime_sizes_is_one_pipeline_for_every_m(gpu) -> None:
    for m in (6, 7):  # the first compiles the kernel
        _matmul(gpu, m, "linear", True, m)
    before = gpu.pipelines_created
    for m in (2, 9, 64, 65, 200):  # (M = 1 is another kernel: a template plans a dim of 1 apart)
        got, want = _matmul(gpu, m, "linear", True, m)
        assert rel_err(got, want) <= 1e-5, m
    assert gpu.pipelines_created == before


def test_matmul_probe_is_one_structure_with_sizes_polynomial_in_m(gpu) -> None:
    """What a live plan fits (ember/plan/live.py): the same kernel and slots at every M, the first uniform value the
    output rows (the work the grid grows with), every value linear in M here, the grid growing with M."""
    hs = [gpu.alloc(1 << 16) for _ in range(3)]
    probes = []
    for m in (10, 11, 12, 13, 40):
        a = View(hs[0], F32, (1, m, 32), (0, 32, 1), 4)
        b = View(hs[1], F32, (1, 32, 16), (0, 16, 1), 0)
        out = View(hs[2], F32, (1, m, 16), (0, 16, 1), 16 * m)  # an offset that moves with M too
        probes.append(gpu.probe_sizes("record_matmul", (a, b, out), {}))
    for h in hs:
        gpu.free(h)
    assert all(p is not None and p[0] == probes[0][0] for p in probes)
    values = np.array([p[1][0] for p in probes], np.int64)
    assert values[:, 0].tolist() == [10, 11, 12, 13, 40]
    step = values[1] - values[0]
    assert all(np.array_equal(values[i], values[0] + i * step) for i in range(4))
    assert np.array_equal(values[4], values[0] + 30 * step)
    assert probes[4][2][0][0] >= probes[0][2][0][0]


def test_runtime_gemm_tile_does_not_depend_on_m(gpu) -> None:
    """plan_gemm would pick other tiles (and K splits) over this range of M; the runtime kernel is one."""
    k, n = 512, 256
    assert tiles.plan_runtime(gpu, n, k, 1)[1] == 1
    assert len({tiles.plan_gemm(gpu, m, n, k, 1) for m in (2, 100, 5000)}) > 1
    hs = [gpu.alloc(5000 * k * 4) for _ in range(3)]
    sources = set()
    for m in (2, 100, 5000):
        probe = gpu.probe_sizes("record_matmul", (View(hs[0], F32, (1, m, k), (0, k, 1), 0),
                                                  View(hs[1], F32, (1, k, n), (0, n, 1), 0),
                                                  View(hs[2], F32, (1, m, n), (0, n, 1), 0)), {})
        sources.add(probe[0])
    for h in hs:
        gpu.free(h)
    assert len(sources) == 1


# ---- the norms: the row count at run time -------------------------------------------------------------------------
def _norm(be, kind: str, rows: int, runtime: bool, affine: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rows)
    n = 48
    x = (rng.standard_normal((rows, n)) * 3 + 100).astype(np.float32)
    scale = rng.standard_normal(n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    hx = upload(be, np.concatenate([np.zeros(5, np.float32), x.ravel()]))  # x at an offset of 5 elements
    hs, hb = upload(be, scale), upload(be, bias)
    out = poisoned(be, rows * n + 3)
    vs, vb = (View.contiguous(h, F32, (n,)) if affine else None for h in (hs, hb))
    steps = be.record_norm(kind, View(hx, F32, (rows, n), (n, 1), 5), vs, vb, View(out, F32, (rows, n), (n, 1), 3), n,
                           1e-5, runtime_sizes=runtime)
    be.execute(steps)
    got = download(be, out, rows * n + 3)
    for h in (hx, hs, hb, out):
        be.free(h)
    assert np.isnan(got[:3]).all(), "the norm wrote before its output's offset"
    xd = x.astype(np.float64)
    if kind == "layernorm":
        y = (xd - xd.mean(1, keepdims=True)) / np.sqrt(xd.var(1, keepdims=True) + 1e-5)
    else:
        y = xd / np.sqrt((xd * xd).mean(1, keepdims=True) + 1e-5)
    return got[3:].reshape(rows, n), y * scale + bias if affine else y


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("rows", [3, 40, 300])
def test_norm_with_runtime_sizes_matches_literal_sizes(gpu, kind: str, rows: int) -> None:
    literal, want = _norm(gpu, kind, rows, False, kind == "layernorm")
    lifted, _ = _norm(gpu, kind, rows, True, kind == "layernorm")
    np.testing.assert_array_equal(lifted, literal)  # each row reduced by the same lanes in the same order
    np.testing.assert_allclose(lifted, want, rtol=1e-4, atol=1e-4)


def test_norm_with_runtime_sizes_is_one_pipeline_for_every_row_count(gpu) -> None:
    for rows in (6, 7):
        _norm(gpu, "layernorm", rows, True, True)
    before = gpu.pipelines_created
    for rows in (1, 9, 257, 1000):
        got, want = _norm(gpu, "layernorm", rows, True, True)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert gpu.pipelines_created == before


# ---- attention: the query length at run time (an encoder's sequence) --------------------------------------------
def _encoder_attention(be, seq: int, causal: bool, runtime: bool) -> tuple[np.ndarray, np.ndarray]:
    """Self-attention over `seq` tokens: q read from a (B, S, H, D) layout, a key padding mask (B, 1, 1, S)."""
    rng = np.random.default_rng(seq)
    b, h, d = 2, 3, 8
    q = rng.standard_normal((b, seq, h, d)).astype(np.float32)
    k = rng.standard_normal((b, h, seq, d)).astype(np.float32)
    v = rng.standard_normal((b, h, seq, d)).astype(np.float32)
    mask = np.where(np.arange(seq)[None, :] >= seq - np.array([[0], [1]]), -np.inf, 0.0).astype(np.float32)
    hq, hk, hv, hm = (upload(be, x) for x in (q, k, v, mask))
    out = poisoned(be, b * h * seq * d)
    steps = be.record_attention_views(View(hq, F32, (b, h, seq, d), (seq * h * d, d, h * d, 1)),
                                      View.contiguous(hk, F32, k.shape), View.contiguous(hv, F32, v.shape),
                                      View(hm, F32, (b, h, seq, seq), (seq, 0, 0, 1)),
                                      View.contiguous(out, F32, (b, h, seq, d)), 0.3, causal, runtime_sizes=runtime)
    be.execute(steps)
    got = download(be, out, (b, h, seq, d))
    for x in (hq, hk, hv, hm, out):
        be.free(x)
    s = np.einsum("bqhd,bhkd->bhqk", q.astype(np.float64), k) * 0.3 + mask[:, None, None, :]
    if causal:
        s = np.where(np.arange(seq)[None, :] <= np.arange(seq)[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return got, np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", [3, 17, 70])
def test_attention_query_length_at_run_time_matches_literal_sizes(gpu, seq: int, causal: bool) -> None:
    literal, want = _encoder_attention(gpu, seq, causal, False)
    lifted, _ = _encoder_attention(gpu, seq, causal, True)
    # The runtime kernel takes the 64-query tile at every length (the literal one a tile for its length): the
    # online softmax visits the same keys in other tiles, so the two agree within f32 rounding.
    np.testing.assert_allclose(lifted, literal, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lifted, want, rtol=1e-4, atol=1e-5)


def test_attention_query_length_at_run_time_is_one_pipeline(gpu) -> None:
    for seq in (6, 7):
        _encoder_attention(gpu, seq, True, True)
    before = gpu.pipelines_created
    for seq in (2, 9, 65, 130):
        got, want = _encoder_attention(gpu, seq, True, True)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert gpu.pipelines_created == before


def test_joined_sizes_arena_moves_two_kernels_with_one_write(gpu) -> None:
    """join_sizes_writers re-binds the moving dispatches to one uniform arena: kernels recorded at one length, then
    given another length's sizes (probed) and grids through the arena, compute what kernels recorded there do."""
    f32 = np.dtype(np.float32)
    big, small = 40, 13  # buffers sized for the larger length; recorded at the larger, moved to the smaller
    rng = np.random.default_rng(3)
    row = big + 1  # strided rows at every length: the same kernels (a contiguous view would merge its dims)
    a = rng.standard_normal((3, row)).astype(np.float32)
    ha, hb, hc = upload(gpu, a), poisoned(gpu, 3 * row), poisoned(gpu, 3 * row)

    def calls(length: int) -> list[tuple]:
        va = View(ha, f32, (3, length), (row, 1), 0)
        vb = View(hb, f32, (3, length), (row, 1), 0)
        vc = View(hc, f32, (3, length), (row, 1), 0)
        return [(call("mul", inp(0), inp(0)), [va], vb), (call("add", inp(0), inp(1)), [vb, va], vc)]

    steps, writers, ranges, rows = [], [], [], []
    for (expr, ins, out), (expr2, ins2, out2) in zip(calls(big), calls(small), strict=True):
        recorded = gpu.record_elementwise(expr, ins, out, runtime_sizes=True)
        structure, values, grids = gpu.probe_sizes("record_elementwise", (expr2, ins2, out2), {})
        assert structure == gpu.probe_sizes("record_elementwise", (expr, ins, out), {})[0]
        moved, writer = gpu.sizes_writer(recorded, grids)
        steps.append(moved)
        writers.append(writer)
        ranges.append([(len(rows) + sum(len(v) for v in values[:d]), len(rows) + sum(len(v) for v in values[:d + 1]))
                       for d in range(len(values))])
        rows += [int(x) for v in values for x in v]
    steps, write = gpu.join_sizes_writers(steps, writers, ranges)
    uniforms = {id(b) for moved in steps for st in moved for b in st.keep if b.usage & wgpu.BufferUsage.UNIFORM}
    assert len(uniforms) == 1  # every moved dispatch binds the one arena
    write(np.array(rows, np.int64))
    gpu.execute([st for moved in steps for st in moved])
    got = download(gpu, hc, (3, row))
    want = a[:, :small] * a[:, :small] + a[:, :small]
    np.testing.assert_allclose(got[:, :small], want, rtol=1e-6, atol=1e-6)
    assert np.isnan(got[:, small:]).all()  # the moved kernels cover the smaller length only
    for h in (ha, hb, hc):
        gpu.free(h)
