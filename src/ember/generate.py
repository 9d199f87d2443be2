"""Text generation with a KV-cache decoder: `ember.generate` and `Generator`.

A decoder exported with its KV cache as graph inputs and outputs (`torch.onnx.export` of a transformers model,
optimum's `decoder_model_merged.onnx` / `decoder_with_past_model.onnx`, ONNX Runtime GenAI's model builder) runs
the prompt once with an empty cache (prefill), then one token a run, each run's `present*` outputs fed back as the
next run's `past*` inputs as DeviceArrays: the cache stays on the device for the whole generation, only the logits
come back to the host (greedy argmax, or temperature / top-k / top-p sampling with numpy, seeded).

The I/O is found by the names those exporters use: `input_ids`; `attention_mask`, `position_ids`,
`use_cache_branch` when the model has them; every input with `past` in its name paired with the output named the
same with `present` for `past_key_values` or `past` (`past_key_values.0.key` -> `present.0.key`, `past_0_k` ->
`present_0_k`); `logits`. A `genai_config.json` in the model's folder (GenAI's builder) gives the names, the
cache's head counts and head size, the eos/pad ids and the context length; a transformers `config.json` /
`generation_config.json` there gives what it has of those.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .device_array import DeviceArray
from .model import Model, load_onnx

# A folder holding a decoder: the files tried in order when no genai_config.json names one.
MODEL_FILES = ("model.onnx", "decoder_model_merged.onnx", "decoder_with_past_model.onnx", "decoder_model.onnx")
_EXPECTED = ("input_ids, a cache as past*/present* pairs (past_key_values.{i}.key|value -> present.{i}.key|value, "
             "past_{i}_{k|v} -> present_{i}_{k|v}) and logits; optionally attention_mask, position_ids and "
             "use_cache_branch")


@dataclass
class GenerationStats:
    """What the last generation cost: prefill (the prompt's run or runs, giving the first token) and each decode
    step after it, in ms, and of each step the host's time in the model's run calls (feeds written, the plan
    moved to the new length, the submit; a readback's wait not included); plans built during it
    (model.cache_info()'s builds, before and after)."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_ms: float = 0.0
    step_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)  # per decode step: the host's time submitting its runs
    wait_ms: list[float] = field(default_factory=list)  # per token: the pick's wait for its logits or token
    builds: int = 0
    builds_total: int = 0
    stopped: str = ""  # "eos", "max_new_tokens" or "context_length"

    @property
    def ms_per_token(self) -> float | None:
        """Mean ms of a decode step (one new token a run after the prefill); None with no decode step."""
        return float(np.mean(self.step_ms)) if self.step_ms else None

    @property
    def tokens_per_s(self) -> float | None:
        ms = self.ms_per_token
        return 1e3 / ms if ms else None

    def as_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "new_tokens": self.new_tokens, "prefill_ms": self.prefill_ms,
                "ms_per_token": self.ms_per_token, "tokens_per_s": self.tokens_per_s,
                "median_step_ms": float(np.median(self.step_ms)) if self.step_ms else None,
                "median_host_ms": float(np.median(self.host_ms)) if self.host_ms else None,
                "median_wait_ms": float(np.median(self.wait_ms)) if self.wait_ms else None,
                "step_ms": list(self.step_ms), "builds": self.builds, "builds_total": self.builds_total,
                "stopped": self.stopped}


@dataclass(frozen=True)
class _Cache:
    """One cache input: its name, the output fed back into it, dtype and the empty past's shape without batch."""

    past: str
    present: str
    dtype: np.dtype
    rank: int
    heads: int | None
    head_size: int | None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {type(e).__name__}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def find_model_file(path: str | os.PathLike) -> tuple[Path, Path | None]:
    """(the .onnx file, its folder's genai_config.json or None) for a model file or a model folder."""
    path = Path(path)
    if not path.is_dir():
        if not path.exists():
            raise FileNotFoundError(f"no such model file or folder: {path}")
        cfg = path.parent / "genai_config.json"
        return path, cfg if cfg.is_file() else None
    cfg = path / "genai_config.json"
    if cfg.is_file():
        name = _read_json(cfg).get("model", {}).get("decoder", {}).get("filename", "model.onnx")
        if not (path / name).is_file():
            raise FileNotFoundError(f"{cfg} names the decoder {name!r}, which is not in {path}")
        return path / name, cfg
    for name in MODEL_FILES:
        if (path / name).is_file():
            return path / name, None
    found = sorted(p.name for p in path.glob("*.onnx"))
    if len(found) == 1:
        return path / found[0], None
    raise FileNotFoundError(f"no decoder in {path}: expected genai_config.json or one of {list(MODEL_FILES)}"
                            + (f"; found {found}" if found else "; it holds no .onnx file"))


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


class ModelConfig:
    """What the model's folder says about it (genai_config.json, else config.json and generation_config.json):
    eos and pad ids, context length, KV heads and head size, and GenAI's I/O names. Empty where it says nothing."""

    def __init__(self, folder: Path | None, genai: Path | None) -> None:
        self.eos: list[int] = []
        self.pad: int | None = None
        self.context_length: int | None = None
        self.kv_heads: int | None = None
        self.head_size: int | None = None
        self.names: dict[str, str] = {}
        self.layers: int | None = None
        self.source: str | None = None
        if genai is not None:
            self._genai(genai)
        elif folder is not None and (folder / "config.json").is_file():
            self._transformers(folder)

    def _genai(self, path: Path) -> None:
        data = _read_json(path)
        model = data.get("model", {})
        dec = model.get("decoder", {})
        self.source = str(path)
        self.eos = _ids(model.get("eos_token_id"))
        pad = _ids(model.get("pad_token_id"))
        self.pad = pad[0] if pad else None
        self.context_length = model.get("context_length") or data.get("search", {}).get("max_length")
        self.kv_heads = dec.get("num_key_value_heads") or dec.get("num_attention_heads")
        self.head_size = dec.get("head_size")
        self.layers = dec.get("num_hidden_layers")
        for group in ("inputs", "outputs"):
            self.names.update({k: v for k, v in dec.get(group, {}).items() if isinstance(v, str)})

    def _transformers(self, folder: Path) -> None:
        cfg = _read_json(folder / "config.json")
        self.source = str(folder / "config.json")
        gen = _read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
        self.eos = _ids(gen.get("eos_token_id", cfg.get("eos_token_id")))
        pad = _ids(gen.get("pad_token_id", cfg.get("pad_token_id")))
        self.pad = pad[0] if pad else None
        self.context_length = cfg.get("max_position_embeddings") or cfg.get("n_positions")
        heads = cfg.get("num_attention_heads") or cfg.get("n_head")
        self.kv_heads = cfg.get("num_key_value_heads") or heads
        hidden = cfg.get("hidden_size") or cfg.get("n_embd")
        self.head_size = cfg.get("head_dim") or (hidden // heads if hidden and heads else None)


def _model_folder(model: Model) -> Path | None:
    source = getattr(model, "source", "") or ""
    prefix = "model file "
    return Path(source[len(prefix):]).parent if source.startswith(prefix) else None


class Generator:
    """Generation with one KV-cache decoder: `Generator(model_or_path).generate(prompt_ids, max_new_tokens)`.

    model: a loaded ember.Model, or an .onnx file or model folder (loaded with backend and load_options, as
    ember.load_onnx). kv_heads / head_size: the cache's shape where neither the model's declared input shapes nor
    its folder's genai_config.json / config.json give it. eos_token_id, pad_token_id, context_length: override
    the folder's. prefill_chunk: feed the prompt that many tokens a run (1 for an export that traced a fixed
    sequence length of 1); default the whole prompt in one run. overlap: greedy steps pick their token on the
    device (an argmax model on the same backend) and feed it to the next step as a DeviceArray, which is
    submitted before the token is read back: the host's work on a step runs while the device runs the one before
    (the step after an eos is computed and dropped); None (default): where the backend runs asynchronously (wgpu;
    on cpu a run is done when it returns, and the host's pick is cheaper). `stats` holds the last generation's
    GenerationStats."""

    def __init__(self, model: Model | str | os.PathLike, *, backend: Any = "auto", kv_heads: int | None = None,
                 head_size: int | None = None, eos_token_id: int | Sequence[int] | None = None,
                 pad_token_id: int | None = None, context_length: int | None = None,
                 prefill_chunk: int | None = None, config_dir: str | os.PathLike | None = None,
                 overlap: bool | None = None, **load_options: Any) -> None:
        if isinstance(model, Model):
            if load_options:
                raise TypeError(f"load options {sorted(load_options)} given with a loaded Model: they apply only "
                                "when the Generator loads the model from a path")
            folder = Path(config_dir) if config_dir is not None else _model_folder(model)
            genai = folder / "genai_config.json" if folder is not None else None
            self.model = model
        else:
            path, genai = find_model_file(model)
            folder = Path(config_dir) if config_dir is not None else path.parent
            if config_dir is not None:
                genai = folder / "genai_config.json"
            self.model = load_onnx(str(path), backend=backend, **load_options)
        self.folder = folder
        self.config = ModelConfig(folder, genai if genai is not None and genai.is_file() else None)
        if prefill_chunk is not None and (not isinstance(prefill_chunk, int) or prefill_chunk < 1):
            raise ValueError(f"prefill_chunk: expected a whole number >= 1 or None, got {prefill_chunk!r}")
        self.prefill_chunk = prefill_chunk
        self.overlap = overlap if overlap is not None else bool(self.model.compute_backend.asynchronous)
        self._argmax: Model | None = None
        self.eos_token_id = _ids(eos_token_id) if eos_token_id is not None else list(self.config.eos)
        self.pad_token_id = pad_token_id if pad_token_id is not None else (
            self.config.pad if self.config.pad is not None else (self.eos_token_id or [0])[0])
        self.context_length = context_length or self.config.context_length
        self._discover(kv_heads, head_size)
        self.stats = GenerationStats()

    # ---- the model's I/O ---------------------------------------------------------------------------------------

    def _discover(self, kv_heads: int | None, head_size: int | None) -> None:
        names = self.config.names
        inputs = {i.name: i for i in self.model.inputs}
        outputs = {o.name: o for o in self.model.outputs}
        found = ", ".join(f"{i.name} ({np.dtype(i.dtype).name}"
                          f"{' [' + ', '.join(map(str, i.shape)) + ']' if i.shape is not None else ''})"
                          for i in self.model.inputs)

        def reject(what: str) -> ValueError:
            return ValueError(f"not a KV-cache decoder: {what}. Inputs found: {found or 'none'}; outputs: "
                              f"{', '.join(outputs) or 'none'}. "
                              f"ember.generate needs {_EXPECTED}")

        self.input_ids = names.get("input_ids", "input_ids")
        self.attention_mask = names.get("attention_mask", "attention_mask")
        self.position_ids = names.get("position_ids", "position_ids")
        self.use_cache_branch = "use_cache_branch" if "use_cache_branch" in inputs else None
        self.logits = names.get("logits", "logits")
        pasts = self._past_names(inputs)
        missing = ([f"no input named {self.input_ids!r}"] if self.input_ids not in inputs else []) + \
            (["no KV-cache inputs (no input with 'past' in its name)"] if not pasts else []) + \
            ([f"no output named {self.logits!r}"] if self.logits not in outputs else [])
        if missing:
            raise reject("; ".join(missing))
        caches, unpaired = [], []
        for past in pasts:
            present = self._present_name(past, outputs)
            if present is None:
                unpaired.append(past)
                continue
            info = inputs[past]
            shape = info.shape
            rank = len(shape) if shape is not None else 4
            if rank != 4:
                raise reject(f"cache input {past!r} has rank {rank}; expected (batch, heads, sequence, head size)")
            out_shape = outputs[present].shape or (None,) * 4

            declared = [shape or (None,) * 4, out_shape if len(out_shape) == 4 else (None,) * 4]
            caches.append(_Cache(past, present, np.dtype(info.dtype), rank,
                                 _static(declared, 1, kv_heads, self.config.kv_heads),
                                 _static(declared, 3, head_size, self.config.head_size)))
        if unpaired:
            raise reject(f"no present* output pairs with the cache input(s) {unpaired}")
        known = {self.input_ids, self.attention_mask, self.position_ids, "use_cache_branch", *pasts}
        other = [n for n in inputs if n not in known]
        if other:
            raise reject(f"input(s) {other} are neither the prompt, its mask and positions nor the cache")
        self.caches = caches
        self.has_mask = self.attention_mask in inputs
        self.has_positions = self.position_ids in inputs
        unknown = [c.past for c in caches if c.heads is None or c.head_size is None]
        if unknown and self.use_cache_branch is None:
            raise ValueError(f"the KV cache's head count and head size are not static in the model's declared "
                             f"shapes of {unknown[:2]}{' ...' if len(unknown) > 2 else ''} and no "
                             f"genai_config.json/config.json beside it gives them: pass Generator(kv_heads=..., "
                             f"head_size=...)")

    def _past_names(self, inputs: Mapping[str, Any]) -> list[str]:
        names = self.config.names
        key, value = names.get("past_key_names"), names.get("past_value_names")
        layers = self.config.layers
        if key and value and layers:
            named = [pattern % i for i in range(layers) for pattern in (key, value)]
            if all(n in inputs for n in named):
                return named
        return [n for n in inputs if "past" in n.lower() and n not in ("use_cache_branch",)]

    def _present_name(self, past: str, outputs: Mapping[str, Any]) -> str | None:
        names = self.config.names
        for k in ("key", "value"):
            pattern, out = names.get(f"past_{k}_names"), names.get(f"present_{k}_names")
            if pattern and out:
                for i in range(self.config.layers or 0):
                    if pattern % i == past and out % i in outputs:
                        return out % i
        for candidate in (past.replace("past_key_values", "present"), past.replace("past", "present"),
                          past.replace("past_key_values", "present_key_values")):
            if candidate in outputs and candidate != past:
                return candidate
        return None

    # ---- generation ------------------------------------------------------------------------------------------

    def _empty_past(self, batch: int) -> dict[str, np.ndarray]:
        """The cache before the prompt: no position. Where its head count or size is unknown (a merged decoder,
        whose use_cache_branch false ignores the past), 1 stands in for them."""
        return {c.past: np.zeros((batch, c.heads or 1, 0, c.head_size or 1), c.dtype) for c in self.caches}

    def _feeds(self, ids: np.ndarray | DeviceArray, past_len: int) -> dict[str, Any]:
        batch, seq = ids.shape
        feeds = {self.input_ids: ids if isinstance(ids, DeviceArray) else ids.astype(self._dtype(self.input_ids))}
        if self.has_mask:
            feeds[self.attention_mask] = np.ones((batch, past_len + seq), np.int64)
        if self.has_positions:
            feeds[self.position_ids] = np.broadcast_to(np.arange(past_len, past_len + seq, dtype=np.int64),
                                                       (batch, seq)).copy()
        if self.use_cache_branch is not None:
            info = next(i for i in self.model.inputs if i.name == self.use_cache_branch)
            rank = len(info.shape) if info.shape is not None else 1
            feeds[self.use_cache_branch] = np.full((1,) * rank, past_len > 0, np.bool_)
        for name in (self.attention_mask, self.position_ids):
            if name in feeds:
                feeds[name] = feeds[name].astype(self._dtype(name))
        return feeds

    def _dtype(self, name: str) -> np.dtype:
        return next(np.dtype(i.dtype) for i in self.model.inputs if i.name == name)

    def _run(self, ids: np.ndarray, past: Mapping[str, Any], past_len: int) -> tuple[Any, dict[str, Any]]:
        """(the logits, the presents), both as the run left them (on the device): _last_logits reads the
        logits."""
        out = self.model.run({**self._feeds(ids, past_len), **past}, keep_on_device=True)
        return out[self.logits], {c.past: out[c.present] for c in self.caches}

    def _run_argmax(self, ids: np.ndarray | DeviceArray, past: Mapping[str, Any],
                    past_len: int) -> tuple[tuple[DeviceArray, Callable[[], np.ndarray]], dict[str, Any]]:
        """_run with the last position's argmax taken on the device: (((batch, 1) token ids, their read started),
        the presents). The step's runs and the read's copy reach the device in one submit."""
        if self._argmax is None:
            self._argmax = load_onnx(argmax_model(self.model, self.logits, self._dtype(self.input_ids)),
                                     backend=self.model.compute_backend)
        with self.model.compute_backend.held_submits():
            out = self.model.run({**self._feeds(ids, past_len), **past}, keep_on_device=True)
            token = self._argmax.run({"logits": out[self.logits]}, keep_on_device=True)["token"]
            read = token.read_later()
        return (token, read), {c.past: out[c.present] for c in self.caches}

    def generate(self, input_ids: Any, max_new_tokens: int = 32, *, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 eos_token_id: int | Sequence[int] | None = None,
                 callback: Callable[[int, np.ndarray], Any] | None = None) -> np.ndarray:
        """The new token ids (int64) after the prompt `input_ids` (a sequence of ids, or a (batch, length) array of
        equal-length prompts): up to max_new_tokens, fewer where every row has produced an eos id (included) or
        the context length is reached. Rows that finished earlier than others are padded with pad_token_id. A 1-d
        prompt gives a 1-d result. Greedy unless do_sample (temperature, then top_k > 0 and top_p < 1 filter the
        distribution; seed makes it reproducible). callback(step, tokens) is called with each step's (batch,)
        tokens as they come. self.stats has the timings."""
        prompt, flat = _prompt(input_ids)
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        eos = set(_ids(eos_token_id) if eos_token_id is not None else self.eos_token_id)
        batch, length = prompt.shape
        if self.context_length and length > self.context_length:
            raise ValueError(f"the prompt has {length} tokens, more than the model's context length of "
                             f"{self.context_length}")
        rng = np.random.default_rng(seed)
        builds0 = self.model.cache_info()["builds"]
        stats = self.stats = GenerationStats(prompt_tokens=length)
        tokens: list[np.ndarray] = []
        done = np.zeros(batch, bool)
        if self.context_length and length >= self.context_length:
            stats.stopped = "context_length"
        elif max_new_tokens == 0:
            stats.stopped = "max_new_tokens"
        if stats.stopped:
            return _result(tokens, batch, flat)
        t0 = time.perf_counter()
        past: dict[str, Any] = self._empty_past(batch)
        pos = 0
        chunk = self.prefill_chunk or length
        overlap = self.overlap and not do_sample
        run = self._run_argmax if overlap else self._run
        while pos < length:
            last, past = run(prompt[:, pos:pos + chunk], past, pos)
            if pos == 0:
                self._learn_cache_shape(past)
            pos += min(chunk, length - pos)
        if overlap:
            token_dev, read = last
        while True:
            n = len(tokens) + 1  # tokens once this one is taken
            more = n < max_new_tokens and not (self.context_length and length + n >= self.context_length)
            if overlap and more:  # the next step, fed this token on the device, queued before it is read back
                t = time.perf_counter()
                (next_dev, next_read), next_past = self._run_argmax(token_dev, past, pos)
                stats.host_ms.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            picked = (read().reshape(-1).astype(np.int64) if overlap
                      else _pick(_last_logits(last), do_sample, temperature, top_k, top_p, rng))
            stats.wait_ms.append((time.perf_counter() - t) * 1e3)
            token = np.where(done, self.pad_token_id, picked)
            tokens.append(token)
            done |= np.isin(token, list(eos))
            t1 = time.perf_counter()
            if len(tokens) == 1:
                stats.prefill_ms = (t1 - t0) * 1e3
            else:
                stats.step_ms.append((t1 - t0) * 1e3)
            t0 = t1
            if callback is not None:
                callback(len(tokens) - 1, token.copy())
            if done.all() and eos:
                stats.stopped = "eos"  # overlapped: the step queued ahead is dropped
                break
            if not more:  # the sequence fills the context, or max_new_tokens are there
                stats.stopped = "max_new_tokens" if n >= max_new_tokens else "context_length"
                break
            if overlap:
                token_dev, read, past = next_dev, next_read, next_past
            else:
                t0 = time.perf_counter()
                last, past = self._run(token[:, None].astype(prompt.dtype), past, pos)
                stats.host_ms.append((time.perf_counter() - t0) * 1e3)
            pos += 1
        stats.new_tokens = len(tokens)
        stats.builds_total = self.model.cache_info()["builds"]
        stats.builds = stats.builds_total - builds0
        return _result(tokens, batch, flat)

    def _learn_cache_shape(self, presents: Mapping[str, Any]) -> None:
        """After the first run: the cache's head counts and sizes from what the model returned."""
        if any(c.heads is None or c.head_size is None for c in self.caches):
            self.caches = [_Cache(c.past, c.present, c.dtype, c.rank, presents[c.past].shape[1],
                                  presents[c.past].shape[3]) for c in self.caches]


def _last_logits(logits: Any) -> np.ndarray:
    """The last position's logits (batch, vocab) on the host, float32: what the host's pick reads."""
    return np.asarray(logits.numpy() if hasattr(logits, "numpy") else logits)[:, -1].astype(np.float32)


def argmax_model(model: Model, logits: str, dtype: np.dtype) -> onnx.ModelProto:
    """An ONNX model from a decoder's logits (batch, sequence, vocab) to its last position's argmax
    (batch, 1) in the dtype of the decoder's input_ids: the greedy pick, run on the decoder's backend."""
    info = next(o for o in model.outputs if o.name == logits)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
    nodes = [helper.make_node("Slice", ["logits", "start", "end", "axis"], ["last"]),
             helper.make_node("ArgMax", ["last"], ["index"], axis=2, keepdims=0),
             helper.make_node("Cast", ["index"], ["token"], to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))]
    consts = [numpy_helper.from_array(np.array([v], np.int64), name)
              for name, v in (("start", -1), ("end", 2**62), ("axis", 1))]
    graph = helper.make_graph(nodes, "greedy_pick",
                              [helper.make_tensor_value_info("logits", elem, ["batch", "sequence", "vocab"])],
                              [helper.make_tensor_value_info("token", helper.np_dtype_to_tensor_dtype(
                                  np.dtype(dtype)), ["batch", 1])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _static(shapes: Sequence[Sequence[Any]], axis: int, given: int | None, config: int | None) -> int | None:
    """A cache dim: static in a declared shape (the past input's, then the present output's), else the one given,
    else the model folder's config's (None: unknown)."""
    for shape in shapes:
        if isinstance(shape[axis], int):
            return shape[axis]
    return given if given is not None else config


def _prompt(input_ids: Any) -> tuple[np.ndarray, bool]:
    arr = np.asarray(input_ids)
    if arr.dtype.kind not in "iu" and arr.size:
        raise ValueError(f"input_ids: expected integer token ids, got dtype {arr.dtype}")
    flat = arr.ndim == 1
    if flat:
        arr = arr[None]
    if arr.ndim != 2 or arr.shape[1] == 0 or arr.shape[0] == 0:
        raise ValueError(f"input_ids: expected a non-empty sequence of token ids or a (batch, length) array, got "
                         f"shape {list(np.shape(input_ids))}")
    return np.ascontiguousarray(arr.astype(np.int64)), flat


def _result(tokens: list[np.ndarray], batch: int, flat: bool) -> np.ndarray:
    out = np.stack(tokens, axis=1).astype(np.int64) if tokens else np.zeros((batch, 0), np.int64)
    return out[0] if flat else out


def check_sampling(max_new_tokens: Any, temperature: Any, top_k: Any, top_p: Any) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected a whole number >= 0, got {max_new_tokens!r}")
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature: expected a number > 0, got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"top_k: expected a whole number >= 0 (0: no top-k filter), got {top_k!r}")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p: expected a number in (0, 1] (1: no nucleus filter), got {top_p!r}")


def _pick(logits: np.ndarray, do_sample: bool, temperature: float, top_k: int, top_p: float,
          rng: np.random.Generator) -> np.ndarray:
    """One token per row of (batch, vocab) logits: argmax, or a sample of softmax(logits / temperature) kept to
    the top_k most likely and the smallest set whose probability reaches top_p."""
    if not do_sample:
        return logits.argmax(-1).astype(np.int64)
    out = np.empty(len(logits), np.int64)
    for row, values in enumerate(logits.astype(np.float64) / temperature):
        order = np.argsort(-values, kind="stable")
        if top_k:
            order = order[:top_k]
        kept = values[order]
        p = np.exp(kept - kept.max())
        p /= p.sum()
        if top_p < 1:
            keep = int(np.searchsorted(np.cumsum(p), top_p)) + 1  # the first index where the sum reaches top_p
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        out[row] = order[rng.choice(len(order), p=p)]
    return out


def generate(model: Model | Generator | str | os.PathLike, input_ids: Any, max_new_tokens: int = 32, *,
             do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             seed: int | None = None, eos_token_id: int | Sequence[int] | None = None, backend: Any = "auto",
             callback: Callable[[int, np.ndarray], Any] | None = None, **load_options: Any) -> np.ndarray:
    """The new token ids a KV-cache decoder generates after input_ids (Generator.generate documents the
    arguments): model is an ember.Model, a Generator, or an .onnx file or model folder loaded on `backend` with
    load_options (ember.load_onnx's, and Generator's kv_heads, head_size, pad_token_id, context_length,
    prefill_chunk). For the timings, keep a Generator and read its stats."""
    gen_keys = ("kv_heads", "head_size", "pad_token_id", "context_length", "prefill_chunk", "config_dir")
    gen_opts = {k: load_options.pop(k) for k in gen_keys if k in load_options}
    if isinstance(model, Generator):
        if load_options or gen_opts:
            raise TypeError(f"options {sorted({**load_options, **gen_opts})} given with a Generator: set them "
                            "when making it")
        gen = model
    elif isinstance(model, Model):
        gen = Generator(model, **gen_opts, **load_options)
    else:
        gen = Generator(model, backend=backend, **gen_opts, **load_options)
    return gen.generate(input_ids, max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                        top_p=top_p, seed=seed, eos_token_id=eos_token_id, callback=callback)
