"""Model folders written by ONNX Runtime GenAI's model builder from `transformers` models with random weights (no
downloads), and ONNX Runtime GenAI's own greedy generation over them: what tests/models/test_genai_builder.py and
bench/bench_genai.py share."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np


def save_hf(model: Any, vocab: int, out: Path) -> Path:
    """`model` (a transformers causal LM) and a word-level tokenizer ("t0" .. "t<vocab-1>"; t1 bos, t2 eos, t0 unk)
    saved as a HF folder, the builder's input."""
    import tokenizers
    import transformers

    model.save_pretrained(out)
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab={f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1",
                                         eos_token="t2").save_pretrained(out)
    return out


def run_builder(hf: Path, out: Path, precision: str, target: str, cache: Path, timeout: float = 1800) -> Path:
    """`python -m onnxruntime_genai.models.builder -i hf -o out -p precision -e target`, written beside `out` and
    renamed (a crashed run leaves no half folder)."""
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(tmp),
           "-p", precision, "-e", target, "-c", str(cache)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the GenAI builder failed ({' '.join(cmd[3:])}):\n{done.stderr[-3000:]}")
    os.replace(tmp, out)
    return out


def cpu_copy(folder: Path, out: Path) -> Path:
    """`folder` with genai_config.json's provider options removed (ONNX Runtime GenAI then runs it on its CPU
    provider), the other files linked."""
    cfg = json.loads((folder / "genai_config.json").read_text())
    cfg["model"]["decoder"]["session_options"]["provider_options"] = []
    out.mkdir(parents=True)
    for f in folder.iterdir():
        if f.name != "genai_config.json":
            (out / f.name).symlink_to(f.resolve())
    (out / "genai_config.json").write_text(json.dumps(cfg))
    return out


def og_greedy(folder: Path, prompts: list[list[int]], new: int) -> np.ndarray:
    """ONNX Runtime GenAI's greedy tokens after equal-length prompts (the folder's own providers)."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompts[0]) + new, batch_size=len(prompts))
    gen = og.Generator(model, params)
    gen.append_tokens(np.array(prompts, np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    return np.array([list(gen.get_sequence(i))[len(prompts[0]):] for i in range(len(prompts))], np.int64)
