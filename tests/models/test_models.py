"""Whole models on every available backend, compared with ONNX Runtime CPU.

Per output: max|ember - ORT| <= 1e-4 * max|ORT| + 1e-5, and the same argmax in every row (a row whose
top two ORT scores lie within that tolerance accepts either).

The whole file has to finish in ~10 minutes on 2 CPU cores for both backends, where wgpu is Mesa's
lavapipe (software Vulkan). Per-sample cost, 2 x MACs of Conv/Gemm (zoo.py has them per model):
resnet18 3.6 GFLOP, the small 64x64 nets < 0.02, light models 0.25 (shufflenet) to 39.3 (vgg19).
Every dynamic-batch model runs at batch 1 and 8 on both backends (~220 GFLOP a backend); the light
models have batch 1 fixed in their files, so they run at batch 1 only. Measured with the runtime of
2026-11-30 on this 2-core machine: lavapipe does ~3 GFLOP/s on ResNet-18 (batch 8: 9 s), and model
load + run came to ~135 s for wgpu and ~10 s for cpu, exports ~15-30 s once (cached after), so
~3-4 minutes for the file. Should wgpu get too slow, list models in WGPU_BATCH1_ONLY: the four
ResNet-18 files are one function through four exporters, so batch 8 on one of them keeps the coverage.
Everything collected runs; `-m "not slow"` leaves the quick ones (shufflenet, squeezenet).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

import ember

from . import zoo

BACKENDS: list[str] = list(ember.available_backends())
BIG_BATCH = 8
# Dynamic-batch models wgpu runs at batch 1 only (empty: the full matrix fits the time budget today).
WGPU_BATCH1_ONLY: frozenset[str] = frozenset()
SLOW_GFLOP = 1.0  # a test costing more than this (per batch) is marked slow


def batches(backend: str, model: zoo.ZooModel) -> list[int]:
    if not model.dynamic_batch or (backend == "wgpu" and model.name in WGPU_BATCH1_ONLY):
        return [1]
    return [1, BIG_BATCH]


def _params() -> list[pytest.param]:
    params = []
    for backend in BACKENDS:
        for model in zoo.all_models().values():
            for batch in batches(backend, model):
                slow = model.exported or model.gflop * batch > SLOW_GFLOP
                marks = [pytest.mark.slow] if slow else []
                test_id = f"{backend}-{model.name}-b{batch}"
                params.append(pytest.param(backend, model.name, batch, id=test_id, marks=marks))
    return params


def assert_matches_reference(got: dict[str, np.ndarray], want: dict[str, np.ndarray], batch: int) -> None:
    for name, ref in want.items():
        assert name in got, f"output {name!r} missing; got {sorted(got)}"
        out = np.asarray(got[name])
        assert out.shape == ref.shape, f"{name}: shape {out.shape}, ORT {ref.shape}"
        assert out.dtype == ref.dtype, f"{name}: dtype {out.dtype}, ORT {ref.dtype}"
        assert np.isfinite(out).all(), f"{name}: non-finite values"
        tol = 1e-4 * float(np.abs(ref).max()) + 1e-5
        err = float(np.abs(out.astype(np.float64) - ref).max())
        assert err <= tol, (
            f"{name}: max|ember - ORT| = {err:.3g} > {tol:.3g} (max|ORT| = {np.abs(ref).max():.3g})"
        )
        # Class scores: the top class per row must agree, unless ORT's own top two are closer than the
        # tolerance (then both are right answers). The light models' uniform softmax is such a tie.
        rows_out, rows_ref = out.reshape(batch, -1), ref.reshape(batch, -1)
        picked = rows_out.argmax(axis=1)
        best = rows_ref.max(axis=1)
        chosen = rows_ref[np.arange(batch), picked]
        wrong = np.flatnonzero(chosen < best - tol)
        assert wrong.size == 0, (
            f"{name}: argmax differs in rows {wrong.tolist()}: ember {picked[wrong].tolist()}, "
            f"ORT {rows_ref.argmax(axis=1)[wrong].tolist()}"
        )


@pytest.mark.parametrize(("backend", "model_name", "batch"), _params())
def test_model_matches_onnxruntime(
    backend: str,
    model_name: str,
    batch: int,
    model_file: Callable[[str], Path],
    ort_reference: Callable[[str, int], tuple[dict[str, np.ndarray], dict[str, np.ndarray]]],
    record_timing: Callable[[float, float], None],
) -> None:
    path = model_file(model_name)
    feeds, want = ort_reference(model_name, batch)
    source: str | onnx.ModelProto = str(path)
    undetermined = undetermined_softmax(path, feeds)
    if undetermined:
        # Compare those outputs' logits instead: float32 fixes them, not the probabilities.
        source, replaced, logits = undetermined
        want = {**{k: v for k, v in want.items() if k not in replaced}, **logits}

    t0 = time.perf_counter()
    model = ember.load_onnx(source, backend=backend)
    t1 = time.perf_counter()
    try:
        assert model.backend == backend
        got = model.run(feeds)
        t2 = time.perf_counter()
    finally:
        del model
        gc.collect()  # release device buffers before the next (maybe 0.5 GB) model loads
    record_timing(t1 - t0, t2 - t1)
    assert_matches_reference(got, want, batch)


# A Softmax over logits this large is not determined by float32 arithmetic: a logit's rounding (|z| * 2^-23) moves
# the probabilities by factors of e^(that rounding). The light zoo's SqueezeNet (real weights) has logits ~1e10.
SOFTMAX_LOGIT_ROUNDING = 1e-2


def undetermined_softmax(path: Path, feeds: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, set, dict] | None:
    """For outputs that are a Softmax of logits whose float32 rounding exceeds SOFTMAX_LOGIT_ROUNDING: (the model
    with their logits exposed as outputs, those outputs' names, {logits name: ORT's logits}); None when none are."""
    import onnxruntime as ort

    proto = onnx.load(str(path))
    producers = {o: n for n in proto.graph.node for o in n.output}
    softmax_inputs = {o.name: producers[o.name].input[0] for o in proto.graph.output
                      if o.name in producers and producers[o.name].op_type == "Softmax"}
    if not softmax_inputs:
        return None
    for logits in softmax_inputs.values():
        proto.graph.output.append(onnx.helper.make_tensor_value_info(logits, onnx.TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    values = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    wide = {out: values[z] for out, z in softmax_inputs.items()
            if float(np.abs(values[z]).max()) * 2.0 ** -23 > SOFTMAX_LOGIT_ROUNDING}
    if not wide:
        return None
    return proto, set(wide), {softmax_inputs[out]: z for out, z in wide.items()}


# ---------------------------------------------------------------- the zoo itself (ONNX Runtime only)


def test_resnet18_exports_agree(model_file: Callable[[str], Path]) -> None:
    """The four ResNet-18 files hold one function (same seed), whatever the exporter did to it."""
    import onnxruntime as ort

    x = zoo.input_array("resnet18-agree", (2, *zoo.RESNET_INPUT))
    outs = {}
    for name in ("resnet18_opset9", "resnet18_opset17", "resnet18_dynamo", "resnet18_bn_unfused"):
        sess = ort.InferenceSession(str(model_file(name)), providers=["CPUExecutionProvider"])
        outs[name] = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    ref = outs["resnet18_opset9"]
    tol = 1e-4 * float(np.abs(ref).max()) + 1e-5
    for name, out in outs.items():
        assert np.abs(out - ref).max() <= tol, name


@pytest.mark.parametrize(
    ("name", "has_bn"), [("resnet18_bn_unfused", True), ("mobilenetv3", True), ("resnet18_opset17", False)]
)
def test_batchnorm_fused_or_not(name: str, has_bn: bool, model_file: Callable[[str], Path]) -> None:
    ops = zoo.op_types(model_file(name))
    assert ("BatchNormalization" in ops) == has_bn, ops


def test_light_models_are_listed() -> None:
    models = zoo.light_models()
    assert sorted(models) == sorted(zoo.LIGHT_NAMES)
    for path, shape in models.values():
        assert path.exists() and shape == (1, 3, 224, 224)
        assert "ConstantOfShape" in zoo.op_types(path)
        onnx.checker.check_model(str(path))
