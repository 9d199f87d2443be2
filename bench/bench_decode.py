"""KV-cache decode speed: `transformers` decoders built from configs (random weights), exported to ONNX with a
flat KV cache (tests/models/decoders.py), decoded greedily a token a step from a random cache of --past positions.

    python bench/bench_decode.py [--models gpt2-124m,llama-1b] [--steps 32] [--past 32]
        [--engines ember-wgpu,ember-wgpu-f16,ember-cpu,torch,torch-f16,ort-cpu] [--json out.json] [--md out.md]
        [--profile DIR] [--kernels N]

Columns per engine: ms per step over the loop (each step a new past length, as in a real decode; the median, and for
ember the mean and the slowest step after the first four, which include a live plan's regrowth), tokens/s, and for
ember the ms of a step whose plan exists already (the same length run again: the replay alone, what a shape-
polymorphic plan would cost per step), the GPU time of that replay (wgpu), the same replay with the next command
buffer encoded after the wait (EMBER_ENCODE_AHEAD=0) and per run of 20 replays queued before one readback (the GPU's
pace rather than a round trip's), ember.Generator's median ms per token, host ms per step (its run calls, no
wait) and wait ms (the pick's wait for its logits or token) from a 32-token prompt (--steps new tokens) with the
greedy pick on the host and overlapped (picked on the device, each step queued before the token before it is
read back), the steps (kernels) a step records, the plans it built, and the growth of the process's RSS and of
the backend's bytes from the fifth step to the last (the issue's memory target: flat over a 512-step decode,
`--steps 512`, beyond the live plan's regrowths, which the bytes columns include).
ember keeps the cache on the device (`keep_on_device=True`, presents fed back as pasts); torch runs the
transformers model eagerly on CUDA with a DynamicCache; ort-cpu is ONNX Runtime's CPU provider on the same export.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from tests.models import decoders  # noqa: E402
from tests.models.memory import rss_mb  # noqa: E402

import ember  # noqa: E402
from ember.generate import Generator  # noqa: E402

MODELS = {
    "gpt2-124m": decoders.Decoder("gpt2", layers=12, hidden=768, heads=12, kv_heads=12, ff=3072, vocab=50257,
                                  positions=1024),
    "llama-1b": decoders.Decoder("llama", layers=16, hidden=2048, heads=32, kv_heads=8, ff=8192, vocab=32000,
                                 positions=2048),
    "gpt2-tiny": decoders.GPT2,
}


PROFILE: Path | None = None  # --profile DIR
PROMPT = 32  # prompt tokens of the Generator columns
BACK_TO_BACK = 20  # replays queued before one readback (the "queued" column)
KERNELS = 0  # --kernels N: the N slowest kernels of a step's replay (Model.profile) go into the notes
NOTES: list[str] = []


def ember_loop(cfg: decoders.Decoder, path: str, backend: str, precision: str, past: int, steps: int) -> dict:
    model = ember.load_onnx(path, backend=backend, precision=precision)
    names = cfg.output_names()
    cache: dict[str, Any] = cfg.past(1, past)
    token = 1
    times = []
    be = model.compute_backend
    pipelines = []
    mem: list[tuple[float, int]] = []
    for step in range(steps):
        feeds = {"input_ids": np.array([[token]], np.int64), "attention_mask": np.ones((1, past + step + 1), np.int64)}
        pipelines.append(getattr(be, "pipelines_created", 0))
        if step in (4, steps - 1):
            mem.append((rss_mb(), be.memory_info()["bytes"]))
        t0 = time.perf_counter()
        out = model.run({**feeds, **cache}, keep_on_device=True)
        logits = out["logits"].numpy()
        times.append((time.perf_counter() - t0) * 1e3)
        token = int(logits[0, -1].argmax())
        last = {**feeds, **cache}
        cache = {f"past{n[len('present'):]}": out[n] for n in names[1:]}
    if PROFILE is not None:  # more steps under cProfile: where a step's host time goes
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for step in range(steps, steps + 16):
            feeds = {"input_ids": np.array([[token]], np.int64),
                     "attention_mask": np.ones((1, past + step + 1), np.int64)}
            out = model.run({**feeds, **cache}, keep_on_device=True)
            token = int(out["logits"].numpy()[0, -1].argmax())
            cache = {f"past{n[len('present'):]}": out[n] for n in names[1:]}
        prof.disable()
        with open(PROFILE / f"{cfg.arch}-{backend}-{precision}.txt", "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(40)
            pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(25)
    replay = harness.measure(lambda: model.run(last, keep_on_device=True)["logits"].numpy(), repeat=20, warmup=2)
    with ember.settings.override(encode_ahead=False):  # the next command buffer encoded after the wait instead
        no_ahead = harness.measure(lambda: model.run(last, keep_on_device=True)["logits"].numpy(), repeat=20,
                                   warmup=2)

    def back_to_back() -> None:  # runs queued without a readback between: the GPU's pace, not the round trip's
        for _ in range(BACK_TO_BACK - 1):
            model.run(last, keep_on_device=True)
        model.run(last, keep_on_device=True)["logits"].numpy()

    queued = harness.measure(back_to_back, repeat=5, warmup=1)
    generated = {}
    prompt = np.random.default_rng(0).integers(0, cfg.vocab, PROMPT)
    for overlap in (False, True):  # ember.Generator from a PROMPT-token prompt: the host's pick, then the device's
        gen = Generator(model, overlap=overlap, eos_token_id=[])
        gen.generate(prompt, 4)  # the prompt's plan
        gen.generate(prompt, steps)
        st = gen.stats.as_dict()
        generated[f"generate ms/token{', overlapped' if overlap else ''}"] = st["median_step_ms"]
        generated[f"generate host ms{', overlapped' if overlap else ''}"] = st["median_host_ms"]
        generated[f"generate wait ms{', overlapped' if overlap else ''}"] = st["median_wait_ms"]
    generated["generate tok/s, overlapped"] = 1e3 / generated["generate ms/token, overlapped"]
    # The first steps plan (three past lengths fit and verify a template); the rest are made from it.
    steady = times[4:] if steps > 8 else times[1:]
    step_ms = float(np.median(steady))
    gpu = model.gpu_time(last) if backend == "wgpu" else None
    if KERNELS and backend == "wgpu":
        rows = model.profile(last)
        top = ", ".join(f"{label} {ms * 1e3:.0f}" for label, ms in rows[:KERNELS])
        total = sum(ms for _, ms in rows)
        NOTES.append(f"{cfg.arch} {precision} past {past + steps}: {len(rows)} kernels, {total:.3f} ms in all; "
                     f"slowest (µs): {top}")
    info = model.cache_info()
    per_step = (pipelines[-1] - pipelines[4]) / max(steps - 5, 1) if steps > 8 else None
    mean_ms = float(np.mean(times[4:] if steps > 8 else times[1:]))  # with the live plans' regrowths
    return {"ms/step": step_ms, "tok/s": 1e3 / step_ms, "mean ms/step": mean_ms, "max ms": max(times[4:] or times),
            "first 4 steps ms": [round(t, 1) for t in times[:4]],
            "replay ms": replay.median, "replay ms, no encode-ahead": no_ahead.median,
            f"ms/run, {BACK_TO_BACK} queued": queued.median / BACK_TO_BACK,
            **({"replay GPU ms": gpu} if gpu is not None else {}), **generated,
            "kernels/step": model.plan_info(last)["steps"], "builds": info["builds"],
            "from template": info["from_template"],
            **({"RSS +MB": mem[-1][0] - mem[0][0], "RSS MB": mem[-1][0],
                "backend +MB": (mem[-1][1] - mem[0][1]) / 2**20, "plan MB": info["bytes"] / 2**20}
               if len(mem) == 2 else {}),
            **({"new pipelines/step": per_step} if backend == "wgpu" else {})}


def torch_loop(cfg: decoders.Decoder, past: int, steps: int, half: bool) -> dict | None:
    torch = harness.cuda_torch()
    if torch is None:
        return None
    from transformers import DynamicCache

    model = decoders.build(cfg).cuda()
    if half:
        model = model.half()
    dtype = torch.float16 if half else torch.float32
    cache = DynamicCache()
    for i, value in enumerate(cfg.past(1, past).values()):
        if i % 2 == 0:
            k = torch.from_numpy(value).to("cuda", dtype)
        else:
            cache.update(k, torch.from_numpy(value).to("cuda", dtype), i // 2)
    token = torch.tensor([[1]], device="cuda")
    times = []
    with torch.no_grad():
        for step in range(steps):
            mask = torch.ones(1, past + step + 1, dtype=torch.int64, device="cuda")
            t0 = time.perf_counter()
            out = model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
            cache = out.past_key_values
    step_ms = float(np.median(times[2:]))
    return {"ms/step": step_ms, "tok/s": 1e3 / step_ms}


def ort_loop(cfg: decoders.Decoder, path: str, past: int, steps: int) -> dict:
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = cfg.output_names()
    cache = cfg.past(1, past)
    token = 1
    times = []
    for step in range(steps):
        feeds = {"input_ids": np.array([[token]], np.int64), "attention_mask": np.ones((1, past + step + 1), np.int64)}
        t0 = time.perf_counter()
        out = dict(zip(names, sess.run(names, {**feeds, **cache}), strict=True))
        times.append((time.perf_counter() - t0) * 1e3)
        token = int(out["logits"][0, -1].argmax())
        cache = {f"past{n[len('present'):]}": out[n] for n in names[1:]}
    step_ms = float(np.median(times[1:]))
    return {"ms/step": step_ms, "tok/s": 1e3 / step_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2-124m,llama-1b")
    ap.add_argument("--engines", default="ember-wgpu,ember-wgpu-f16,torch,torch-f16,ort-cpu")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--past", type=int, default=32)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--profile", type=Path, help="write cProfile tables of 16 more ember steps into this folder")
    ap.add_argument("--kernels", type=int, default=0, help="list the N slowest kernels of a step (GPU profile)")
    args = ap.parse_args()
    global PROFILE, KERNELS
    PROFILE, KERNELS = args.profile, args.kernels
    report = harness.Report("KV-cache decode, batch 1", args)
    for name in args.models.split(","):
        cfg = MODELS[name]
        t0 = time.perf_counter()
        path = str(decoders.export(cfg, "torchscript"))
        report.notes.append(f"{name}: export ready in {time.perf_counter() - t0:.0f} s")
        for engine in args.engines.split(","):
            try:
                if engine.startswith("ember-"):
                    parts = engine.split("-")
                    res = ember_loop(cfg, path, parts[1], "f16" if parts[-1] == "f16" else "f32", args.past,
                                     args.steps)
                elif engine.startswith("torch"):
                    res = torch_loop(cfg, args.past, max(args.steps, 16), engine.endswith("f16"))
                elif engine == "ort-cpu":
                    res = ort_loop(cfg, path, args.past, args.steps)
                else:
                    raise ValueError(f"unknown engine {engine!r}")
            except Exception as e:  # one engine failing leaves the others' figures
                report.notes.append(f"{name} {engine}: {type(e).__name__}: {str(e)[:200]}")
                continue
            if res is None:
                report.notes.append(f"{name} {engine}: not available here")
                continue
            for column, value in res.items():
                report.set(f"{name} {engine}", column, value)
            report.notes += NOTES
            NOTES.clear()
    report.finish()


if __name__ == "__main__":
    main()
