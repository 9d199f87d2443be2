"""gemm and record_matmul on every backend, against a float64 numpy oracle (fresh random inputs every run)."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.backends.base import View
from ember.core.expr import call, const, eval_numpy, inp

from .helpers import download, poisoned, rel_err, upload

TOL = 1e-4
F32 = np.dtype(np.float32)
TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]


def stored(rng: np.random.Generator, rows: int, cols: int, ld: int) -> np.ndarray:
    """A rows x ld row-major buffer whose padding columns hold NaN (a kernel must never read them)."""
    buf = np.full((rows, ld), np.nan, np.float32)
    buf[:, :cols] = rng.standard_normal((rows, cols))
    return buf


def run_gemm(be: ember.ComputeBackend, rng: np.random.Generator, ta: bool, tb: bool, m: int, n: int, k: int, *,
             alpha: float = 1.0, beta: float = 0.0, pad_a: int = 0, pad_b: int = 0, pad_c: int = 0) -> None:
    a_rows, a_cols = (k, m) if ta else (m, k)
    b_rows, b_cols = (n, k) if tb else (k, n)
    lda, ldb, ldc = a_cols + pad_a, b_cols + pad_b, n + pad_c
    a = stored(rng, a_rows, a_cols, lda)
    b = stored(rng, b_rows, b_cols, ldb)
    c0 = rng.standard_normal((m, ldc)).astype(np.float32)  # outside the window: must stay as it is
    if beta == 0.0:
        c0[:, :n] = np.nan  # beta = 0 ignores the old contents, NaN included
    ha, hb, hc = upload(be, a), upload(be, b), upload(be, c0)
    try:
        be.gemm(ta, tb, m, n, k, alpha, ha, lda, hb, ldb, beta, hc, ldc)
        got = download(be, hc, (m, ldc))
    finally:
        for h in (ha, hb, hc):
            be.free(h)
    a64 = a[:, :a_cols].astype(np.float64)
    b64 = b[:, :b_cols].astype(np.float64)
    opa, opb = (a64.T if ta else a64), (b64.T if tb else b64)
    ref = alpha * (opa @ opb)
    # Rounding error is bounded relative to the sum of the terms' magnitudes, not to the result: a 1 x 1 output
    # that cancels to near zero would otherwise fail on fresh random inputs. For larger outputs the two agree.
    scale = abs(alpha) * (np.abs(opa) @ np.abs(opb))
    if beta != 0.0:
        ref += beta * c0[:, :n]
        scale += abs(beta) * np.abs(c0[:, :n])
    err = float(np.abs(got[:, :n] - ref).max() / scale.max()) if m * n else 0.0
    assert np.isfinite(got[:, :n]).all() and err <= TOL, (m, n, k, ta, tb, err)
    np.testing.assert_array_equal(got[:, n:], c0[:, n:])  # padding columns untouched


@pytest.mark.parametrize("ta,tb", TRANSPOSES)
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (3, 3, 3), (17, 17, 17), (129, 129, 129), (1, 129, 17),
                                   (129, 1, 3), (3, 17, 129), (17, 3, 5), (8, 12, 16)])
def test_gemm_sizes(be: ember.ComputeBackend, rng: np.random.Generator, ta: bool, tb: bool, m: int, n: int,
                    k: int) -> None:
    run_gemm(be, rng, ta, tb, m, n, k)


@pytest.mark.parametrize("ta,tb", TRANSPOSES)
@pytest.mark.parametrize("m,n,k", [(300, 520, 40), (2049, 2047, 13), (513, 1031, 24)])
def test_gemm_many_workgroups(be: ember.ComputeBackend, rng: np.random.Generator, ta: bool, tb: bool, m: int,
                              n: int, k: int) -> None:
    run_gemm(be, rng, ta, tb, m, n, k)


@pytest.mark.parametrize("m,n,k", [(5, 7, 4096), (33, 65, 4096), (64, 64, 1000)])
def test_gemm_long_k(be: ember.ComputeBackend, rng: np.random.Generator, m: int, n: int, k: int) -> None:
    run_gemm(be, rng, False, True, m, n, k)
    run_gemm(be, rng, True, False, m, n, k)


@pytest.mark.parametrize("ta,tb", TRANSPOSES)
@pytest.mark.parametrize("pads", [(1, 2, 3), (4, 4, 4), (3, 0, 8), (0, 5, 1)])
def test_gemm_leading_dims(be: ember.ComputeBackend, rng: np.random.Generator, ta: bool, tb: bool,
                           pads: tuple[int, int, int]) -> None:
    # lda/ldb/ldc above the minimum, aligned to 4 or not (vec4 loads with masking vs scalar loads).
    run_gemm(be, rng, ta, tb, 37, 70, 45, pad_a=pads[0], pad_b=pads[1], pad_c=pads[2], beta=0.5)
    run_gemm(be, rng, ta, tb, 20, 36, 12, pad_a=pads[0], pad_b=pads[1], pad_c=pads[2])


@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (0.5, 0.0), (-1.5, 2.0), (1.0, 1.0), (0.0, 1.0), (2.0, -1.0)])
def test_gemm_alpha_beta(be: ember.ComputeBackend, rng: np.random.Generator, alpha: float, beta: float) -> None:
    run_gemm(be, rng, False, False, 33, 41, 19, alpha=alpha, beta=beta, pad_c=3)
    run_gemm(be, rng, True, True, 130, 66, 70, alpha=alpha, beta=beta)


@pytest.mark.parametrize("m,n", [(1, 9), (7, 1), (1, 1)])
def test_gemm_beta_c_single_row_or_column(be: ember.ComputeBackend, rng: np.random.Generator, m: int, n: int) -> None:
    """beta * C with a size-1 dim: C's view of out is out itself whatever the size-1 dim's stride says."""
    run_gemm(be, rng, False, False, m, n, 5, beta=0.5, pad_c=2)
    run_gemm(be, rng, True, True, m, n, 130, alpha=2.0, beta=-1.0)


def test_gemm_tile_configs(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Every generated tile shape, forced: without split K over an even count of K tiles and with it over an odd
    one (the unrolled K loop's tail), edges in M, N and K. The four layouts rotate over the tiles, so each layout
    meets several tiles and both split arms (every tile in every combination took ~13 minutes on lavapipe)."""
    be = wgpu_be  # a wgpu-only check: runs on wgpu, never skipped
    from ember.backends.wgpu import autotune
    from ember.backends.wgpu.shader import tiles as shader_tiles

    # The huge tile's code shape (8 x 16 per thread, warp layout, unrolled K loop) at half its workgroup memory, so
    # adapters with 32 KiB of it (lavapipe) run that generator path too.
    half_huge = shader_tiles.Tile(64, 128, 16, 8, 16, warp=True, unroll2=True)
    tiles = [*shader_tiles.TILES.values(), shader_tiles.LARGE_16K, autotune.WIDE, autotune.TALL, half_huge]
    ran = 0
    for tile in tiles:
        if not autotune.tile_legal(be, tile):
            assert tile in (shader_tiles.TILES["huge"], shader_tiles.TILES["large"]), f"{tile} should fit any adapter"
            continue
        for splits, (ta, tb), (m, n, k) in (
                (1, TRANSPOSES[ran % 4], (tile.bm + 3, tile.bn * 2 + 1, tile.bk * 5 + 1)),
                (3, TRANSPOSES[(ran + 1) % 4], (tile.bm - 5, tile.bn + 7, tile.bk * 7 - 2))):
            planned: list[int] = []
            monkeypatch.setattr(shader_tiles, "plan_gemm", lambda be, m, n, k, z, t=tile, s=splits, seen=planned:
                                seen.append(1) or (t, shader_tiles.split_count(k, t, s)))
            run_gemm(be, rng, ta, tb, m, n, k, pad_a=ta, pad_b=4, beta=0.5)
            monkeypatch.undo()
            assert planned, f"{tile} was never planned: the forced plan_gemm is not the one the GEMM asks"
        ran += 1
    assert ran >= len(tiles) - 2


def test_gemm_split_k(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """Few output tiles and a long K: the planner splits K (partial sums + reduce with the epilogue)."""
    if be.name == "wgpu":
        from ember.backends.wgpu.shader import tiles as shader_tiles

        assert shader_tiles.plan_gemm(be, 40, 50, 3000, 1)[1] > 1
    run_gemm(be, rng, False, False, 40, 50, 3000, alpha=0.5, beta=2.0, pad_c=3)
    run_gemm(be, rng, True, True, 64, 64, 1024)


# ---- record_matmul: batches, broadcasts, bias, activation, odd strides ---------------------------------------------
def matmul_case(be: ember.ComputeBackend, a: np.ndarray, a_view, b: np.ndarray, b_view, out_shape, *,
                bias: np.ndarray | None = None, bias_view=None, alpha: float = 1.0, beta: float = 1.0, act=None,
                out_strides=None) -> tuple[np.ndarray, np.ndarray]:
    """Upload a, b (and bias) as given, run record_matmul with the views the callables build, return got, ref."""
    ha, hb = upload(be, a), upload(be, b)
    hbias = upload(be, bias) if bias is not None else None
    nb, m, n = out_shape
    if out_strides is None:
        out_strides = View.contiguous(0, F32, out_shape).strides
    span = sum((d - 1) * s for d, s in zip(out_shape, out_strides, strict=True)) + 1
    ho = poisoned(be, span)
    try:
        av, bv = a_view(ha), b_view(hb)
        ov = View(ho, F32, out_shape, out_strides)
        biasv = bias_view(hbias) if bias is not None else None
        be.execute(be.record_matmul(av, bv, ov, alpha=alpha, bias=biasv, beta=beta, act=act))
        raw = download(be, ho, span)
    finally:
        for h in (ha, hb, hbias, ho):
            if h is not None:
                be.free(h)
    got = np.lib.stride_tricks.as_strided(raw, out_shape, [s * 4 for s in out_strides]).copy()
    ref = alpha * np.matmul(_np_view(a, av), _np_view(b, bv))
    if bias is not None:
        ref = ref + beta * _np_view(bias, biasv.broadcast_to(out_shape) if biasv.shape != out_shape else biasv)
    if act is not None:
        ref = eval_numpy(act, [ref], np.float64)
    # the rest of the output buffer (outside the window) keeps its NaN poison
    mask = np.ones(span, bool)
    idx = np.lib.stride_tricks.as_strided(np.arange(span), out_shape, [s * 8 for s in out_strides])
    mask[idx.ravel()] = False
    assert np.isnan(raw[mask]).all(), "an element outside the output window was written"
    return got, ref


def _np_view(arr: np.ndarray, v: View) -> np.ndarray:
    flat = np.ascontiguousarray(arr, np.float32).ravel().astype(np.float64)
    return np.lib.stride_tricks.as_strided(flat[v.offset:], v.shape, [s * 8 for s in v.strides], writeable=False)


@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
def test_matmul_batched_broadcast(be: ember.ComputeBackend, rng: np.random.Generator, layout: str) -> None:
    nb, m, n, k = 3, 19, 21, 10
    a = rng.standard_normal((k, m) if layout[0] == "t" else (m, k)).astype(np.float32)  # shared over the batch
    b = rng.standard_normal((nb, n, k) if layout[1] == "t" else (nb, k, n)).astype(np.float32)
    a_strides = (0, 1, m) if layout[0] == "t" else (0, k, 1)
    b_strides = (n * k, 1, k) if layout[1] == "t" else (k * n, n, 1)
    bias = rng.standard_normal(n).astype(np.float32)
    got, ref = matmul_case(be, a, lambda h: View(h, F32, (nb, m, k), a_strides), b,
                           lambda h: View(h, F32, (nb, k, n), b_strides), (nb, m, n), bias=bias,
                           bias_view=lambda h: View.contiguous(h, F32, (n,)), alpha=0.75, beta=1.0,
                           act=call("relu", inp(0)))
    assert rel_err(got, ref) <= TOL


@pytest.mark.parametrize("act", [None, call("relu", inp(0)), call("mul", inp(0), call("sigmoid", inp(0))),
                                 call("gelu", inp(0)), call("min", call("max", inp(0), const(-0.5)), const(0.5))])
def test_matmul_bias_act(be: ember.ComputeBackend, rng: np.random.Generator, act) -> None:
    nb, m, n, k = 2, 33, 20, 17
    a = rng.standard_normal((nb, m, k)).astype(np.float32)
    b = rng.standard_normal((nb, k, n)).astype(np.float32)
    bias = rng.standard_normal((m, 1)).astype(np.float32)  # per-row bias, broadcast over columns and batch
    got, ref = matmul_case(be, a, lambda h: View.contiguous(h, F32, (nb, m, k)), b,
                           lambda h: View.contiguous(h, F32, (nb, k, n)), (nb, m, n), bias=bias,
                           bias_view=lambda h: View(h, F32, (nb, m, n), (0, 1, 0)), beta=-2.0, act=act)
    assert rel_err(got, ref) <= TOL


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("m", [1, 37])
def test_matmul_residual(be: ember.ComputeBackend, rng: np.random.Generator, with_bias: bool, m: int) -> None:
    """out = gelu(a @ b + beta * bias + residual): a Linear with a bias, then a residual Add, as one step."""
    assert be.matmul_residual
    nb, n, k = 2, 24, 19
    a = rng.standard_normal((nb, m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((nb, m, n)).astype(np.float32)
    ha, hb, hbias, hr = upload(be, a), upload(be, b), upload(be, bias), upload(be, res)
    ho = poisoned(be, nb * m * n)
    try:
        bv = View(hb, F32, (nb, k, n), (0, n, 1))
        biasv = View(hbias, F32, (nb, m, n), (0, 0, 1)) if with_bias else None
        be.execute(be.record_matmul(View.contiguous(ha, F32, a.shape), bv, View.contiguous(ho, F32, (nb, m, n)),
                                    bias=biasv, beta=0.5, act=call("gelu", inp(0)),
                                    residual=View.contiguous(hr, F32, res.shape)))
        got = download(be, ho, (nb, m, n))
    finally:
        for h in (ha, hb, hbias, hr, ho):
            be.free(h)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64)) + res + (0.5 * bias if with_bias else 0.0)
    assert rel_err(got, eval_numpy(call("gelu", inp(0)), [ref], np.float64)) <= TOL


def test_matmul_strided_out_and_odd_strides(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """Operands with no unit-stride inner dim (generic kernel) and a strided output window."""
    nb, m, n, k = 2, 13, 11, 9
    a = rng.standard_normal(nb * m * k * 6).astype(np.float32)
    b = rng.standard_normal(nb * k * n * 4).astype(np.float32)
    got, ref = matmul_case(be, a, lambda h: View(h, F32, (nb, m, k), (m * k * 6, 2, 2 * m + 3), 5), b,
                           lambda h: View(h, F32, (nb, k, n), (k * n * 4, 3 * n, 3), 1), (nb, m, n),
                           out_strides=(m * (n + 5) + 2, n + 5, 1))
    assert rel_err(got, ref) <= TOL


def test_matmul_negative_strides(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    m, n, k = 7, 6, 5
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    # A with its rows flipped, B with its columns flipped.
    got, ref = matmul_case(be, a, lambda h: View(h, F32, (1, m, k), (0, -k, 1), (m - 1) * k), b,
                           lambda h: View(h, F32, (1, k, n), (0, n, -1), n - 1), (1, m, n))
    assert rel_err(got, ref) <= TOL


def test_matmul_bias_is_out(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """bias given as the very View of out (gemm's beta * C): read through the output binding."""
    nb, m, n, k, ldc = 2, 20, 30, 8, 33
    a = rng.standard_normal((nb, m, k)).astype(np.float32)
    b = rng.standard_normal((nb, k, n)).astype(np.float32)
    c = rng.standard_normal((nb, m, ldc)).astype(np.float32)
    ha, hb, hc = upload(be, a), upload(be, b), upload(be, c)
    try:
        cv = View(hc, F32, (nb, m, n), (m * ldc, ldc, 1))
        be.execute(be.record_matmul(View.contiguous(ha, F32, a.shape), View.contiguous(hb, F32, b.shape), cv,
                                    alpha=1.5, bias=cv, beta=0.25, act=call("tanh", inp(0))))
        got = download(be, hc, (nb, m, ldc))
    finally:
        for h in (ha, hb, hc):
            be.free(h)
    ref = np.tanh(1.5 * (a.astype(np.float64) @ b) + 0.25 * c[:, :, :n])
    assert rel_err(got[:, :, :n], ref) <= TOL
    np.testing.assert_array_equal(got[:, :, n:], c[:, :, n:])


def test_matmul_one_arena(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """a, b, bias and out in one allocation at disjoint offsets (as an arena planner would place them)."""
    m, n, k = 21, 18, 14
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    oa, ob, obias, oo = 4, 4 + a.size + 3, 8 + a.size + b.size, 16 + a.size + b.size + n
    arena = np.full(oo + m * n + 4, np.nan, np.float32)
    arena[oa:oa + a.size], arena[ob:ob + b.size], arena[obias:obias + n] = a.ravel(), b.ravel(), bias
    h = upload(be, arena)
    try:
        be.execute(be.record_matmul(View(h, F32, (1, m, k), (0, k, 1), oa), View(h, F32, (1, k, n), (0, n, 1), ob),
                                    View(h, F32, (1, m, n), (0, n, 1), oo),
                                    bias=View(h, F32, (n,), (1,), obias), beta=1.0))
        got = download(be, h, arena.size)
    finally:
        be.free(h)
    ref = a.astype(np.float64) @ b + bias
    assert rel_err(got[oo:oo + m * n].reshape(m, n), ref) <= TOL
    np.testing.assert_array_equal(got[:oo], arena[:oo])


def test_matmul_large_batch(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """More batches than one grid dimension holds (65,535)."""
    nb, m, n, k = 70001, 2, 3, 2
    a = rng.standard_normal((nb, m, k)).astype(np.float32)
    b = rng.standard_normal((nb, k, n)).astype(np.float32)
    got, ref = matmul_case(be, a, lambda h: View.contiguous(h, F32, a.shape), b,
                           lambda h: View.contiguous(h, F32, b.shape), (nb, m, n))
    assert rel_err(got, ref) <= TOL


def test_matmul_rejects_other_dtypes(wgpu_be: ember.ComputeBackend) -> None:
    be = wgpu_be  # a wgpu-only check: runs on wgpu, never skipped
    h = be.alloc(64)
    try:
        v = View(h, np.dtype(np.int32), (1, 2, 2), (0, 2, 1))
        with pytest.raises(NotImplementedError, match="int32"):
            be.record_matmul(v, v, View.contiguous(h, F32, (1, 2, 2)))
    finally:
        be.free(h)


def test_matmul_rejects_view_past_allocation(wgpu_be: ember.ComputeBackend) -> None:
    be = wgpu_be  # a wgpu-only check: runs on wgpu, never skipped
    h, ho = be.alloc(4 * 16), be.alloc(4 * 16)
    try:
        with pytest.raises(ValueError, match="^a:"):
            be.record_matmul(View.contiguous(h, F32, (1, 4, 5)), View.contiguous(h, F32, (1, 5, 1)),
                             View.contiguous(ho, F32, (1, 4, 1)))
    finally:
        be.free(h)
        be.free(ho)


def test_checked_shaders_agree(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same kernels built as checked (naga bounds checks) shader modules give the same answers."""
    assert "wgpu" in ember.available_backends(), "the test suite needs a wgpu adapter (lavapipe on CPU machines)"
    monkeypatch.setenv("EMBER_CHECKED_SHADERS", "1")
    checked = ember.backend("wgpu")
    assert checked.checked
    run_gemm(checked, rng, False, True, 70, 129, 33, beta=0.5, pad_a=1)
    run_gemm(checked, rng, True, False, 64, 64, 16, pad_b=4)


# ---- operands above the adapter's max storage-buffer binding size -------------------------------------------------
def limit_bindings(be: ember.ComputeBackend, monkeypatch: pytest.MonkeyPatch, limit: int) -> list[str]:
    """On wgpu: lower the max binding size to `limit` bytes (as if the adapter had that limit) and check every
    dispatch's bindings against it and the offset alignment; returns the labels of the dispatches recorded."""
    labels: list[str] = []
    if be.name != "wgpu":
        return labels
    be.free(be.alloc(4))  # the device exists (limits read)
    align = int(be.limits["min-storage-buffer-offset-alignment"])
    monkeypatch.setattr(be, "max_binding", limit)
    real = be.dispatch

    def dispatch(pipeline, buffers, grid, label=""):
        for b in (buffers.values() if isinstance(buffers, dict) else buffers):
            if isinstance(b, tuple):
                _, offset, size = b
                assert offset % align == 0 and size % 4 == 0 and 0 < size <= limit, (label, offset, size)
            else:
                assert (be.buffer(b) if isinstance(b, int) else b).size <= limit, label
        labels.append(label)
        return real(pipeline, buffers, grid, label)

    monkeypatch.setattr(be, "dispatch", dispatch)
    return labels


def kernels(labels: list[str]) -> int:
    return sum(not lab.endswith("splitk_reduce") for lab in labels)


@pytest.mark.parametrize("ta,tb,m,n,k,beta,pads,parts", [
    (False, True, 3, 700, 600, 0.0, (0, 0, 0), 8),  # a fully connected layer (Gemm transB=1): B split by columns
    (False, True, 2, 701, 301, 0.5, (1, 3, 2), 4),  # ... unaligned leading dims and row starts
    (False, False, 5, 700, 600, 0.5, (0, 0, 3), 8),  # B row-major: split along K, partial sums through out
    (True, False, 700, 9, 600, 1.0, (2, 1, 0), 8),  # A transposed: split along K
    (False, False, 700, 600, 8, -1.0, (0, 0, 4), 8),  # C (read and written) too big: split by rows
])
def test_gemm_above_binding_limit(be: ember.ComputeBackend, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
                                  ta: bool, tb: bool, m: int, n: int, k: int, beta: float, pads: tuple[int, int, int],
                                  parts: int) -> None:
    """A buffer bigger than max-storage-buffer-binding-size (lowered to 256 KiB here; VGG19's 411 MB weight
    against lavapipe's 128 MiB for real): each dispatch binds an aligned sub-range of at most that much."""
    labels = limit_bindings(be, monkeypatch, 256 * 1024)
    run_gemm(be, rng, ta, tb, m, n, k, alpha=0.75, beta=beta, pad_a=pads[0], pad_b=pads[1], pad_c=pads[2])
    if be.name == "wgpu":
        assert kernels(labels) == parts, labels


@pytest.mark.parametrize("layout", ["nn", "nt", "reversed"])
def test_matmul_above_binding_limit(be: ember.ComputeBackend, rng: np.random.Generator,
                                    monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """Batched, with bias and an activation that must see the whole K sum (relu of partial sums would differ);
    B at an odd offset in its buffer; negative strides (the strided kernel) split too."""
    nb, m, n, k = 3, 20, 150, 140
    labels = limit_bindings(be, monkeypatch, 64 * 1024)
    b = rng.standard_normal(7 + nb * k * n).astype(np.float32)
    strides = {"nn": (k * n, n, 1), "nt": (k * n, 1, k), "reversed": (k * n, 1, -k)}[layout]
    off = 7 + (n - 1) * k if layout == "reversed" else 7
    a = rng.standard_normal((nb, m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    got, ref = matmul_case(be, a, lambda h: View.contiguous(h, F32, a.shape), b,
                           lambda h: View(h, F32, (nb, k, n), strides, off), (nb, m, n), bias=bias,
                           bias_view=lambda h: View.contiguous(h, F32, (n,)), alpha=0.5, beta=1.5,
                           act=call("relu", inp(0)))
    assert rel_err(got, ref) <= TOL
    if be.name == "wgpu":
        assert kernels(labels) > 1, labels


def test_matmul_binding_limit_unsplittable(wgpu_be: ember.ComputeBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Operands of one buffer share its binding: a and b 16 KB apart under a 1 KiB limit cannot be split apart,
    and that is reported, not mis-bound."""
    be = wgpu_be  # a wgpu-only check: runs on wgpu, never skipped
    limit_bindings(be, monkeypatch, 1024)
    h, ho = be.alloc(4 * 4096), be.alloc(16)
    try:
        with pytest.raises(NotImplementedError, match="max-storage-buffer-binding-size"):
            be.record_matmul(View.contiguous(h, F32, (1, 1, 1)), View.contiguous(h, F32, (1, 1, 1), 4000),
                             View.contiguous(ho, F32, (1, 1, 1)))
    finally:
        be.free(h)
        be.free(ho)


# ---- the error contract ----------------------------------------------------------------------------------------
def test_gemm_errors(be: ember.ComputeBackend) -> None:
    ha, hb, hc = be.alloc(4 * 12), be.alloc(4 * 12), be.alloc(4 * 9)
    args = dict(trans_a=False, trans_b=False, m=3, n=3, k=4, alpha=1.0, a=ha, lda=4, b=hb, ldb=3, beta=0.0, c=hc,
                ldc=3)
    try:
        be.gemm(**args)  # fits exactly
        for name, value, match in [("m", 0, "^m must"), ("n", -1, "^n must"), ("k", 0, "^k must"),
                                   ("m", 2.0, "^m must be an int"), ("lda", 3, "^lda"), ("ldb", 2, "^ldb"),
                                   ("ldc", 2, "^ldc"), ("m", 4, "^a:"), ("ldb", 4, "^b:"), ("ldc", 4, "^c:"),
                                   ("alpha", float("nan"), "alpha"), ("beta", float("inf"), "beta"),
                                   ("a", 10_000, "^a: handle"), ("c", "x", "^c: a handle")]:
            with pytest.raises(ValueError, match=match):
                be.gemm(**{**args, name: value})
        with pytest.raises(ValueError, match="^a:"):  # trans_a: A is k x m = 4 x 3 with lda 3 -> fits; lda 5 not
            be.gemm(**{**args, "trans_a": True, "lda": 5})
        be.free(hb)
        with pytest.raises(ValueError, match="^b: handle .* is freed"):
            be.gemm(**args)
        hb = be.alloc(4 * 12)
    finally:
        for h in (ha, hb, hc):
            be.free(h)


# ---- the matrix-vector kernel (M <= 4: decode steps) ----------------------------------------------------------------
@pytest.mark.parametrize("groups", [0, 512])
@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("layout", ["rows", "cols"])
@pytest.mark.parametrize("n, k", [(1, 1), (37, 300), (130, 2049), (132, 2049), (64, 300), (40, 2048)])
def test_wgpu_gemv(wgpu_be: ember.ComputeBackend, rng: np.random.Generator, m: int, layout: str, n: int,
                   k: int, groups: int) -> None:
    """B row-major (K, N) or transposed (a tied embedding as lm_head), batch 2 with a shared B, bias, residual and
    an activation; ragged N and K (the tail loop, the last workgroup's idle columns); K whole (gemv_groups=0) and
    split into partial sums (few columns), the last split a ragged one; B read in quads of columns where N is a
    multiple of 4 (row-major) or of k where K is (transposed), M <= 2."""
    be, nb = wgpu_be, 2
    a = rng.standard_normal((nb, m, k)).astype(np.float32)
    b = rng.standard_normal((k, n) if layout == "rows" else (n, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((nb, m, n)).astype(np.float32)
    ha, hb, hbias, hr = upload(be, a), upload(be, b), upload(be, bias), upload(be, res)
    ho = poisoned(be, nb * m * n + 7)
    try:
        bv = View(hb, F32, (nb, k, n), (0, n, 1) if layout == "rows" else (0, 1, k))
        with ember.settings.override(gemv_groups=groups):
            steps = be.record_matmul(View.contiguous(ha, F32, a.shape), bv, View.contiguous(ho, F32, (nb, m, n)),
                                     bias=View(hbias, F32, (nb, m, n), (0, 0, 1)), alpha=0.5,
                                     act=call("relu", inp(0)), residual=View.contiguous(hr, F32, res.shape))
        kernel = f"matmul_gemv.{layout if min(n, k) > 1 else 'rows'}"
        kernel += "4" if m <= 2 and min(n, k) > 1 and (n if layout == "rows" else k) % 4 == 0 else ""
        labels = [s.label for s in steps]
        if groups == 0 or k == 1:
            assert labels == [kernel]
        else:  # 18 column workgroups at n = 130 split K = 2049 (ragged: 2049 is no multiple of a split)
            assert len(labels) == 2 or k < 2048, labels
            if len(labels) == 2:
                assert labels[0].startswith(f"{kernel}:split") and labels[1] == "matmul_gemv:splitk_reduce"
        be.execute(steps)
        raw = download(be, ho, nb * m * n + 7)
    finally:
        for h in (ha, hb, hbias, hr, ho):
            be.free(h)
    wb = b.astype(np.float64) if layout == "rows" else b.astype(np.float64).T
    ref = np.maximum(0.5 * np.matmul(a.astype(np.float64), wb) + bias + res, 0.0)
    assert rel_err(raw[:nb * m * n].reshape(nb, m, n), ref) <= TOL
    assert np.isnan(raw[nb * m * n:]).all()


def test_wgpu_gemv_setting_off_takes_the_tiled_kernel(wgpu_be: ember.ComputeBackend) -> None:
    h = wgpu_be.alloc(4 * 64)
    try:
        with ember.settings.override(gemv=False):
            steps = wgpu_be.record_matmul(View.contiguous(h, F32, (1, 1, 8)), View.contiguous(h, F32, (1, 8, 4), 8),
                                          View.contiguous(h, F32, (1, 1, 4), 48))
        assert all(not s.label.startswith("matmul_gemv") for s in steps)
    finally:
        wgpu_be.free(h)
