"""ember.DataParallel: a batch split across several devices of one process equals a single-device run. Two backend
objects on one adapter (lavapipe here; the cpu backend twice) stand in for two GPUs."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.parallel import split_sizes
from tests.unit.test_plan_cache import conv3x3, mlp

TOL = {"rtol": 1e-4, "atol": 1e-4}  # outputs up to ~40 from 64-term sums


def same(out: np.ndarray, ref: ember.Model, feeds: dict[str, np.ndarray], devices: int, backend_name: str) -> None:
    """DataParallel's output against one device: on cpu exactly the single-device runs of the same shards,
    concatenated (the whole batch in one run may differ in the last bit: the GEMM's blocking depends on the row
    count); close to the whole batch in one run on every backend."""
    whole = ref.run(feeds)["y"]
    assert out.shape == whole.shape and out.dtype == whole.dtype
    np.testing.assert_allclose(out, whole, **TOL)
    if backend_name == "cpu":
        n = next(iter(feeds.values())).shape[0]
        bounds = np.cumsum([0, *split_sizes(n, [1] * devices)])
        shards = [ref.run({k: v[lo:hi] for k, v in feeds.items()})["y"]
                  for lo, hi in zip(bounds[:-1], bounds[1:], strict=True) if hi > lo]
        np.testing.assert_array_equal(out, np.concatenate(shards))


@pytest.fixture(scope="module", params=ember.available_backends())
def two(request: pytest.FixtureRequest) -> tuple[str, list[ember.ComputeBackend], ember.ComputeBackend]:
    """(backend name, two backends on adapter 0, a third one for the single-device reference)."""
    name = request.param
    return name, [ember.backend(name), ember.backend(name)], ember.backend(name)


@pytest.mark.parametrize("build,shape", [(mlp, (16,)), (conv3x3, (4, 8, 8))], ids=["mlp", "conv3x3"])
@pytest.mark.parametrize("batch", [1, 2, 7, 32])
def test_equals_single_device(two: tuple, build: object, shape: tuple, batch: int) -> None:
    name, pair, ref_be = two
    ref = ember.load_onnx(build(), backend=ref_be)
    x = np.random.default_rng(batch).standard_normal((batch, *shape)).astype(np.float32)
    with ember.DataParallel(build(), adapters=pair) as dp:
        out = dp.run({"x": x})
        assert list(out) == ["y"]
        same(out["y"], ref, {"x": x}, 2, name)
        (y,) = dp(x)
        np.testing.assert_array_equal(y, out["y"])


def test_adapter_indices(backend_name: str) -> None:
    """adapters=[0, 0] opens two devices on adapter 0; "all" one per adapter (one here)."""
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    ref = ember.load_onnx(mlp(), backend=ember.backend(backend_name))
    with ember.DataParallel(mlp(), adapters=[0, 0], backend=backend_name) as dp:
        assert len(dp.models) == 2 and dp.devices[0] is not dp.devices[1]
        same(dp.run({"x": x})["y"], ref, {"x": x}, 2, backend_name)
    with ember.DataParallel(mlp(), adapters="all", backend=backend_name) as dp:
        expected = max(1, len(ember.adapters())) if backend_name == "wgpu" else 1
        assert len(dp.models) == expected
        same(dp.run({"x": x})["y"], ref, {"x": x}, expected, backend_name)


def test_split_sizes() -> None:
    assert split_sizes(7, [1, 1]) == [4, 3]
    assert split_sizes(1, [1, 1, 1]) == [1, 0, 0]
    assert split_sizes(10, [3, 1]) == [8, 2]  # 7.5 / 2.5: the tie goes to the larger weight
    assert split_sizes(0, [1, 1]) == [0, 0]
    for n in range(20):
        for ws in ([1, 1], [1, 2, 3], [5, 1, 1, 1]):
            sizes = split_sizes(n, ws)
            assert sum(sizes) == n and min(sizes) >= 0


def test_uneven_split_and_weights() -> None:
    """Each device runs its share (the shard sizes seen by the models), outputs in the batch's order."""
    pair = [ember.backend("cpu"), ember.backend("cpu")]
    x = np.arange(7 * 16, dtype=np.float32).reshape(7, 16) / 100
    ref = ember.load_onnx(mlp(), backend="cpu").run({"x": x})["y"]
    for weights, sizes in ((None, [4, 3]), ([1, 3], [2, 5]), ([1, 1, 1], [3, 2, 2])):
        pair = [ember.backend("cpu") for _ in sizes]
        with ember.DataParallel(mlp(), adapters=pair, weights=weights) as dp:
            seen: list[tuple[int, int]] = []
            for i, m in enumerate(dp.models):
                run = m.run
                m.run = lambda feeds, *a, _run=run, _i=i, _seen=seen: (_seen.append((_i, feeds["x"].shape[0])),
                                                                       _run(feeds, *a))[1]
            np.testing.assert_allclose(dp.run({"x": x})["y"], ref, **TOL)
            assert sorted(seen) == list(enumerate(sizes))
    with pytest.raises(ValueError, match="weights"):
        ember.DataParallel(mlp(), adapters=pair, weights=[1, 0])


def test_runs_concurrently() -> None:
    """Each shard runs on a thread of its own: both devices' runs are in flight at once."""
    pair = [ember.backend("cpu"), ember.backend("cpu")]
    barrier = threading.Barrier(2, timeout=10)
    with ember.DataParallel(mlp(), adapters=pair) as dp:
        for m in dp.models:
            m.run = lambda feeds, *a, _run=m.run: (barrier.wait(), _run(feeds, *a))[1]
        dp.run({"x": np.ones((4, 16), np.float32)})  # a BrokenBarrierError if the shards ran one after the other


def multi_input(batch_out: bool = True) -> object:
    """y = a @ w + b[None] with a (N, 16), b (M, 8): two symbolic dim-0 inputs; z (4,) without a batch axis."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])]
    if not batch_out:
        nodes.append(helper.make_node("ReduceSum", ["y"], ["z"], keepdims=0))
        outs = [helper.make_tensor_value_info("z", TensorProto.FLOAT, [])]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 16]),
                                             helper.make_tensor_value_info("b", TensorProto.FLOAT, ["M", 8])],
                              outs, [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_bad_inputs() -> None:
    pair = [ember.backend("cpu"), ember.backend("cpu")]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 16)).astype(np.float32), rng.standard_normal((6, 8)).astype(np.float32)
    with ember.DataParallel(multi_input(), adapters=pair) as dp:
        assert dp.batch_inputs == ["a", "b"]
        np.testing.assert_allclose(dp.run({"a": a, "b": b})["y"],
                                   ember.load_onnx(multi_input(), backend="cpu").run({"a": a, "b": b})["y"], **TOL)
        with pytest.raises(ValueError, match=r"disagree on the batch size.*'a': 6, 'b': 5"):
            dp.run({"a": a, "b": b[:5]})
        # The same errors as Model.run for names and dtypes.
        with pytest.raises(ValueError, match="missing input"):
            dp.run({"a": a})
        with pytest.raises(ValueError, match="unknown input"):
            dp.run({"a": a, "b": b, "c": b})
        with pytest.raises(ValueError, match="expected dtype float32"):
            dp.run({"a": a.astype(np.int32), "b": b})
        with pytest.raises(ValueError, match="device array"):
            dp.run({"a": _device_array(a, pair[0]), "b": b})
    with ember.DataParallel(multi_input(batch_out=False), adapters=pair) as dp:
        with pytest.raises(ValueError, match="output 'z' has no batch axis"):
            dp.run({"a": a, "b": b})
        with pytest.raises(ValueError, match="no batch axis"):  # the same on one shard: whatever the batch size
            dp.run({"a": a[:1], "b": b[:1]})
    with pytest.raises(ValueError, match="batch_inputs: unknown"):
        ember.DataParallel(mlp(), adapters=pair, batch_inputs=["q"])
    with pytest.raises(ValueError, match="adapters"):
        ember.DataParallel(mlp(), adapters=[pair[0], 0])
    with pytest.raises(ValueError, match="adapters"):
        ember.DataParallel(mlp(), adapters=[], backend="cpu")
    with pytest.raises(ValueError, match="adapter 0"):
        ember.DataParallel(mlp(), adapters=[0, 1], backend="cpu")
    with pytest.raises(ValueError, match="adapters="):
        ember.DataParallel(mlp(), adapters=[0], backend="cpu", adapter=0)
    dp = ember.DataParallel(mlp(), adapters=pair)
    dp.close()
    with pytest.raises(RuntimeError, match="close"):
        dp.run({"x": np.ones((2, 16), np.float32)})


def _device_array(a: np.ndarray, be: ember.ComputeBackend) -> ember.DeviceArray:
    """A device array of `be`, made by a one-node model run with keep_on_device."""
    ident = helper.make_graph([helper.make_node("Identity", ["a"], ["o"])], "id",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, ["N", 16])])
    m = ember.load_onnx(helper.make_model(ident, opset_imports=[helper.make_opsetid("", 17)]), backend=be)
    return m.run({"a": a}, keep_on_device=True)["o"]


def test_precision_f16_on_wgpu() -> None:
    """Load options reach every device: precision='f16' where the adapter has shader-f16."""
    if "wgpu" not in ember.available_backends():
        pytest.skip("no wgpu adapter")
    pair = [ember.backend("wgpu"), ember.backend("wgpu")]
    if "shader-f16" not in pair[0].features:
        pytest.skip("the adapter lacks shader-f16")
    x = np.random.default_rng(3).standard_normal((9, 4, 8, 8)).astype(np.float32)
    ref = ember.load_onnx(conv3x3(), backend=ember.backend("wgpu"), precision="f16").run({"x": x})["y"]
    with ember.DataParallel(conv3x3(), adapters=pair, precision="f16") as dp:
        assert all(m.precision == "f16" for m in dp.models)
        np.testing.assert_allclose(dp.run({"x": x})["y"], ref, rtol=1e-2, atol=1e-2)
