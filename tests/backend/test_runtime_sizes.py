"""wgpu's elementwise kernels with their sizes in a uniform buffer (`runtime_sizes=True`, what plans made from a
template record): the same results as the kernels with sizes in the source, over strided, broadcast, offset
and index-computed (`load`) operands, and one pipeline for every size of the same structure."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backends.base import View
from ember.core.expr import call, coord, inp, load

from .helpers import download, poisoned, upload


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
