"""Gate for the fused attention primitive record_attention_views: out = softmax(scale * q kᵀ + mask) v over 4-D
(B, H, S, D) Views, causal (bottom-right aligned) or not, additive masks, grouped-query heads, on every backend.

Oracle: per query row, in float64 Python loops independent of numpy's matmul: each score is math.fsum over
head_dim, the softmax is max-subtracted, each output element a math.fsum of weights times v over the keys; a row
that sees no key (causal with seq_q > seq_kv, or a mask row of all -inf) gives zeros, and those zeros must be
exact. Errors are relative to max|ref| of each (batch, head) slab, at 1e-4 (a product over a dot product, as
attention is judged in this project); fresh inputs at magnitudes near 1 and 1e-4, and scores near 30 (a nearly
one-hot softmax); outputs poisoned with NaN before each of two runs that must be bitwise identical.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember.backends.base import View

from .gate import row_errors, run_twice, upload

TOL = 1e-4
HEAD_DIMS = [1, 2, 3, 4, 7, 8, 16, 32, 33, 64, 127, 128, 256]


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float,
              causal: bool) -> np.ndarray:
    """float64 loops over logical (B, Hq, Sq, D), (B, Hkv, Skv, D) arrays; mask broadcast to (B, Hq, Sq, Skv)."""
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    rep = hq // hkv
    full_mask = None if mask is None else np.broadcast_to(mask, (b, hq, sq, skv)).tolist()
    ql, kl, vl = q.tolist(), k.tolist(), v.tolist()
    out = np.zeros((b, hq, sq, d), np.float64)
    for bi in range(b):
        for h in range(hq):
            ks, vs = kl[bi][h // rep], vl[bi][h // rep]
            for i in range(sq):
                qi = ql[bi][h][i]
                scores = []
                for j in range(skv):
                    s = scale * math.fsum(qi[t] * ks[j][t] for t in range(d))
                    if full_mask is not None:
                        s += full_mask[bi][h][i][j]
                    if causal and j > i + skv - sq:
                        s = -math.inf
                    scores.append(s)
                m = max(scores)
                if m == -math.inf:
                    continue  # sees no key: zeros
                e = [math.exp(s - m) if s != -math.inf else 0.0 for s in scores]
                den = math.fsum(e)
                for t in range(d):
                    out[bi, h, i, t] = math.fsum(e[j] * vs[j][t] for j in range(skv)) / den
    return out


def sample(rng: np.random.Generator, shape: tuple[int, ...], magnitude: str) -> np.ndarray:
    scale = {"normal": 1.0, "tiny": 1e-4, "peaked": 1.0}[magnitude]
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def run_case(be: ember.ComputeBackend, rng: np.random.Generator, batch: int, hq: int, hkv: int, seq_q: int,
             seq_kv: int, d: int, causal: bool, magnitude: str = "normal", mask: np.ndarray | None = None,
             layout: str = "bhsd") -> tuple[np.ndarray, np.ndarray]:
    """Run the kernel twice (poisoned, bitwise identical) and check against the oracle; returns (got, ref).

    layout "bshd" stores q/k/v/out as (B, S, H, D) and hands the kernel permuted views, as a model's reshape +
    transpose does; "bhsd" stores them contiguous after a 3-element pad (an offset no vec4 load aligns to)."""
    q = sample(rng, (batch, hq, seq_q, d), magnitude)
    k = sample(rng, (batch, hkv, seq_kv, d), magnitude)
    v = sample(rng, (batch, hkv, seq_kv, d), "normal" if magnitude == "peaked" else magnitude)
    # "peaked": scale * q·k has a standard deviation near 30, so the softmax is nearly one-hot.
    scale = 30.0 / math.sqrt(d) if magnitude == "peaked" else 1.0 / math.sqrt(d)
    if magnitude == "tiny":
        scale = 1e8 / math.sqrt(d)  # keeps the scores near 1 while q, k and v are near 1e-4
    handles = []

    def place(arr: np.ndarray) -> tuple[View, View]:
        """(the (B, H, S, D) view the kernel gets, the contiguous view of its storage)."""
        if layout == "bshd":
            h, stored = upload(be, arr.transpose(0, 2, 1, 3))
            view = stored.permute((0, 2, 1, 3))
        else:
            h, stored = upload(be, arr, pad=3)
            view = stored
        handles.append(h)
        return view, stored

    try:
        (qv, _), (kv, _), (vv, _) = place(q), place(k), place(v)
        ov, ostored = place(np.zeros((batch, hq, seq_q, d), np.float32))
        mv = None
        if mask is not None:
            hm, mv = upload(be, mask)
            handles.append(hm)
            mv = mv.broadcast_to((batch, hq, seq_q, seq_kv))
        steps = be.record_attention_views(qv, kv, vv, mv, ov, scale, causal)
        got = np.asarray(run_twice(be, steps, ostored), np.float64)
        if layout == "bshd":
            got = got.transpose(0, 2, 1, 3)
    finally:
        for h in handles:
            be.free(h)
    ref = reference(q, k, v, mask, scale, causal)
    err = row_errors(got, ref, seq_q * d)  # one row per (batch, head) slab
    worst = int(np.argmax(err))
    assert err[worst] < TOL, (f"slab {worst}: relative error {err[worst]:.3g} >= {TOL}",
                              (batch, hq, hkv, seq_q, seq_kv, d, causal, magnitude, layout))
    dead = ~np.any(ref != 0, axis=-1)  # rows that see no key: exact zeros
    assert np.all(got[dead] == 0), "a query row that sees no key is not all zeros"
    return got, ref


# Every head_dim, causal and not; seq_q == seq_kv, seq_q < seq_kv and seq_q > seq_kv spread over them. Each shape
# compiles its own kernel on wgpu, so the matrix is a walk rather than a cross product.
SHAPES = [(5, 5), (3, 11), (9, 4)]
DIM_CASES = [(d, SHAPES[i % 3], c) for i, d in enumerate(HEAD_DIMS) for c in (False, True)]


@pytest.mark.parametrize("d,seqs,causal", DIM_CASES, ids=[f"d{d}-{sq}x{skv}-{'causal' if c else 'full'}"
                                                          for d, (sq, skv), c in DIM_CASES])
def test_head_dims(be: ember.ComputeBackend, rng: np.random.Generator, d: int, seqs: tuple[int, int],
                   causal: bool) -> None:
    run_case(be, rng, 2, 2, 2, *seqs, d, causal)


@pytest.mark.parametrize("magnitude", ["normal", "tiny", "peaked"])
@pytest.mark.parametrize("seqs,d,causal", [((6, 13), 8, True), ((13, 6), 33, False), ((1, 17), 64, True),
                                           ((7, 7), 128, False)])
def test_magnitudes(be: ember.ComputeBackend, rng: np.random.Generator, magnitude: str, seqs: tuple[int, int],
                    d: int, causal: bool) -> None:
    run_case(be, rng, 1, 2, 2, *seqs, d, causal, magnitude)


@pytest.mark.parametrize("hq,hkv", [(4, 2), (4, 1), (6, 3), (3, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query(be: ember.ComputeBackend, rng: np.random.Generator, hq: int, hkv: int, causal: bool) -> None:
    """kv head h // (hq / hkv) serves query head h; heads that read the wrong kv head show in the oracle."""
    run_case(be, rng, 2, hq, hkv, 5, 9, 16, causal, layout="bshd")


def mask_with_holes(rng: np.random.Generator, shape: tuple[int, ...], dead_row: int | None) -> np.ndarray:
    """A random additive mask (bias values and -inf entries); `dead_row` of every (batch, head) is all -inf."""
    m = rng.standard_normal(shape).astype(np.float32)
    m[rng.random(shape) < 0.3] = -np.inf
    if dead_row is not None:
        m[..., dead_row, :] = -np.inf
    return m


@pytest.mark.parametrize("mask_shape", ["full", "per_batch", "shared"])
@pytest.mark.parametrize("seqs,d,causal", [((6, 6), 8, False), ((4, 10), 32, True), ((10, 4), 7, False),
                                           ((5, 12), 64, False)])
def test_additive_mask(be: ember.ComputeBackend, rng: np.random.Generator, mask_shape: str, seqs: tuple[int, int],
                       d: int, causal: bool) -> None:
    """An additive mask with -inf entries and one fully masked query row (which must give zeros), broadcast from
    (B, Hq, Sq, Skv), (B, 1, Sq, Skv) or (1, 1, Sq, Skv)."""
    batch, hq, hkv = 2, 4, 2
    sq, skv = seqs
    shape = {"full": (batch, hq, sq, skv), "per_batch": (batch, 1, sq, skv), "shared": (1, 1, sq, skv)}[mask_shape]
    got, _ = run_case(be, rng, batch, hq, hkv, sq, skv, d, causal, mask=mask_with_holes(rng, shape, sq // 2))
    assert np.all(got[:, :, sq // 2] == 0)


def test_causal_rows_that_see_nothing(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """Causal with seq_q > seq_kv: the first seq_q - seq_kv query rows see no key and are exact zeros."""
    got, _ = run_case(be, rng, 1, 2, 1, 12, 4, 8, True)
    assert np.all(got[:, :, :8] == 0) and np.all(np.isfinite(got))
