"""The command line's `ember generate`: token generation with a KV-cache decoder (ember/generate.py), the prompt
as ids or as text through a `tokenizer.json` (the `tokenizers` package), timings at the end. ember/cli.py
registers the command and maps errors to exit codes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from .cli_util import OK, USAGE, CliError, describe_error, one_line
from .generate import Generator, check_sampling, find_model_file


def add_parser(command: Any) -> None:
    """Register `ember generate` through cli.py's `command(name, help)` factory."""
    g = command("generate", "generate tokens with a KV-cache decoder (torch.onnx.export, optimum or ONNX Runtime "
                            "GenAI layout), the cache kept on the device")
    g.add_argument("model", help="an .onnx file or a model folder (genai_config.json, tokenizer.json are read there)")
    p = g.add_mutually_exclusive_group(required=True)
    p.add_argument("--prompt-ids", metavar="ID,ID,...", help="the prompt as token ids, e.g. 1,2,3")
    p.add_argument("--prompt", metavar="TEXT", help="the prompt as text (needs a tokenizer.json: --tokenizer, or "
                                                    "the model's folder)")
    g.add_argument("--tokenizer", metavar="PATH", help="a tokenizer.json or the folder holding one; decodes the "
                   "output to text too (default: the model folder's tokenizer.json, when there is one)")
    g.add_argument("--max-new-tokens", type=int, default=32, help="default 32")
    g.add_argument("--backend", default="auto", choices=["auto", "cpu", "wgpu"], help="default auto")
    s = g.add_argument_group("sampling (greedy unless --sample)")
    s.add_argument("--sample", action="store_true", help="sample instead of taking the most likely token")
    s.add_argument("--temperature", type=float, default=1.0, help="default 1.0")
    s.add_argument("--top-k", type=int, default=0, help="keep the K most likely tokens (default 0: all)")
    s.add_argument("--top-p", type=float, default=1.0, help="keep the most likely tokens up to this probability "
                                                             "(default 1.0: all)")
    s.add_argument("--seed", type=int, default=None, help="seed of the sampler (default: a fresh one each run)")
    g.add_argument("--eos", metavar="ID,ID,...", help="stop tokens (default: the model folder's config, else none)")
    g.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="feed the prompt N tokens a run (1 for an export traced at sequence length 1)")
    g.add_argument("--stream", action="store_true", help="print each token as it comes")
    g.add_argument("--json", metavar="FILE.json", help="write the ids, text and timings to a JSON file")
    g.set_defaults(func=generate)


def _id_list(option: str, text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise CliError(USAGE, f"{option} {text!r}: expected comma-separated whole numbers, e.g. 1,2,3") from None
    if not ids or min(ids) < 0:
        raise CliError(USAGE, f"{option} {text!r}: expected one or more token ids >= 0")
    return ids


def load_tokenizer(path: str | os.PathLike) -> Any:
    """A `tokenizers.Tokenizer` from a tokenizer.json or the folder holding one."""
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise CliError(USAGE, f"no tokenizer.json at {path}")
    try:
        import tokenizers
    except ImportError:
        raise CliError(USAGE, "text prompts and decoded output need the 'tokenizers' package (pip install "
                              "tokenizers); or give the prompt as ids with --prompt-ids") from None
    try:
        return tokenizers.Tokenizer.from_file(str(file))
    except Exception as e:
        raise CliError(USAGE, f"cannot read the tokenizer {file}: {one_line(str(e))}") from e


def _check_args(args: argparse.Namespace) -> None:
    if not os.path.exists(args.model):
        raise CliError(USAGE, f"no such file or folder: {args.model}")
    try:
        check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        raise CliError(USAGE, "--" + str(e).replace("_", "-")) from None
    if args.prefill_chunk is not None and args.prefill_chunk < 1:
        raise CliError(USAGE, f"--prefill-chunk {args.prefill_chunk}: expected a whole number >= 1")
    if args.json:
        folder = os.path.dirname(os.path.abspath(args.json))
        if not os.path.isdir(folder) or os.path.isdir(args.json):
            raise CliError(USAGE, f"--json {args.json}: cannot write there")


def _tokenizer_for(args: argparse.Namespace) -> Any:
    if args.tokenizer is not None:
        return load_tokenizer(args.tokenizer)
    folder = Path(args.model) if os.path.isdir(args.model) else Path(args.model).parent
    if (folder / "tokenizer.json").is_file():
        return load_tokenizer(folder)
    if args.prompt is not None:
        raise CliError(USAGE, f"--prompt needs a tokenizer: give --tokenizer PATH (no tokenizer.json in {folder}), "
                              "or the prompt as ids with --prompt-ids")
    return None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def generate(args: argparse.Namespace) -> int:
    _check_args(args)
    tokenizer = _tokenizer_for(args)
    if args.prompt is not None:
        prompt = list(tokenizer.encode(args.prompt).ids)
        if not prompt:
            raise CliError(USAGE, f"--prompt {args.prompt!r}: the tokenizer gives no tokens for it")
    else:
        prompt = _id_list("--prompt-ids", args.prompt_ids)
    eos = _id_list("--eos", args.eos) if args.eos else None
    try:
        path, _ = find_model_file(args.model)
    except FileNotFoundError as e:
        raise CliError(USAGE, str(e)) from None
    try:
        gen = Generator(args.model, backend=args.backend, eos_token_id=eos, prefill_chunk=args.prefill_chunk)
    except Exception as e:  # not a KV-cache decoder: ValueError, exit 3 as a model rejected at load
        raise describe_error(e, at_load=True) from e
    model = gen.model
    adapter = f" ({model.compute_backend.adapter_name})" if model.backend == "wgpu" else ""
    print(f"model: {path} on {model.backend}{adapter}", flush=True)
    print(f"prompt: {len(prompt)} tokens", flush=True)

    so_far: list[int] = []
    shown = [""]

    def stream(step: int, tokens: Any) -> None:
        so_far.append(int(tokens[0]))
        if tokenizer is None:
            piece = f"{so_far[-1]} "
        else:  # the text so far decoded whole, its new end shown: a token alone may decode without its space
            text = tokenizer.decode(so_far)
            piece, shown[0] = (text[len(shown[0]):], text) if text.startswith(shown[0]) else (text, text)
        sys.stdout.write(piece)
        sys.stdout.flush()

    try:
        ids = gen.generate(prompt, args.max_new_tokens, do_sample=args.sample, temperature=args.temperature,
                           top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                           callback=stream if args.stream else None)
    except ValueError as e:
        raise CliError(USAGE, one_line(str(e))) from e
    except Exception as e:
        raise describe_error(e, at_load=False) from e
    if args.stream:
        print()
    ids_list = [int(t) for t in ids]
    print(f"ids: {','.join(map(str, ids_list))}")
    text = tokenizer.decode(ids_list) if tokenizer is not None else None
    if text is not None:
        print(f"text: {text}")
    st = gen.stats
    info = model.cache_info()
    print(f"prefill: {_fmt(st.prefill_ms)} ms ({st.prompt_tokens} tokens); decode: {_fmt(st.ms_per_token)} ms/token, "
          f"{_fmt(st.tokens_per_s, 1)} tok/s over {len(st.step_ms)} steps; {st.new_tokens} new tokens "
          f"(stopped: {st.stopped}); plans built: {st.builds} (cached now: {info['plans']})", flush=True)
    if args.json:
        data = {"model": str(path), "backend": model.backend, "prompt_ids": prompt, "ids": ids_list, "text": text,
                **st.as_dict(), "cache_info": info}
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
    return OK
