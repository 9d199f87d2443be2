"""The cpu backend's convs share one im2col scratch buffer: padding must be re-zeroed on every run, and a step
recorded before the buffer grew must rebind to the grown one."""

from __future__ import annotations

import numpy as np

from ember.backends.base import View
from ember.backends.cpu import CpuBackend

from .helpers import download, poisoned, rel_err, upload
from .test_conv2d import F32, TOL, conv_ref, out_hw


def _conv(be: CpuBackend, rng: np.random.Generator, xshape: tuple[int, ...], k: int, r: int, stride: int,
          pad: int) -> tuple:
    n, c, h, w = xshape
    x = rng.standard_normal(xshape).astype(np.float32)
    f = rng.standard_normal((k, c, r, r)).astype(np.float32)
    p, q = out_hw(h, w, r, r, (stride, stride), (pad,) * 4, (1, 1))
    hx, hf, ho = upload(be, x), upload(be, f), poisoned(be, n * k * p * q)
    steps = be.record_conv(View.contiguous(hx, F32, xshape), View.contiguous(hf, F32, f.shape), None,
                           View.contiguous(ho, F32, (n, k, p, q)), (stride, stride), (pad,) * 4, (1, 1), 1)
    ref = conv_ref(x, f, None, (stride, stride), (pad,) * 4)
    return steps, lambda: download(be, ho, (n, k, p, q)), ref


def test_shared_scratch_padding_and_growth(rng: np.random.Generator) -> None:
    be = CpuBackend().init()
    # No padding: fills the whole scratch with data, where the padded conv below needs zeros.
    dense, got_dense, ref_dense = _conv(be, rng, (1, 8, 12, 12), 5, 3, 1, 0)
    padded, got_padded, ref_padded = _conv(be, rng, (1, 8, 9, 9), 4, 3, 2, 2)
    for _ in range(2):
        be.execute(dense + padded)
        assert rel_err(got_dense(), ref_dense) <= TOL
        assert rel_err(got_padded(), ref_padded) <= TOL
    # A bigger conv grows the scratch: the steps recorded before move to the new buffer.
    big, got_big, ref_big = _conv(be, rng, (2, 16, 20, 20), 6, 5, 1, 2)
    be.execute(big + dense + padded + big)
    for got, ref in ((got_big, ref_big), (got_dense, ref_dense), (got_padded, ref_padded)):
        assert rel_err(got(), ref) <= TOL
