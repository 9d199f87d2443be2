"""ember.ray on a local Ray cluster (loopback, 2 CPUs, started once for this module and shut down): a 2,000-sample
dataset through OnnxPredictor on the cpu backend and on wgpu, outputs equal to direct runs, throughput printed.

Ray is in the test extras: these tests run wherever the suite does (no skip when it is missing)."""

from __future__ import annotations

import concurrent.futures
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import ray
import ray.data

import ember
import ember.ray as er
from tests.unit.test_plan_cache import conv3x3, mlp

SAMPLES = 2000
TIMEOUT_S = 120  # one pipeline, actor start included; the whole module takes ~40 s on 2 cores


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, num_gpus=0, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, logging_level="ERROR")
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The models as files: every actor reads its own copy of the model from the path."""
    root = tmp_path_factory.mktemp("ray_models")
    paths = {}
    for name, build in (("mlp", mlp), ("conv3x3", conv3x3)):
        paths[name] = root / f"{name}.onnx"
        onnx.save(build(), str(paths[name]))
    return paths


def bounded(fn: Callable[[], Any]) -> Any:
    """fn() in a thread, failing the test after TIMEOUT_S (ray.shutdown in the fixture stops what is left)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(fn).result(timeout=TIMEOUT_S)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def dataset(x: np.ndarray) -> ray.data.Dataset:
    """Columns "id" and "image": rows of x, made from ray.data.range in the workers."""
    def rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"id": batch["id"], "image": x[batch["id"]]}

    return ray.data.range(len(x)).map_batches(rows, batch_format="numpy")


def collect(ds: ray.data.Dataset, label: str, capsys: pytest.CaptureFixture) -> dict[str, np.ndarray]:
    """Every row, sorted by id (Ray Data need not keep the order), with the pipeline's throughput printed."""
    t0 = time.perf_counter()
    out = bounded(lambda: ds.take_batch(SAMPLES + 1, batch_format="numpy"))
    wall = time.perf_counter() - t0
    order = np.argsort(out["id"])
    with capsys.disabled():
        print(f"\n[ray] {label}: {len(order)} samples in {wall:.2f} s = {len(order) / wall:.0f} samples/s "
              f"(actor start and model load included)", file=sys.stderr)
    return {k: v[order] for k, v in out.items()}


def test_cpu_predict_equals_direct_runs(cluster: None, models: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    x = np.random.default_rng(0).standard_normal((SAMPLES, 16)).astype(np.float32)
    ds = er.predict(dataset(x), str(models["mlp"]), backend="cpu", input_columns={"image": "x"},
                    output_columns={"y": "logits"}, passthrough=["id"], batch_size=250, num_cpus=0.5)
    out = collect(ds, "cpu mlp, 1 actor, batch 250", capsys)
    assert sorted(out) == ["id", "logits"]
    np.testing.assert_array_equal(out["id"], np.arange(SAMPLES))
    ref = ember.load_onnx(models["mlp"], backend="cpu")
    # The same batches as the actor ran (250 rows each): bit-exact on the cpu backend.
    direct = np.concatenate([ref.run({"x": x[i:i + 250]})["y"] for i in range(0, SAMPLES, 250)])
    np.testing.assert_array_equal(out["logits"], direct)


def test_wgpu_two_actors(cluster: None, models: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    """Two actors on the one adapter (lavapipe), each loading the model once, through map_batches by hand."""
    x = np.random.default_rng(1).standard_normal((SAMPLES, 4, 8, 8)).astype(np.float32)
    ds = dataset(x).map_batches(er.OnnxPredictor, fn_constructor_kwargs={
        "model": str(models["conv3x3"]), "backend": "wgpu", "input_columns": ["image"], "passthrough": ["id"]},
        batch_format="numpy", batch_size=200, num_gpus=0, num_cpus=0.5, **er.actor_pool(2))
    out = collect(ds, "wgpu conv3x3, 2 actors, batch 200", capsys)
    ref = ember.load_onnx(models["conv3x3"], backend="wgpu")
    direct = np.concatenate([ref.run({"x": x[i:i + 200]})["y"] for i in range(0, SAMPLES, 200)])
    np.testing.assert_allclose(out["y"], direct, rtol=1e-4, atol=1e-4)


def test_wgpu_precision_f16(cluster: None, models: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    be = ember.backend("wgpu")
    if "shader-f16" not in be.features:
        pytest.skip("the adapter lacks shader-f16")
    x = np.random.default_rng(2).standard_normal((SAMPLES // 4, 16)).astype(np.float32)
    ds = er.predict(dataset(x), str(models["mlp"]), backend="wgpu", precision="f16", input_columns={"image": "x"},
                    passthrough=["id"], batch_size=100, num_cpus=0.5)
    out = collect(ds, "wgpu mlp f16, 1 actor, batch 100", capsys)
    ref = ember.load_onnx(models["mlp"], backend=be, precision="f16")
    direct = np.concatenate([ref.run({"x": x[i:i + 100]})["y"] for i in range(0, len(x), 100)])
    np.testing.assert_allclose(out["y"], direct, rtol=1e-3, atol=1e-3)


def test_bad_batches_fail_with_the_models_error(cluster: None, models: dict[str, Path]) -> None:
    """A wrong dtype: Model.run's ValueError, raised in the driver with the actor's traceback (Ray wraps it in a
    RayTaskError(UserCodeException) whose text holds it); a missing column names the columns there are."""
    ints = np.arange(10 * 16, dtype=np.int64).reshape(10, 16)
    for ds, message in (
            (er.predict(dataset(ints), str(models["mlp"]), backend="cpu", input_columns={"image": "x"}, num_cpus=0.5),
             "ValueError: input 'x': expected dtype float32, got int64"),
            (er.predict(dataset(ints.astype(np.float32)), str(models["mlp"]), backend="cpu", num_cpus=0.5),
             "ValueError: batch column(s) ['x'] missing; the batch has ['id', 'image']")):
        with pytest.raises(Exception) as info:  # noqa: B017 (Ray's own exception type, checked below)
            bounded(ds.materialize)
        text = "\n".join(str(e) for e in (info.value, info.value.__cause__) if e is not None)
        assert message in text, text


def test_actor_index_counter(cluster: None) -> None:
    """Where Ray assigned no GPUs, actors take the adapters in turn: a named counter hands out 0, 1, 2, ..."""
    first = er._actor_index()
    assert er._actor_index() == first + 1


def test_pick_adapter() -> None:
    gpus = ["NVIDIA H200 (Vulkan, DiscreteGPU)"] * 4 + ["llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, CPU)"]
    never = lambda: pytest.fail("the actor index is not needed here")  # noqa: E731
    assert er.pick_adapter([2], gpus, never) == 2
    assert er.pick_adapter(["3"], gpus, never) == 3
    assert er.pick_adapter([5], gpus, never) == 1  # more Ray GPUs than adapters: wrapped
    assert er.pick_adapter([], gpus, lambda: 7) == 2  # no GPU from Ray: in turn over all 5 adapters
    assert er.pick_adapter(["GPU-1b2c"], gpus, lambda: 1) == 1  # a UUID: in turn
    assert er.pick_adapter([], gpus[-1:], never) == 0  # one adapter
    assert er.pick_adapter([0], gpus[-1:], lambda: 4) == 0  # only a software adapter: in turn over it


def test_columns_and_missing_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    assert er._columns(None, ["x"], "input") == {"x": "x"}
    assert er._columns(["a", "b"], ["x", "y"], "input") == {"a": "x", "b": "y"}
    assert er._columns(["p"], ["y"], "output") == {"y": "p"}
    with pytest.raises(ValueError, match="input_columns: 1 column"):
        er._columns(["a"], ["x", "y"], "input")
    with pytest.raises(ValueError, match="unknown output"):
        er._columns({"z": "col"}, ["y"], "output")
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"ember\[ray\]"):
        er.require_ray()
