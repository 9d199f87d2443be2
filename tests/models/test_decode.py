"""Greedy decoding with a KV cache through `transformers` decoders exported to ONNX (tests/models/decoders.py): a
prompt with an empty cache, then one token a step with the cache fed back on the device, compared with ONNX
Runtime step by step (logits and tokens)."""

from __future__ import annotations

import numpy as np
import pytest

import ember

from . import decoders
from .decoders import GPT2, LLAMA, Decoder

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

PROMPT = [3, 141, 59, 26, 5]


def _greedy(cfg: Decoder, path: str, backend: str, steps: int, prefill: bool) -> tuple[ember.Model, int]:
    """Decode with ember (cache kept on the device) and with ONNX Runtime for `steps` runs: PROMPT in one run
    (`prefill`) or a token a run, then greedy tokens; assert every run's logits and token agree. Returns the model
    and the number of distinct feed shapes it saw."""
    model = ember.load_onnx(path, backend=backend)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = cfg.output_names()
    ids = np.array([PROMPT if prefill else PROMPT[:1]], np.int64)
    past_e: dict = cfg.past(1, 0)
    past_o = dict(past_e)
    shapes = set()
    total = 0
    for step in range(steps):
        total += ids.shape[1]
        mask = np.ones((1, total), np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        shapes.add((ids.shape, mask.shape))
        out_e = model.run({**feeds, **past_e}, keep_on_device=True)
        out_o = dict(zip(names, sess.run(names, {**feeds, **past_o}), strict=True))
        logits = out_e["logits"].numpy()
        want = out_o["logits"]
        err = np.abs(logits - want).max() / max(np.abs(want).max(), 1e-6)
        assert err <= 1e-4, f"step {step}: logits differ from ONNX Runtime's by {err:.2e} (relative to their max)"
        token = int(logits[0, -1].argmax())
        assert token == int(want[0, -1].argmax()), f"step {step}: token {token}, ONNX Runtime {want[0, -1].argmax()}"
        assert out_e["present_0_k"].shape == (1, cfg.kv_heads, total, cfg.head_dim)
        past_e = {f"past{n[len('present'):]}": out_e[n] for n in names[1:]}  # DeviceArrays: no host round trip
        past_o = {f"past{n[len('present'):]}": out_o[n] for n in names[1:]}
        forced = not prefill and step + 1 < len(PROMPT)
        ids = np.array([[PROMPT[step + 1] if forced else token]], np.int64)
    return model, len(shapes)


@pytest.mark.parametrize("cfg", [GPT2, LLAMA], ids=["gpt2", "llama"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_greedy_decode_matches_onnxruntime(backend_name: str, cfg: Decoder, exporter: str) -> None:
    backend = backend_name
    steps = 64
    # The torchscript exporter bakes the traced sequence length of 1 into LLaMA's attention (ONNX Runtime fails a
    # longer prompt too): that export reads the prompt a token a run.
    prefill = not (exporter == "torchscript" and cfg.arch == "llama")
    model, shapes = _greedy(cfg, str(decoders.export(cfg, exporter)), backend, steps, prefill)
    info = model.cache_info()
    # Planned: the prefill (or, a token a run, past lengths 0 and 1: a dim of 0 or 1 plans apart), then two past
    # lengths fit a template; a third is traced to verify it and, like every later length, served by the
    # template's live plan (ember/plan/fit.py, live.py): no plan built, no graph walk after it.
    assert shapes == steps
    assert info["builds"] == (3 if prefill else 4), info
    assert info["traces"] == info["builds"] + 1, info
    assert info["from_template"] == steps - info["builds"]
    assert info["bytes"] <= info["limit_bytes"]
    assert info["weight_bytes"] > 0 and info["evictions"] == 0


@pytest.mark.parametrize("cfg", [decoders.PHI, decoders.GPT_NEOX], ids=["phi", "gpt_neox"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_partial_rotary_decode_matches_onnxruntime(backend_name: str, cfg: Decoder, exporter: str) -> None:
    """Rotary over part of each head (Phi: half, GPT-NeoX: a quarter): RotateHalf on the rotated slice, the rest
    passed through, every step equal to ONNX Runtime's."""
    model, shapes = _greedy(cfg, str(decoders.export(cfg, exporter)), backend_name, 12, prefill=True)
    assert shapes == 12
    assert model.rewrites["rotary_fused"] == 2 * cfg.layers
    assert model.stats()["rotary.fused"] == 2 * cfg.layers * 12


def test_a_small_plan_cache_evicts_during_decode_and_stays_correct() -> None:
    path = str(decoders.export(GPT2, "torchscript"))
    model = ember.load_onnx(path, backend="cpu", plan_cache_bytes=1)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    # Two past lengths alternated: every run evicts the other's plan and rebuilds its own.
    for i in range(6):
        length = 4 + (i % 2) * 7
        feeds = {"input_ids": np.array([[i + 1]], np.int64), "attention_mask": np.ones((1, length + 1), np.int64),
                 **GPT2.past(1, length, seed=i)}
        got = model.run(feeds)["logits"]
        want = sess.run(["logits"], feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    info = model.cache_info()
    assert info["plans"] == 1 and info["builds"] == 6 and info["evictions"] == 5


@pytest.mark.parametrize("cfg", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_every_plan_a_decode_takes_from_its_template_equals_a_traced_build(backend_name: str, cfg: Decoder) -> None:
    # EMBER_TEMPLATE_CHECK traces each shape a template serves and compares the two number for number.
    with ember.settings.override(template_check=True):
        model, _ = _greedy(cfg, str(decoders.export(cfg, "dynamo")), backend_name, 12, prefill=False)
    info = model.cache_info()
    assert info["builds"] == 4 and info["from_template"] == 8, info


def test_precision_f16_decode_is_made_from_a_template() -> None:
    # precision="f16" casts the constants that move with the past length (the position embedding row): the
    # template recomputes them and casts them again, saturated as the planner does.
    path = str(decoders.export(GPT2, "dynamo"))
    m32 = ember.load_onnx(path, backend="wgpu")
    m16 = ember.load_onnx(path, backend="wgpu", precision="f16")
    with ember.settings.override(template_check=True):
        for length in range(2, 14):
            feeds = {"input_ids": np.array([[7]], np.int64), "attention_mask": np.ones((1, length + 1), np.int64),
                     **GPT2.past(1, length, seed=length)}
            got, want = m16.run(feeds)["logits"], m32.run(feeds)["logits"]
            assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max(), length
    info = m16.cache_info()
    assert info["builds"] == 2 and info["from_template"] == 10, info


# A decode step's kernels for the 2-layer configs (GPT2, LLAMA, QWEN2), the most each backend may record: the
# rewrites that keep them down are rotary (RotateHalf), Q/K/V and gate/up as one product, the per-layer mask
# computed once, reshapes of strided data as views, residual adds in the products' epilogues, and on wgpu a
# Concat (the grown KV cache) as one kernel. A regression in any of them shows here as more steps. (The cpu
# backend composes RotateHalf of views, two copies and a kernel, and copies a Concat part by part: numpy's
# slices are cheaper there than one kernel's computed indices.)
STEP_BUDGET = {("gpt2", "wgpu"): 27, ("gpt2", "cpu"): 35, ("llama", "wgpu"): 35, ("llama", "cpu"): 47,
               ("qwen2", "wgpu"): 35, ("qwen2", "cpu"): 47}


@pytest.mark.parametrize("cfg", [GPT2, LLAMA, decoders.QWEN2], ids=["gpt2", "llama", "qwen2"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_f16_decode_step_adds_only_the_logits_cast(cfg: Decoder, exporter: str) -> None:
    # precision="f16" keeps the float32 past KV as it comes (Concat and attention read either float), reads no
    # data for Shape, and narrows a widened float16 value (the models' Cast to float32 around RMSNorm) back to
    # itself: the step is the float32 one's kernels plus the logits' cast to the declared float32.
    path = str(decoders.export(cfg, exporter))
    feeds = {"input_ids": np.array([[1]], np.int64), "attention_mask": np.ones((1, 7), np.int64), **cfg.past(1, 6)}
    m32, m16 = (ember.load_onnx(path, backend="wgpu", precision=p) for p in ("f32", "f16"))
    n32, n16 = m32.plan_info(feeds)["steps"], m16.plan_info(feeds)["steps"]
    assert n16 == n32 + 1, (n32, n16)
    got, want = m16.run(feeds), m32.run(feeds)
    for name in cfg.output_names():
        assert got[name].dtype == np.float32, name
        assert np.abs(got[name] - want[name]).max() <= 1e-2 * np.abs(want[name]).max(), name


@pytest.mark.parametrize("cfg", [GPT2, LLAMA, decoders.QWEN2], ids=["gpt2", "llama", "qwen2"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_decode_step_kernels(backend_name: str, cfg: Decoder, exporter: str) -> None:
    model = ember.load_onnx(str(decoders.export(cfg, exporter)), backend=backend_name)
    feeds = {"input_ids": np.array([[1]], np.int64), "attention_mask": np.ones((1, 7), np.int64), **cfg.past(1, 6)}
    info = model.plan_info(feeds)
    assert info["steps"] <= STEP_BUDGET[(cfg.arch, backend_name)], info
    assert info["epilogue.fused"] >= 2 * cfg.layers  # the two residual adds of every block
    if cfg.arch != "gpt2":
        assert model.rewrites["rotary_fused"] == 2 * cfg.layers  # q and k
        assert model.rewrites["matmuls_merged"] == 3 * cfg.layers  # q, k, v as one; gate and up as one
        assert info["rotary.fused"] == 2 * cfg.layers
