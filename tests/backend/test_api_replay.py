"""The public ops' replay cache (backends/api_cache.py): a call's steps are recorded once per call signature and
replayed after. Replays must read the buffers' current contents, never outlive a freed handle, tell apart calls
that differ in any argument, stay bounded, and hold up under threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import ember
from ember import settings

from .helpers import download, upload


def _ref_gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c.astype(np.float64)


def _close(got: np.ndarray, ref: np.ndarray, what: str, tol: float = 1e-5) -> None:
    err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
    assert err < tol, f"{what}: relative error {err:.2e}"


def _attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool) -> np.ndarray:
    s = scale * (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2))
    if causal:
        sq, skv = s.shape[-2:]
        s = np.where(np.arange(skv)[None, :] > np.arange(sq)[:, None] + skv - sq, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)


def _conv_ref(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    p, q = h + 2 * pad - r + 1, wd + 2 * pad - s + 1
    out = np.zeros((n, k, p, q))
    for i in range(r):
        for j in range(s):
            out += np.einsum("nchw,kc->nkhw", xp[:, :, i:i + p, j:j + q], w[:, :, i, j].astype(np.float64))
    return out


def test_repeated_calls_read_current_inputs(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """Every op called again and again, its inputs (and gemm's C) rewritten with copy_htod between calls: each call
    gives the float64 reference of what the buffers hold then, and the later calls are replays."""
    m, n, k = 24, 20, 36
    ha, hb, hc = be.alloc(m * k * 4), be.alloc(k * n * 4), be.alloc(m * n * 4)
    x, y, o = be.alloc(4 * 1000), be.alloc(4 * 1000), be.alloc(4 * 1000)
    b_, h_, sq, d = 2, 3, 5, 8
    q, kk, v, ao = (be.alloc(b_ * h_ * sq * d * 4) for _ in range(4))
    cx, cw, co = be.alloc(2 * 3 * 7 * 7 * 4), be.alloc(4 * 3 * 3 * 3 * 4), be.alloc(2 * 4 * 7 * 7 * 4)
    handles = (ha, hb, hc, x, y, o, q, kk, v, ao, cx, cw, co)
    before = be.api_cache_info()
    try:
        for rep in range(4):
            a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
            c = rng.standard_normal((m, n), np.float32)
            for h, arr in ((ha, a), (hb, b), (hc, c)):
                be.copy_htod(h, arr)
            be.gemm(False, False, m, n, k, 0.75, ha, k, hb, n, -1.5, hc, n)
            _close(download(be, hc, (m, n)), _ref_gemm(a, b, c, 0.75, -1.5), f"gemm, call {rep}")

            xs, ys = rng.standard_normal(1000, np.float32), rng.standard_normal(1000, np.float32)
            be.copy_htod(x, xs)
            be.copy_htod(y, ys)
            be.unary("exp", x, o, 1000)
            _close(download(be, o, 1000), np.exp(xs.astype(np.float64)), f"unary, call {rep}")
            be.binary("mul", x, y, o, 1000)
            _close(download(be, o, 1000), xs.astype(np.float64) * ys, f"binary, call {rep}")
            be.reduce("sum", x, o, (10, 100), 1)
            _close(download(be, o, 10), xs.reshape(10, 100).astype(np.float64).sum(1), f"reduce, call {rep}")

            qs, ks, vs = (rng.standard_normal((b_, h_, sq, d), np.float32) for _ in range(3))
            for h, arr in ((q, qs), (kk, ks), (v, vs)):
                be.copy_htod(h, arr)
            be.attention(q, kk, v, ao, b_, h_, sq, sq, d, 0.3, True)
            _close(download(be, ao, (b_, h_, sq, d)), _attention_ref(qs, ks, vs, 0.3, True), f"attention, call {rep}")

            xs4, ws4 = rng.standard_normal((2, 3, 7, 7), np.float32), rng.standard_normal((4, 3, 3, 3), np.float32)
            be.copy_htod(cx, xs4)
            be.copy_htod(cw, ws4)
            be.conv2d_forward(cx, (2, 3, 7, 7), cw, (4, 3, 3, 3), co, (2, 4, 7, 7), 1, 1)
            _close(download(be, co, (2, 4, 7, 7)), _conv_ref(xs4, ws4, 1), f"conv2d, call {rep}", 1e-4)
        after = be.api_cache_info()
        assert after["misses"] - before["misses"] == 6  # each op recorded once ...
        assert after["hits"] - before["hits"] == 3 * 6  # ... and replayed on every later call
    finally:
        for h in handles:
            be.free(h)
    assert be.api_cache_info()["entries"] <= before["entries"]  # freeing dropped what named those handles


@pytest.mark.parametrize("overwritten", [False, True])
def test_freed_handles_leave_no_stale_entry(be: ember.ComputeBackend, rng: np.random.Generator,
                                            overwritten: bool) -> None:
    """Free the buffers of a cached call and allocate again (on wgpu, overwritten=True hands the freed output's
    buffer back under a new handle): calls on the new handles compute on the new data, and the old entries are
    gone with their handles."""
    n = 777
    xs = rng.standard_normal(n, np.float32)
    x, o = upload(be, xs), be.alloc(n * 4, overwritten=overwritten)
    be.unary("neg", x, o, n)
    be.unary("neg", x, o, n)
    np.testing.assert_array_equal(download(be, o, n), -xs)
    entries = be.api_cache_info()["entries"]
    be.free(x)
    be.free(o)
    assert be.api_cache_info()["entries"] == entries - 1
    for round_ in range(3):
        # The recycled output buffer now comes back as an input: its contents are written afresh.
        ys, zs = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
        y = be.alloc(n * 4, overwritten=overwritten)
        be.copy_htod(y, ys)
        z = upload(be, zs)
        out = be.alloc(n * 4, overwritten=overwritten)
        assert len({x, o, y, z, out}) == 5  # handles count up, never reused
        be.unary("neg", y, out, n)
        np.testing.assert_array_equal(download(be, out, n), -ys, err_msg=f"round {round_}")
        be.binary("sub", z, y, out, n)
        np.testing.assert_allclose(download(be, out, n), zs - ys, rtol=1e-6, err_msg=f"round {round_}")
        for h in (y, z, out):
            be.free(h)
    assert be.api_cache_info()["entries"] == entries - 1
    with pytest.raises(ValueError, match="freed"):
        be.unary("neg", x, o, n)  # a freed handle is still refused, cached call or not


def test_scalars_and_sizes_are_part_of_the_key(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    m = n = k = 16
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    c = rng.standard_normal((m, n), np.float32)
    ha, hb, hc = upload(be, a), upload(be, b), be.alloc(m * n * 4)
    x, o = upload(be, rng.standard_normal(256, np.float32)), be.alloc(256 * 4)
    try:
        start = be.api_cache_info()
        for alpha, beta in ((1.0, 0.0), (2.0, 0.5), (1.0, 0.0), (2.0, 0.5), (-1.0, 1.0)):
            be.copy_htod(hc, c)
            be.gemm(False, False, m, n, k, alpha, ha, k, hb, n, beta, hc, n)
            _close(download(be, hc, (m, n)), _ref_gemm(a, b, c, alpha, beta), f"gemm alpha={alpha} beta={beta}")
        be.gemm(True, False, m, n, k, 1.0, ha, m, hb, n, 0.0, hc, n)  # the transpose flag too
        _close(download(be, hc, (m, n)), a.T.astype(np.float64) @ b, "gemm trans_a")
        info = be.api_cache_info()
        assert (info["misses"] - start["misses"], info["hits"] - start["hits"]) == (4, 2)
        xs = download(be, x, 256)
        for count in (100, 200, 100):
            be.copy_htod(o, np.zeros(256, np.float32))
            be.unary("abs", x, o, count)
            got = download(be, o, 256)
            np.testing.assert_array_equal(got[:count], np.abs(xs[:count]))
            assert not got[count:].any(), f"n={count} wrote past its end"
        info2 = be.api_cache_info()
        assert (info2["misses"] - info["misses"], info2["hits"] - info["hits"]) == (2, 1)
    finally:
        for h in (ha, hb, hc, x, o):
            be.free(h)


def test_cache_is_bounded(backend_name: str, rng: np.random.Generator) -> None:
    be = ember.backend(backend_name)  # a backend of its own: the session's cache is left alone
    bound = be.api_cache_info()["bound"]
    assert 16 <= bound <= 1024
    n = 64
    ins = [upload(be, rng.standard_normal(n, np.float32)) for _ in range(16)]
    outs = [be.alloc(n * 4) for _ in range(-(-(bound + 40) // 16))]
    calls = [(i, o) for o in outs for i in ins][: bound + 40]
    try:
        for i, o in calls:
            be.unary("relu", i, o, n)
        info = be.api_cache_info()
        assert info["entries"] == bound and info["evictions"] == 40 and info["misses"] == bound + 40
        first_in, first_out = calls[0]  # evicted: recorded again, and right
        be.unary("relu", first_in, first_out, n)
        assert be.api_cache_info()["misses"] == bound + 41
        np.testing.assert_array_equal(download(be, first_out, n), np.maximum(download(be, first_in, n), 0))
        last_in, last_out = calls[-1]  # still cached: a replay
        be.unary("relu", last_in, last_out, n)
        assert be.api_cache_info()["hits"] == 1
    finally:
        be.release()
    assert be.api_cache_info()["entries"] == 0


def test_recording_settings_are_part_of_the_key(wgpu_be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """wgpu: a setting read while recording (the direct-conv switch) makes a call of its own."""
    be = wgpu_be
    xs, ws = rng.standard_normal((1, 8, 6, 6), np.float32), rng.standard_normal((8, 8, 3, 3), np.float32)
    x, w, o = upload(be, xs), upload(be, ws), be.alloc(8 * 6 * 6 * 4)
    try:
        be.conv2d_forward(x, (1, 8, 6, 6), w, (8, 8, 3, 3), o, (1, 8, 6, 6), 1, 1)
        start = be.api_cache_info()
        with settings.override(direct_conv=False):
            be.conv2d_forward(x, (1, 8, 6, 6), w, (8, 8, 3, 3), o, (1, 8, 6, 6), 1, 1)
        _close(download(be, o, (1, 8, 6, 6)), _conv_ref(xs, ws, 1), "conv2d, direct_conv=0", 1e-4)
        be.conv2d_forward(x, (1, 8, 6, 6), w, (8, 8, 3, 3), o, (1, 8, 6, 6), 1, 1)
        info = be.api_cache_info()
        assert (info["misses"] - start["misses"], info["hits"] - start["hits"]) == (1, 1)
    finally:
        for h in (x, w, o):
            be.free(h)


def test_commands_failing_validation_raise_on_every_call(wgpu_be: ember.ComputeBackend,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """wgpu: a cache hit replays without wgpu-py's error capture (encode.replay_checked_before), which is sound only
    because an entry is kept after a first run through the checked calls succeeded. Steps that fail validation (a
    grid past the adapter's workgroup limit) raise on the first call, are never kept, and so raise on every call;
    the valid steps recorded afterwards run, and replay."""
    import wgpu

    from ember.backends.wgpu.program import WORKGROUPS_PER_DIM

    be, n = wgpu_be, 4096
    x, y = upload(be, np.arange(n, dtype=np.float32) - n / 2), be.alloc(n * 4)
    try:
        good = be.record_unary(ember.UnaryOp.RELU, x, y, n)
        bad = [good[0]._replace(grid=(WORKGROUPS_PER_DIM + 1, 1, 1)), *good[1:]]
        monkeypatch.setattr(be, "record_unary", lambda *args: bad)
        start = be.api_cache_info()
        for _ in range(3):
            with pytest.raises(wgpu.GPUError):
                be.unary("relu", x, y, n)
        info = be.api_cache_info()
        assert (info["misses"] - start["misses"], info["hits"] - start["hits"]) == (3, 0)
        assert info["entries"] == start["entries"]
        monkeypatch.undo()
        for _ in range(3):
            be.unary("relu", x, y, n)
        info = be.api_cache_info()
        assert (info["misses"] - start["misses"], info["hits"] - start["hits"]) == (4, 2)
        np.testing.assert_array_equal(download(be, y, n), np.maximum(np.arange(n, dtype=np.float32) - n / 2, 0))
    finally:
        be.free(x)
        be.free(y)


def test_same_call_from_several_threads(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """Threads making the same call (one cache key) and calls of their own at once: every result right, and the
    shared key holds one entry at the end."""
    n = 4096
    xs = rng.standard_normal(n, np.float32)
    x, shared = upload(be, xs), be.alloc(n * 4)
    errors: list[str] = []
    start = be.api_cache_info()

    def work(seed: int) -> None:
        try:
            own_in = upload(be, np.full(n, seed, np.float32))
            own_out = be.alloc(n * 4)
            for _ in range(25):
                be.unary("tanh", x, shared, n)  # every thread writes the same values here
                be.binary("add", x, own_in, own_out, n)
            np.testing.assert_allclose(download(be, own_out, n), xs + seed, rtol=1e-6)
            be.free(own_in)
            be.free(own_out)
        except BaseException as e:  # reported by the main thread
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors[:2]
        np.testing.assert_allclose(download(be, shared, n), np.tanh(xs.astype(np.float64)), rtol=1e-5, atol=1e-6)
        info = be.api_cache_info()
        assert info["hits"] + info["misses"] - start["hits"] - start["misses"] == 6 * 50
        assert info["entries"] - start["entries"] == 1  # the shared call; each thread's own went with its handles
    finally:
        be.free(x)
        be.free(shared)


def test_small_replays_wait_for_one_submit_and_keep_queue_order() -> None:
    """wgpu holds small public-op replays back for one submit (encode.Pending); every write, read, free and model
    run reaches the queue after them, so results are those of the calls in the order they were made."""
    if "wgpu" not in ember.available_backends():
        pytest.skip("no wgpu adapter")
    be = ember.backend("wgpu")
    n = 1024
    a, b, c = (be.alloc(n * 4) for _ in range(3))
    rng = np.random.default_rng(7)
    waited = 0
    for it in range(40):
        x = rng.standard_normal(n).astype(np.float32)
        be.copy_htod(a, x)
        be.unary("relu", a, b, n)
        be.binary("add", b, a, c, n)
        be.unary("neg", c, b, n)  # b = -(relu(x) + x), read before the next write of a
        waited = max(waited, len(be._pending.cbs))
        be.copy_htod(a, np.zeros(n, np.float32))
        got = np.empty(n, np.float32)
        be.copy_dtoh(got, b)
        np.testing.assert_array_equal(got, -(np.maximum(x, 0) + x), err_msg=f"round {it}")
        if it % 10 == 9:  # a buffer freed right after calls that bind it: they run before it goes
            t = be.alloc(n * 4)
            be.unary("relu", a, t, n)
            be.binary("add", a, t, c, n)
            be.free(t)
            be.synchronize()
    assert waited >= 1, "no replay waited for a shared submit"
    for h in (a, b, c):
        be.free(h)
