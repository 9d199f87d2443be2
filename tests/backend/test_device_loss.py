"""A lost GPU device (here: destroyed on purpose, as a driver reset would leave it): runs raise DeviceLostError
naming the backend, `Model.reload()` moves the model onto a new device, and models loaded by name afterwards get a
working one. Out-of-memory on allocation is tested in test_api.py."""

from __future__ import annotations

import numpy as np
import pytest

import ember

from ..unit.test_plan_cache import Reference, mlp


@pytest.fixture
def own_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backends loaded by name get devices of the test's own: the suite's shared one is not the one destroyed."""
    import ember.model

    monkeypatch.setattr(ember.model, "_SHARED", {})


def test_lost_device_is_a_clear_error_and_reload_recovers(own_shared: None) -> None:
    model = ember.load_onnx(mlp(), backend="wgpu")
    ref = Reference(mlp())
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(model.run({"x": x})["y"], ref(x), rtol=1e-4, atol=1e-5)
    lost = model.compute_backend
    lost.device.destroy()
    with pytest.raises(ember.DeviceLostError, match="wgpu backend: the device was lost") as err:
        model.run({"x": x})
    assert isinstance(err.value, RuntimeError) and lost.lost
    with pytest.raises(ember.DeviceLostError):  # said at once from now on, without touching the device
        model.run({"x": x[:1]})
    other = ember.load_onnx(mlp(), backend="wgpu")  # by name: a new device, not the lost one
    assert other.compute_backend is not lost
    model.reload()
    assert model.compute_backend is other.compute_backend
    for m in (model, other):
        np.testing.assert_allclose(m.run({"x": x})["y"], ref(x), rtol=1e-4, atol=1e-5)
    assert model.cache_info()["builds"] >= 2
    model.close()  # closing after a reload frees on the new device
    other.close()


def test_reload_of_a_model_on_a_caller_backend_object_says_what_to_do() -> None:
    be = ember.backend("wgpu")
    model = ember.load_onnx(mlp(), backend=be)
    be.device.destroy()
    with pytest.raises(ember.DeviceLostError):
        model.run({"x": np.zeros((1, 16), np.float32)})
    with pytest.raises(RuntimeError, match="backend object given to load_onnx"):
        model.reload()
    model.close()  # nothing to free on a lost device, and no error

