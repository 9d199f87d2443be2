"""The cpu backend's runtime sizes (backends/cpu/resizable.py: what a live plan's move hands its moving record calls)
and its compiled small-row kernels (_rows.c, native_rows.py): a call recorded with `runtime_sizes=True` and then
moved by sizes_writer to other Views gives what a fresh record at those Views gives (copies, bool chains, a gather,
attention with and without a mask, grouped heads, causal), on the compiled kernels and on numpy's; Views moved
outside their buffers raise instead of reading or writing there; the compiled attention matches numpy's over
fully masked rows, NaN and strided keys."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backends.base import View
from ember.backends.cpu import CpuBackend, native_rows
from ember.backends.cpu.attention import attention_numpy
from ember.core.expr import call, const, inp

F32 = np.dtype(np.float32)
needs_rows = pytest.mark.skipif(not native_rows.available(), reason="the compiled row kernels are not built here")


@pytest.fixture
def cpu() -> CpuBackend:
    return CpuBackend().init()


def _buffer(be: CpuBackend, a: np.ndarray) -> int:
    h = be.alloc(max(a.nbytes, 8))
    be.upload(h, a)
    return h


def _kv(h: int, dtype: np.dtype, heads: int, length: int, cap: int, d: int, offset: int = 0) -> View:
    """(1, heads, length, d) of a cache laid out for `cap` positions."""
    return View(h, dtype, (1, heads, length, d), (heads * cap * d, cap * d, d, 1), offset)


def _moved(be: CpuBackend, method: str, at_a: tuple, at_b: tuple, kwargs: dict | None = None) -> list:
    """Steps recorded with runtime sizes at the calls' arguments at_a, then moved to at_b's."""
    kwargs = kwargs or {}
    steps = getattr(be, method)(*at_a, **kwargs, runtime_sizes=True)
    structure, numbers, grids = be.probe_sizes(method, at_b, kwargs)
    assert structure == be.probe_sizes(method, at_a, kwargs)[0]
    steps, write = be.sizes_writer(steps, grids)
    write(numbers)
    return steps


def _read(be: CpuBackend, v: View) -> np.ndarray:
    return be.array(v).copy()


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_a_moved_copy_is_a_fresh_copy(cpu: CpuBackend, rng: np.random.Generator, dtype: type) -> None:
    """A KV cache's Concat part (past into the present laid out for the new length), moved from 5 to 9 positions;
    float32 takes the compiled copy where it is built, int64 numpy's."""
    dt = np.dtype(dtype)
    src = _buffer(cpu, (rng.standard_normal(4 * 16 * 8) * 100).astype(dt))
    dst = _buffer(cpu, np.full(4 * 16 * 10, -1, dt))
    expr = inp(0, "float" if dt.kind == "f" else "int")

    def args(n: int) -> tuple:
        return expr, [_kv(src, dt, 4, n, n, 8)], _kv(dst, dt, 4, n, n + 1, 8)

    steps = _moved(cpu, "record_elementwise", args(5), args(9))
    compiled = "CopyViews" in getattr(steps[0].steps[0], "__qualname__", "")
    assert compiled == (dt == F32 and native_rows.available())
    for step in steps:
        step()
    got = _read(cpu, args(9)[2])
    np.testing.assert_array_equal(got, cpu.array(args(9)[1][0]))
    assert (cpu.array(View(dst, dt, (4,), (10 * 8,), 9 * 8)) == -1).all()  # the row past the copy: untouched


def test_moved_bool_chain_and_where_match_fresh_records(cpu: CpuBackend) -> None:
    """A decode's mask chain: int64 mask -> bool, And with a constant, Where between two float constants."""
    mask = _buffer(cpu, np.array([1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1], np.int64))
    other = _buffer(cpu, np.array([True, False] * 6))
    flags, both, add = cpu.alloc(16), cpu.alloc(16), cpu.alloc(64)
    for n_a, n_b in ((5, 11), (11, 3)):
        def cast(n: int) -> tuple:
            return (call("to_bool", inp(0, "int")), [View.contiguous(mask, np.int64, (1, n))],
                    View.contiguous(flags, np.bool_, (1, n)))

        def conj(n: int) -> tuple:
            return (call("and", inp(0, "bool"), inp(1, "bool")),
                    [View.contiguous(flags, np.bool_, (1, n)), View.contiguous(other, np.bool_, (1, n))],
                    View.contiguous(both, np.bool_, (1, n)))

        def where(n: int) -> tuple:
            return (call("where", inp(0, "bool"), const(0.0), const(-np.inf)), [View.contiguous(both, np.bool_,
                                                                                                (1, n))],
                    View.contiguous(add, np.float32, (1, n)))

        for make in (cast, conj, where):
            for step in _moved(cpu, "record_elementwise", make(n_a), make(n_b)):
                step()
        got = _read(cpu, where(n_b)[2])
        m = np.array([1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1])[:n_b] != 0
        want = np.where(m & np.array([True, False] * 6)[:n_b], 0.0, -np.inf).astype(np.float32)[None]
        np.testing.assert_array_equal(got, want)


def test_a_moved_gather_matches_a_fresh_one(cpu: CpuBackend, rng: np.random.Generator) -> None:
    table = _buffer(cpu, rng.standard_normal((20, 6)).astype(np.float32))
    idx = _buffer(cpu, np.array([3, -1, 0, 19, 7, -20, 2], np.int64))
    out = cpu.alloc(7 * 6 * 4)

    def args(n: int) -> tuple:
        return (View.contiguous(table, F32, (20, 6)), View.contiguous(idx, np.int64, (1, n)), 0,
                View.contiguous(out, F32, (1, n, 6)))

    for step in _moved(cpu, "record_gather", args(2), args(7)):
        step()
    want = cpu.array(args(7)[0])[np.array([3, -1, 0, 19, 7, -20, 2])][None]
    np.testing.assert_array_equal(_read(cpu, args(7)[3]), want)


@pytest.mark.parametrize("masked,causal,heads,kv_heads,sq", [(True, False, 4, 4, 1), (False, True, 4, 2, 3),
                                                              (True, True, 6, 3, 2), (False, False, 2, 1, 1)])
def test_moved_attention_matches_a_fresh_record(cpu: CpuBackend, rng: np.random.Generator, masked: bool,
                                                causal: bool, heads: int, kv_heads: int, sq: int) -> None:
    """Attention over a growing cache (keys 6 -> 13, the cache laid out for each length), grouped heads, an
    additive mask broadcast over heads and query rows; moved steps equal a fresh record at the new length."""
    d, cap = 8, 13
    q = _buffer(cpu, rng.standard_normal(heads * sq * d).astype(np.float32))
    k = _buffer(cpu, rng.standard_normal(kv_heads * cap * d).astype(np.float32))
    v = _buffer(cpu, rng.standard_normal(kv_heads * cap * d).astype(np.float32))
    m = _buffer(cpu, np.where(rng.random(cap) < 0.3, -np.inf, 0.0).astype(np.float32))
    out_a, out_b = cpu.alloc(heads * sq * d * 4), cpu.alloc(heads * sq * d * 4)

    def args(n: int, out: int) -> tuple:
        mask = View(m, F32, (1, heads, sq, n), (0, 0, 0, 1)) if masked else None
        return (View.contiguous(q, F32, (1, heads, sq, d)), _kv(k, F32, kv_heads, n, n, d),
                _kv(v, F32, kv_heads, n, n, d), mask, View.contiguous(out, F32, (1, heads, sq, d)), 0.35, causal)

    for step in _moved(cpu, "record_attention_views", args(6, out_a), args(13, out_a)):
        step()
    cpu.execute(cpu.record_attention_views(*args(13, out_b)))
    got, want = _read(cpu, args(13, out_a)[4]), _read(cpu, args(13, out_b)[4])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.isnan(got).any()


def test_views_moved_outside_their_buffers_raise(cpu: CpuBackend, rng: np.random.Generator) -> None:
    """Numbers that reach past a buffer (a live plan's fit gone wrong) raise ValueError, on the compiled
    kernels' route (copy, attention) and on numpy's (where), before anything runs."""
    src = _buffer(cpu, rng.standard_normal(64).astype(np.float32))
    dst = cpu.alloc(64 * 4)

    def copy(n: int) -> tuple:
        return inp(0), [View.contiguous(src, F32, (1, n))], View.contiguous(dst, F32, (1, n))

    with pytest.raises(ValueError, match="reaches outside allocation"):
        _moved(cpu, "record_elementwise", copy(8), copy(65))
    square = View.contiguous(src, F32, (2, 2)), View.contiguous(dst, F32, (2, 2))
    huge = inp(0), [View(src, F32, (2, 2), (2**40, 1))], square[1]  # strides whose extent would overflow int64
    with pytest.raises(ValueError, match="reaches outside allocation"):
        _moved(cpu, "record_elementwise", (inp(0), [square[0]], square[1]), huge)
    q, kv = _buffer(cpu, np.zeros(16, np.float32)), _buffer(cpu, np.zeros(8 * 16, np.float32))
    out = cpu.alloc(16 * 4)

    def attend(n: int) -> tuple:
        return (View.contiguous(q, F32, (1, 1, 1, 16)), View.contiguous(kv, F32, (1, 1, n, 16)),
                View.contiguous(kv, F32, (1, 1, n, 16)), None, View.contiguous(out, F32, (1, 1, 1, 16)), 1.0, False)

    with pytest.raises(ValueError, match="reaches outside allocation"):
        _moved(cpu, "record_attention_views", attend(4), attend(9))


def test_a_copy_whose_views_overlap_takes_numpy(cpu: CpuBackend) -> None:
    """A copy within one buffer whose source and destination overlap (the compiled copy declines it): numpy's
    copyto, which reads the whole source first."""
    h = _buffer(cpu, np.arange(16, dtype=np.float32))
    steps = cpu.record_elementwise(inp(0), [View.contiguous(h, F32, (1, 8))], View.contiguous(h, F32, (1, 8), 2),
                                   runtime_sizes=True)
    for step in steps:
        step()
    np.testing.assert_array_equal(cpu.array(View.contiguous(h, F32, (16,))),
                                  np.array([0, 1, 0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15], np.float32))


@needs_rows
@pytest.mark.parametrize("seed", range(6))
def test_compiled_attention_matches_numpy(seed: int) -> None:
    """Random decode-sized problems: grouped heads, strided (transposed) keys, masks with -inf and fully masked
    rows (zeros), NaN in a query row (NaN out there), causal with several query rows."""
    rng = np.random.default_rng(seed)
    heads, kv_heads = (4, 2) if seed % 2 else (3, 3)
    sq, skv, d = 1 + seed % 3, 5 + 3 * seed, 8
    q = rng.standard_normal((2, heads, sq, d)).astype(np.float32)
    k = np.ascontiguousarray(rng.standard_normal((2, kv_heads, d, skv)).astype(np.float32)).swapaxes(2, 3)
    v = rng.standard_normal((2, kv_heads, skv, d)).astype(np.float32)
    mask = np.where(rng.random((2, 1, sq, skv)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[0, 0, 0] = -np.inf
    if seed == 3:
        q[1, 0, 0, 2] = np.nan
    causal = seed >= 4
    out = np.full((2, heads, sq, d), 7.0, np.float32)
    step = native_rows.attention_step(q, k, v, mask, out, 0.3, causal)
    assert step is not None
    step()
    rep = heads // kv_heads
    m = mask + (np.where(np.arange(skv)[None] <= np.arange(sq)[:, None] + skv - sq, 0.0, -np.inf) if causal else 0)
    want = attention_numpy(q, np.repeat(k, rep, 1), np.repeat(v, rep, 1), np.float32(0.3), m.astype(np.float32))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert not out[0, :, 0].any()  # the fully masked row


@needs_rows
def test_compiled_kernels_decline_what_they_do_not_take() -> None:
    """float16, too many query rows, an output overlapping an input: None (the numpy kernels run)."""
    q = np.zeros((1, 2, 1, 4), np.float32)
    kv = np.zeros((1, 2, 3, 4), np.float32)
    assert native_rows.attention_step(q.astype(np.float16), kv, kv, None, q.copy(), 1.0, False) is None
    many = np.zeros((1, 2, native_rows.ATTENTION_MAX_QUERIES + 1, 4), np.float32)
    assert native_rows.attention_step(many, kv, kv, None, many.copy(), 1.0, False) is None
    assert native_rows.attention_step(q, kv, kv, None, q, 1.0, False) is None
    x = np.zeros((2, 8), np.float32)
    assert native_rows.norm_step("layernorm", x, None, None, x[:, ::-1], 8, 1e-5) is None
    assert native_rows.gelu_step("gelu", x, x[::-1]) is None
