"""load_onnx's and ember.backend()'s keyword options: typed, keyword-only, and checked by name and value. A typo
raises TypeError naming it, the closest valid option and every valid one; a wrong value names the option and what
was given, before the model is read."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import ember
from ember.model import LOAD_OPTIONS, shared_backend

from .test_plan_cache import mlp

LOAD_VALID = ("adapter, autotune, external_data_dir, fuse, plan_cache_bytes, power_preference, precision, safe, "
              "webgpu")


@pytest.mark.parametrize(("typo", "meant"), [("autotun", "autotune"), ("precison", "precision"), ("fused", "fuse"),
                                             ("plan_cache_byte", "plan_cache_bytes"), ("adaptor", "adapter"),
                                             ("external_data", "external_data_dir")])
def test_load_onnx_typo_names_the_closest_option(typo: str, meant: str) -> None:
    with pytest.raises(TypeError) as info:
        ember.load_onnx(mlp(), backend="cpu", **{typo: True})
    assert str(info.value) == (f"load_onnx() got an unexpected option {typo!r} (did you mean {meant!r}?); "
                               f"valid options: {LOAD_VALID}")


def test_load_onnx_unknown_option_without_a_close_match() -> None:
    with pytest.raises(TypeError, match=r"unexpected option 'zzz'; valid options: adapter, autotune") as info:
        ember.load_onnx(mlp(), backend="cpu", zzz=1)
    assert "did you mean" not in str(info.value)


def test_several_unknown_options_are_all_named() -> None:
    with pytest.raises(TypeError, match=r"'autotun' \(did you mean 'autotune'\?\) \(and 'precison'\)"):
        ember.load_onnx(mlp(), backend="cpu", precison="f16", autotun=True)


def test_typo_is_caught_before_the_model_is_read() -> None:
    with pytest.raises(TypeError, match="autotun"):
        ember.load_onnx("/no/such/model.onnx", backend="cpu", autotun=True)
    with pytest.raises(ValueError, match="precision"):
        ember.load_onnx("/no/such/model.onnx", backend="cpu", precision="f8")


@pytest.mark.parametrize(("typo", "meant"), [("adaptr", "adapter"), ("power_preferense", "power_preference"),
                                             ("power", "power_preference")])
def test_backend_typo_names_the_closest_option(typo: str, meant: str) -> None:
    for make in (ember.backend, shared_backend):
        with pytest.raises(TypeError) as info:
            make("cpu", **{typo: 0})
        where = make.__name__
        assert str(info.value) == (f"{where}() got an unexpected option {typo!r} (did you mean {meant!r}?); valid "
                                   "options: adapter, power_preference, safe, webgpu")


@pytest.mark.parametrize(("option", "value", "error"), [
    ("fuse", 1, TypeError), ("fuse", "yes", TypeError), ("fuse", None, TypeError),
    ("precision", "fp16", ValueError), ("precision", "F16", ValueError), ("precision", 16, ValueError),
    ("precision", None, ValueError),
    ("plan_cache_bytes", -1, ValueError), ("plan_cache_bytes", 1.5, ValueError),
    ("plan_cache_bytes", "1GB", ValueError), ("plan_cache_bytes", True, ValueError),
    ("autotune", "yes", TypeError), ("autotune", 1, TypeError),
    ("adapter", 1.0, TypeError), ("adapter", True, TypeError), ("adapter", [0], TypeError),
    ("power_preference", "fast", ValueError), ("power_preference", 1, ValueError),
])
def test_wrong_values_name_the_option_and_the_value(option: str, value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=rf"^{option}: expected .*got {re.escape(repr(value))}"):
        ember.load_onnx(mlp(), backend="cpu", **{option: value})


@pytest.mark.parametrize(("option", "value", "error"), [("adapter", 1.0, TypeError), ("adapter", False, TypeError),
                                                        ("power_preference", "fast", ValueError)])
def test_backend_wrong_values(option: str, value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=rf"^{option}: expected .*got {re.escape(repr(value))}"):
        ember.backend("cpu", **{option: value})


def test_cpu_backend_refuses_device_options() -> None:
    with pytest.raises(ValueError, match="cpu backend takes no options, got \\['adapter'\\]"):
        ember.backend("cpu", adapter=0)
    with pytest.raises(ValueError, match="power_preference"):
        ember.load_onnx(mlp(), backend="cpu", power_preference="low-power")


def test_device_options_with_a_backend_object_are_refused() -> None:
    with pytest.raises(ValueError, match="adapter: pick the device of a backend given by name"):
        ember.load_onnx(mlp(), backend=ember.backend("cpu"), adapter=0)


def test_every_documented_option_is_accepted(tmp_path: object) -> None:
    x = np.ones((2, 16), np.float32)
    want = ember.load_onnx(mlp(), backend="cpu").run({"x": x})["y"]
    for opts in ({"fuse": True}, {"fuse": False}, {"fuse": np.bool_(False)}, {"precision": "f32"},
                 {"plan_cache_bytes": 0}, {"plan_cache_bytes": 1 << 20}, {"plan_cache_bytes": np.int64(4096)},
                 {"plan_cache_bytes": None}, {"autotune": None}, {"autotune": False}, {"autotune": True},
                 {"adapter": None, "power_preference": None}, {"external_data_dir": tmp_path},
                 {"external_data_dir": None}):
        m = ember.load_onnx(mlp(), backend="cpu", **opts)
        np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)
    m = ember.load_onnx(mlp(), "cpu", external_data_dir=None, fuse=False, precision="f32", plan_cache_bytes=1 << 20,
                        autotune=False, adapter=None, power_preference=None)
    assert m.fuse is False and m.precision == "f32" and m.cache_info()["limit_bytes"] == 1 << 20
    assert ember.backend("cpu", adapter=None, power_preference=None).name == "cpu"
    # None is "not given": the same shared device as no option at all.
    assert shared_backend("cpu", adapter=None) is shared_backend("cpu")


def test_signatures_are_keyword_only_and_typed() -> None:
    params = inspect.signature(ember.load_onnx).parameters
    keyword = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert sorted(keyword) == sorted(LOAD_OPTIONS)
    assert {n: params[n].default for n in keyword} == {
        "external_data_dir": None, "fuse": True, "precision": "f32", "plan_cache_bytes": None, "autotune": None,
        "adapter": None, "power_preference": None, "safe": False, "webgpu": None}
    assert all(params[n].annotation is not inspect.Parameter.empty for n in keyword)
    for name in keyword:  # each one documented
        assert f"{name} (" in ember.load_onnx.__doc__, name
    bparams = inspect.signature(ember.backend).parameters
    assert [n for n, p in bparams.items() if p.kind is inspect.Parameter.KEYWORD_ONLY] == [
        "adapter", "power_preference", "safe", "webgpu"]
    # Model takes every option but external_data_dir (which load_onnx reads), also keyword-only.
    mparams = inspect.signature(ember.Model).parameters
    assert sorted(n for n, p in mparams.items() if p.kind is inspect.Parameter.KEYWORD_ONLY) == \
        sorted(set(LOAD_OPTIONS) - {"external_data_dir"})


@pytest.mark.skipif("wgpu" not in ember.available_backends(), reason="no WebGPU adapter")
def test_wgpu_options_accepted() -> None:
    x = np.ones((2, 16), np.float32)
    want = ember.load_onnx(mlp(), backend="cpu").run({"x": x})["y"]
    for opts in ({"adapter": 0}, {"power_preference": "low-power"}, {"power_preference": "high-performance"},
                 {"autotune": False, "plan_cache_bytes": 1 << 20}):
        m = ember.load_onnx(mlp(), backend="wgpu", **opts)
        np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match="did you mean 'power_preference'"):
        ember.backend("wgpu", power_prefrence="low-power")


WGPU = pytest.mark.skipif("wgpu" not in ember.available_backends(), reason="no wgpu adapter")


@WGPU
def test_safe_runs_checked_shader_modules_on_a_device_of_its_own() -> None:
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    trusted = ember.load_onnx(mlp(), backend="wgpu")
    safe = ember.load_onnx(mlp(), backend="wgpu", safe=True)
    assert safe.compute_backend is not trusted.compute_backend
    assert safe.compute_backend.checked and not trusted.compute_backend.checked
    assert safe.compute_backend is ember.load_onnx(mlp(), backend="wgpu", safe=True).compute_backend  # shared
    np.testing.assert_array_equal(safe.run({"x": x})["y"], trusted.run({"x": x})["y"])
    safe.reload()
    assert safe.compute_backend.checked


@WGPU
def test_safe_refuses_a_trusted_backend_object() -> None:
    with pytest.raises(ValueError, match=r"safe=True: the wgpu backend object given runs trusted shader modules"):
        ember.load_onnx(mlp(), backend=ember.backend("wgpu"), safe=True)
    assert ember.load_onnx(mlp(), backend=ember.backend("wgpu", safe=True), safe=True).compute_backend.checked


def test_safe_on_cpu_is_accepted_and_safe_must_be_a_bool() -> None:
    x = np.ones((2, 16), np.float32)
    assert ember.load_onnx(mlp(), backend="cpu", safe=True).run({"x": x})["y"].shape == (2, 8)
    with pytest.raises(TypeError, match=r"safe: expected True or False, got 'yes'"):
        ember.load_onnx(mlp(), backend="cpu", safe="yes")
