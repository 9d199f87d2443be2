"""ember.ray's Ray Serve deployment on a local Ray cluster (loopback, 2 CPUs, no HTTP proxy; started once for this
module and shut down): 64 concurrent requests through a DeploymentHandle on the cpu backend and on wgpu, each reply
equal to a direct run of its request, with Serve batches of more than one request; and the grouping in-process.

Ray Serve is in the test extras: these tests run wherever the suite does (no skip when it is missing)."""

from __future__ import annotations

import concurrent.futures
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import ray
from onnx import TensorProto, helper, numpy_helper
from ray import serve

import ember
import ember.ray as er
from tests.unit.test_plan_cache import mlp

REQUESTS = 64
TIMEOUT_S = 90  # one deployment with its requests, replica start and model load included


def seq_model() -> onnx.ModelProto:
    """x (N, T, 4) -> x @ w (N, T, 3), both dims symbolic: requests of other lengths T cannot concatenate."""
    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "seq",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", 3])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def total_model(batch: int | str) -> onnx.ModelProto:
    """x (batch, 16) -> the sum of everything, a scalar: its output does not carry the batch."""
    graph = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)], "total",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve_models")
    paths = {}
    for name, build in (("mlp", mlp), ("seq", seq_model)):
        paths[name] = root / f"{name}.onnx"
        onnx.save(build(), str(paths[name]))
    return paths


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, num_gpus=0, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, logging_level="ERROR")
    try:
        serve.start(proxy_location="Disabled")  # handles only: no HTTP proxy, no port
        yield
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def cpu_handle(cluster: None, models: dict[str, Path]) -> Any:
    """The mlp on the cpu backend, one replica shared by the tests below."""
    return deploy(models["mlp"], "cpu", "cpu")


def bounded(fn: Callable[[], Any]) -> Any:
    """fn() in a thread, failing the test after TIMEOUT_S (the fixture's shutdown stops what is left)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(fn).result(timeout=TIMEOUT_S)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def deploy(path: Path, backend: str, name: str, **options: Any) -> Any:
    app = er.serve_deployment(str(path), backend=backend, name=name, num_cpus=0.5, max_batch_size=16,
                              batch_wait_timeout_s=0.05, **options)
    return bounded(lambda: serve.run(app, name=name, route_prefix=None))


def send(handle: Any, requests: list[Any]) -> list[Any]:
    """All requests at once (each handle.remote returns without waiting), then every reply, or its exception."""
    def replies() -> list[Any]:
        responses = [handle.remote(r) for r in requests]
        out = []
        for response in responses:
            try:
                out.append(response.result(timeout_s=TIMEOUT_S))
            except Exception as e:  # the test checks which
                out.append(e)
        return out

    return bounded(replies)


def check_replies(ref: ember.Model, requests: list[dict[str, np.ndarray]], replies: list[Any], tol: float) -> None:
    for request, reply in zip(requests, replies, strict=True):
        assert not isinstance(reply, Exception), reply
        x = request["x"]
        single = x.ndim == len(ref.inputs[0].shape) - 1
        direct = ref.run({"x": x[np.newaxis] if single else x})
        assert sorted(reply) == sorted(direct)
        for k, v in direct.items():
            np.testing.assert_allclose(reply[k], v[0] if single else v, rtol=tol, atol=tol)


def counts(handle: Any) -> dict[str, dict[int, int]]:
    return handle.stats.remote().result(timeout_s=TIMEOUT_S)


def report(label: str, stats: dict[str, dict[int, int]], capsys: pytest.CaptureFixture) -> None:
    with capsys.disabled():
        print(f"\n[serve] {label}: requests per Serve batch {sorted(stats['batches'].items())}, "
              f"rows per run {sorted(stats['runs'].items())}", file=sys.stderr)


def test_cpu_concurrent_requests_batch(cpu_handle: Any, models: dict[str, Path],
                                       capsys: pytest.CaptureFixture) -> None:
    """Single samples and small batches mixed: one concatenated run per Serve batch, split back per request."""
    rng = np.random.default_rng(0)
    requests = [{"x": rng.standard_normal((16,) if i % 3 else (1 + i % 4, 16)).astype(np.float32)}
                for i in range(REQUESTS)]
    before = counts(cpu_handle)["batches"]
    replies = send(cpu_handle, requests)
    check_replies(ember.load_onnx(models["mlp"], backend="cpu"), requests, replies, 1e-5)
    stats = counts(cpu_handle)
    report("cpu mlp", stats, capsys)
    assert sum(n * (c - before.get(n, 0)) for n, c in stats["batches"].items()) == REQUESTS
    assert max(stats["batches"]) > 1, stats  # concurrent requests shared a run
    assert all(rows & (rows - 1) == 0 for rows in stats["runs"]), stats  # padded to powers of two


def test_bad_requests_fail_alone(cpu_handle: Any, models: dict[str, Path]) -> None:
    """A wrong dtype and a missing input get Model.run's ValueError, raised to their callers only; the good
    requests of the same batches are answered."""
    rng = np.random.default_rng(1)
    good = [{"x": rng.standard_normal((2, 16)).astype(np.float32)} for _ in range(8)]
    bad = [{"x": np.ones((2, 16), np.int64)}, {"image": good[0]["x"]}]
    replies = send(cpu_handle, good[:4] + bad + good[4:])
    check_replies(ember.load_onnx(models["mlp"], backend="cpu"), good, replies[:4] + replies[6:], 1e-5)
    for reply, message in zip(replies[4:6], ("input 'x': expected dtype float32, got int64",
                                             "unknown input name(s) ['image']"), strict=True):
        assert isinstance(reply, ValueError), repr(reply)  # Ray's RayTaskError is also the cause's class
        assert message in str(reply)


def test_wgpu_groups_by_shape(cluster: None, models: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    """Sequence lengths 3 and 5 in one stream of requests: one run per length, not a failed concatenation."""
    rng = np.random.default_rng(2)
    requests = [{"x": rng.standard_normal((() if i % 2 else (1 + i % 3,)) + (3 + 2 * (i % 4 < 2), 4))
                 .astype(np.float32)} for i in range(REQUESTS)]  # single samples (T, 4) and batches (k, T, 4)
    handle = deploy(models["seq"], "wgpu", "wgpu")
    replies = send(handle, requests)
    check_replies(ember.load_onnx(models["seq"], backend="wgpu"), requests, replies, 1e-4)
    stats = counts(handle)
    report("wgpu seq, lengths 3 and 5", stats, capsys)
    assert max(stats["batches"]) > 1, stats


def test_run_batch_in_process() -> None:
    """The grouping without Serve: shapes and dtypes group apart, padding, and models that cannot concatenate."""
    d = er.OnnxDeployment(mlp(), backend="cpu")
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal(16).astype(np.float32), rng.standard_normal((2, 16)).astype(np.float32),
          rng.standard_normal((2, 16))]  # float64: a group of its own, cast by model.run
    out = d.run_batch([{"x": xs[0]}, xs[1], {"x": xs[2]}, {}])
    ref = ember.load_onnx(mlp(), backend="cpu")
    np.testing.assert_allclose(out[0]["y"], ref.run({"x": xs[0][None]})["y"][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[1]["y"], ref.run({"x": xs[1]})["y"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[2]["y"], ref.run({"x": xs[2]})["y"], rtol=1e-5, atol=1e-5)
    assert isinstance(out[3], ValueError) and "missing input(s) ['x']" in str(out[3])
    assert d.stats()["runs"] == {4: 1, 2: 1}  # 1 + 2 rows padded to 4; the float64 pair alone

    # A fixed batch dim: samples get the batch axis, but every request runs alone.
    fixed = er.OnnxDeployment(total_model(1), backend="cpu")
    out = fixed.run_batch([xs[0], xs[0] * 2])
    assert [float(o["y"]) for o in out] == pytest.approx([xs[0].sum(), 2 * xs[0].sum()], rel=1e-5)
    assert fixed.stats()["runs"] == {1: 2}
    # A symbolic batch whose output drops it: the concatenated run cannot split, so each request runs alone.
    total = er.OnnxDeployment(total_model("N"), backend="cpu")
    out = total.run_batch([xs[1], xs[1][:1]])
    assert [float(o["y"]) for o in out] == pytest.approx([xs[1].sum(), xs[1][:1].sum()], rel=1e-5)
    assert total.stats()["runs"] == {2: 1, 1: 1}


def test_http_json_request(cpu_handle: Any, models: dict[str, Path]) -> None:
    """What Serve's HTTP proxy hands the replica (a starlette Request, here a stand-in sent through the handle):
    a JSON object in, JSON-ready lists out."""
    class FakeRequest:  # defined here: cloudpickle sends the class by value to the replica
        scope: dict[str, Any] = {}

        def __init__(self, body: Any) -> None:
            self.body = body

        async def json(self) -> Any:
            return self.body

    x = np.random.default_rng(5).standard_normal((2, 16)).astype(np.float32)
    reply, missing = send(cpu_handle, [FakeRequest({"x": x.tolist()}), FakeRequest({})])
    assert isinstance(reply["y"], list)
    np.testing.assert_allclose(reply["y"], ember.load_onnx(models["mlp"], backend="cpu").run({"x": x})["y"],
                               rtol=1e-5, atol=1e-5)
    assert isinstance(missing, ValueError) and "missing input(s) ['x']" in str(missing)


def test_missing_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    with pytest.raises(ImportError, match=r"ember\[serve\]"):
        er.require_serve()
    with pytest.raises(ImportError, match=r"ember\[serve\]"):
        er.serve_deployment("model.onnx", backend="cpu")
