"""The WebGPU runtimes under the wgpu backend (runtime.py): choosing one, what each reports, bad choices."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest

import ember
from ember import settings
from ember.backends.wgpu import runtime as rtm
from ember.cli import main as cli_main

from .helpers import download, upload

pytestmark = pytest.mark.skipif("wgpu" not in ember.available_backends(), reason="no wgpu adapter")


def _matmul_model() -> onnx.ModelProto:
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])
    w = oh.make_tensor("w", onnx.TensorProto.FLOAT, [8, 4], np.arange(32, dtype=np.float32) / 32)
    return oh.make_model(oh.make_graph([oh.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w]),
                         opset_imports=[oh.make_opsetid("", 17)])


@pytest.mark.parametrize("bad", ["vulkan", "Dawn", 3])
def test_bad_webgpu_choice_names_the_choices(bad: object) -> None:
    with pytest.raises(ValueError, match=r"webgpu: expected one of \['auto', 'dawn', 'wgpu-native'\]"):
        ember.backend("wgpu", webgpu=bad)
    with pytest.raises(ValueError, match="webgpu: expected one of"):
        ember.load_onnx(_matmul_model(), backend="wgpu", webgpu=bad)


def test_cpu_backend_refuses_webgpu() -> None:
    with pytest.raises(ValueError, match="cpu backend takes no options.*webgpu"):
        ember.backend("cpu", webgpu="wgpu-native")


def test_webgpu_setting_is_validated() -> None:
    with pytest.raises(ValueError):
        with settings.override(webgpu="metal"):
            pass


def test_resolve_follows_choice_then_setting() -> None:
    assert rtm.resolve("wgpu-native") == "wgpu-native"
    assert rtm.resolve("dawn") == "dawn"
    with settings.override(webgpu="wgpu-native"):
        assert rtm.resolve() == "wgpu-native"
        assert rtm.resolve("dawn") == "dawn"  # the option wins over the setting
    # auto takes Dawn only where it offers matrix units on a hardware adapter
    assert rtm.resolve("auto") == ("dawn" if rtm.auto_takes_dawn() else "wgpu-native")


def test_dawn_missing_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rtm, "_MADE", {})
    monkeypatch.setattr(rtm, "dawn_installed", lambda: False)
    with pytest.raises(RuntimeError, match=r"Dawn WebGPU runtime is not installed: pip install 'ember\[dawn\]'"):
        ember.backend("wgpu", webgpu="dawn")
    assert not rtm.auto_takes_dawn.__wrapped__()  # auto never picks a runtime that is not there


def test_wgpu_native_runs_and_reports_itself() -> None:
    be = ember.backend("wgpu", webgpu="wgpu-native")
    info = be.runtime_info()
    assert info["webgpu"] == "wgpu-native" and info["matrix_configs"] == []
    assert info["matrix"].startswith("none") or settings.MATRIX.get() in ("off", "emulate")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(8, dtype=np.float32).reshape(4, 2)
    ha, hb, hc = upload(be, a), upload(be, b), be.alloc(6 * 4)
    be.gemm(False, False, 3, 2, 4, 1.0, ha, 4, hb, 2, 0.0, hc, 2)
    np.testing.assert_allclose(download(be, hc, (3, 2)), a @ b, rtol=1e-6)


def test_dawn_runs_where_it_sees_an_adapter() -> None:
    """Dawn, where installed: the same product as wgpu-native, or (no adapter it accepts, e.g. Mesa 22's lavapipe)
    a RuntimeError naming the runtime and the driver it needs."""
    if not rtm.dawn_installed():
        with pytest.raises(RuntimeError, match="pip install 'ember\\[dawn\\]'"):
            ember.backend("wgpu", webgpu="dawn")
        return
    if not rtm.runtime("dawn").adapters():
        with pytest.raises(RuntimeError, match=r"backend 'wgpu' \(dawn\): no Vulkan/Metal/D3D12 adapter"):
            ember.backend("wgpu", webgpu="dawn")
        return
    be = ember.backend("wgpu", webgpu="dawn")
    assert be.runtime_info()["webgpu"] == "dawn"
    a = np.random.default_rng(0).standard_normal((33, 17)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((17, 9)).astype(np.float32)
    ha, hb, hc = upload(be, a), upload(be, b), be.alloc(33 * 9 * 4)
    be.gemm(False, False, 33, 9, 17, 1.0, ha, 17, hb, 9, 0.0, hc, 9)
    np.testing.assert_allclose(download(be, hc, (33, 9)), a @ b, rtol=1e-5, atol=1e-5)


def test_models_share_a_device_per_resolved_runtime() -> None:
    m1 = ember.load_onnx(_matmul_model(), backend="wgpu")
    m2 = ember.load_onnx(_matmul_model(), backend="wgpu", webgpu=rtm.resolve())
    assert m1._be is m2._be  # "auto" and the runtime it resolves to are one device
    x = np.ones((2, 8), np.float32)
    np.testing.assert_allclose(m1.run({"x": x})["y"], x @ (np.arange(32, dtype=np.float32).reshape(8, 4) / 32),
                               rtol=1e-6)
    info = m1.plan_info()["runtime"]
    assert info["webgpu"] == rtm.resolve() and info["backend"] == "wgpu"


def test_backends_cli_lists_each_runtime(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "wgpu (wgpu-native " in out and "matrix arm:" in out
    assert f"wgpu webgpu='auto' takes: {rtm.resolve()}" in out
    if rtm.dawn_installed():
        assert "wgpu (dawn" in out
