"""ember.load_onnx / Model: the API, the error contract, plans, fusion and device-resident outputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember import settings
from ember.model import cast_feed


def make_model(nodes: list, inputs: list, outputs: list, inits: list | None = None, opset: int = 17,
               extra_opsets: list | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", inputs, outputs, inits or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *(extra_opsets or [])])


def vi(name: str, shape: list, dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


@pytest.fixture
def conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["y"], axes=[2, 3], keepdims=0)]
    return make_model(nodes, [vi("x", ["N", 3, 8, 8])], [vi("y", ["N", 4])], [w, b], opset=13)


def reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_load_sources(tmp_path, conv_model, backend_name) -> None:
    x = np.random.rand(2, 3, 8, 8).astype(np.float32)
    (want,) = reference(conv_model, {"x": x})
    path = tmp_path / "m.onnx"
    onnx.save(conv_model, str(path))
    for source in (conv_model, conv_model.SerializeToString(), str(path), path):
        m = ember.load_onnx(source, backend=backend_name)
        np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)
    assert m.backend == backend_name
    assert [(i.name, i.shape, i.dtype) for i in m.inputs] == [("x", ("N", 3, 8, 8), np.dtype(np.float32))]
    assert m.outputs[0].name == "y" and m.outputs[0].dtype == np.float32
    text = repr(m)
    assert "x" in text and "y" in text and backend_name in text and "nodes" in text
    (y,) = m(x)  # positional form
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_missing_and_corrupt_files(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.onnx"):
        ember.load_onnx(tmp_path / "nope.onnx", backend="cpu")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x01garbage that is not a model\xff\xff")
    with pytest.raises(ValueError, match="bad.onnx"):
        ember.load_onnx(bad, backend="cpu")
    with pytest.raises(ValueError, match="bytes of model data"):
        ember.load_onnx(b"\xff\xfe not protobuf", backend="cpu")
    with pytest.raises(ValueError, match="unknown backend"):
        ember.load_onnx(bad, backend="tpu")


def test_unsupported_ops_all_listed() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("FancyOp", ["a"], ["b"], domain="com.example", name="fancy1"),
             helper.make_node("Bernoulli", ["b"], ["c"], name="coin"),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [vi("x", [4])], [vi("y", None)], extra_opsets=[helper.make_opsetid("com.example", 1)])
    with pytest.raises(NotImplementedError) as e:
        ember.load_onnx(model, backend="cpu")
    msg = str(e.value)
    assert "2 unsupported" in msg
    assert "FancyOp" in msg and "com.example" in msg and "fancy1" in msg
    assert "Bernoulli" in msg and "coin" in msg and "opset 17" in msg


def test_feed_errors(conv_model, backend_name) -> None:
    m = ember.load_onnx(conv_model, backend=backend_name)
    x = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(ValueError, match=r"missing input.*'x'"):
        m.run({})
    with pytest.raises(ValueError, match=r"unknown input name.*'z'"):
        m.run({"x": x, "z": x})
    with pytest.raises(ValueError, match=r"'x'.*rank 4.*rank 3"):
        m.run({"x": x[0]})
    with pytest.raises(ValueError, match=r"'x'.*dim 1 must be 3, got 2"):
        m.run({"x": np.zeros((1, 2, 8, 8), np.float32)})
    with pytest.raises(ValueError, match=r"'x'.*float32.*int64"):
        m.run({"x": x.astype(np.int64)})
    with pytest.raises(ValueError, match="positional"):
        m(x, x)
    # The documented casting rule: float64 -> float32 is a cast, not an error.
    np.testing.assert_allclose(m.run({"x": x.astype(np.float64)})["y"], m.run({"x": x})["y"])


def test_cast_rule() -> None:
    assert cast_feed("a", np.array([1, 2], np.int32), np.dtype(np.int64)).dtype == np.int64
    assert cast_feed("a", [1.5, 2.0], np.dtype(np.float32)).dtype == np.float32
    with pytest.raises(ValueError, match="do not fit"):
        cast_feed("a", np.array([2**40], np.int64), np.dtype(np.int32))
    with pytest.raises(ValueError, match="expected dtype bool"):
        cast_feed("a", np.array([1, 0]), np.dtype(bool))
    with pytest.raises(ValueError, match="expected dtype int64"):
        cast_feed("a", np.array([1.0]), np.dtype(np.int64))


def test_symbolic_dims_must_agree(backend_name) -> None:
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    model = make_model(nodes, [vi("a", ["n", 2]), vi("b", ["n", 2])], [vi("y", ["n", 2])])
    m = ember.load_onnx(model, backend=backend_name)
    with pytest.raises(ValueError, match="'n'"):
        m.run({"a": np.zeros((3, 2), np.float32), "b": np.zeros((4, 2), np.float32)})


def test_plan_per_shape_and_replay(conv_model, backend_name) -> None:
    m = ember.load_onnx(conv_model, backend=backend_name)
    be = m.compute_backend
    for batch in (1, 3, 1, 3):
        x = np.random.rand(batch, 3, 8, 8).astype(np.float32)
        np.testing.assert_allclose(m.run({"x": x})["y"], reference(conv_model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert len(m._plans) == 2
    if backend_name == "wgpu":
        before = be.pipelines_created
        m.run({"x": np.random.rand(3, 3, 8, 8).astype(np.float32)})
        assert be.pipelines_created == before  # a replay builds nothing


def test_backend_failure_during_load_is_runtime_error(conv_model, backend_name, monkeypatch) -> None:
    cls = type(ember.backend(backend_name))

    def boom(*args, **kwargs):
        raise OSError("device lost")

    monkeypatch.setattr(cls, "record_conv", boom)
    static = onnx.ModelProto()
    static.CopyFrom(conv_model)
    static.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1  # static: the plan is built at load
    with pytest.raises(RuntimeError, match=f"failed to load model on backend '{backend_name}'.*device lost"):
        ember.load_onnx(static, backend=backend_name)


def test_elementwise_chain_is_one_kernel(backend_name) -> None:
    ops = ["Relu", "Neg", "Exp", "Sigmoid", "Tanh", "Abs"]
    nodes = [helper.make_node(op, [f"t{i}"], [f"t{i + 1}"]) for i, op in enumerate(ops)]
    nodes.append(helper.make_node("Add", [f"t{len(ops)}", "c"], ["y"]))
    c = numpy_helper.from_array(np.array([0.25], np.float32), "c")
    model = make_model(nodes, [vi("t0", [5, 7])], [vi("y", [5, 7])], [c])
    x = np.random.randn(5, 7).astype(np.float32)
    fused = ember.load_onnx(model, backend=backend_name)
    plain = ember.load_onnx(model, backend=backend_name, fuse=False)
    assert fused.plan_info()["elementwise.kernels"] == 1 and fused.plan_info()["steps"] == 1
    assert plain.plan_info()["steps"] == len(nodes)
    want = reference(model, {"t0": x})[0]
    for m in (fused, plain):
        np.testing.assert_allclose(m.run({"t0": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_conv_activation_epilogue_and_batchnorm_fold(backend_name) -> None:
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in
             [("w", (6, 3, 3, 3)), ("s", (6,)), ("bb", (6,)), ("m", (6,))]]
    inits.append(numpy_helper.from_array(rng.random(6).astype(np.float32) + 0.5, "v"))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
             helper.make_node("Clip", ["n", "lo", "hi"], ["y"])]
    inits += [numpy_helper.from_array(np.array(0, np.float32), "lo"), numpy_helper.from_array(np.array(6, np.float32),
                                                                                                "hi")]
    model = make_model(nodes, [vi("x", [2, 3, 9, 9])], [vi("y", [2, 6, 9, 9])], inits, opset=13)
    m = ember.load_onnx(model, backend=backend_name)
    info = m.plan_info()
    assert m.rewrites["batchnorms_folded"] == 1
    assert info["steps"] == 1 and info["epilogue.fused"] == 1  # conv + folded BN + Clip in one kernel
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    np.testing.assert_allclose(m.run({"x": x})["y"], reference(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_buffer_reuse_reports_memory(backend_name) -> None:
    nodes = [helper.make_node("Relu" if i % 2 else "Neg", [f"t{i}"], [f"t{i + 1}"]) for i in range(12)]
    model = make_model(nodes, [vi("t0", [64, 64])], [vi("t12", [64, 64])])
    m = ember.load_onnx(model, backend=backend_name, fuse=False)
    info = m.plan_info()
    assert info["intermediate_bytes_without_reuse"] == 12 * 64 * 64 * 4
    assert info["intermediate_bytes"] <= 3 * 64 * 64 * 4  # a chain needs two buffers in turn, plus the output
    x = np.random.randn(64, 64).astype(np.float32)
    np.testing.assert_array_equal(m.run({"t0": x})["t12"], reference(model, {"t0": x})[0])


def test_device_arrays_chain_models(conv_model, backend_name) -> None:
    first = ember.load_onnx(make_model([helper.make_node("Mul", ["a", "a"], ["y"])], [vi("a", [2, 3, 8, 8])],
                                       [vi("y", [2, 3, 8, 8])]), backend=backend_name)
    second = ember.load_onnx(conv_model, backend=backend_name)
    assert second.compute_backend is first.compute_backend  # models on one backend name share its device
    x = np.random.rand(2, 3, 8, 8).astype(np.float32)
    mid = first.run({"a": x}, keep_on_device=True)["y"]
    assert isinstance(mid, ember.DeviceArray) and mid.shape == (2, 3, 8, 8) and mid.dtype == np.float32
    np.testing.assert_allclose(mid.numpy(), x * x, rtol=1e-6)
    out = second.run({"x": mid})["y"]
    np.testing.assert_allclose(out, reference(conv_model, {"x": x * x})[0], rtol=1e-4, atol=1e-5)
    other = ember.load_onnx(conv_model, backend=ember.backend(backend_name))  # a backend object of its own
    with pytest.raises(ValueError, match="device array of another backend"):
        other.run({"x": mid})


def test_profile_labels_nodes(conv_model, backend_name) -> None:
    m = ember.load_onnx(conv_model, backend=backend_name)
    rows = m.profile({"x": np.random.rand(1, 3, 8, 8).astype(np.float32)})
    assert rows and all(ms >= 0 for _, ms in rows)
    assert any("Conv" in label for label, _ in rows)


def test_wgpu_refuses_float64_instead_of_falling_back() -> None:
    """float64 with a double-float kernel runs on wgpu; one without (Sin) is refused at load, naming float64,
    rather than computed in float32 or on the host."""
    if "wgpu" not in ember.available_backends():
        pytest.fail("the wgpu backend must be available to the test suite")
    add = make_model([helper.make_node("Add", ["a", "a"], ["y"])], [vi("a", [3], TensorProto.DOUBLE)],
                     [vi("y", [3], TensorProto.DOUBLE)])
    x = np.array([1.0, 1 + 2.0**-40, -3.5])
    for backend in ("cpu", "wgpu"):
        got = ember.load_onnx(add, backend=backend).run({"a": x})["y"]
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, 2 * x)  # 1 + 2^-40 needs more than float32's 24 bits
    sin = make_model([helper.make_node("Sin", ["a"], ["y"])], [vi("a", [3], TensorProto.DOUBLE)],
                     [vi("y", [3], TensorProto.DOUBLE)])
    with pytest.raises(NotImplementedError, match="float64"):
        ember.load_onnx(sin, backend="wgpu")


def test_static_feeds_fast_path_keeps_the_contract(backend_name) -> None:
    """Static-shape feeds skip the full check only when nothing needs casting or copying: views, other
    dtypes, lists and int64 inputs (stored as int32 on wgpu) still give the same results and errors."""
    nodes = [helper.make_node("Cast", ["i"], ["f"], to=TensorProto.FLOAT), helper.make_node("Add", ["x", "f"], ["y"])]
    m = ember.load_onnx(make_model(nodes, [vi("x", [2, 3]), vi("i", [2, 3], TensorProto.INT64)], [vi("y", [2, 3])]),
                        backend=backend_name)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    i = np.arange(6, dtype=np.int64).reshape(2, 3) * 10
    want = x + i
    for feed_x in (x, x.T.copy().T, np.asfortranarray(x), x.astype(np.float64), x.tolist(), x.copy()):
        np.testing.assert_array_equal(m.run({"x": feed_x, "i": i})["y"], want)
    np.testing.assert_array_equal(m.run({"x": x, "i": i[:, ::-1][:, ::-1]})["y"], want)
    with pytest.raises(ValueError, match=r"'x'.*dim 1 must be 3, got 2"):
        m.run({"x": np.zeros((2, 2), np.float32), "i": i})
    with pytest.raises(ValueError, match=r"'i'.*int64.*float32"):
        m.run({"x": x, "i": x})
    with pytest.raises(ValueError, match=r"unknown input name.*'j'"):
        m.run({"x": x, "j": i})
    with pytest.raises(ValueError, match=r"missing input.*'i'"):
        m.run({"x": x})


def test_runs_replay_a_command_buffer_encoded_ahead(conv_model) -> None:
    """wgpu encodes a plan's next command buffer right after each submit: every run must still see its own
    inputs (the early buffer is submitted after that run's writes), and closing the model releases it."""
    m = ember.load_onnx(conv_model, backend="wgpu")
    rng = np.random.default_rng(4)
    for batch in (2, 2, 5, 2, 5, 5):
        x = rng.random((batch, 3, 8, 8), np.float32)
        np.testing.assert_allclose(m.run({"x": x})["y"], reference(conv_model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    if settings.WGPU_PY_ENCODE.get() or not settings.ENCODE_AHEAD.get():  # the wrapper path encodes every run itself
        return
    replays = [plan._readback[0] for plan in m._plans.values()]
    assert all(len(r.ahead) == 1 for r in replays), "each plan holds its next command buffer"
    m.close()
    assert all(not r.ahead for r in replays)


@pytest.mark.parametrize("spin_s", [0.0, 1e-6, 5.0])
def test_readback_wait_spins_then_blocks(conv_model, monkeypatch, spin_s) -> None:
    """A hardware GPU's readback polls without blocking before the driver's fence wait: with no spin, a spin that
    ends before the GPU does (then blocks), and one that outlasts it, every run returns its own outputs."""
    from ember.backends.wgpu import readback

    calls = []

    def spin(be) -> float:
        calls.append(spin_s)
        return spin_s

    monkeypatch.setattr(readback, "spin_s", spin)
    m = ember.load_onnx(conv_model, backend="wgpu")
    rng = np.random.default_rng(5)
    for batch in (3, 1, 3):
        x = rng.random((batch, 3, 8, 8), np.float32)
        np.testing.assert_allclose(m.run({"x": x})["y"], reference(conv_model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert len(calls) >= 3


def test_readback_never_spins_on_a_software_adapter() -> None:
    from ember.backends.wgpu import readback

    be = ember.backend("wgpu")
    be._require_init()
    if be.adapter.info["adapter_type"] == "CPU":
        assert readback.spin_s(be) == 0.0
    else:
        assert readback.spin_s(be) == settings.WAIT_SPIN_US.get() * 1e-6


def test_wgpu_profile_methods(conv_model) -> None:
    """Both wgpu profile methods on the same plan: one non-negative time per step; the marginal one (what a
    step adds to the whole run, the default on hardware GPUs) is exercised here on lavapipe too."""
    m = ember.load_onnx(conv_model, backend="wgpu")
    x = np.random.rand(2, 3, 8, 8).astype(np.float32)
    m.run({"x": x})
    plan = next(iter(m._plans.values()))
    be = m.compute_backend
    for method in ("marginal", "isolated"):
        times = be.profile(plan.steps, method=method)
        assert len(times) == len(plan.steps) and all(t >= 0 and np.isfinite(t) for t in times), (method, times)
    with pytest.raises(ValueError, match="method"):
        be.profile(plan.steps, method="per-pass")
    np.testing.assert_allclose(m.run({"x": x})["y"], reference(conv_model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_gpu_time(conv_model, backend_name) -> None:
    m = ember.load_onnx(conv_model, backend=backend_name)
    t = m.gpu_time({"x": np.random.rand(2, 3, 8, 8).astype(np.float32)}, reps=2)
    assert np.isfinite(t) and t > 0



@pytest.mark.parametrize("spatial", [(17,), (9, 7)])
def test_conv_residual_add_relu_is_one_kernel(backend_name, spatial) -> None:
    """relu(Conv(x) + x), 1-D and 2-D: the Add and the Relu run in the conv's epilogue (one step)."""
    rng = np.random.default_rng(5)
    r = len(spatial)
    w = numpy_helper.from_array(rng.standard_normal((6, 6) + (3,) * r).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 2 * r),
             helper.make_node("Add", ["x", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, [vi("x", [2, 6, *spatial])], [vi("y", [2, 6, *spatial])], [w, b])
    x = rng.standard_normal((2, 6, *spatial)).astype(np.float32)
    m = ember.load_onnx(model, backend=backend_name)
    np.testing.assert_allclose(m.run({"x": x})["y"], reference(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    info = m.plan_info({"x": x})
    assert info["steps"] == 1 and info["epilogue.fused"] == 2
