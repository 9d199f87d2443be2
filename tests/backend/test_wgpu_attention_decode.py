"""wgpu's split-KV decode attention (attention_decode.py: kernels/attention_split.wgsl + attention_combine.wgsl)
against a float64 numpy oracle: one query row against key counts that no split count divides, head_dim 64, 128,
40 and 30 (scalar loads), f32 and f16 storage, GQA, additive masks (broadcast, with fully -inf rows), causal, strided
and windowed views, and runtime sizes moved from key count to key count the way live plans move them (probe_sizes,
sizes_writer). Every case checks which kernels ran (dispatch labels); EMBER_ATTENTION_SPLIT_KV=0 keeps the flash
kernel."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ember import settings
from ember.backends.base import View
from ember.backends.wgpu.attention_decode import MAX_SPLITS, chunk_keys, split_count

SPLIT = ["attention.split_kv", "attention.split_kv_combine"]
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


@pytest.fixture
def gpu(wgpu_be, monkeypatch):
    """The wgpu backend, its dispatches' labels collected in gpu.labels."""
    be = wgpu_be
    labels: list[str] = []
    real = be.dispatch

    def dispatch(pipeline, buffers, grid, label=""):
        labels.append(label)
        return real(pipeline, buffers, grid, label)

    monkeypatch.setattr(be, "dispatch", dispatch)
    monkeypatch.setattr(be, "labels", labels, raising=False)
    return be


def oracle(q, k, v, mask, scale: float) -> np.ndarray:
    """softmax(scale q k^T + mask) v in float64; kv head h // (Hq / Hkv) serves query head h; a row whose scores
    are all -inf gives zeros. (A single query sees every key under a bottom-right causal mask.)"""
    rep = q.shape[1] // k.shape[1]
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = scale * np.einsum("bhid,bhjd->bhij", q, k)
    if mask is not None:
        s = s + np.asarray(mask, np.float64)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    den = e.sum(axis=-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", e / np.where(den > 0, den, 1), v)


def store(be, a: np.ndarray, dtype: np.dtype) -> int:
    h = be.alloc(max(a.size * dtype.itemsize, 4))
    be.upload(h, np.ascontiguousarray(a, dtype))
    return h


def fetch(be, h: int, n: int, dtype: np.dtype) -> np.ndarray:
    return np.asarray(be.download(View.contiguous(h, dtype, (n,))), np.float64)


class Case:
    """q (B, Hq, 1, D) stored as (B, 1, Hq, D) (a model's reshape + transpose), k and v in a KV cache of `cap`
    keys per head (B, Hkv, cap, D), the output written (B, 1, Hq, D) after `pad` NaN elements."""

    def __init__(self, be, rng, b: int, hq: int, hkv: int, keys: int, d: int, dtype: np.dtype, cap: int | None = None,
                 mask: np.ndarray | None = None, pad: int = 3) -> None:
        self.be, self.dtype, self.cap, self.pad = be, dtype, cap or keys, pad
        self.q = rng.standard_normal((b, hq, 1, d)).astype(dtype)
        self.cache = rng.standard_normal((2, b, hkv, self.cap, d)).astype(dtype)
        self.scale = 1 / math.sqrt(d)
        self.hq = store(be, self.q.transpose(0, 2, 1, 3), dtype)
        self.hc = store(be, self.cache, dtype)
        self.ho = store(be, np.full(pad + self.q.size, np.nan, np.float32), dtype)
        self.hm = None if mask is None else store(be, mask, F32)
        self.mask = mask

    def views(self, keys: int) -> tuple:
        b, hq, _, d = self.q.shape
        hkv = self.cache.shape[2]
        q = View(self.hq, self.dtype, (b, hq, 1, d), (hq * d, d, hq * d, 1))
        st = (hkv * self.cap * d, self.cap * d, d, 1)
        k, v = (View(self.hc, self.dtype, (b, hkv, keys, d), st, i * b * hkv * self.cap * d) for i in (0, 1))
        m = None
        if self.mask is not None:  # (B | 1, Hq | 1, 1, cap): the first `keys` of each row, broadcast where 1
            mb, mh = self.mask.shape[:2]
            m = View(self.hm, F32, (b, hq, 1, keys), (0 if mb == 1 else mh * self.cap, 0 if mh == 1 else self.cap,
                                                      0, 1))
        out = View(self.ho, self.dtype, (b, hq, 1, d), (hq * d, d, hq * d, 1), self.pad)
        return q, k, v, m, out

    def record(self, keys: int, causal: bool = False, runtime: bool = False) -> list:
        return self.be.record_attention_views(*self.views(keys), self.scale, causal, runtime_sizes=runtime)

    def result(self) -> np.ndarray:
        raw = fetch(self.be, self.ho, self.pad + self.q.size, self.dtype)
        assert np.isnan(raw[:self.pad]).all(), "written before the output's offset"
        b, hq, _, d = self.q.shape
        return raw[self.pad:].reshape(b, 1, hq, d).transpose(0, 2, 1, 3)

    def want(self, keys: int) -> np.ndarray:
        mask = None if self.mask is None else np.broadcast_to(self.mask[..., :keys],
                                                              (self.q.shape[0], self.q.shape[1], 1, keys))
        return oracle(self.q, self.cache[0][:, :, :keys], self.cache[1][:, :, :keys], mask, self.scale)

    def check(self, keys: int) -> np.ndarray:
        got, want = self.result(), self.want(keys)
        tol = 2e-3 if self.dtype == F16 else 2e-5  # f16: one rounding of the output (2^-11) relative to the largest
        err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
        assert err <= tol, (keys, err)
        return got

    def free(self) -> None:
        for h in (self.hq, self.hc, self.ho, self.hm):
            if h is not None:
                self.be.free(h)


def test_split_count_and_chunks() -> None:
    assert [split_count(n, 32) for n in (1, 63, 64, 100, 504, 1023, 1024, 5000)] == [1, 1, 2, 3, 15, 31, 32, 32]
    assert split_count(5000, 0) == 1 and split_count(10, 2, cap=4) == 4
    for keys in (1, 7, 33, 100, 513, 2048):
        for splits, min_keys in ((split_count(keys, 32), 32), (MAX_SPLITS, 32), (MAX_SPLITS, 2)):
            chunk = chunk_keys(keys, splits, min_keys)
            assert chunk >= min_keys and chunk * splits >= keys  # every key in a chunk, each at least min_keys long


# (keys, head_dim, storage, EMBER_ATTENTION_SPLIT_KV): counts no split count divides, chunks that end early (the
# later splits empty), the cap of 32 splits; head_dim 40 and 30 (no vec4 rows: element-wise loads and stores).
CASES = [(7, 64, F32, 2), (33, 128, F32, 2), (100, 40, F32, 2), (100, 64, F16, 32), (513, 128, F32, 32),
         (513, 64, F16, 2), (70, 30, F32, 4)]


@pytest.mark.parametrize("keys,d,dtype,min_keys", CASES)
def test_split_kv_matches_oracle(gpu, rng, keys: int, d: int, dtype: np.dtype, min_keys: int) -> None:
    case = Case(gpu, rng, 1, 4, 4, keys, d, dtype, cap=keys + 5)
    try:
        with settings.override(attention_split_kv=min_keys):
            steps = case.record(keys)
        assert gpu.labels == SPLIT
        gpu.execute(steps)
        case.check(keys)
    finally:
        case.free()


@pytest.mark.parametrize("causal", [False, True])
def test_split_kv_grouped_query_with_masks(gpu, rng, causal: bool) -> None:
    """8 query heads over 2 kv heads, a (B, Hq, 1, S) mask with scattered -inf, one head's row and one batch's
    rows entirely -inf (zeros), f16 storage for one of the two."""
    b, hq, keys = 2, 8, 150
    mask = rng.uniform(-2, 2, (b, hq, 1, keys)).astype(np.float32)
    mask[rng.random(mask.shape) < 0.2] = -np.inf
    mask[0, 3] = -np.inf
    mask[1, :, :, :140] = -np.inf
    mask[1, :, :, 140:] = -np.inf
    mask[0, 5, :, :100] = -1e9  # a large finite mask beside -inf
    case = Case(gpu, rng, b, hq, 2, keys, 64, F16 if causal else F32, mask=mask)
    try:
        gpu.execute(case.record(keys, causal))
        assert gpu.labels == SPLIT
        got = case.check(keys)
        assert np.all(got[0, 3] == 0) and np.all(got[1] == 0)
    finally:
        case.free()


def test_split_kv_key_padding_mask_broadcast(gpu, rng) -> None:
    """A (1, 1, 1, S) mask broadcast over batch and heads (strides 0), padding keys at -inf."""
    keys = 97
    mask = np.zeros((1, 1, 1, keys), np.float32)
    mask[..., 90:] = -np.inf
    mask[..., 10] = -np.inf
    case = Case(gpu, rng, 2, 4, 2, keys, 128, F32, mask=mask)
    try:
        gpu.execute(case.record(keys, True))
        assert gpu.labels == SPLIT
        case.check(keys)
    finally:
        case.free()


def test_split_kv_off_keeps_the_flash_kernel(gpu, rng) -> None:
    case = Case(gpu, rng, 1, 4, 2, 200, 64, F32)
    try:
        with settings.override(attention_split_kv=0):
            gpu.execute(case.record(200))
            gpu.execute(case.record(200, runtime=True))
        assert gpu.labels == ["attention", "attention"]
        case.check(200)
        del gpu.labels[:]
        gpu.execute(case.record(40))  # one chunk of 32 keys at most: nothing to split
        assert gpu.labels == ["attention"]
        case.check(40)
    finally:
        case.free()


def test_split_kv_windows_of_a_big_cache(gpu, rng, monkeypatch) -> None:
    """k and v windows of a KV cache allocation above the max binding size (lowered to 256 KiB): each binds the
    byte range it touches; runtime sizes fall back to literal ones there."""
    gpu.free(gpu.alloc(4))
    monkeypatch.setattr(gpu, "max_binding", 256 * 1024)
    case = Case(gpu, rng, 1, 4, 2, 300, 64, F32, cap=600)  # 1.2 MiB of cache
    try:
        gpu.execute(case.record(300, runtime=True))
        assert gpu.labels == SPLIT
        case.check(300)
    finally:
        case.free()


@pytest.mark.parametrize("dtype", [F32, F16])
def test_split_kv_runtime_sizes_move_across_key_counts(gpu, rng, dtype: np.dtype) -> None:
    """Recorded once with runtime sizes at 40 keys, then moved to other counts as a live plan moves its calls: the
    probe's structure (kernels, slots) and grids are the same at every count, the first uniform value is the key
    count, and the moved steps give each count's answer (2 keys to the 32-split bound's 2048 and past it). One key
    is a structure of its own (its key stride squeezed to 0, as a template plans a dim of 1 apart): recorded there."""
    mask = rng.uniform(-1, 1, (1, 8, 1, 2100)).astype(np.float32)
    mask[0, 2, :, 1:] = -np.inf  # head 2 sees only key 0
    case = Case(gpu, rng, 1, 8, 2, 2100, 64 if dtype == F32 else 128, dtype, mask=mask)
    try:
        steps = case.record(40, causal=True, runtime=True)
        assert gpu.labels == SPLIT
        first = gpu.probe_sizes("record_attention_views", (*case.views(40), case.scale, True), {})
        assert first is not None
        for keys in (40, 2, 7, 33, 100, 513, 2048, 2100):
            probe = gpu.probe_sizes("record_attention_views", (*case.views(keys), case.scale, True), {})
            assert probe is not None and probe[0] == first[0] and probe[2] == first[2], keys
            assert [int(x[0]) for x in probe[1]] == [keys, keys]
            moved, write = gpu.sizes_writer(steps, [tuple(g) for g in probe[2]])
            write(probe[1])
            gpu.execute(moved)
            case.check(keys)
        assert gpu.labels == SPLIT  # nothing recorded again
        gpu.execute(case.record(1, causal=True, runtime=True))
        case.check(1)
        assert gpu.labels == SPLIT * 2
    finally:
        case.free()
