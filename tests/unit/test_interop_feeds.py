"""Feeds from other array libraries (ember.interop): torch tensors (requires_grad, non-contiguous, CUDA through the
host), objects with only __array__ or only __dlpack__; and DeviceArray read back through numpy's and DLPack's
protocols. Each run equals the run on the numpy feed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import ember
import ember.onnxruntime as ember_ort
from ember.interop import host_array

from .test_plan_cache import mlp


class OnlyArray:
    """Numpy's protocol and nothing else."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._a if dtype is None else self._a.astype(dtype)


class OnlyDLPack:
    """DLPack's protocol and nothing else (no __array__, no numpy())."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._a.__dlpack_device__()


class FakeCudaTensor:
    """A torch-like tensor on "cuda": numpy() works only after cpu(), which it records."""

    def __init__(self, a: np.ndarray, calls: list[str], device: str = "cuda") -> None:
        self._a, self.calls, self.device, self.dtype = a, calls, SimpleNamespace(type=device), a.dtype

    def detach(self) -> FakeCudaTensor:
        self.calls.append("detach")
        return FakeCudaTensor(self._a, self.calls, self.device.type)

    def cpu(self) -> FakeCudaTensor:
        self.calls.append("cpu")
        return FakeCudaTensor(self._a, self.calls, "cpu")

    def numpy(self) -> np.ndarray:
        if self.device.type != "cpu":
            raise TypeError("can't convert cuda:0 device type tensor to numpy")
        self.calls.append("numpy")
        return self._a


@pytest.fixture(scope="module")
def model() -> ember.Model:
    return ember.load_onnx(mlp(), backend="cpu")


@pytest.fixture
def x() -> np.ndarray:
    return np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)


def feeds(x: np.ndarray) -> dict[str, Any]:
    """Every kind of feed for the array x (float32, shape (3, 16))."""
    t = torch.from_numpy(x.copy())
    return {
        "torch": t,
        "torch requires_grad": t.clone().requires_grad_(True),
        "torch grad non-leaf": t.clone().requires_grad_(True) * 1.0,
        "torch transposed": torch.from_numpy(np.ascontiguousarray(x.T)).T,
        "torch transposed requires_grad": torch.from_numpy(np.ascontiguousarray(x.T)).requires_grad_(True).t(),
        "torch float64": t.double(),  # within the kind: float64 -> float32
        "__array__ only": OnlyArray(x.copy()),
        "__dlpack__ only": OnlyDLPack(x.copy()),
        "__dlpack__ of a transpose": OnlyDLPack(np.ascontiguousarray(x.T).T),
    }


@pytest.mark.parametrize("kind", list(feeds(np.zeros((3, 16), np.float32))))
def test_feed_kinds_match_the_numpy_feed(model: ember.Model, x: np.ndarray, kind: str) -> None:
    want = model.run({"x": x})["y"]
    value = feeds(x)[kind]
    np.testing.assert_allclose(model.run({"x": value})["y"], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(model(value)[0], want, rtol=1e-6, atol=1e-6)


def test_transposed_torch_feed_is_really_non_contiguous(x: np.ndarray) -> None:
    t = torch.from_numpy(np.ascontiguousarray(x.T)).T
    assert not t.is_contiguous()
    np.testing.assert_array_equal(host_array("x", t), x)


def test_torch_feed_is_not_modified_and_keeps_its_grad(model: ember.Model, x: np.ndarray) -> None:
    t = torch.from_numpy(x.copy()).requires_grad_(True)
    model.run({"x": t})
    assert t.requires_grad and t.grad is None
    np.testing.assert_array_equal(t.detach().numpy(), x)


def test_cuda_tensor_goes_through_the_host(model: ember.Model, x: np.ndarray) -> None:
    calls: list[str] = []
    got = model.run({"x": FakeCudaTensor(x, calls)})["y"]
    assert calls == ["detach", "cpu", "numpy"]
    np.testing.assert_allclose(got, model.run({"x": x})["y"], rtol=1e-6, atol=1e-6)
    calls.clear()
    host_array("x", FakeCudaTensor(x, calls, device="cpu"))
    assert calls == ["detach", "numpy"]  # a host tensor is not copied


def test_casting_rule_holds_for_interop_feeds(model: ember.Model, x: np.ndarray) -> None:
    with pytest.raises(ValueError, match="expected dtype float32, got int64"):
        model.run({"x": torch.ones((3, 16), dtype=torch.int64)})
    with pytest.raises(ValueError, match="expected dtype float32, got int32"):
        model.run({"x": OnlyDLPack(np.ones((3, 16), np.int32))})
    with pytest.raises(ValueError, match="dim 1 must be 16"):
        model.run({"x": OnlyArray(np.ones((3, 4), np.float32))})
    with pytest.raises(ValueError, match=r"input 'x': cannot read the Tensor \(dtype torch.bfloat16\)"):
        model.run({"x": torch.ones((3, 16), dtype=torch.bfloat16)})


def test_inference_session_takes_interop_feeds(x: np.ndarray) -> None:
    sess = ember_ort.InferenceSession(mlp().SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    for value in feeds(x).values():
        np.testing.assert_allclose(sess.run(None, {"x": value})[0], want, rtol=1e-6, atol=1e-6)


def test_device_array_through_numpy_and_dlpack() -> None:
    be = ember.backend("cpu")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    d = ember.DeviceArray.from_numpy(be, a)
    np.testing.assert_array_equal(np.asarray(d), a)
    np.testing.assert_array_equal(np.asarray(d, dtype=np.float64), a)
    assert np.asarray(d, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match="always a copy"):
        np.array(d, copy=False)
    assert d.__dlpack_device__() == (1, 0)  # kDLCPU: the export is a host copy
    host = np.from_dlpack(d)
    np.testing.assert_array_equal(host, a)
    host[...] = 0  # a copy: the device array is unchanged
    np.testing.assert_array_equal(d.numpy(), a)
    np.testing.assert_array_equal(torch.from_dlpack(d).numpy(), a)
    with pytest.raises(BufferError):
        np.from_dlpack(d, copy=False)


@pytest.mark.skipif("wgpu" not in ember.available_backends(), reason="no WebGPU adapter")
def test_wgpu_interop_feeds_and_device_array(x: np.ndarray) -> None:
    m = ember.load_onnx(mlp(), backend="wgpu")
    want = ember.load_onnx(mlp(), backend="cpu").run({"x": x})["y"]
    for kind, value in feeds(x).items():
        np.testing.assert_allclose(m.run({"x": value})["y"], want, rtol=1e-4, atol=1e-5, err_msg=kind)
    out = m.run({"x": torch.from_numpy(x).requires_grad_(True)}, keep_on_device=True)["y"]
    assert isinstance(out, ember.DeviceArray)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.from_dlpack(out), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(torch.from_dlpack(out).numpy(), want, rtol=1e-4, atol=1e-5)
