"""Fused attention on every backend against a float64 numpy oracle (fresh random inputs every run)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember

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
