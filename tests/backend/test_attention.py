"""Fused attention on every backend against a float64 numpy oracle (fresh random inputs every run)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember import settings
from ember.backends.base import View

from .helpers import download, poisoned, rel_err, upload

TOL = 1e-4


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool) -> np.ndarray:
    """softmax(scale * q k^T + mask) v in float64; causal is bottom-right aligned (query i sees keys
    j <= i + seq_kv - seq_q) and a query that sees no key gives zeros."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = scale * np.einsum("bhid,bhjd->bhij", q, k)
    seq_q, seq_kv = q.shape[2], k.shape[2]
    visible = np.ones((seq_q, seq_kv), bool)
    if causal:
        visible = np.arange(seq_kv)[None, :] <= np.arange(seq_q)[:, None] + (seq_kv - seq_q)
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.where(visible, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    den = e.sum(axis=-1, keepdims=True)
    p = e / np.where(den > 0, den, 1)
    return np.einsum("bhij,bhjd->bhid", p, v)


def run_attention(be: ember.ComputeBackend, rng: np.random.Generator, batch: int, heads: int, seq_q: int,
                  seq_kv: int, head_dim: int, causal: bool, scale: float | None = None) -> float:
    q = rng.standard_normal((batch, heads, seq_q, head_dim)).astype(np.float32)
    k = rng.standard_normal((batch, heads, seq_kv, head_dim)).astype(np.float32)
    v = rng.standard_normal((batch, heads, seq_kv, head_dim)).astype(np.float32)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    hq, hk, hv = upload(be, q), upload(be, k), upload(be, v)
    ho = poisoned(be, q.size)
    try:
        be.attention(hq, hk, hv, ho, batch, heads, seq_q, seq_kv, head_dim, scale, causal)
        got = download(be, ho, q.shape)
    finally:
        for h in (hq, hk, hv, ho):
            be.free(h)
    return rel_err(got, attention_ref(q, k, v, scale, causal))


# Every head_dim causal and not at seq_q == seq_kv; the other shapes (seq_q < seq_kv, seq_q > seq_kv,
# decoding with seq_q = 1) spread over head_dims and both masks. Each shape compiles its own kernel, and
# compiles are what cost time on lavapipe, hence no full cross product.
CASES = [(17, 17, d, c) for d in (1, 3, 8, 64, 128) for c in (False, True)] + [
    (5, 33, 3, False), (5, 33, 64, True), (5, 33, 128, True),
    (33, 5, 1, True), (33, 5, 8, False), (33, 5, 128, False),
    (1, 40, 8, True), (1, 40, 64, False), (1, 40, 3, True),
]


@pytest.mark.parametrize("seq_q,seq_kv,head_dim,causal", CASES)
def test_attention(be: ember.ComputeBackend, rng: np.random.Generator, seq_q: int, seq_kv: int, head_dim: int,
                   causal: bool) -> None:
    err = run_attention(be, rng, 2, 3, seq_q, seq_kv, head_dim, causal)
    assert err <= TOL, err


@pytest.mark.parametrize("seq_q,seq_kv,causal", [(9, 40, False), (9, 40, True), (40, 9, True)])
def test_attention_head_dim_256(be: ember.ComputeBackend, rng: np.random.Generator, seq_q: int, seq_kv: int,
                                causal: bool) -> None:
    """The largest head_dim: tiles shrink to fit workgroup storage."""
    err = run_attention(be, rng, 1, 2, seq_q, seq_kv, 256, causal)
    assert err <= TOL, err


@pytest.mark.parametrize("causal", [False, True])
def test_attention_long(be: ember.ComputeBackend, rng: np.random.Generator, causal: bool) -> None:
    """Many key tiles and query blocks; sizes that are no multiple of any tile."""
    err = run_attention(be, rng, 1, 2, 150, 237, 64, causal)
    assert err <= TOL, err


def test_attention_scale_and_peaked_scores(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """A large scale makes the softmax nearly one-hot: the online max must keep exp() in range."""
    err = run_attention(be, rng, 1, 1, 20, 50, 16, False, scale=30.0)
    assert err <= TOL, err


def test_attention_rows_that_see_nothing(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """Causal with seq_q > seq_kv: the first seq_q - seq_kv queries see no key and give zeros."""
    batch, heads, seq_q, seq_kv, d = 1, 2, 12, 4, 8
    q = rng.standard_normal((batch, heads, seq_q, d)).astype(np.float32)
    k = rng.standard_normal((batch, heads, seq_kv, d)).astype(np.float32)
    v = rng.standard_normal((batch, heads, seq_kv, d)).astype(np.float32)
    hq, hk, hv = upload(be, q), upload(be, k), upload(be, v)
    ho = poisoned(be, q.size)
    try:
        be.attention(hq, hk, hv, ho, batch, heads, seq_q, seq_kv, d, 0.5, True)
        got = download(be, ho, q.shape)
    finally:
        for h in (hq, hk, hv, ho):
            be.free(h)
    assert np.all(got[:, :, : seq_q - seq_kv] == 0)
    assert rel_err(got, attention_ref(q, k, v, 0.5, True)) <= TOL


# ---- record_attention_views: strided q/k/v/out, grouped-query heads, additive masks ---------------------------------
F32 = np.dtype(np.float32)


def views_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float,
              causal: bool) -> np.ndarray:
    """The float64 oracle over logical (B, H, S, D) arrays: kv head h // (Hq / Hkv) serves query head h, mask is
    additive (broadcast to (B, Hq, Sq, Skv)); a row whose scores are all -inf gives zeros."""
    rep = q.shape[1] // k.shape[1]
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = scale * np.einsum("bhid,bhjd->bhij", q, k)
    if mask is not None:
        s = s + mask.astype(np.float64)
    seq_q, seq_kv = q.shape[2], k.shape[2]
    if causal:
        s = np.where(np.arange(seq_kv)[None, :] <= np.arange(seq_q)[:, None] + (seq_kv - seq_q), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    den = e.sum(axis=-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", e / np.where(den > 0, den, 1), v)


def placed(logical: np.ndarray, layout: str) -> tuple[np.ndarray, tuple[int, ...], int]:
    """Store a logical (B, H, S, D) array in a buffer the way `layout` says; unused elements are NaN (a kernel
    that reads outside its view shows it). Returns (flat buffer, strides, offset) of the (B, H, S, D) view."""
    b, h, s, d = logical.shape
    if layout == "bhsd":  # contiguous
        return logical.ravel().copy(), (h * s * d, s * d, d, 1), 0
    if layout == "bshd":  # (B, S, H, D) storage seen through a permute, as a model's reshape + transpose gives
        return logical.transpose(0, 2, 1, 3).ravel().copy(), (s * h * d, d, h * d, 1), 0
    if layout == "padded":  # rows padded by 3 elements and an odd offset: no vec4 access possible
        buf = np.full(5 + b * h * s * (d + 3), np.nan, np.float32)
        win = buf[5:].reshape(b, h, s, d + 3)
        win[..., :d] = logical
        return buf, (h * s * (d + 3), s * (d + 3), d + 3, 1), 5
    if layout == "reversed":  # the sequence stored backwards: a negative stride
        return logical[:, :, ::-1].ravel().copy(), (h * s * d, s * d, -d, 1), (s - 1) * d
    if layout == "dmajor":  # head_dim not unit-stride: (B, H, D, S) storage
        return logical.transpose(0, 1, 3, 2).ravel().copy(), (h * s * d, s * d, 1, s), 0
    raise ValueError(layout)


def run_views(be: ember.ComputeBackend, rng: np.random.Generator, batch: int, hq: int, hkv: int, seq_q: int,
              seq_kv: int, d: int, causal: bool, *, layouts: str | tuple[str, str, str] = "bshd",
              out_layout: str = "bhsd", mask: np.ndarray | None = None, scale: float | None = None) -> np.ndarray:
    """Run record_attention_views on views laid out as given and compare with the oracle; returns the output."""
    lq, lk, lv = (layouts,) * 3 if isinstance(layouts, str) else layouts
    q = rng.standard_normal((batch, hq, seq_q, d)).astype(np.float32)
    k = rng.standard_normal((batch, hkv, seq_kv, d)).astype(np.float32)
    v = rng.standard_normal((batch, hkv, seq_kv, d)).astype(np.float32)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    ref = views_ref(q, k, v, mask, scale, causal)
    handles = []
    try:
        ins = []
        for arr, layout in ((q, lq), (k, lk), (v, lv)):
            buf, strides, off = placed(arr, layout)
            handles.append(upload(be, buf))
            ins.append(View(handles[-1], F32, arr.shape, strides, off))
        mview = None
        if mask is not None:
            handles.append(upload(be, mask))
            mview = View.contiguous(handles[-1], F32, mask.shape).broadcast_to((batch, hq, seq_q, seq_kv))
        obuf, ostrides, ooff = placed(np.zeros_like(q), out_layout)
        handles.append(poisoned(be, obuf.size))
        ov = View(handles[-1], F32, q.shape, ostrides, ooff)
        be.execute(be.record_attention_views(*ins, mview, ov, scale, causal))
        raw = download(be, handles[-1], obuf.size)
    finally:
        for h in handles:
            be.free(h)
    got = np.lib.stride_tricks.as_strided(raw[ooff:], q.shape, [s * 4 for s in ostrides]).copy()
    written = np.zeros(raw.size, bool)
    idx = np.lib.stride_tricks.as_strided(np.arange(raw.size)[ooff:], q.shape, [s * 8 for s in ostrides])
    written[idx.ravel()] = True
    assert np.isnan(raw[~written]).all(), "an element outside the output view was written"
    err = rel_err(got, ref)
    assert err <= TOL, err
    return got


@pytest.mark.parametrize("seq_q,seq_kv,d,causal", [(17, 17, 64, False), (17, 17, 64, True), (5, 33, 8, True),
                                                   (33, 5, 16, True), (1, 40, 64, False), (9, 40, 3, False)])
def test_views_transposed(be: ember.ComputeBackend, rng: np.random.Generator, seq_q: int, seq_kv: int, d: int,
                          causal: bool) -> None:
    """q/k/v as (B, S, H, D) tensors permuted to (B, H, S, D), the output written the same way."""
    run_views(be, rng, 2, 3, 3, seq_q, seq_kv, d, causal, out_layout="bshd")


@pytest.mark.parametrize("layouts,out_layout", [
    ("padded", "padded"), ("reversed", "bhsd"), ("dmajor", "bshd"), (("bhsd", "bshd", "padded"), "reversed"),
    (("reversed", "dmajor", "bshd"), "dmajor"),
])
def test_views_strides(be: ember.ComputeBackend, rng: np.random.Generator, layouts, out_layout: str) -> None:
    """Padded rows at an odd offset, negative sequence strides, a non-unit head_dim stride, mixed layouts."""
    run_views(be, rng, 2, 2, 2, 11, 19, 8, True, layouts=layouts, out_layout=out_layout)
    run_views(be, rng, 1, 2, 2, 6, 6, 5, False, layouts=layouts, out_layout=out_layout)


@pytest.mark.parametrize("hq,hkv", [(4, 2), (8, 2), (4, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_views_grouped_query(be: ember.ComputeBackend, rng: np.random.Generator, hq: int, hkv: int,
                             causal: bool) -> None:
    """Hq / Hkv = 2, 4 (and multi-query): query head h reads kv head h // (Hq / Hkv)."""
    run_views(be, rng, 2, hq, hkv, 7, 23, 16, causal)


def test_views_grouped_query_decode(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """Decoding (seq_q = 1) against a longer cache, GQA, with a padding mask."""
    mask = np.zeros((1, 1, 1, 50), np.float32)
    mask[..., 45:] = -np.inf
    run_views(be, rng, 2, 8, 2, 1, 50, 64, False, mask=mask)


@pytest.mark.parametrize("causal", [False, True])
def test_views_mask_keys(be: ember.ComputeBackend, rng: np.random.Generator, causal: bool) -> None:
    """A (1, 1, 1, Skv) mask broadcast over batch, heads and queries: padding keys at -inf, others finite."""
    seq_kv = 37
    mask = rng.uniform(-2, 2, (1, 1, 1, seq_kv)).astype(np.float32)
    mask[..., 30:] = -np.inf
    mask[..., 3] = -np.inf
    run_views(be, rng, 2, 4, 2, 21, seq_kv, 32, causal, mask=mask)


@pytest.mark.parametrize("seq_q,seq_kv,causal", [(13, 13, False), (13, 13, True), (6, 29, True), (29, 6, True)])
def test_views_mask_rows(be: ember.ComputeBackend, rng: np.random.Generator, seq_q: int, seq_kv: int,
                         causal: bool) -> None:
    """A (B, 1, Sq, Skv) mask with scattered -inf and fully masked rows: those rows give exact zeros."""
    batch, hq = 2, 3
    mask = rng.uniform(-3, 3, (batch, 1, seq_q, seq_kv)).astype(np.float32)
    mask[rng.random(mask.shape) < 0.3] = -np.inf
    mask[0, 0, 2] = -np.inf
    mask[1, 0, seq_q - 1] = -np.inf
    got = run_views(be, rng, batch, hq, hq, seq_q, seq_kv, 16, causal, mask=mask)
    assert np.all(got[0, :, 2] == 0) and np.all(got[1, :, seq_q - 1] == 0)


def test_views_mask_everything(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """Every score -inf: zeros everywhere, no NaN."""
    mask = np.full((1, 1, 1, 9), -np.inf, np.float32)
    got = run_views(be, rng, 1, 2, 2, 4, 9, 8, False, mask=mask)
    assert np.all(got == 0)


@pytest.mark.parametrize("causal", [False, True])
def test_views_large_scale_with_mask(be: ember.ComputeBackend, rng: np.random.Generator, causal: bool) -> None:
    """Peaked scores plus a large finite mask (-1e9, as exporters write) next to -inf entries."""
    mask = np.zeros((2, 1, 20, 50), np.float32)
    mask[:, :, :, 40:] = -1e9
    mask[:, :, 5, :] = -np.inf
    run_views(be, rng, 2, 2, 1, 20, 50, 16, causal, mask=mask, scale=30.0)


@pytest.mark.parametrize("d", [128, 256])
def test_views_head_dim_large(be: ember.ComputeBackend, rng: np.random.Generator, d: int) -> None:
    mask = rng.uniform(-1, 1, (1, 1, 1, 24)).astype(np.float32)
    run_views(be, rng, 1, 4, 2, 9, 24, d, True, mask=mask, out_layout="bshd")


def test_views_packed_qkv(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """q, k and v as views into one (B, S, 3, H, D) buffer (a fused QKV projection), output elsewhere."""
    batch, seq, heads, d = 2, 15, 3, 8
    qkv = rng.standard_normal((batch, seq, 3, heads, d)).astype(np.float32)
    h, ho = upload(be, qkv), poisoned(be, batch * heads * seq * d)
    try:
        st = (seq * 3 * heads * d, d, 3 * heads * d, 1)
        q, k, v = (View(h, F32, (batch, heads, seq, d), st, i * heads * d) for i in range(3))
        out = View.contiguous(ho, F32, (batch, heads, seq, d))
        be.execute(be.record_attention_views(q, k, v, None, out, 0.3, True))
        got = download(be, ho, out.shape)
    finally:
        be.free(h)
        be.free(ho)
    lq, lk, lv = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    assert rel_err(got, views_ref(lq, lk, lv, None, 0.3, True)) <= TOL


def test_views_rejects_view_past_allocation(wgpu_be: ember.ComputeBackend) -> None:
    be = wgpu_be  # a wgpu-only check: runs on wgpu, never skipped
    h, ho = be.alloc(4 * 64), be.alloc(4 * 64)
    try:
        good = View.contiguous(h, F32, (1, 1, 8, 8))
        bad = View(h, F32, (1, 1, 8, 8), (64, 64, 8, 1), 1)
        out = View.contiguous(ho, F32, (1, 1, 8, 8))
        with pytest.raises(ValueError, match="^k:"):
            be.record_attention_views(good, bad, good, None, out, 1.0, False)
        with pytest.raises(ValueError, match="^mask:"):
            be.record_attention_views(good, good, good, View(h, F32, (1, 1, 8, 8), (0, 0, 9, 1)), out, 1.0, False)
    finally:
        be.free(h)
        be.free(ho)


def test_views_checked_shaders_agree(rng: np.random.Generator) -> None:
    """The view kernels built as checked shader modules (naga bounds checks) give the same answers."""
    assert "wgpu" in ember.available_backends(), "the test suite needs a wgpu adapter (lavapipe on CPU machines)"
    with settings.override(checked_shaders=True):
        checked = ember.backend("wgpu")
    assert checked.checked
    mask = rng.uniform(-1, 1, (2, 1, 7, 12)).astype(np.float32)
    mask[0, 0, 1] = -np.inf
    run_views(checked, rng, 2, 4, 2, 7, 12, 8, True, mask=mask, out_layout="padded")
    run_views(checked, rng, 1, 2, 1, 5, 9, 3, False, layouts="reversed", out_layout="bshd")


def test_views_into_allocation_above_binding_limit(be: ember.ComputeBackend, rng: np.random.Generator,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """k and v: windows of a KV cache allocation bigger than the max binding size (lowered to 384 KiB here):
    the kernel binds the byte range the views touch."""
    batch, heads, cap, seq_q, seq_kv, d, start = 1, 2, 4096, 3, 40, 16, 1001
    if be.name == "wgpu":
        be.free(be.alloc(4))
        monkeypatch.setattr(be, "max_binding", 384 * 1024)
    q = rng.standard_normal((batch, heads, seq_q, d)).astype(np.float32)
    cache = rng.standard_normal((2, batch, heads, cap, d)).astype(np.float32)  # 1 MiB: k and v caches
    hq, hc, ho = upload(be, q), upload(be, cache), poisoned(be, q.size)
    try:
        st = (heads * cap * d, cap * d, d, 1)
        k, v = (View(hc, F32, (batch, heads, seq_kv, d), st, i * batch * heads * cap * d + start * d) for i in (0, 1))
        be.execute(be.record_attention_views(View.contiguous(hq, F32, q.shape), k, v, None,
                                             View.contiguous(ho, F32, q.shape), 0.25, True))
        got = download(be, ho, q.shape)
    finally:
        for h in (hq, hc, ho):
            be.free(h)
    kk, vv = (cache[i][:, :, start:start + seq_kv] for i in (0, 1))
    assert rel_err(got, views_ref(q, kk, vv, None, 0.25, True)) <= TOL
