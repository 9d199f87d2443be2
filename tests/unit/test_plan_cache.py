"""The plan cache and the weight pool: weights are uploaded once per model and shared by the plans of every input
shape; the plans are an LRU bounded by the device bytes they hold; cache_info() reports both; close() frees all."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember import settings
from ember.backends.base import OutOfMemoryError
from ember.ops import Context
from ember.plan import WeightPool
from ember.plan.folding import fold_backend

TOL = {"rtol": 1e-4, "atol": 1e-5}


def mlp() -> onnx.ModelProto:
    """x (N, 16) -> relu(x @ w1 + b1) @ w2 + b2, the batch symbolic: a plan per batch size."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w1", (16, 64)), ("b1", (64,)), ("w2", (64, 8)), ("b2", (8,)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["m"]),
             helper.make_node("Add", ["m", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv3x3() -> onnx.ModelProto:
    """A 3x3 conv (Winograd-eligible: its transformed filter is a constant made while planning)."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


class Reference:
    def __init__(self, model: onnx.ModelProto) -> None:
        import onnxruntime as ort

        self.sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.sess.run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def own_be(backend_name: str) -> ember.ComputeBackend:
    """A backend of the module's own: its live allocations are this module's models' only."""
    return ember.backend(backend_name)


def live_bytes(be: ember.ComputeBackend) -> int:
    return sum(be._sizes.values())


def all_plans(m: ember.Model) -> list:
    """The cached plans and the templates' live plans (ember/plan/live.py)."""
    live = list(m._families._live.values()) if m._families is not None else []
    return [*m._plans.values(), *live]


def owned_bytes(m: ember.Model) -> int:
    """Bytes of the buffers the model's plans own (not the shared weights, not kernel scratch)."""
    be = m.compute_backend
    return sum(be.nbytes(h) for plan in all_plans(m) for h in plan.handles)


def test_weights_uploaded_once_across_shapes(own_be: ember.ComputeBackend) -> None:
    model, ref = mlp(), Reference(mlp())
    before = live_bytes(own_be)
    m = ember.load_onnx(model, backend=own_be)
    weights = sum(a.nbytes for a in m.graph.initializers.values())
    rng = np.random.default_rng(2)
    for i, batch in enumerate((1, 2, 3, 5, 8, 13)):
        x = rng.standard_normal((batch, 16)).astype(np.float32)
        np.testing.assert_allclose(m.run({"x": x})["y"], ref(x), **TOL)
        info = m.cache_info()
        # Planned: batch 1 (a dim of 1 plans apart), 2 and 3 (they fit a template); 5 is traced to verify it and,
        # like the rest, runs on the template's live plan, moved from batch to batch.
        assert info["builds"] + info["from_template"] == i + 1 and info["evictions"] == 0
        assert info["builds"] == min(i + 1, 3), info
        assert info["plans"] == info["builds"] + (info["from_template"] > 0) == len(all_plans(m))
        assert info["weight_bytes"] == weights, "every initializer once, whatever the number of plans"
        assert m._pool.uploads == len(m.graph.initializers)
        # The backend holds the weights once, and beyond them only the plans' own buffers.
        assert live_bytes(own_be) - before == weights + owned_bytes(m)
        assert info["bytes"] == sum(p.device_bytes for p in all_plans(m)) >= owned_bytes(m)
    assert m.plan_info({"x": x})["device_bytes"] == next(iter(m._families._live.values())).device_bytes
    m.close()
    assert live_bytes(own_be) == before


def test_derived_constants_shared(own_be: ember.ComputeBackend) -> None:
    """A Winograd-transformed filter, made anew by every plan, is one buffer for all of them (keyed by
    content); so is precision="f16"'s float16 copy of each weight (keyed by the weight and the cast)."""
    model, ref = conv3x3(), Reference(conv3x3())
    rng = np.random.default_rng(3)
    with settings.override(winograd=2):
        m = ember.load_onnx(model, backend=own_be)
        sizes = []
        for batch in (1, 2, 3):
            x = rng.standard_normal((batch, 4, 8, 8)).astype(np.float32)
            np.testing.assert_allclose(m.run({"x": x})["y"], ref(x), rtol=1e-4, atol=1e-4)
            assert m.plan_info({"x": x}).get("conv.winograd") == 1
            sizes.append(m.cache_info()["weight_bytes"])
    assert len(set(sizes)) == 1 and m.cache_info()["plans"] == 3
    m.close()
    if own_be.name != "wgpu" or "shader-f16" not in own_be.features:
        return
    model = mlp()
    ref = Reference(model)
    m = ember.load_onnx(model, backend=own_be, precision="f16")
    weights = sum(a.nbytes for a in m.graph.initializers.values())
    for batch in (1, 4, 7):
        x = rng.standard_normal((batch, 16)).astype(np.float32)
        np.testing.assert_allclose(m.run({"x": x})["y"], ref(x), rtol=1e-2, atol=2e-2)
        assert m.cache_info()["weight_bytes"] == weights // 2  # float16 copies only, once each
    m.close()


def test_eviction_under_a_small_bound(backend_name: str) -> None:
    model, ref = mlp(), Reference(mlp())
    rng = np.random.default_rng(4)
    batches = (1, 2, 3, 4)
    sizes = {}
    probe = ember.load_onnx(model, backend=backend_name)
    with settings.override(templates=False):  # a plan of its own per batch, each in the cache
        for b in batches:
            probe.plan_info({"x": np.zeros((b, 16), np.float32)})
            sizes[b] = probe._plans[((b, 16),), ()].device_bytes
    probe.close()
    limit = sizes[3] + sizes[4]  # the two largest fit, all four do not
    m = ember.load_onnx(model, backend=backend_name, plan_cache_bytes=limit)
    assert m.cache_info()["limit_bytes"] == limit
    order = (1, 2, 3, 4, 1, 4, 2, 2, 3)
    for b in order:
        x = rng.standard_normal((b, 16)).astype(np.float32)
        np.testing.assert_allclose(m.run({"x": x})["y"], ref(x), **TOL)
        info = m.cache_info()
        assert info["bytes"] <= limit or info["plans"] == 1, info
        live = list(m._families._live.values())
        assert info["bytes"] == sum(sizes[k[0][0][0]] for k in m._plans) + sum(p.device_bytes for p in live)
        if (((b, 16),), ()) in m._plans:  # else the template's live plan ran it (batches 2 to 4, once verified)
            assert next(reversed(m._plans)) == (((b, 16),), ())  # the plan just used is the most recent
        else:
            assert live and live[0].v == b
    info = m.cache_info()
    made = info["builds"] + info["from_template"]
    assert info["evictions"] > 0
    assert made > len(set(order)), "evicted shapes came back and were made again"
    m.close()


def test_alternating_shapes_with_room_for_one_plan(backend_name: str) -> None:
    """Every switch evicts the other plan and rebuilds it; the weights stay (uploaded once) and every result
    is ONNX Runtime's."""
    model, ref = mlp(), Reference(mlp())
    rng = np.random.default_rng(5)
    m = ember.load_onnx(model, backend=backend_name, plan_cache_bytes=0)
    for i in range(100):
        x = rng.standard_normal((2 if i % 2 else 5, 16)).astype(np.float32)
        np.testing.assert_allclose(m.run({"x": x})["y"], ref(x), **TOL)
    info = m.cache_info()
    assert info["plans"] == 1 and info["builds"] + info["from_template"] == 100 and info["evictions"] == 99
    assert m._pool.uploads == len(m.graph.initializers)  # each new plan took the weights before the old one went
    m.close()


def test_runs_from_threads_share_the_cache(backend_name: str) -> None:
    model, ref = mlp(), Reference(mlp())
    m = ember.load_onnx(model, backend=backend_name, plan_cache_bytes=0)
    xs = {b: np.random.default_rng(b).standard_normal((b, 16)).astype(np.float32) for b in (1, 3, 6)}
    want = {b: ref(x) for b, x in xs.items()}
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for b in np.random.default_rng(seed).choice(list(xs), 15):
                np.testing.assert_allclose(m.run({"x": xs[b]})["y"], want[b], **TOL)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert m.cache_info()["plans"] == 1
    m.close()


def test_out_of_memory_while_building_frees_the_cache_and_retries(backend_name: str, monkeypatch) -> None:
    import ember.plan.families as families

    model, ref = mlp(), Reference(mlp())
    m = ember.load_onnx(model, backend=backend_name)
    for b in (1, 2):
        m.run({"x": np.zeros((b, 16), np.float32)})
    real, calls = families.trace, []

    def once_out_of_memory(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OutOfMemoryError("no room")
        return real(*args, **kwargs)

    monkeypatch.setattr(families, "trace", once_out_of_memory)
    x = np.random.default_rng(6).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(m.run({"x": x})["y"], ref(x), **TOL)
    info = m.cache_info()
    assert len(calls) == 2 and info["plans"] == 1 and info["evictions"] == 2
    m.close()


@pytest.mark.parametrize("bad", [-1, 1.5, 1e9, "1GB", True, [1]])
def test_bad_plan_cache_bytes(bad: object) -> None:
    with pytest.raises(ValueError, match="plan_cache_bytes"):
        ember.load_onnx(mlp(), backend="cpu", plan_cache_bytes=bad)


def test_close_frees_everything(own_be: ember.ComputeBackend) -> None:
    before = (len(own_be._sizes), live_bytes(own_be))
    model, ref = mlp(), Reference(mlp())
    m = ember.load_onnx(model, backend=own_be, plan_cache_bytes=1 << 20)
    for b in (1, 2, 3):
        m.run({"x": np.ones((b, 16), np.float32)})
    assert live_bytes(own_be) > before[1]
    m.close()
    assert (len(own_be._sizes), live_bytes(own_be)) == before
    info = m.cache_info()
    assert info["plans"] == info["bytes"] == info["weight_bytes"] == 0
    x = np.random.default_rng(7).standard_normal((2, 16)).astype(np.float32)
    np.testing.assert_allclose(m.run({"x": x})["y"], ref(x), **TOL)  # a closed model builds (and uploads) again
    m.close()
    assert (len(own_be._sizes), live_bytes(own_be)) == before


def test_a_pool_serves_its_own_backend_only(own_be: ember.ComputeBackend) -> None:
    pool = WeightPool(own_be)
    with pytest.raises(ValueError, match="pool"):
        Context(fold_backend(), pool)  # constant folding's cpu backend is another backend, even for cpu models
    ctx = Context(own_be, pool)
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    pool.register([w])
    t = ctx.const(w)
    assert ctx.view(t).handle == ctx.view(ctx.const(w.reshape(3, 2))).handle  # one buffer for every view of w
    same = ctx.const(np.array([1.0, 2.0], np.float32))
    assert ctx.view(same).handle == ctx.view(ctx.const(np.array([1.0, 2.0], np.float32))).handle  # by content
    assert ctx.view(same).handle != ctx.view(ctx.const(np.array([1.0, 3.0], np.float32))).handle
    assert ctx.view(ctx.const(w[:, :2])).handle != ctx.view(t).handle  # a strided view: its own upload
    assert len(pool) == 4
    pool.release(ctx.shared)
    assert len(pool) == 0 and pool.bytes == 0


def test_pipeline_cache_is_bounded_and_recorded_plans_survive_eviction() -> None:
    """The wgpu backend keeps at most settings.PIPELINE_CACHE compiled pipelines (shaders are specialised per shape,
    so many shapes would keep every one); a plan recorded earlier holds its own and still runs after they leave."""
    be = ember.backend("wgpu")
    node = helper.make_node("Tanh", ["x"], ["y"])
    graph = helper.make_graph([node], "tanh", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 7])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(1).standard_normal((4, 7)).astype(np.float32)
    data = be.alloc(4 * 64)
    try:
        with settings.override(pipeline_cache=3):
            model = ember.load_onnx(proto, backend=be)
            np.testing.assert_allclose(model.run({"x": x})["y"], np.tanh(x), rtol=1e-6, atol=1e-6)
            evicted = be.pipelines_evicted
            for n in range(1, 7):  # six new specialisations push the model's pipeline out
                be.unary("tanh", data, data, n)
            assert len(be._pipelines) == 3
            assert be.pipelines_evicted >= evicted + 4
            created = be.pipelines_created
            np.testing.assert_allclose(model.run({"x": x})["y"], np.tanh(x), rtol=1e-6, atol=1e-6)
            assert be.pipelines_created == created, "a replay builds nothing, evicted or not"
    finally:
        be.free(data)


def test_memory_info_counts_live_allocations(backend_name: str) -> None:
    be = ember.backend(backend_name)
    before = be.memory_info()
    handle = be.alloc(4096)
    try:
        assert be.memory_info() == {"allocations": before["allocations"] + 1, "bytes": before["bytes"] + 4096}
    finally:
        be.free(handle)
    assert be.memory_info() == before


def test_plan_info_names_the_symbolic_dims() -> None:
    node = helper.make_node("Relu", ["x"], ["y"])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, None])
    graph = helper.make_graph([node], "relu", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = ember.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), backend="cpu")
    info = model.plan_info({"x": np.zeros((2, 3, 5), np.float32)})
    assert info["symbolic_dims"] == {"x": {0: "batch", 2: None}}
