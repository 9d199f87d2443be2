"""ember.onnxruntime as an ONNX Runtime drop-in.

Each `*_usage` function is written as onnxruntime code is (`ort` the module, `providers` the session's list) and
returns what it observed. Every test runs its usage with `import onnxruntime as ort` and with
`import ember.onnxruntime as ort` (cpu and wgpu providers); each run checks itself, and ember's observations must
agree with ONNX Runtime's. Tests of ember's own additions (device-resident values, provider options) follow.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
import ember.onnxruntime as ember_ort
from ember.session_types import BACKEND_PROVIDERS

onnxruntime = pytest.importorskip("onnxruntime")

ORT_CPU = ["CPUExecutionProvider"]
EMBER_PROVIDERS = {"cpu": ["CPUExecutionProvider"],
                   "wgpu": ["WebGpuExecutionProvider", "CPUExecutionProvider"]}


@dataclass(frozen=True)
class Impl:
    name: str
    ort: ModuleType
    providers: list[str]


IMPLS = [Impl("onnxruntime", onnxruntime, ORT_CPU)] + \
    [Impl(f"ember-{b}", ember_ort, EMBER_PROVIDERS[b]) for b in ember.available_backends()]


@pytest.fixture(params=IMPLS, ids=lambda i: i.name)
def impl(request: pytest.FixtureRequest) -> Impl:
    return request.param


def vi(name: str, shape: list | None, dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def save(model: onnx.ModelProto, folder: Path, name: str) -> str:
    path = folder / f"{name}.onnx"
    onnx.save(model, str(path))
    return str(path)


W = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
B = np.random.default_rng(1).standard_normal(3).astype(np.float32)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("ort_api")
    out: dict[str, str] = {}
    # MatMul + Add + Relu with a symbolic batch dim.
    mlp = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        "mlp", [vi("x", ["batch", 4])], [vi("y", ["batch", 3])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")])
    out["mlp"] = save(helper.make_model(mlp, opset_imports=[helper.make_opsetid("", 17)]), folder, "mlp")
    # int64 and bool outputs; one output declared without a shape (ORT reports the inferred one).
    typed = helper.make_graph(
        [helper.make_node("ArgMax", ["x"], ["idx"], axis=1, keepdims=0),
         helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.float32(0), "zero")),
         helper.make_node("Greater", ["x", "zero"], ["pos"]), helper.make_node("Shape", ["x"], ["shape"])],
        "typed", [vi("x", ["n", 5])],
        [vi("idx", ["n"], TensorProto.INT64), vi("pos", None, TensorProto.BOOL), vi("shape", [2], TensorProto.INT64)])
    out["typed"] = save(helper.make_model(typed, opset_imports=[helper.make_opsetid("", 17)]), folder, "typed")
    # metadata_props and the other ModelProto fields ORT's ModelMetadata reads.
    meta = helper.make_model(
        helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "meta_graph", [vi("x", [2])], [vi("y", [2])],
                          doc_string="the graph's doc"),
        opset_imports=[helper.make_opsetid("", 17)], producer_name="ember-tests", producer_version="1.2",
        domain="ai.ember.test", model_version=7, doc_string="a model with metadata")
    helper.set_model_props(meta, {"author": "ember", "license": "MIT"})
    out["meta"] = save(meta, folder, "meta")
    # Dims the model leaves undeclared, -1 (an exporter's "free"), and an input of unknown rank.
    x = vi("x", ["seq", 1, 3])
    x.type.tensor_type.shape.dim[1].Clear()
    free = vi("f", [2, 1])
    free.type.tensor_type.shape.dim[1].dim_value = -1
    dims = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["f"], ["g"]),
         helper.make_node("Abs", ["r"], ["s"])],
        "dims", [x, free, vi("r", None)], [vi("y", None), vi("g", [2, None]), vi("s", None)])
    out["dims"] = save(helper.make_model(dims, opset_imports=[helper.make_opsetid("", 17)]), folder, "dims")
    # An initializer also listed as a graph input (IR >= 4): overridable by a feed.
    over = helper.make_graph([helper.make_node("Mul", ["x", "scale"], ["y"])], "over",
                             [vi("x", [3]), vi("scale", [1])], [vi("y", [3])],
                             [numpy_helper.from_array(np.array([2.0], np.float32), "scale")])
    out["over"] = save(helper.make_model(over, opset_imports=[helper.make_opsetid("", 17)]), folder, "over")
    # Weights in a file beside the model.
    ext = helper.make_model(mlp, opset_imports=[helper.make_opsetid("", 17)])
    (folder / "ext").mkdir()
    onnx.save(ext, str(folder / "ext" / "ext.onnx"), save_as_external_data=True, location="ext.bin",
              size_threshold=0)
    out["ext"] = str(folder / "ext" / "ext.onnx")
    return out


def agree(impl: Impl, usage: Any, *args: Any) -> dict[str, Any]:
    """Run `usage` with `impl`; for ember, also with ONNX Runtime, and check the observations match."""
    got = usage(impl.ort, impl.providers, *args)
    if impl.ort is not onnxruntime:
        want = usage(onnxruntime, ORT_CPU, *args)
        assert got.keys() == want.keys()
        for key in want:
            same(got[key], want[key], key)
    return got


def same(got: Any, want: Any, where: str) -> None:
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{where}: {type(got).__name__} instead of an array"
        assert got.dtype == want.dtype and got.shape == want.shape, \
            f"{where}: {got.dtype}{got.shape} vs ONNX Runtime's {want.dtype}{want.shape}"
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=where)
        else:
            np.testing.assert_array_equal(got, want, err_msg=where)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: {got!r} vs ONNX Runtime's {want!r}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            same(g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} vs ONNX Runtime's {want!r}"


def signature(args: list) -> list[tuple]:
    return [(a.name, list(a.shape), a.type) for a in args]


# -- usages: onnxruntime code as it is written ---------------------------------------------------------------------

def mlp_usage(ort: ModuleType, providers: list[str], path: str) -> dict[str, Any]:
    sess = ort.InferenceSession(path, providers=providers)
    input_name = sess.get_inputs()[0].name
    output_name = sess.get_outputs()[0].name
    results = {"inputs": signature(sess.get_inputs()), "outputs": signature(sess.get_outputs())}
    for batch in (1, 5, 2):  # a symbolic batch: each size runs
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        (y,) = sess.run(None, {input_name: x})
        np.testing.assert_allclose(y, np.maximum(x @ W + B, 0), rtol=1e-5, atol=1e-6)
        results[f"batch{batch}"] = y
        (named,) = sess.run([output_name], {input_name: x})
        np.testing.assert_array_equal(named, y)
        assert len(sess.run([], {input_name: x})) == 1  # [] like None: every output
    return results


def typed_usage(ort: ModuleType, providers: list[str], path: str) -> dict[str, Any]:
    sess = ort.InferenceSession(path, providers=providers)
    x = np.array([[1, -2, 3, 0, 9], [-1, -1, 5, 2, 0]], np.float32)
    idx, pos, shape = sess.run(None, {"x": x})
    assert idx.dtype == np.int64 and pos.dtype == np.bool_ and shape.dtype == np.int64
    np.testing.assert_array_equal(idx, [4, 2])
    np.testing.assert_array_equal(pos, x > 0)
    np.testing.assert_array_equal(shape, [2, 5])
    (pos_only,) = sess.run(["pos"], {"x": x})
    return {"outputs": signature(sess.get_outputs()), "idx": idx, "pos": pos, "shape": shape, "pos_only": pos_only}


def meta_usage(ort: ModuleType, providers: list[str], path: str) -> dict[str, Any]:
    sess = ort.InferenceSession(path, providers=providers)
    meta = sess.get_modelmeta()
    assert meta.custom_metadata_map == {"author": "ember", "license": "MIT"}
    return {k: getattr(meta, k) for k in ("producer_name", "graph_name", "graph_description", "domain",
                                          "description", "version", "custom_metadata_map")}


def dims_usage(ort: ModuleType, providers: list[str], path: str) -> dict[str, Any]:
    sess = ort.InferenceSession(path, providers=providers)
    x = np.arange(-6, 6, dtype=np.float32).reshape(2, 2, 3)
    f = np.array([[1.0, -2.0, 3.0]] * 2, np.float32)
    r = np.float32([-1.5, 2.0, -3.0, 4.0])
    y, g, s = sess.run(None, {"x": x, "f": f, "r": r})
    np.testing.assert_array_equal(s, np.abs(r))
    return {"inputs": signature(sess.get_inputs()), "outputs": signature(sess.get_outputs()), "y": y, "g": g, "s": s}


def iobinding_usage(ort: ModuleType, providers: list[str], path: str) -> dict[str, Any]:
    sess = ort.InferenceSession(path, providers=providers)
    x = np.ones((3, 4), np.float32)
    io = sess.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("y")
    sess.run_with_iobinding(io)
    (y,) = io.copy_outputs_to_cpu()
    (value,) = io.get_outputs()
    assert value.device_name() == "cpu" and value.shape() == [3, 3] and value.data_type() == "tensor(float)"
    # Into a buffer the caller owns.
    out = np.zeros((3, 3), np.float32)
    io.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(out, y)
    # OrtValues in and out.
    xv = ort.OrtValue.ortvalue_from_numpy(2 * x)
    assert xv.shape() == [3, 4] and xv.element_type() == TensorProto.FLOAT and xv.tensor_size_in_bytes() == 48
    (yv,) = sess.run_with_ort_values(["y"], {"x": xv})
    io.clear_binding_outputs()
    with pytest.raises(RuntimeError, match="output"):
        sess.run_with_iobinding(io)  # nothing bound to compute
    return {"y": y, "value": value.numpy(), "out": out, "ortvalue": yv.numpy(), "type": yv.data_type()}


def options_usage(ort: ModuleType, providers: list[str], path: str) -> dict[str, Any]:
    results = {}
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                  ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(path, sess_options=so, providers=providers)
        got = sess.get_session_options()
        assert got.graph_optimization_level == level and got.intra_op_num_threads == 1
        assert got.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        (results[str(level)],) = sess.run(None, {"x": np.full((2, 4), 0.5, np.float32)})
    fresh = ort.SessionOptions()
    results["defaults"] = [str(fresh.graph_optimization_level), str(fresh.execution_mode), fresh.intra_op_num_threads,
                           fresh.inter_op_num_threads, fresh.log_severity_level, fresh.enable_profiling,
                           fresh.enable_mem_pattern, fresh.optimized_model_filepath]
    results["enums"] = [(str(v), int(v)) for v in (*ort.GraphOptimizationLevel.__members__.values(),
                                                   *ort.ExecutionMode.__members__.values())]
    with pytest.raises(RuntimeError):
        fresh.get_session_config_entry("never.set")
    # A free dimension fixed by name: the inputs report the number, and feeds must match it.
    so = ort.SessionOptions()
    so.add_free_dimension_override_by_name("batch", 2)
    sess = ort.InferenceSession(path, sess_options=so, providers=providers)
    results["fixed"] = signature(sess.get_inputs()) + signature(sess.get_outputs())
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument):
        sess.run(None, {"x": np.zeros((3, 4), np.float32)})
    return results


def errors_usage(ort: ModuleType, providers: list[str], mlp: str, folder: Path) -> dict[str, Any]:
    state = ort.capi.onnxruntime_pybind11_state
    sess = ort.InferenceSession(mlp, providers=providers)
    x = np.ones((2, 4), np.float32)
    seen = {}
    with pytest.raises(ValueError) as e:
        sess.run(None, {})  # missing input: a ValueError in both
    seen["missing"] = issubclass(e.type, ValueError)
    for what, feed, names in (("rank", {"x": np.ones(4, np.float32)}, None), ("dim", {"x": np.ones((2, 5), np.float32)},
                                                                             None),
                              ("name", {"x": x, "nope": x}, None), ("output", {"x": x}, ["nope"])):
        with pytest.raises(state.InvalidArgument) as e:
            sess.run(names, feed)
        seen[what] = e.type.__name__
    with pytest.raises(state.InvalidProtobuf) as e:
        ort.InferenceSession(b"not an onnx model", providers=providers)
    seen["garbage"] = e.type.__name__
    with pytest.raises(state.NoSuchFile) as e:
        ort.InferenceSession(str(folder / "missing.onnx"), providers=providers)
    seen["no file"] = e.type.__name__
    with pytest.raises(TypeError):
        ort.InferenceSession(12345, providers=providers)
    return seen


def override_usage(ort: ModuleType, providers: list[str], path: str) -> dict[str, Any]:
    sess = ort.InferenceSession(path, providers=providers)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    (default,) = sess.run(None, {"x": x})
    (overridden,) = sess.run(None, {"x": x, "scale": np.array([-1.0], np.float32)})
    np.testing.assert_array_equal(default, 2 * x)
    np.testing.assert_array_equal(overridden, -x)
    return {"inputs": signature(sess.get_inputs()), "overridable": signature(sess.get_overridable_initializers()),
            "default": default, "overridden": overridden, "again": sess.run(None, {"x": x})[0]}


def external_data_usage(ort: ModuleType, providers: list[str], path: str) -> dict[str, Any]:
    sess = ort.InferenceSession(path, providers=providers)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x @ W + B, 0), rtol=1e-5, atol=1e-6)
    return {"y": y}


def unknown_provider_usage(ort: ModuleType, providers: list[str], path: str) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = ort.InferenceSession(path, providers=["NoSuchExecutionProvider"])
    (message,) = [str(w.message) for w in caught if "NoSuchExecutionProvider" in str(w.message)]
    assert "CPUExecutionProvider" in message  # it names the available ones
    # Malformed providers: ORT retries on CPU, unless enable_fallback=0, where the ValueError comes out.
    malformed = []
    for bad, options in (({"CPUExecutionProvider"}, None), (["CPUExecutionProvider"], [{}, {}]),
                         ([("CPUExecutionProvider", "not a dict")], None)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            malformed += ort.InferenceSession(path, providers=bad, provider_options=options).get_providers()
        with pytest.raises(ValueError, match="sequence|same length|strings or"):
            ort.InferenceSession(path, providers=bad, provider_options=options, enable_fallback=0)
    with pytest.raises(TypeError):
        ort.InferenceSession(path, providers=3)
    tuple_form = ort.InferenceSession(path, providers=[("CPUExecutionProvider", {})])
    return {"fallback": sess.get_providers(), "tuple": tuple_form.get_providers(), "malformed": malformed,
            "has_cpu": "CPUExecutionProvider" in ort.get_available_providers(), "device": ort.get_device() in
            ("CPU", "GPU")}


# -- the same usages on ONNX Runtime and on ember -------------------------------------------------------------------

def test_mlp_with_symbolic_batch(impl: Impl, models: dict[str, str]) -> None:
    got = agree(impl, mlp_usage, models["mlp"])
    assert got["inputs"] == [("x", ["batch", 4], "tensor(float)")]
    assert got["outputs"] == [("y", ["batch", 3], "tensor(float)")]


def test_int64_and_bool_outputs(impl: Impl, models: dict[str, str]) -> None:
    got = agree(impl, typed_usage, models["typed"])
    assert got["outputs"] == [("idx", ["n"], "tensor(int64)"), ("pos", ["n", 5], "tensor(bool)"),
                              ("shape", [2], "tensor(int64)")]


def test_model_metadata(impl: Impl, models: dict[str, str]) -> None:
    got = agree(impl, meta_usage, models["meta"])
    assert got["producer_name"] == "ember-tests" and got["version"] == 7 and got["graph_name"] == "meta_graph"


def test_undeclared_dims(impl: Impl, models: dict[str, str]) -> None:
    got = agree(impl, dims_usage, models["dims"])
    # An undeclared dim (and -1) reads as None, an undeclared rank as [].
    assert got["inputs"] == [("x", ["seq", None, 3], "tensor(float)"), ("f", [2, None], "tensor(float)"),
                             ("r", [], "tensor(float)")]


def test_io_binding_and_ort_values(impl: Impl, models: dict[str, str]) -> None:
    agree(impl, iobinding_usage, models["mlp"])


def test_session_options(impl: Impl, models: dict[str, str]) -> None:
    got = agree(impl, options_usage, models["mlp"])
    assert got["defaults"][:2] == ["GraphOptimizationLevel.ORT_ENABLE_ALL", "ExecutionMode.ORT_SEQUENTIAL"]


def test_error_classes(impl: Impl, models: dict[str, str], tmp_path: Path) -> None:
    agree(impl, errors_usage, models["mlp"], tmp_path)


def test_overridable_initializers(impl: Impl, models: dict[str, str]) -> None:
    got = agree(impl, override_usage, models["over"])
    assert got["overridable"] == [("scale", [1], "tensor(float)")]


def test_external_data(impl: Impl, models: dict[str, str]) -> None:
    agree(impl, external_data_usage, models["ext"])


def test_unknown_provider_warns_and_falls_back_to_cpu(impl: Impl, models: dict[str, str]) -> None:
    got = agree(impl, unknown_provider_usage, models["mlp"])
    assert got["fallback"] == ["CPUExecutionProvider"]


# -- ember's side: providers, device-resident values ---------------------------------------------------------------

def test_providers_pick_the_backend(models: dict[str, str]) -> None:
    assert ember.InferenceSession is ember_ort.InferenceSession and ember.SessionOptions is ember_ort.SessionOptions
    available = ember_ort.get_available_providers()
    assert available[-1] == "CPUExecutionProvider"
    assert ("WebGpuExecutionProvider" in available) == ("wgpu" in ember.available_backends())
    for providers in (["CPUExecutionProvider"], ["CUDAExecutionProvider", "CPUExecutionProvider"]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sess = ember_ort.InferenceSession(models["mlp"], providers=providers)
        assert sess.get_providers() == ["CPUExecutionProvider"] and sess.backend == "cpu"
        assert sess.get_provider_options() == {"CPUExecutionProvider": {}}
    sess = ember_ort.InferenceSession(models["mlp"])  # no providers: ember's auto choice
    assert sess.get_providers() == [BACKEND_PROVIDERS[sess.backend]] and sess.get_providers()[0] in available
    # A bare string is one provider name (ORT would read each character as one).
    assert ember_ort.InferenceSession(models["mlp"], providers="CPUExecutionProvider").backend == "cpu"
    so = ember_ort.SessionOptions()
    so.graph_optimization_level = ember_ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert not ember_ort.InferenceSession(models["mlp"], so, providers=["CPUExecutionProvider"]).model.fuse
    assert ember_ort.InferenceSession(models["mlp"], providers=["CPUExecutionProvider"]).model.fuse
    sess.set_providers(["CPUExecutionProvider"])
    assert sess.backend == "cpu"
    with pytest.raises(ValueError, match="sequence"):
        sess.set_providers({"CPUExecutionProvider"})  # ORT falls back only when a session is created
    (y,) = sess.run(None, {"x": np.ones((1, 4), np.float32)})
    np.testing.assert_allclose(y, np.maximum(np.ones((1, 4)) @ W + B, 0), rtol=1e-5, atol=1e-6)


def test_ignored_options_warn_unless_silenced(models: dict[str, str]) -> None:
    with pytest.warns(UserWarning, match="provider option 'arena_extend_strategy' is ignored"):
        ember_ort.InferenceSession(models["mlp"], providers=[("CPUExecutionProvider",
                                                              {"arena_extend_strategy": "kSameAsRequested"})])
    so = ember_ort.SessionOptions()
    so.enable_profiling = True
    with pytest.warns(UserWarning, match="enable_profiling is ignored"):
        ember_ort.InferenceSession(models["mlp"], so, providers=["CPUExecutionProvider"])
    so.log_severity_level = 3  # errors only: the session's warnings are silent
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ember_ort.InferenceSession(models["mlp"], so, providers=["NoSuchExecutionProvider"])


def test_ember_load_options(models: dict[str, str]) -> None:
    state = ember_ort.capi.onnxruntime_pybind11_state
    cpu = ["CPUExecutionProvider"]
    # Weights outside a model given as bytes: ember's external_data_dir says where.
    raw = onnx.load(models["ext"], load_external_data=False).SerializeToString()
    with pytest.raises(state.InvalidGraph, match="external_data_dir"):
        ember_ort.InferenceSession(raw, providers=cpu)
    sess = ember_ort.InferenceSession(raw, providers=cpu, external_data_dir=Path(models["ext"]).parent)
    x = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.maximum(x @ W + B, 0), rtol=1e-5, atol=1e-6)
    # An option ember cannot honour is the option's fault (InvalidArgument), not the model's.
    with pytest.raises(state.InvalidArgument, match="precision"):
        ember_ort.InferenceSession(models["mlp"], providers=cpu, precision="f16")
    with pytest.raises(state.InvalidArgument, match="plan_cache_bytes"):
        ember_ort.InferenceSession(models["mlp"], providers=cpu, plan_cache_bytes=-1)
    if "wgpu" in ember.available_backends():
        with pytest.raises(state.InvalidArgument, match="adapter"):
            ember_ort.InferenceSession(models["mlp"], providers=[("WebGpuExecutionProvider", {"adapter": "99"})])


def test_unsupported_and_malformed_models_use_ort_classes(tmp_path: Path) -> None:
    state = ember_ort.capi.onnxruntime_pybind11_state
    g = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"], domain="ai.ember.none")], "g", [vi("x", [1])],
                          [vi("y", [1])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.ember.none", 1)])
    with pytest.raises(state.NotImplemented, match="NoSuchOp"):
        ember_ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    bad = helper.make_graph([helper.make_node("Relu", ["nothing"], ["y"])], "g", [vi("x", [1])], [vi("y", [1])])
    with pytest.raises(state.InvalidGraph, match="nothing"):
        ember_ort.InferenceSession(helper.make_model(bad, opset_imports=[helper.make_opsetid("", 17)])
                                   .SerializeToString(), providers=["CPUExecutionProvider"])
    from ember.onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    assert InvalidArgument is state.InvalidArgument and issubclass(InvalidArgument, ValueError)


@pytest.mark.skipif("wgpu" not in ember.available_backends(), reason="no WebGPU adapter")
def test_webgpu_values_stay_on_the_device(models: dict[str, str]) -> None:
    sess = ember_ort.InferenceSession(models["mlp"], providers=["WebGpuExecutionProvider"])
    assert sess.backend == "wgpu"
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    want = np.maximum(x @ W + B, 0)
    xv = ember_ort.OrtValue.ortvalue_from_numpy(x, "webgpu", 0)
    assert xv.device_name() == "webgpu" and isinstance(xv.device_array, ember.DeviceArray)
    (yv,) = sess.run_with_ort_values(None, {"x": xv})
    assert yv.device_name() == "webgpu"
    np.testing.assert_allclose(yv.numpy(), want, rtol=1e-5, atol=1e-6)
    io = sess.io_binding()
    io.bind_ortvalue_input("x", xv)
    io.bind_output("y", "webgpu")
    sess.run_with_iobinding(io)
    (out,) = io.get_outputs()
    assert out.device_name() == "webgpu"
    np.testing.assert_allclose(io.copy_outputs_to_cpu()[0], want, rtol=1e-5, atol=1e-6)
    # A device OrtValue bound as the output receives the result; update_inplace rewrites an input on the device.
    target = ember_ort.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32, "webgpu")
    io.bind_ortvalue_output("y", target)
    xv.update_inplace(-x)
    sess.run_with_iobinding(io)
    np.testing.assert_allclose(target.numpy(), np.maximum(-x @ W + B, 0), rtol=1e-5, atol=1e-6)
    with pytest.raises(ember_ort.capi.onnxruntime_pybind11_state.NotImplemented):
        io.bind_input("x", "webgpu", 0, np.float32, [2, 4], 1234)
    # A device value feeds a cpu session too (read back, as ORT copies between devices), and run() takes it.
    cpu = ember_ort.InferenceSession(models["mlp"], providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(cpu.run(None, {"x": xv})[0], np.maximum(-x @ W + B, 0),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="webgpu"):
        bound = cpu.io_binding()
        bound.bind_cpu_input("x", x)
        bound.bind_output("y", "webgpu")
        cpu.run_with_iobinding(bound)
