"""Model folders written by ONNX Runtime GenAI's model builder (`python -m onnxruntime_genai.models.builder -i HF_DIR
-o OUT -p PRECISION -e TARGET`), from `transformers` configs with random weights and a word-level tokenizer made
with `tokenizers` (no downloads): ember's greedy generation gives ONNX Runtime GenAI's own tokens, and each step's
logits equal ONNX Runtime's on the same file, on every backend.

The folders hold what the builder emits for the target: com.microsoft GroupQueryAttention (rotary inside),
SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization, MatMulNBits for int4 (and int8), float16 weights and
KV cache for fp16. ONNX Runtime GenAI runs every folder on its CPU provider (the webgpu/cuda folders with their
provider options removed from a copy of genai_config.json), which is the reference here.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import ember
from ember.cli import main as cli_main

from . import genai
from .zoo import CACHE_DIR

pytest.importorskip("onnxruntime_genai")
ort = pytest.importorskip("onnxruntime")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

VOCAB = 256
SMALL = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
ARCHS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config"}
# (architecture, builder precision, builder execution target)
FOLDERS = {
    "llama-fp32-cpu": ("llama", "fp32", "cpu"),
    "llama-int4-cpu": ("llama", "int4", "cpu"),
    "llama-int8-cpu": ("llama", "int8", "cpu"),
    "llama-int4-webgpu": ("llama", "int4", "webgpu"),
    "llama-fp16-webgpu": ("llama", "fp16", "webgpu"),
    "qwen2-int4-cpu": ("qwen2", "int4", "cpu"),
}
PROMPT = [1, 5, 9, 33, 70]
NEW_TOKENS = 12


def _key() -> str:
    h = hashlib.sha256(Path(__file__).read_bytes() + Path(genai.__file__).read_bytes())
    for dist in ("onnxruntime-genai", "onnxruntime", "transformers", "torch", "onnx"):
        h.update(f"{dist}={importlib.metadata.version(dist)};".encode())
    return h.hexdigest()[:10]


def _hf_folder(arch: str, root: Path) -> Path:
    import torch

    out = root / f"hf-{arch}"
    if not (out / "tokenizer.json").exists():
        torch.manual_seed(0)
        cfg = getattr(transformers, ARCHS[arch])(**SMALL, bos_token_id=1, eos_token_id=2)
        genai.save_hf(transformers.AutoModelForCausalLM.from_config(cfg), VOCAB, out)
    return out


def build(name: str) -> Path:
    """The builder's folder for FOLDERS[name], cached under .cache/models."""
    arch, precision, target = FOLDERS[name]
    root = CACHE_DIR / f"genai-{_key()}"
    out = root / name
    if not (out / "genai_config.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        genai.run_builder(_hf_folder(arch, root), out, precision, target, root / "cache", timeout=600)
    return out


def og_greedy(folder: Path, tmp: Path, prompts: list[list[int]], new: int) -> np.ndarray:
    return genai.og_greedy(genai.cpu_copy(folder, tmp / folder.name), prompts, new)


@pytest.fixture(scope="module", params=sorted(FOLDERS))
def folder(request: pytest.FixtureRequest) -> Path:
    return build(request.param)


def test_builder_wrote_what_it_is_known_for(folder: Path) -> None:
    """The folders exercise the contrib ops the builder emits (so these tests cover them, not a plainer graph)."""
    ops = {n.op_type for n in onnx.load(str(folder / "model.onnx"), load_external_data=False).graph.node}
    assert {"GroupQueryAttention", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization"} <= ops
    assert ("MatMulNBits" in ops) == ("int" in folder.name), sorted(ops)


@pytest.mark.parametrize("backend", ember.available_backends())
def test_greedy_tokens_equal_onnxruntime_genai(folder: Path, backend: str, tmp_path: Path) -> None:
    want = og_greedy(folder, tmp_path, [PROMPT], NEW_TOKENS)[0]
    got = ember.generate(str(folder), PROMPT, NEW_TOKENS, backend=backend)
    np.testing.assert_array_equal(got, want)


def _exact(path: Path, tmp: Path) -> str:
    """The model with MatMulNBits' accuracy_level set to 0: the builder asks for 4 (ONNX Runtime's CPU kernel then
    quantises the activations to int8 per block), ember computes the dequantised product in float (as level 0)."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        for a in node.attribute:
            if node.op_type == "MatMulNBits" and a.name == "accuracy_level":
                a.i = 0
    out = tmp / "exact.onnx"
    onnx.save(model, str(out))
    return str(out)


def _ort_steps(path: Path, model: ember.Model, steps: int, tmp: Path) -> None:
    """A prefill of PROMPT and `steps` single-token steps through model.run and an ONNX Runtime session side by side,
    each step's presents fed back as the next pasts; the logits compared at every step."""
    sess = ort.InferenceSession(_exact(path, tmp), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    pasts = [i for i in sess.get_inputs() if i.name.startswith("past_key_values.")]
    dtype = np.float16 if pasts[0].type == "tensor(float16)" else np.float32
    decoder = json.loads((path.parent / "genai_config.json").read_text())["model"]["decoder"]
    cache = {i.name: np.zeros((1, decoder["num_key_value_heads"], 0, decoder["head_size"]), dtype) for i in pasts}
    ids, total = list(PROMPT), 0
    for step in range(steps + 1):
        total += len(ids)
        feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, total), np.int64), **cache}
        ref = dict(zip(names, sess.run(names, feeds), strict=True))
        got = model.run(feeds)
        logits = ref["logits"].astype(np.float32)
        # float16 files: ONNX Runtime and ember round differently inside the fused ops (fp16 has 11 bits).
        rel = 2e-2 if dtype == np.float16 else 1e-4
        atol = rel * float(np.abs(logits).max()) + 1e-5
        np.testing.assert_allclose(np.asarray(got["logits"], np.float32), logits, rtol=rel, atol=atol,
                                   err_msg=f"{path.parent.name} step {step}")
        cache = {name: ref[name.replace("past_key_values", "present")] for name in cache}
        ids = [int(logits[0, -1].argmax())]


@pytest.mark.parametrize("backend", ember.available_backends())
def test_step_logits_equal_onnxruntime(folder: Path, backend: str, tmp_path: Path) -> None:
    model = ember.load_onnx(str(folder / "model.onnx"), backend=backend)
    _ort_steps(folder / "model.onnx", model, 2, tmp_path)
    # The norms are fused, except float16 ones on cpu (which computes float16 per op, as ONNX's reference does).
    half = next(i.dtype for i in model.inputs if i.name.startswith("past_key_values.")) == np.float16
    stats = model.stats()
    assert stats.get("rmsnorm.fused", 0) > 0 or backend == "cpu" and half, stats


def test_batch_of_prompts_equals_onnxruntime_genai(tmp_path: Path) -> None:
    folder = build("llama-fp32-cpu")
    prompts = [PROMPT, [1, 200, 3, 44, 7]]
    want = og_greedy(folder, tmp_path, prompts, NEW_TOKENS)
    got = ember.generate(str(folder), np.array(prompts), NEW_TOKENS, backend="cpu")
    np.testing.assert_array_equal(got, want)


def test_cli_generates_from_a_text_prompt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ember generate FOLDER --prompt TEXT`: the folder's tokenizer.json encodes the prompt and decodes the tokens."""
    folder = build("llama-int4-cpu")
    text = " ".join(f"t{i}" for i in PROMPT)
    want = og_greedy(folder, tmp_path, [PROMPT], 8)[0]
    assert cli_main(["generate", str(folder), "--prompt", text, "--max-new-tokens", "8", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "ids: " + ",".join(map(str, want)) in out, out
    assert "text: " + " ".join(f"t{t}" for t in want) in out, out
    assert "tok/s" in out, out


@pytest.mark.parametrize("backend", ember.available_backends())
def test_decode_builds_few_plans(backend: str) -> None:
    """A decode over a GenAI folder is served by a template after the first steps (the GroupQueryAttention mask and
    positions come from coordinates, not from constants that change with the length)."""
    from ember.generate import Generator

    gen = Generator(str(build("llama-int4-cpu")), backend=backend)
    gen.generate(PROMPT, 24)
    info = gen.model.cache_info()
    assert info["builds"] <= 4 and info["from_template"] >= 19, info
