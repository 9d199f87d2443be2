"""`ember.generate` / `Generator` and `ember generate` on the suite's `transformers` decoders exported with a KV
cache (tests/models/decoders.py): greedy tokens identical to a greedy loop on ONNX Runtime over the same export,
seeded sampling, stop tokens, the context limit, the GenAI builder's names with a genai_config.json, an optimum-style
merged decoder (an If on use_cache_branch), and the clear error for a model that is no KV-cache decoder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import ember
from ember.cli import main as cli_main
from ember.generate import Generator

from . import decoders
from .decoders import GPT2, LLAMA, Decoder

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

PROMPT = [3, 141, 59, 26, 5]
# (config, exporter, prompt tokens a run: the torchscript LLaMA export traced a sequence of 1 into its attention)
EXPORTS = {"gpt2-torchscript": (GPT2, "torchscript", None), "gpt2-dynamo": (GPT2, "dynamo", None),
           "llama-dynamo": (LLAMA, "dynamo", None), "llama-torchscript": (LLAMA, "torchscript", 1)}


def _path(name: str) -> str:
    cfg, exporter, _ = EXPORTS[name]
    return str(decoders.export(cfg, exporter))


def ort_greedy(path: str, prompt: list[int], steps: int, chunk: int | None = None) -> list[int]:
    """Greedy decode on ONNX Runtime: the prompt (`chunk` tokens a run), then a token a run, every present fed back
    as the past of its name; the cache's empty shape from the declared inputs."""
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    outputs = [o.name for o in sess.get_outputs()]
    pasts = [i for i in sess.get_inputs() if "past" in i.name]
    cache = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32) for i in pasts}
    present = {i.name: i.name.replace("past", "present") for i in pasts}
    ids, pos, tokens = list(prompt), 0, []
    chunk = chunk or len(ids)
    while len(tokens) < steps:
        feed = ids[pos:pos + chunk] if pos < len(prompt) else [tokens[-1]]
        out = dict(zip(outputs, sess.run(outputs, {"input_ids": np.array([feed], np.int64),
                                                    "attention_mask": np.ones((1, pos + len(feed)), np.int64),
                                                    **cache}), strict=True))
        pos += len(feed)
        cache = {name: out[present[name]] for name in cache}
        if pos >= len(prompt):
            tokens.append(int(out["logits"][0, -1].argmax()))
    return tokens


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    """ONNX Runtime's 16 greedy tokens after PROMPT, per export."""
    return {name: ort_greedy(_path(name), PROMPT, 16, EXPORTS[name][2]) for name in EXPORTS}


@pytest.mark.parametrize("name", list(EXPORTS))
def test_greedy_generate_on_cpu_matches_onnxruntime(name: str, reference: dict[str, list[int]]) -> None:
    gen = Generator(_path(name), backend="cpu", prefill_chunk=EXPORTS[name][2])
    got = gen.generate(PROMPT, max_new_tokens=16)
    assert got.dtype == np.int64 and got.tolist() == reference[name]
    st = gen.stats
    assert st.new_tokens == 16 and st.prompt_tokens == 5 and st.stopped == "max_new_tokens"
    assert len(st.step_ms) == 15 and st.prefill_ms > 0 and st.ms_per_token > 0 and st.tokens_per_s > 0
    # Planned: the prefill (or past lengths 0 and 1, a token a run), then two past lengths fit a template; a third,
    # traced to verify it, and every later step run on the template's live plan.
    runs = 5 + 15 if EXPORTS[name][2] == 1 else 1 + 15
    info = gen.model.cache_info()
    assert st.builds == info["builds"] == (4 if EXPORTS[name][2] == 1 else 3), info
    assert info["builds"] + info["from_template"] == runs
    # The function form, on the loaded model, gives the same tokens.
    again = ember.generate(gen.model, np.array([PROMPT]), 16, prefill_chunk=EXPORTS[name][2])
    assert again.shape == (1, 16) and again[0].tolist() == reference[name]


@pytest.mark.parametrize("name", ["gpt2-torchscript", "llama-dynamo"])
def test_greedy_generate_on_wgpu_matches_onnxruntime(name: str, reference: dict[str, list[int]]) -> None:
    if "wgpu" not in ember.available_backends():
        pytest.skip("no wgpu adapter")
    gen = Generator(_path(name), backend="wgpu")
    assert gen.generate(PROMPT, 8).tolist() == reference[name][:8]
    assert gen.stats.builds == 3 and gen.model.cache_info()["from_template"] == 5


@pytest.mark.parametrize("backend", ["cpu", "wgpu"])
def test_greedy_steps_overlapped_on_the_device_match_the_host_s_pick(backend: str,
                                                                      reference: dict[str, list[int]]) -> None:
    """overlap (the default): each step's argmax on the device, fed to the next step as a DeviceArray, which is
    queued before the token is read. Same tokens, stops and padding as the host's pick, for a batch whose rows
    stop at different steps (the step queued after the last eos dropped)."""
    if backend not in ember.available_backends():
        pytest.skip(f"no {backend} adapter")
    want = reference["llama-dynamo"]
    model = ember.load_onnx(_path("llama-dynamo"), backend=backend)
    host, device = Generator(model, overlap=False), Generator(model, overlap=True)
    assert Generator(model).overlap == (backend == "wgpu")
    prompts = np.array([PROMPT, [7, 8, 9, 10, 11]])
    eos = [want[7], 11]  # the first row stops at its 8th token; the second (455, 84, 11, ...) at its 3rd
    assert eos[0] not in want[:7]
    a = host.generate(prompts, 12, eos_token_id=eos)
    b = device.generate(prompts, 12, eos_token_id=eos)
    assert a.tolist() == b.tolist() and a[0].tolist() == want[:8] and a[1, 2] == 11 and a[1, 3:].tolist() == [0] * 5
    assert device.stats.stopped == host.stats.stopped == "eos" and device.stats.new_tokens == 8
    assert host._argmax is None and device._argmax is not None
    assert device._argmax.compute_backend is model.compute_backend
    assert device.generate(PROMPT, 9).tolist() == want[:9] and device.stats.stopped == "max_new_tokens"
    assert len(device.stats.step_ms) == 8


def test_a_read_started_before_a_write_sees_the_data_before_it() -> None:
    """DeviceArray.read_later: the read is queued when asked for, so a write (or a run) submitted after it does
    not show in what read() returns, on either backend."""
    from ember.device_array import DeviceArray

    for name in ("cpu", "wgpu"):
        if name not in ember.available_backends():
            continue
        be = ember.backend(name)
        x = np.arange(10, dtype=np.int64).reshape(2, 5)
        arr = DeviceArray.from_numpy(be, x)
        read = arr.read_later()
        be.upload(arr.handle, x + 100)
        np.testing.assert_array_equal(read(), x)
        np.testing.assert_array_equal(read(), x)  # read twice: the same
        np.testing.assert_array_equal(arr.numpy(), x + 100)
        assert arr.read_later()().dtype == np.int64


def test_sampling_is_reproducible_with_a_seed_and_differs_from_greedy(reference: dict[str, list[int]]) -> None:
    gen = Generator(_path("llama-dynamo"), backend="cpu")
    a = gen.generate(PROMPT, 12, do_sample=True, temperature=1.5, seed=7)
    b = gen.generate(PROMPT, 12, do_sample=True, temperature=1.5, seed=7)
    c = gen.generate(PROMPT, 12, do_sample=True, temperature=1.5, seed=8)
    assert a.tolist() == b.tolist()
    assert a.tolist() != reference["llama-dynamo"][:12] and a.tolist() != c.tolist()
    # top_k=1 (and a vanishing top_p) leave only the most likely token: sampling is greedy then.
    assert gen.generate(PROMPT, 6, do_sample=True, top_k=1, seed=3).tolist() == reference["llama-dynamo"][:6]
    assert gen.generate(PROMPT, 6, do_sample=True, top_p=1e-9, seed=3).tolist() == reference["llama-dynamo"][:6]
    for bad in ({"temperature": 0}, {"top_k": -1}, {"top_p": 0}, {"top_p": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            gen.generate(PROMPT, 2, do_sample=True, **bad)


def test_eos_and_the_context_length_stop_generation(reference: dict[str, list[int]]) -> None:
    want = reference["llama-dynamo"]
    gen = Generator(_path("llama-dynamo"), backend="cpu")
    eos = want[3]
    stop = want.index(eos)
    got = gen.generate(PROMPT, 16, eos_token_id=eos)
    assert got.tolist() == want[:stop + 1] and gen.stats.stopped == "eos"
    gen = Generator(gen.model, eos_token_id=[999, eos], context_length=8)
    got = gen.generate(PROMPT, 16)  # the sequence fills 8 positions: 3 new tokens (eos comes later)
    assert got.tolist() == want[:3] and gen.stats.stopped == "context_length"
    with pytest.raises(ValueError, match="9 tokens, more than the model's context length of 8"):
        gen.generate(list(range(9)), 4)


def test_a_model_without_a_kv_cache_is_rejected_naming_what_it_has(tmp_path: Path) -> None:
    x = onnx.helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["b", "s"])
    y = onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.INT64, ["b", "s"])
    model = onnx.helper.make_model(onnx.helper.make_graph([onnx.helper.make_node("Identity", ["input_ids"],
                                                                                  ["logits"])], "g", [x], [y]))
    path = tmp_path / "plain.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ValueError, match=r"not a KV-cache decoder: no KV-cache inputs .*Inputs found: "
                                         r"input_ids \(int64 \[b, s\]\); outputs: logits\. .*past_key_values"):
        Generator(str(path), backend="cpu")
    assert cli_main(["generate", str(path), "--prompt-ids", "1,2", "--backend", "cpu"]) == 3


def _rename(model: onnx.ModelProto, names: dict[str, str]) -> None:
    graph = model.graph
    for vi in [*graph.input, *graph.output]:
        vi.name = names.get(vi.name, vi.name)
    for node in graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]


def _genai_names(cfg: Decoder) -> dict[str, str]:
    kv = {"k": "key", "v": "value"}
    return {**{f"past_{i}_{k}": f"past_key_values.{i}.{kv[k]}" for i in range(cfg.layers) for k in "kv"},
            **{f"present_{i}_{k}": f"present.{i}.{kv[k]}" for i in range(cfg.layers) for k in "kv"}}


def _symbolic_heads(model: onnx.ModelProto) -> None:
    """The cache's head count and size left symbolic in the declared shapes (as GenAI's and optimum's files may)."""
    for vi in [*model.graph.input, *model.graph.output]:
        if "past" in vi.name or "present" in vi.name:
            dims = vi.type.tensor_type.shape.dim
            dims[1].dim_param, dims[3].dim_param = "kv_heads", "head_size"


def test_genai_folder_with_its_config(tmp_path: Path, reference: dict[str, list[int]]) -> None:
    """The GenAI builder's names (past_key_values.%d.key -> present.%d.key), the cache shape, eos and context length
    from the folder's genai_config.json."""
    model = onnx.load(_path("gpt2-torchscript"))
    _rename(model, _genai_names(GPT2))
    model.graph.ClearField("value_info")
    _symbolic_heads(model)
    onnx.save(model, str(tmp_path / "model.onnx"))
    decoder = {"filename": "model.onnx", "head_size": GPT2.head_dim, "hidden_size": GPT2.hidden,
               "num_attention_heads": GPT2.heads, "num_key_value_heads": GPT2.kv_heads,
               "num_hidden_layers": GPT2.layers,
               "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                          "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
               "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                           "present_value_names": "present.%d.value"}}
    (tmp_path / "genai_config.json").write_text(json.dumps(
        {"model": {"decoder": decoder, "eos_token_id": [499], "pad_token_id": 0, "context_length": 12,
                   "type": "gpt2", "vocab_size": GPT2.vocab}}))
    gen = Generator(tmp_path, backend="cpu")
    assert gen.config.kv_heads == GPT2.kv_heads and gen.eos_token_id == [499] and gen.context_length == 12
    assert [c.present for c in gen.caches][:2] == ["present.0.key", "present.0.value"]
    assert gen.generate(PROMPT, 16).tolist() == reference["gpt2-torchscript"][:7]  # 5 + 7 = the context of 12
    assert gen.stats.stopped == "context_length"


def _merged(cfg: Decoder, base: onnx.ModelProto) -> onnx.ModelProto:
    """An optimum-style merged decoder: If(use_cache_branch) running the export on the cache (then) or on an empty
    cache of its own (else, the past inputs unread), the cache's head count and size symbolic in the I/O."""
    g = base.graph
    outer = {i.name for i in g.input} | {t.name for t in g.initializer}

    def branch(prefix: str, pasts_inside: bool) -> onnx.GraphProto:
        rename = {}
        nodes = []
        if not pasts_inside:
            for vi in g.input:
                if "past" in vi.name:
                    rename[vi.name] = prefix + vi.name
                    empty = onnx.helper.make_tensor(prefix + vi.name, onnx.TensorProto.FLOAT,
                                                    [1, cfg.kv_heads, 0, cfg.head_dim], [])
                    nodes.append(onnx.helper.make_node("Constant", [], [prefix + vi.name], value=empty))
        for node in g.node:
            n = onnx.NodeProto()
            n.CopyFrom(node)
            n.name = prefix + node.name
            n.input[:] = [rename.get(x, x) if x in outer or x == "" else prefix + x for x in node.input]
            n.output[:] = [prefix + x for x in node.output]
            nodes.append(n)
        outs = [onnx.helper.make_tensor_value_info(prefix + o.name, o.type.tensor_type.elem_type, None)
                for o in g.output]
        return onnx.helper.make_graph(nodes, prefix + "branch", [], outs)

    cond = onnx.helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])
    node = onnx.helper.make_node("If", ["use_cache_branch"], [o.name for o in g.output],
                                 then_branch=branch("with_past/", True), else_branch=branch("no_past/", False))
    graph = onnx.helper.make_graph([node], "merged", [*g.input, cond], list(g.output), list(g.initializer))
    model = onnx.helper.make_model(graph, opset_imports=list(base.opset_import))
    _symbolic_heads(model)
    return model


def test_merged_decoder_learns_the_cache_shape_from_its_first_run(tmp_path: Path,
                                                                   reference: dict[str, list[int]]) -> None:
    base = onnx.load(_path("gpt2-torchscript"))
    _rename(base, _genai_names(GPT2))
    model = _merged(GPT2, base)
    path = tmp_path / "decoder_model_merged.onnx"
    onnx.save(model, str(path))
    gen = Generator(tmp_path, backend="cpu")
    assert gen.use_cache_branch == "use_cache_branch" and gen.caches[0].heads is None
    assert gen.generate(PROMPT, 8).tolist() == reference["gpt2-torchscript"][:8]
    assert (gen.caches[0].heads, gen.caches[0].head_size) == (GPT2.kv_heads, GPT2.head_dim)


def _tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer.json of `vocab` words w0 ... (built offline with the tokenizers package)."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))


def test_cli_generate_prints_the_api_s_ids(tmp_path: Path, capsys: pytest.CaptureFixture,
                                           reference: dict[str, list[int]]) -> None:
    path = _path("gpt2-torchscript")
    want = reference["gpt2-torchscript"][:8]
    out_json = tmp_path / "out.json"
    code = cli_main(["generate", path, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "8",
                     "--backend", "cpu", "--json", str(out_json), "-q"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"ids: {','.join(map(str, want))}" in out
    assert "ms/token" in out and "tok/s" in out and "prefill" in out and "plans built: 3" in out
    data = json.loads(out_json.read_text())
    assert data["ids"] == want and data["new_tokens"] == 8 and data["ms_per_token"] > 0
    # Sampling from the command line matches the API with the same seed.
    sampled = ember.generate(path, PROMPT, 6, do_sample=True, top_k=20, seed=5, backend="cpu")
    assert cli_main(["generate", path, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "6",
                     "--backend", "cpu", "--sample", "--top-k", "20", "--seed", "5", "-q"]) == 0
    assert f"ids: {','.join(map(str, sampled.tolist()))}" in capsys.readouterr().out
    # Text in and out through a tokenizer.json.
    _tokenizer(tmp_path, GPT2.vocab)
    code = cli_main(["generate", path, "--prompt", " ".join(f"w{i}" for i in PROMPT), "--tokenizer", str(tmp_path),
                     "--max-new-tokens", "8", "--backend", "cpu", "-q"])
    out = capsys.readouterr().out
    assert code == 0 and f"ids: {','.join(map(str, want))}" in out
    assert f"text: {' '.join(f'w{i}' for i in want)}" in out
    # Bad usage: exit 2, one line on stderr.
    assert cli_main(["generate", path, "--prompt-ids", "1,x", "--backend", "cpu"]) == 2
    assert cli_main(["generate", path, "--prompt", "w1", "--backend", "cpu"]) == 2  # no tokenizer beside the model
    assert "needs a tokenizer" in capsys.readouterr().err
