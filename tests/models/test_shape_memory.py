"""Many input shapes through one model: a transformers BERT export (tests/models/encoders.py) fed a new sequence
length per run. The plan cache stays within its bound, the weights are uploaded once, memory stops growing after
the first shapes, and every run matches ONNX Runtime."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import ember
from ember.plan.live import LivePlan

from . import encoders
from .memory import rss_mb

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")



def _lengths(n: int) -> list[int]:
    # Distinct and out of order, 8 ... 507.
    lengths = [8 + (i * 37) % 500 for i in range(n)]
    assert len(set(lengths)) == n
    return lengths


def test_200_sequence_lengths_keep_plans_bounded_and_memory_flat_on_cpu() -> None:
    path = str(encoders.export())
    limit = 4 << 20
    model = ember.load_onnx(path, backend="cpu", plan_cache_bytes=limit)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    be = model.compute_backend
    lengths = _lengths(200)
    rss: list[float] = []
    held = 0
    for i, length in enumerate(lengths):
        feeds = encoders.BERT.feeds(1, length, seed=i)
        got = model.run(feeds)["last_hidden_state"]
        if i % 20 == 0:  # ONNX Runtime every 20th length: the comparison is not what is measured here
            np.testing.assert_allclose(got, sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
        if i % 50 == 49:
            gc.collect()
            rss.append(rss_mb())
        info = model.cache_info()
        assert info["bytes"] <= limit or info["plans"] == 1, info
        held = max(held, info["bytes"])
    info = model.cache_info()
    # Three lengths are planned (they fit the template: the attention scores grow as length²), a fourth is
    # traced to verify it; from it on every length is the template's live plan, moved from length to length
    # (made again with more room when a length needs it).
    assert info["builds"] == 3 and info["from_template"] == 197 and info["traces"] == 4, info
    assert model._families.live_plans == 1 and info["plans"] <= info["builds"] + 1, info
    # The memory target: after the first shapes (which raise the allocator's high-water mark), 150 more
    # lengths grow RSS by at most 5 % plus what the plan cache may hold (its bound, or the one plan above it).
    budget = 0.05 * rss[0] + held / 2**20
    assert rss[-1] - rss[0] <= budget, f"RSS (MB) after 50, 100, 150, 200 lengths: {rss}; budget {budget:.1f} MB"
    before = be.memory_info()["allocations"]
    model.close()
    assert be.memory_info()["allocations"] < before


WGPU_LENGTHS = 200


def test_sequence_lengths_on_wgpu_compile_nothing_after_the_first_and_keep_device_bytes_bounded() -> None:
    """Every record call of the encoder takes runtime sizes on wgpu (the GEMMs' M, the norms' rows, attention's
    query and key lengths): once the template's live plan exists, a new length compiles no pipeline and remakes
    no record call, only writes the kernels' uniform sizes."""
    path = str(encoders.export())
    limit = 4 << 20
    model = ember.load_onnx(path, backend="wgpu", plan_cache_bytes=limit)
    be = model.compute_backend
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    device: list[int] = []
    pipelines: list[int] = []
    live: list[LivePlan] = []
    for i, length in enumerate(_lengths(WGPU_LENGTHS)):
        feeds = encoders.BERT.feeds(1, length, seed=i)
        # The check traces each length the template serves and, on each live move, probes the record calls
        # again and compares their sizes with the fitted ones.
        with ember.settings.override(template_check=True):
            got = model.run(feeds)["last_hidden_state"]
        np.testing.assert_allclose(got, sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4, err_msg=f"length {length}")
        device.append(model.cache_info()["bytes"] + model.cache_info()["weight_bytes"])
        pipelines.append(be.pipelines_created)
        for plan in model._families._live.values():
            assert plan._fast and not plan._remake, f"length {length}: a move remakes record calls"
            live.append(plan)
    info = model.cache_info()
    assert info["builds"] == 3 and info["from_template"] == WGPU_LENGTHS - 3 and info["traces"] == 4, info
    assert info["bytes"] <= limit or info["plans"] == 1
    # The lengths the template serves (the 4th on) compile only the runtime-sized kernels, once: the verifying
    # trace's length makes the first live plan; every later length, on it or on the larger one made when a
    # length did not fit, compiles nothing.
    assert pipelines[-1] == pipelines[3], pipelines
    assert len({id(p) for p in live}) <= 3 and max(p.moves for p in live) > WGPU_LENGTHS // 2
    # The device holds the weights once and the plans within the bound, whatever the number of lengths seen.
    assert max(device) <= limit + info["weight_bytes"] + max(device[0], 16 << 20)
    model.close()
    assert model.cache_info()["plans"] == 0


def test_alternating_two_shapes_stays_correct_on_every_backend(backend_name: str) -> None:
    path = str(encoders.export())
    model = ember.load_onnx(path, backend=backend_name)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = [encoders.BERT.feeds(1, 9, seed=1), encoders.BERT.feeds(2, 23, seed=2)]
    want = [sess.run(None, f)[0] for f in feeds]
    for i in range(100):
        got = model.run(feeds[i % 2])["last_hidden_state"]
        np.testing.assert_allclose(got, want[i % 2], rtol=1e-4, atol=1e-4, err_msg=f"run {i}")
    assert model.cache_info()["builds"] == 2
