"""DFT (ONNX opset 17 and 20) on every backend, against numpy's FFT in float64 and ONNX's own node cases.

ONNX Runtime CPU fails every DFT case of onnx 1.23, so the cases cannot sit in the conformance allowlists (which
lean on ONNX Runtime's pass list); they are checked here instead. The two inverse cases are left out: their expected
imaginary parts are exact zeros that a float32 spectrum cannot reproduce within the runner's atol of 1e-7.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember

from ..conformance.harness import all_cases, check_case

CASES = ["test_dft", "test_dft_axis", "test_dft_axis_opset19", "test_dft_irfft", "test_dft_irfft_opset19",
         "test_dft_opset19", "test_dft_rfft", "test_dft_rfft_opset19"]


@pytest.mark.parametrize("name", CASES)
def test_onnx_node_case(name: str, backend_name: str) -> None:
    check_case(all_cases()[name], backend_name)


def dft_model(shape: tuple[int, ...], opset: int, axis: int, inverse: int, onesided: int,
              length: int | None) -> bytes:
    inputs = ["x", "n" if length is not None else ""]
    inits = [helper.make_tensor("n", TensorProto.INT64, [], [length])] if length is not None else []
    attrs = {"inverse": inverse, "onesided": onesided}
    if opset >= 20:
        inputs.append("axis")
        inits.append(helper.make_tensor("axis", TensorProto.INT64, [], [axis]))
    else:
        attrs["axis"] = axis
    node = helper.make_node("DFT", inputs, ["y"], **attrs)
    graph = helper.make_graph([node], "dft", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def reference(x: np.ndarray, axis: int, inverse: bool, onesided: bool, length: int | None) -> np.ndarray:
    signal = x[..., 0].astype(np.float64) if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1].astype(np.float64)
    n = length or (2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis])
    if inverse and onesided:
        return np.fft.irfft(signal, n=n, axis=axis)[..., None]
    spectrum = (np.fft.ifft if inverse else np.fft.fft)(signal, n=n, axis=axis)
    if onesided:
        spectrum = np.take(spectrum, range(n // 2 + 1), axis=axis)
    return np.stack([spectrum.real, spectrum.imag], -1)


@pytest.mark.parametrize(("shape", "opset", "axis", "inverse", "onesided", "length"), [
    ((2, 16, 1), 20, 1, 0, 0, None),         # real signal, full spectrum
    ((3, 10, 4, 2), 20, -3, 0, 0, None),     # complex, an inner dim after the axis, negative axis
    ((2, 12, 2), 17, 1, 1, 0, None),         # inverse
    ((2, 9, 1), 20, 1, 0, 1, None),          # one-sided, odd length
    ((1, 7, 2), 17, 1, 0, 0, 12),            # zero-padded to dft_length
    ((1, 20, 1), 20, 1, 0, 0, 8),            # cut to dft_length
    ((2, 5, 3, 2), 20, 1, 1, 1, 8),          # a real inverse of a one-sided spectrum (irfft)
    ((1, 1000, 1), 20, 1, 0, 0, None),       # long: the phase reduced mod N keeps float32 precise
])
def test_matches_numpy_fft(backend_name: str, shape: tuple[int, ...], opset: int, axis: int, inverse: int,
                           onesided: int, length: int | None) -> None:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    model = ember.load_onnx(dft_model(shape, opset, axis, inverse, onesided, length), backend=backend_name)
    got = model.run({"x": x})["y"]
    want = reference(x, axis % len(shape), bool(inverse), bool(onesided), length)
    assert got.shape == want.shape
    scale = float(np.abs(want).max())
    # float32 sums of up to N terms: the error grows like sqrt(N) ulps of the largest term.
    assert float(np.abs(got - want).max()) <= 2e-6 * np.sqrt(want.shape[axis % len(shape)]) * scale


def test_bad_axis_is_named() -> None:
    # ONNX's shape inference sees it first, at load: "axis attribute value -1 is invalid for a tensor of rank 3".
    with pytest.raises(ValueError, match=r"DFT .*axis (attribute value )?-1 is (outside|invalid)"):
        ember.load_onnx(dft_model((2, 8, 1), 20, -1, 0, 0, None), backend="cpu")


def test_last_dim_must_be_real_or_complex() -> None:
    with pytest.raises(ValueError, match=r"must end in a dim of 1 \(real\) or 2 \(complex\)"):
        ember.load_onnx(dft_model((2, 8, 3), 20, 1, 0, 0, None), backend="cpu")
