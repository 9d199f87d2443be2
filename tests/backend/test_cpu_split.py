"""The cpu backend splits large products over its thread pool (one OpenBLAS thread each): convs by bands of
output rows or by input channels (partial products, summed after), 1x1 convs by columns or channels, matmuls by
batch, rows or columns, max pooling by channels. Each split must give the whole op's result; shapes here are
large enough to split."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ember.backends.base import View
from ember.backends.cpu import CpuBackend, parallel
from ember.core.expr import call, const, eval_numpy, inp

from .helpers import download, poisoned, rel_err, upload
from .test_conv2d import F32, TOL, conv_ref, out_hw

RELU = call("relu", inp(0))
_POOL = parallel.Pool(1)  # the caller and one worker: every split below runs even where EMBER_CPU_THREADS=1


@pytest.fixture(autouse=True)
def two_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "pool", lambda: _POOL)

CONVS = [
    # (N, C, H, W), (K, R, S), stride, pads, dilation, groups, bias, act
    ((1, 16, 20, 20), (32, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, True, RELU),  # rows
    ((1, 3, 61, 57), (16, 7, 7), (2, 2), (3, 2, 3, 1), (1, 1), 1, True, None),  # a stem: rows, phases
    ((1, 64, 4, 4), (128, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, True, RELU),  # weight-heavy: channels
    ((1, 64, 7, 6), (192, 3, 3), (2, 2), (1, 0, 1, 1), (1, 1), 1, False, None),  # strided, channels
    ((1, 37, 9, 7), (256, 3, 3), (2, 2), (0, 2, 1, 1), (1, 1), 1, True, RELU),  # odd channels, strided
    ((2, 33, 6, 5), (128, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, True, RELU),  # channels, batch
    ((2, 16, 18, 18), (32, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 2, True, None),  # dilated, grouped, batch
    ((1, 64, 24, 24), (64, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, True, RELU),  # 1x1: columns
    ((1, 256, 5, 5), (512, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, True, None),  # 1x1: channels
    ((3, 64, 12, 12), (64, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, False, None),  # 1x1: images
    ((1, 64, 47, 47), (96, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1, True, None),  # strided 1x1: rows
    ((1, 128, 14, 13), (256, 1, 1), (2, 3), (0, 0, 0, 0), (1, 1), 1, True, RELU),  # strided 1x1: channels
    ((2, 64, 30, 29), (64, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1, False, None),  # strided 1x1: images
]


@pytest.mark.parametrize(("xshape", "wshape", "stride", "pads", "dil", "groups", "with_bias", "act"), CONVS,
                         ids=[f"{c[0]}-{c[1]}-s{c[2][0]}-g{c[5]}" for c in CONVS])
def test_conv_split_matches_reference(xshape, wshape, stride, pads, dil, groups, with_bias, act,
                                      rng: np.random.Generator) -> None:
    be = CpuBackend().init()
    n, c, h, w = xshape
    k, r, s = wshape
    x = rng.standard_normal(xshape).astype(np.float32)
    f = rng.standard_normal((k, c // groups, r, s)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32) if with_bias else None
    p, q = out_hw(h, w, r, s, stride, pads, dil)
    hx, hf, ho = upload(be, x), upload(be, f), poisoned(be, n * k * p * q)
    bias = View.contiguous(upload(be, b), F32, (k,)) if b is not None else None
    steps = be.record_conv(View.contiguous(hx, F32, xshape), View.contiguous(hf, F32, f.shape), bias,
                           View.contiguous(ho, F32, (n, k, p, q)), stride, pads, dil, groups, act, const_weight=True)
    ref = conv_ref(x, f, b, stride, pads, dil, groups, act)
    for _ in range(2):
        be.execute(steps)
        assert rel_err(download(be, ho, (n, k, p, q)), ref) <= TOL


MATMULS = [
    # a (B, M, K), b (B, K, N), bias shape or None, alpha, beta, act
    ((4, 64, 96), (4, 96, 80), None, 1.0, 1.0, None),  # batch
    ((1, 300, 128), (1, 128, 64), (64,), 1.0, 1.0, RELU),  # rows
    ((1, 4, 512), (1, 512, 1000), (1000,), 0.5, 2.0, None),  # columns (an FC layer)
    ((1, 1, 2048), (1, 2048, 1000), (1, 1000), 1.0, 1.0, call("sigmoid", inp(0))),  # one row: columns
    ((3, 100, 64), (1, 64, 200), (3, 100, 200), 1.0, -1.0, None),  # b broadcast over the batch
]


@pytest.mark.parametrize(("ashape", "bshape", "bias_shape", "alpha", "beta", "act"), MATMULS,
                         ids=[f"{m[0]}x{m[1]}" for m in MATMULS])
def test_matmul_split_matches_reference(ashape, bshape, bias_shape, alpha, beta, act,
                                        rng: np.random.Generator) -> None:
    be = CpuBackend().init()
    a = rng.standard_normal(ashape).astype(np.float32)
    bm = rng.standard_normal(bshape).astype(np.float32)
    out_shape = (max(ashape[0], bshape[0]), ashape[1], bshape[2])
    av = View.contiguous(upload(be, a), F32, ashape).broadcast_to((out_shape[0], *ashape[1:]))
    bv = View.contiguous(upload(be, bm), F32, bshape).broadcast_to((out_shape[0], *bshape[1:]))
    c = rng.standard_normal(bias_shape).astype(np.float32) if bias_shape is not None else None
    cv = View.contiguous(upload(be, c), F32, bias_shape) if c is not None else None
    ho = poisoned(be, int(np.prod(out_shape)))
    steps = be.record_matmul(av, bv, View.contiguous(ho, F32, out_shape), alpha=alpha, bias=cv, beta=beta, act=act)
    assert isinstance(steps[0], functools.partial)  # pool.run over the parts
    ref = alpha * np.matmul(a.astype(np.float64), bm.astype(np.float64))
    if c is not None:
        ref = ref + beta * c.astype(np.float64)
    if act is not None:
        ref = eval_numpy(act, [ref], np.float64)
    be.execute(steps)
    assert rel_err(download(be, ho, out_shape), np.broadcast_to(ref, out_shape)) <= TOL


@pytest.mark.parametrize(("xshape", "kernel", "stride", "pads", "dil"), [
    ((1, 64, 112, 112), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # ResNet's
    ((2, 5, 33, 31), (3, 2), (2, 3), (1, 0, 2, 1), (1, 2)),
    ((1, 3, 9, 9), (5, 5), (1, 1), (4, 4, 4, 4), (1, 1)),  # windows of padding only: -inf
])
def test_max_pool_separable(xshape, kernel, stride, pads, dil, rng: np.random.Generator) -> None:
    be = CpuBackend().init()
    x = rng.standard_normal(xshape).astype(np.float32)
    x.reshape(-1)[:: 97] = np.nan  # NaN propagates
    n, c, h, w = xshape
    (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw) = kernel, stride, pads, dil
    p, q = out_hw(h, w, kh, kw, stride, pads, dil)
    hx, ho = upload(be, x), poisoned(be, n * c * p * q)
    be.execute(be.record_pool("max", View.contiguous(hx, F32, xshape), View.contiguous(ho, F32, (n, c, p, q)),
                              kernel, stride, pads, dil, False))
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=-np.inf)
    taps = [xp[:, :, i * dh: i * dh + (p - 1) * sh + 1: sh, j * dw: j * dw + (q - 1) * sw + 1: sw]
            for i in range(kh) for j in range(kw)]
    ref = taps[0]
    for t in taps[1:]:
        ref = np.maximum(ref, t)
    np.testing.assert_array_equal(download(be, ho, (n, c, p, q)), ref)


def test_blas_thread_count_restored() -> None:
    """Running steps holds OpenBLAS to one thread and gives its count back afterwards, nested runs included."""
    hold = parallel.one_blas_thread()
    if hold is None:
        pytest.fail("numpy here should run on an OpenBLAS that ember finds and can hold to one thread")
    before = hold._get()
    be = CpuBackend().init()
    h = upload(be, np.ones(4, np.float32))
    seen = []
    be.execute([lambda: seen.append(hold._get()), lambda: be.execute([lambda: seen.append(hold._get())]),
                lambda: seen.append(hold._get())])
    assert seen == [1, 1, 1]
    assert hold._get() == before
    be.free(h)


def test_relu6_epilogue_on_split_conv(rng: np.random.Generator) -> None:
    """A clip epilogue (compiled once per part) on a conv split by rows."""
    be = CpuBackend().init()
    act = call("min", call("max", inp(0), const(0.0)), const(6.0))
    x = rng.standard_normal((1, 16, 30, 30)).astype(np.float32) * 3
    f = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
    hx, hf, ho = upload(be, x), upload(be, f), poisoned(be, 24 * 28 * 28)
    be.execute(be.record_conv(View.contiguous(hx, F32, x.shape), View.contiguous(hf, F32, f.shape), None,
                              View.contiguous(ho, F32, (1, 24, 28, 28)), (1, 1), (0, 0, 0, 0), (1, 1), 1, act))
    assert rel_err(download(be, ho, (1, 24, 28, 28)), conv_ref(x, f, act=act)) <= TOL


@pytest.mark.parametrize(("b", "hq", "hkv", "causal", "masked"), [(1, 4, 4, False, True), (1, 8, 2, True, False),
                                                                (3, 1, 1, True, True)])
def test_attention_split_matches_whole(b, hq, hkv, causal, masked, rng: np.random.Generator) -> None:
    from ember.backends.cpu.attention import attention_numpy

    be = CpuBackend().init()
    sq, skv, d = 96, 128, 64
    q = rng.standard_normal((b, hq, sq, d)).astype(np.float32)
    k = rng.standard_normal((b, hkv, skv, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, skv, d)).astype(np.float32)
    mask = rng.standard_normal((1, 1, sq, skv)).astype(np.float32) if masked else None
    views = [View.contiguous(upload(be, a), F32, a.shape) for a in (q, k, v)]
    mv = View.contiguous(upload(be, mask), F32, mask.shape).broadcast_to((b, hq, sq, skv)) if masked else None
    ho = poisoned(be, b * hq * sq * d)
    be.execute(be.record_attention_views(*views, mv, View.contiguous(ho, F32, (b, hq, sq, d)), 0.125, causal))
    rep = hq // hkv
    m = np.broadcast_to(mask, (b, hq, sq, skv)) if masked else None
    if causal:
        i, j = np.arange(sq)[:, None], np.arange(skv)[None, :]
        cm = np.where(j <= i + (skv - sq), 0.0, -np.inf).astype(np.float32)
        m = cm if m is None else m + cm
    ref = attention_numpy(q, np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1), np.float32(0.125), m)
    assert rel_err(download(be, ho, (b, hq, sq, d)), ref) <= 1e-5


@pytest.mark.parametrize("total", [0, 1, 2, 3, 7, 28, 112, 513])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_spans_cover_and_lead(total: int, parts: int) -> None:
    """The pool's split: contiguous, non-empty ranges covering range(total), the caller's first no smaller than
    any other (it starts first: parallel.LEAD) and none more than one item plus LEAD off an even share."""
    got = parallel.spans(total, parts)
    assert got[0][0] == 0 and got[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(got, got[1:], strict=False))
    assert len(got) == max(1, min(parts, total))
    if total:
        sizes = [b - a for a, b in got]
        assert min(sizes) >= 1 and sizes[0] >= max(sizes)
        assert sizes[0] <= total / len(got) + parallel.LEAD * total + 1


def test_spans_lead_from_time() -> None:
    """A short split (work of a few head starts) gives the caller a larger lead, capped at 25% of the whole."""
    assert parallel.spans(100, 2, seconds=1.0) == parallel.spans(100, 2)  # long: the flat LEAD
    first = parallel.spans(100, 2, seconds=parallel.HEAD_START_S * 4)[0][1]
    assert parallel.spans(100, 2)[0][1] < first <= 75
    assert parallel.spans(100, 2, seconds=1e-9)[0] == (0, 75)


def test_phases_order_and_errors() -> None:
    """parallel.Phases: every first part runs before any second part; a failing first part skips the second
    parts, its own exception reaches the caller, and the next run works again."""
    import threading

    log: list[str] = []
    lock = threading.Lock()
    fail = [True]

    def step(name: str, raises: bool = False):
        def run() -> None:
            if raises and fail[0]:
                raise ValueError("first part failed")
            with lock:
                log.append(name)
        return run

    phases = parallel.Phases(_POOL, [step("a0"), step("a1", raises=True)], [step("b0"), step("b1")])
    with pytest.raises(ValueError, match="first part failed"):
        phases()
    assert not any(e.startswith("b") for e in log)
    fail[0] = False
    for _ in range(3):
        log.clear()
        phases()
        assert sorted(log[:2]) == ["a0", "a1"] and sorted(log[2:]) == ["b0", "b1"]


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize(("xshape", "k"), [((1, 16, 6, 6), 64), ((1, 7, 5, 6), 40), ((2, 8, 5, 7), 96)])
def test_winograd_channel_split_in_phases(m: int, xshape: tuple, k: int, rng: np.random.Generator) -> None:
    """A Winograd conv with more output channels than tiles: the input transform over ranges of input channels,
    a barrier, then the products over ranges of output channels, in one region (parallel.Phases)."""
    from ember.core import winograd

    from .test_cpu_winograd import TOL as WTOL
    from .test_cpu_winograd import _record

    be = CpuBackend().init()
    n, c, h, w = xshape
    x = rng.standard_normal(xshape).astype(np.float32)
    f = rng.standard_normal((k, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    steps, ho = _record(be, x, winograd.transform_weights(f, m), b, (1, 1, 1, 1), m, RELU, (n, k, h, w))
    want = conv_ref(x, f, b, (1, 1), (1, 1, 1, 1), act=RELU)
    calls: list[int] = []
    run = _POOL.run
    _POOL.run = lambda tasks: (calls.append(len(tasks)), run(tasks))[1]  # type: ignore[method-assign]
    try:
        for _ in range(2):
            be.execute(steps)  # through Pool.run_program: the phases as two regions of one program
            assert rel_err(download(be, ho, (n, k, h, w)), want) <= WTOL[m]
            with parallel.one_blas_thread():
                steps[0]()  # alone: parallel.Phases
            assert rel_err(download(be, ho, (n, k, h, w)), want) <= WTOL[m]
    finally:
        del _POOL.run
    assert calls == [2, 2]  # one region a run of the step alone


def _logger(log: list[str], name: str, fail: list[bool] | None = None):
    import threading

    lock = threading.Lock()

    def run() -> None:
        if fail is not None and fail[0]:
            raise ValueError(f"{name} failed")
        with lock:
            log.append(name)

    return run


def test_run_program_order_and_errors() -> None:
    """Pool.run_program: regions in order with a barrier after each, the callables after a region once it is
    done, OnCaller items between stretches; a failing task stops the rest, and the next run works."""
    log: list[str] = []
    fail = [True]
    r = parallel.Region
    items = [_logger(log, "s0"), r(_POOL, [_logger(log, "a0"), _logger(log, "a1"), _logger(log, "a2")]),
             _logger(log, "f1"), _logger(log, "f2"), r(_POOL, [_logger(log, "b0"), _logger(log, "b1", fail)]),
             _logger(log, "f3"), r(_POOL, [_logger(log, "c0"), _logger(log, "c1")]),
             parallel.OnCaller(_logger(log, "g")), r(_POOL, [_logger(log, "d0"), _logger(log, "d1")]),
             r(_POOL, [_logger(log, "e0"), _logger(log, "e1")]), _logger(log, "f4")]
    with pytest.raises(ValueError, match="b1 failed"):
        _POOL.run_program(items)
    assert "f3" not in log and not any(e[0] in "cdeg" for e in log)
    fail[0] = False
    for _ in range(5):
        log.clear()
        _POOL.run_program(items)
        pos = {e: i for i, e in enumerate(log)}
        assert sorted(log) == sorted(["s0", "a0", "a1", "a2", "f1", "f2", "b0", "b1", "f3", "c0", "c1", "g", "d0",
                                      "d1", "e0", "e1", "f4"])
        order = [["s0"], ["a0", "a1", "a2"], ["f1"], ["f2"], ["b0", "b1"], ["f3"], ["c0", "c1"], ["g"],
                 ["d0", "d1"], ["e0", "e1"], ["f4"]]
        for before, after in zip(order, order[1:], strict=False):
            assert max(pos[e] for e in before) < min(pos[e] for e in after)


def test_run_program_without_a_free_worker() -> None:
    """A worker busy elsewhere never joins: the caller runs the whole program alone instead of waiting."""
    import itertools
    import threading

    pool = parallel.Pool(1)
    release, busy = threading.Event(), threading.Event()

    def block() -> None:
        busy.set()
        release.wait()

    pool._jobs.put([[block], itertools.count(), threading.Lock(), threading.Event(), [], 0])  # as Pool.run posts
    assert busy.wait(5)
    log: list[str] = []
    r = parallel.Region
    pool.run_program([r(pool, [_logger(log, "a0"), _logger(log, "a1")]), _logger(log, "f"),
                      r(pool, [_logger(log, "b0"), _logger(log, "b1")])])
    assert log[:2] in (["a0", "a1"], ["a1", "a0"]) and log[2] == "f" and sorted(log[3:]) == ["b0", "b1"]
    release.set()
