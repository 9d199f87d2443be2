"""Consecutive steps that touch disjoint memory share one parallel region (CpuBackend.execute with
parallel.merge_regions): a ResNet downsampling block's strided 3x3 conv and its 1x1 shortcut, both reading the
block's input. Steps that depend on each other, or that both use the shared scratch, keep a barrier between."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backends.base import View
from ember.backends.cpu import CpuBackend, native, parallel
from ember.backends.cpu import conv as cpu_conv
from ember.core.expr import call, inp

from .helpers import download, poisoned, rel_err, upload
from .test_conv2d import F32, TOL, conv_ref, out_hw

RELU = call("relu", inp(0))
_POOL = parallel.Pool(1)  # the caller and one worker: the convs split even where EMBER_CPU_THREADS=1


@pytest.fixture(autouse=True)
def two_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "pool", lambda: _POOL)
    monkeypatch.setattr(parallel, "SPLIT_MACS", 0)


@pytest.fixture
def regions(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Per execute: the task count of each region it ran."""
    seen: list[list[int]] = []
    run = parallel.Pool.run_program

    def spy(self: parallel.Pool, items: list) -> None:
        seen.append([len(x.tasks) for x in items if isinstance(x, parallel.Region)])
        run(self, items)

    monkeypatch.setattr(parallel.Pool, "run_program", spy)
    return seen


def conv(be: CpuBackend, hx: int, xshape: tuple[int, ...], f: np.ndarray, b: np.ndarray | None, stride, pads,
         act=None) -> tuple[list, int, tuple[int, ...]]:
    n, _, h, w = xshape
    k, _, r, s = f.shape
    p, q = out_hw(h, w, r, s, stride, pads, (1, 1))
    ho = poisoned(be, n * k * p * q)
    bias = View.contiguous(upload(be, b), F32, (k,)) if b is not None else None
    steps = be.record_conv(View.contiguous(hx, F32, xshape), View.contiguous(upload(be, f), F32, f.shape), bias,
                           View.contiguous(ho, F32, (n, k, p, q)), stride, pads, (1, 1), 1, act, const_weight=True)
    return steps, ho, (n, k, p, q)


@pytest.mark.parametrize("xshape", [(1, 32, 28, 28), (1, 48, 15, 13), (2, 16, 14, 14)])
def test_strided_conv_and_shortcut_share_a_region(xshape, regions: list[list[int]],
                                                  rng: np.random.Generator) -> None:
    be = CpuBackend().init()
    c = xshape[1]
    x = rng.standard_normal(xshape).astype(np.float32)
    f3 = rng.standard_normal((2 * c, c, 3, 3)).astype(np.float32)
    f1 = rng.standard_normal((2 * c, c, 1, 1)).astype(np.float32)
    b3 = rng.standard_normal(2 * c).astype(np.float32)
    hx = upload(be, x)
    body, h3, s3 = conv(be, hx, xshape, f3, b3, (2, 2), (1, 1, 1, 1), RELU)
    short, h1, s1 = conv(be, hx, xshape, f1, None, (2, 2), (0, 0, 0, 0))
    for _ in range(2):
        be.execute(body + short)
        assert rel_err(download(be, h3, s3), conv_ref(x, f3, b3, (2, 2), (1, 1, 1, 1), act=RELU)) <= TOL
        assert rel_err(download(be, h1, s1), conv_ref(x, f1, None, (2, 2))) <= TOL
    assert regions[-1] == [4]  # both convs' two parts, one region


def test_dependent_convs_keep_their_barrier(regions: list[list[int]], rng: np.random.Generator) -> None:
    """The second conv reads the first's output: two regions."""
    be = CpuBackend().init()
    xshape = (1, 32, 16, 16)
    x = rng.standard_normal(xshape).astype(np.float32)
    f1 = rng.standard_normal((32, 32, 1, 1)).astype(np.float32)
    f2 = rng.standard_normal((32, 32, 1, 1)).astype(np.float32)
    first, h1, s1 = conv(be, upload(be, x), xshape, f1, None, (2, 2), (0, 0, 0, 0))
    second, h2, s2 = conv(be, h1, s1, f2, None, (1, 1), (0, 0, 0, 0))
    be.execute(first + second)
    assert regions[-1] == [2, 2]
    want = conv_ref(conv_ref(x, f1, None, (2, 2)).astype(np.float32), f2)
    assert rel_err(download(be, h2, s2), want) <= TOL


@pytest.mark.parametrize("direct", [False, True], ids=["im2col", "native-direct"])
def test_two_window_convs(monkeypatch: pytest.MonkeyPatch, regions: list[list[int]], rng: np.random.Generator,
                          direct: bool) -> None:
    """Independent convs: through im2col both fill the backend's one scratch buffer, so two regions; through the
    compiled direct conv (no scratch) one region of four tasks."""
    if direct and not native.available():
        pytest.skip("the compiled kernels are not built here, or this CPU lacks AVX-512F")
    monkeypatch.setattr(cpu_conv, "DIRECT_NATIVE", direct)
    be = CpuBackend().init()
    xshape = (1, 16, 20, 20)
    x = rng.standard_normal(xshape).astype(np.float32)
    fa = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    fb = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
    hx = upload(be, x)
    a, ha, sa = conv(be, hx, xshape, fa, None, (2, 2), (1, 1, 1, 1))
    b, hb, sb = conv(be, hx, xshape, fb, None, (1, 1), (1, 1, 1, 1))
    be.execute(a + b)
    assert regions[-1] == ([4] if direct else [2, 2])
    assert rel_err(download(be, ha, sa), conv_ref(x, fa, None, (2, 2), (1, 1, 1, 1))) <= TOL
    assert rel_err(download(be, hb, sb), conv_ref(x, fb, None, (1, 1), (1, 1, 1, 1))) <= TOL


def test_access_conflicts() -> None:
    buf = np.zeros(100, np.float32)
    a, b, c = buf[:40], buf[40:80], buf[80:]
    assert not parallel.Access([a], [b], False).conflicts(parallel.Access([a], [c], False))  # both read a
    assert parallel.Access([a], [b], False).conflicts(parallel.Access([b[5:]], [c], False))  # reads b: written
    assert parallel.Access([a], [b], False).conflicts(parallel.Access([c], [a[:1]], False))  # writes what is read
    assert parallel.Access([a], [b], False).conflicts(parallel.Access([c], [b[-1:]], False))  # both write b
    assert parallel.Access([a], [b], True).conflicts(parallel.Access([a], [c], True))  # both use the scratch
